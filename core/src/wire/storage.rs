//! The on-disk and on-wire layout of the share types the extension stores
//! (`iris_code_share`, `iris_mask_share`, `face_share`), and their text form. Kept here, free of Postgres, so
//! every validation rule is unit-tested; the extension only copies bytes in and out of varlenas.
//!
//! Binary layout of the payload (after the 4-byte varlena header; also the `send`/`recv`
//! format), little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | layout version, currently 1 |
//! | 2 | 1 | share kind: 1 iris code share, 2 iris mask share, 3 face template share |
//! | 3 | 1 | index of the party holding the share (0, 1, 2) |
//! | 4 | 4 | n, the number of coefficients |
//! | 8 | w·n | the coefficients, little-endian, w bytes each |
//!
//! Iris shares hold Z_2^16 coefficients (w = 2), element-major, n a positive multiple of 4
//! (whole GR(2^16, 4) elements, see [`crate::iris::encoding`]). Face shares hold one additive
//! Z_2^32 share per embedding element (w = 4, n = the dimension l, 1..=[`MAX_FACE_DIM`]; see
//! [`crate::face`]).
//!
//! Text form: `v1:p<party>:<base64 of the w·n coefficient bytes>` (standard alphabet, padded,
//! no whitespace), e.g. `v1:p0:AAABAA==`.

use base64::Engine;

use crate::party::PartyIndex;

/// Current layout version.
pub const SHARE_LAYOUT_VERSION: u16 = 1;
/// Bytes before the coefficients.
pub const SHARE_HEADER_LEN: usize = 8;
/// Largest coefficient count accepted (a guard against absurd allocations): 2^20.
pub const MAX_SHARE_COEFS: usize = 1 << 20;
/// Largest dimension a `face_share` may have.
pub const MAX_FACE_DIM: usize = 4096;

/// Which share type a payload belongs to. Each kind is its own SQL type, so a mask share can
/// never be stored or used where a code share belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareKind {
    /// A party's share of an encoded iris code (`mask − 2·(code ∧ mask)`), SQL type
    /// `iris_code_share`.
    IrisCode,
    /// A party's share of an iris mask, SQL type `iris_mask_share`.
    IrisMask,
    /// A party's additive Z_2^32 share of a quantised face embedding, SQL type `face_share`.
    FaceTemplate,
}

impl ShareKind {
    /// The SQL type name, used in every error message.
    pub fn type_name(self) -> &'static str {
        match self {
            ShareKind::IrisCode => "iris_code_share",
            ShareKind::IrisMask => "iris_mask_share",
            ShareKind::FaceTemplate => "face_share",
        }
    }

    fn tag(self) -> u8 {
        match self {
            ShareKind::IrisCode => 1,
            ShareKind::IrisMask => 2,
            ShareKind::FaceTemplate => 3,
        }
    }

    /// Bytes per coefficient: 2 (Z_2^16) for iris shares, 4 (Z_2^32) for face shares.
    pub fn coef_bytes(self) -> usize {
        match self {
            ShareKind::IrisCode | ShareKind::IrisMask => 2,
            ShareKind::FaceTemplate => 4,
        }
    }

    /// The largest coefficient count of this kind.
    fn max_coefs(self) -> usize {
        match self {
            ShareKind::IrisCode | ShareKind::IrisMask => MAX_SHARE_COEFS,
            ShareKind::FaceTemplate => MAX_FACE_DIM,
        }
    }

    /// Iris shares hold whole GR(2^16, 4) elements: multiples of 4 coefficients.
    fn coef_multiple(self) -> usize {
        match self {
            ShareKind::IrisCode | ShareKind::IrisMask => 4,
            ShareKind::FaceTemplate => 1,
        }
    }
}

/// Why a share value was rejected. The message names the type; it never echoes share data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareLayoutError {
    /// Text input that does not follow `v1:p<party>:<base64>`.
    #[error("invalid input syntax for type {type_name}: {reason}")]
    Syntax {
        /// The SQL type.
        type_name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Binary input that does not follow the layout.
    #[error("invalid binary representation of type {type_name}: {reason}")]
    Binary {
        /// The SQL type.
        type_name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The coefficient count does not match the column's declared length.
    #[error("{type_name} has {actual} coefficients, but the column requires {expected}")]
    LengthMismatch {
        /// The SQL type.
        type_name: &'static str,
        /// Declared by the typmod.
        expected: usize,
        /// In the value.
        actual: usize,
    },
    /// A declared length (typmod) that no share can have.
    #[error("invalid length {length} for type {type_name}: must be a positive multiple of {multiple}, at most {max}")]
    BadTypmod {
        /// The SQL type.
        type_name: &'static str,
        /// The requested length.
        length: i64,
        /// Lengths must be multiples of this.
        multiple: usize,
        /// The maximum.
        max: usize,
    },
}

/// A validated share payload, borrowed from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareView<'a> {
    /// Which type it is.
    pub kind: ShareKind,
    /// The party holding it.
    pub party: PartyIndex,
    /// The coefficient bytes (w·n, little-endian u16 or u32 by kind).
    pub coef_bytes: &'a [u8],
}

impl ShareView<'_> {
    /// Number of coefficients.
    pub fn len(&self) -> usize {
        self.coef_bytes.len() / self.kind.coef_bytes()
    }

    /// True when there are no coefficients (never, for a validated share).
    pub fn is_empty(&self) -> bool {
        self.coef_bytes.is_empty()
    }

    /// The coefficients of an iris share as integers.
    pub fn coefs(&self) -> Vec<u16> {
        coefs_from_le_bytes(self.coef_bytes)
    }

    /// The coefficients of a face share as integers.
    pub fn words(&self) -> Vec<u32> {
        self.coef_bytes
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect()
    }
}

/// Z_2^16 coefficients from their little-endian bytes (a trailing odd byte is ignored; callers
/// check lengths first).
pub fn coefs_from_le_bytes(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|p| u16::from_le_bytes([p[0], p[1]]))
        .collect()
}

/// Appends coefficients as little-endian bytes.
pub fn push_coefs_le(out: &mut Vec<u8>, coefs: &[u16]) {
    out.extend(coefs.iter().flat_map(|c| c.to_le_bytes()));
}

/// Checks a declared length (typmod) for `kind`.
pub fn validate_typmod(kind: ShareKind, length: i64) -> Result<usize, ShareLayoutError> {
    let multiple = kind.coef_multiple() as i64;
    let ok = length > 0 && length % multiple == 0 && length as u64 <= kind.max_coefs() as u64;
    if ok {
        Ok(length as usize)
    } else {
        Err(ShareLayoutError::BadTypmod {
            type_name: kind.type_name(),
            length,
            multiple: kind.coef_multiple(),
            max: kind.max_coefs(),
        })
    }
}

/// Checks a value's coefficient count against a column's typmod (negative: no constraint).
pub fn check_typmod(view: &ShareView<'_>, typmod: i32) -> Result<(), ShareLayoutError> {
    if typmod >= 0 && view.len() != typmod as usize {
        return Err(ShareLayoutError::LengthMismatch {
            type_name: view.kind.type_name(),
            expected: typmod as usize,
            actual: view.len(),
        });
    }
    Ok(())
}

fn check_coef_count(kind: ShareKind, n: usize) -> Result<(), String> {
    let (multiple, max) = (kind.coef_multiple(), kind.max_coefs());
    if n == 0 || !n.is_multiple_of(multiple) || n > max {
        let name = kind.type_name();
        return Err(match kind {
            ShareKind::FaceTemplate => {
                format!("{name} must hold 1 to {max} elements; got {n}")
            }
            _ => format!(
                "{name} must hold a positive multiple of {multiple} coefficients (whole ring elements), at most {max}; got {n}"
            ),
        });
    }
    Ok(())
}

/// Builds the binary payload of a share (header + coefficients).
pub fn encode_share(kind: ShareKind, party: PartyIndex, coefs: &[u16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SHARE_HEADER_LEN + 2 * coefs.len());
    write_share_header(kind, party, coefs.len(), &mut out);
    push_coefs_le(&mut out, coefs);
    out
}

/// Builds the binary payload of a face share (header + Z_2^32 element shares).
pub fn encode_face_share(party: PartyIndex, words: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SHARE_HEADER_LEN + 4 * words.len());
    write_share_header(ShareKind::FaceTemplate, party, words.len(), &mut out);
    out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
    out
}

/// Appends the 8-byte header for a share of `n` coefficients.
pub fn write_share_header(kind: ShareKind, party: PartyIndex, n: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&SHARE_LAYOUT_VERSION.to_le_bytes());
    out.push(kind.tag());
    out.push(party.as_u8());
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

/// Validates a binary payload as a share of `kind`.
pub fn decode_share(kind: ShareKind, bytes: &[u8]) -> Result<ShareView<'_>, ShareLayoutError> {
    let fail = |reason: String| ShareLayoutError::Binary {
        type_name: kind.type_name(),
        reason,
    };
    if bytes.len() < SHARE_HEADER_LEN {
        return Err(fail(format!(
            "{} bytes is shorter than the {SHARE_HEADER_LEN}-byte header",
            bytes.len()
        )));
    }
    let version = u16::from_le_bytes([bytes[0], bytes[1]]);
    if version != SHARE_LAYOUT_VERSION {
        return Err(fail(format!(
            "unsupported layout version {version} (this build reads version {SHARE_LAYOUT_VERSION})"
        )));
    }
    if bytes[2] != kind.tag() {
        return Err(fail(format!(
            "share kind tag {} is not this type's",
            bytes[2]
        )));
    }
    let party = PartyIndex::new(i64::from(bytes[3]))
        .map_err(|_| fail(format!("party index {} is not 0, 1 or 2", bytes[3])))?;
    let n = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    check_coef_count(kind, n).map_err(fail)?;
    let body = &bytes[SHARE_HEADER_LEN..];
    let width = kind.coef_bytes();
    if body.len() != width * n {
        return Err(fail(format!(
            "header announces {n} coefficients ({} bytes) but {} bytes follow",
            width * n,
            body.len()
        )));
    }
    Ok(ShareView {
        kind,
        party,
        coef_bytes: body,
    })
}

/// Parses the text form `v1:p<party>:<base64>` into a binary payload.
pub fn parse_share_text(kind: ShareKind, text: &str) -> Result<Vec<u8>, ShareLayoutError> {
    let fail = |reason: &str| ShareLayoutError::Syntax {
        type_name: kind.type_name(),
        reason: reason.to_owned(),
    };
    let rest = text
        .strip_prefix("v1:p")
        .ok_or_else(|| fail("expected the prefix \"v1:p<party>:\""))?;
    let (party_text, data) = rest
        .split_once(':')
        .ok_or_else(|| fail("expected \":\" after the party index"))?;
    let party = match party_text {
        "0" => PartyIndex::ALL[0],
        "1" => PartyIndex::ALL[1],
        "2" => PartyIndex::ALL[2],
        _ => return Err(fail("party index must be 0, 1 or 2")),
    };
    let coef_bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|_| fail("coefficients are not valid padded standard base64"))?;
    let width = kind.coef_bytes();
    if !coef_bytes.len().is_multiple_of(width) {
        return Err(fail(&if width == 2 {
            "coefficient bytes have odd length".to_owned()
        } else {
            format!("coefficient bytes are not a multiple of {width} (whole Z_2^32 words)")
        }));
    }
    let n = coef_bytes.len() / width;
    check_coef_count(kind, n).map_err(|reason| ShareLayoutError::Syntax {
        type_name: kind.type_name(),
        reason,
    })?;
    let mut out = Vec::with_capacity(SHARE_HEADER_LEN + coef_bytes.len());
    write_share_header(kind, party, n, &mut out);
    out.extend_from_slice(&coef_bytes);
    Ok(out)
}

/// The text form of a validated share.
pub fn format_share_text(view: &ShareView<'_>) -> String {
    format!(
        "v1:p{}:{}",
        view.party.as_u8(),
        base64::engine::general_purpose::STANDARD.encode(view.coef_bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KINDS: [ShareKind; 2] = [ShareKind::IrisCode, ShareKind::IrisMask];

    proptest! {
        #[test]
        fn binary_and_text_round_trip(coefs in proptest::collection::vec(any::<u16>(), 1..64usize), party in 0i64..3, k in 0usize..2) {
            let mut coefs = coefs;
            coefs.truncate(coefs.len() / 4 * 4);
            prop_assume!(!coefs.is_empty());
            let kind = KINDS[k];
            let party = PartyIndex::new(party).expect("in range");
            let bytes = encode_share(kind, party, &coefs);
            let view = decode_share(kind, &bytes).expect("valid");
            prop_assert_eq!(view.party, party);
            prop_assert_eq!(view.coefs(), coefs.clone());
            let text = format_share_text(&view);
            prop_assert_eq!(parse_share_text(kind, &text).expect("parses"), bytes);
        }
    }

    #[test]
    fn binary_rejections() {
        let p0 = PartyIndex::ALL[0];
        let good = encode_share(ShareKind::IrisCode, p0, &[1, 2, 3, 4]);
        assert!(decode_share(ShareKind::IrisCode, &good).is_ok());
        assert!(
            decode_share(ShareKind::IrisMask, &good).is_err(),
            "kind is checked"
        );
        assert!(decode_share(ShareKind::IrisCode, &good[..7]).is_err());
        assert!(decode_share(ShareKind::IrisCode, &good[..good.len() - 2]).is_err());
        let mut bad = good.clone();
        bad[0] = 2;
        assert!(decode_share(ShareKind::IrisCode, &bad).is_err(), "version");
        let mut bad = good.clone();
        bad[3] = 3;
        assert!(decode_share(ShareKind::IrisCode, &bad).is_err(), "party");
        let three = encode_share(ShareKind::IrisCode, p0, &[1, 2, 3]);
        assert!(
            decode_share(ShareKind::IrisCode, &three).is_err(),
            "whole elements"
        );
        let empty = encode_share(ShareKind::IrisCode, p0, &[]);
        assert!(decode_share(ShareKind::IrisCode, &empty).is_err(), "empty");
    }

    #[test]
    fn text_rejections() {
        let kind = ShareKind::IrisMask;
        for bad in [
            "",
            "v2:p0:AAAAAAAAAAA=",
            "v1:p3:AAAAAAAAAAA=",
            "v1:p0AAAAAAAAAAA=",
            "v1:p0:AAAA AAAAAAA=",
            "v1:p0:AAAAAAAAAAA",
            "v1:p0:AAAA",
            "v1:p0:",
            " v1:p0:AAAAAAAAAAA=",
        ] {
            let err = parse_share_text(kind, bad).expect_err(bad);
            assert!(err.to_string().contains("iris_mask_share"), "{err}");
        }
        assert!(parse_share_text(kind, "v1:p2:AAAAAAAAAAA=").is_ok());
    }

    #[test]
    fn typmods() {
        assert_eq!(validate_typmod(ShareKind::IrisCode, 12800), Ok(12800));
        assert!(validate_typmod(ShareKind::IrisCode, 0).is_err());
        assert!(validate_typmod(ShareKind::IrisCode, 6).is_err());
        assert!(validate_typmod(ShareKind::IrisCode, -4).is_err());
        let bytes = encode_share(ShareKind::IrisCode, PartyIndex::ALL[1], &[0; 8]);
        let view = decode_share(ShareKind::IrisCode, &bytes).expect("valid");
        assert!(check_typmod(&view, 8).is_ok());
        assert!(check_typmod(&view, -1).is_ok());
        assert!(check_typmod(&view, 12).is_err());
    }
}
