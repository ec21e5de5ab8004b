//! The plaintext iris template: 12,800-bit code and mask, the Open-IRIS / iris-mpc base64
//! interchange format, column rotations, and the fractional Hamming distance (docs/protocols/iris.md).
//!
//! A code (and its mask) is a (16, 200, 2, 2) bit array: 16 rows × 200 columns × 2 wavelets ×
//! 2 parts (real, imaginary). Bit index `i = 800*row + 4*col + 2*wavelet + real_imag`.
//!
//! **Rotation convention** (pinned by `iris_mpc_all_rotations.txt` of iris-mpc):
//! [`IrisBits::rotate`]`(k)` moves column `c` to column `(c + k) mod 200` within every row,
//! i.e. `rotated[row][c] = original[row][(c − k) mod 200]`, exactly `numpy.roll(a, k, axis=1)`
//! on the (16, 200, 2, 2) array. Open-IRIS's `HammingDistanceMatcher` rolls the *probe* the
//! same way; [`min_fhd_over_rotations`] therefore rotates the query and keeps the enrolled
//! template fixed. (Rotating the enrolled template by −k instead gives the same distances, so
//! the minimum does not depend on which side is rotated; only the reported best k flips sign.)

use std::fmt;
use std::ops::{BitAnd, BitOr, BitXor, Not};

use base64::Engine as _;

/// Rows of an iris code.
pub const IRIS_ROWS: usize = 16;
/// Columns (angular positions) of an iris code; rotations act on this axis.
pub const IRIS_COLS: usize = 200;
/// Gabor wavelets per position.
pub const IRIS_WAVELETS: usize = 2;
/// Parts per wavelet response: real and imaginary.
pub const IRIS_PARTS: usize = 2;
/// Bits in an iris code or mask: 16 × 200 × 2 × 2.
pub const IRIS_CODE_BITS: usize = IRIS_ROWS * IRIS_COLS * IRIS_WAVELETS * IRIS_PARTS;
/// Bytes of an iris code in the interchange format (before base64).
pub const IRIS_CODE_BYTES: usize = IRIS_CODE_BITS / 8;
/// 64-bit words of the in-memory representation.
pub const IRIS_CODE_WORDS: usize = IRIS_CODE_BITS / 64;
/// Bits per row (200 columns × 4 bits).
pub const IRIS_ROW_BITS: usize = IRIS_COLS * IRIS_WAVELETS * IRIS_PARTS;
/// Largest column rotation tried when matching: k ∈ −15..=15, 31 rotations.
pub const MAX_ROTATION: i32 = 15;
/// Number of rotations tried when matching (2·[`MAX_ROTATION`] + 1).
pub const NUM_ROTATIONS: usize = 2 * MAX_ROTATION as usize + 1;

const ROW_BYTES: usize = IRIS_ROW_BITS / 8;

/// Why an iris bit array could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IrisFormatError {
    /// The base64 text contains a whitespace character.
    #[error("{what}: base64 text contains whitespace at byte offset {offset}; the interchange format is one unbroken standard-base64 string")]
    Whitespace {
        /// Which array was being parsed ("iris code", "iris mask").
        what: &'static str,
        /// Byte offset of the first whitespace character.
        offset: usize,
    },
    /// The text is not valid standard (padded, `+/` alphabet) base64.
    #[error("{what}: invalid standard base64: {detail}")]
    Base64 {
        /// Which array was being parsed.
        what: &'static str,
        /// The decoder's description of the problem.
        detail: String,
    },
    /// The base64 decoded to the wrong number of bytes.
    #[error("{what}: expected 1600 bytes after base64 decoding, got {got}")]
    DecodedLength {
        /// Which array was being parsed.
        what: &'static str,
        /// Number of decoded bytes.
        got: usize,
    },
    /// A raw byte array had the wrong length.
    #[error("{what}: expected 1600 bytes, got {got}")]
    ByteLength {
        /// Which array was being parsed.
        what: &'static str,
        /// Number of bytes supplied.
        got: usize,
    },
}

/// A 12,800-bit iris code or mask.
///
/// Stored as 200 words; bit index i (see the module docs) lives in word `i / 64` at bit
/// position `63 − i % 64`, so that the big-endian bytes of the words are exactly the
/// MSB-first interchange byte stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IrisBits {
    words: [u64; IRIS_CODE_WORDS],
}

impl Default for IrisBits {
    /// All bits zero.
    fn default() -> Self {
        Self::zeros()
    }
}

impl fmt::Debug for IrisBits {
    /// Prints the number of set bits and the interchange base64.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IrisBits")
            .field("ones", &self.popcount())
            .field("base64", &self.to_base64())
            .finish()
    }
}

/// The bit index `800*row + 4*col + 2*wavelet + real_imag` of an array position.
/// Arguments are not range-checked; in-range arguments give indices below 12,800.
pub const fn bit_index(row: usize, col: usize, wavelet: usize, real_imag: usize) -> usize {
    IRIS_ROW_BITS * row + 4 * col + 2 * wavelet + real_imag
}

impl IrisBits {
    /// All bits zero.
    pub const fn zeros() -> Self {
        Self {
            words: [0; IRIS_CODE_WORDS],
        }
    }

    /// All bits one.
    pub const fn ones() -> Self {
        Self {
            words: [u64::MAX; IRIS_CODE_WORDS],
        }
    }

    /// Builds the array from its words (layout: see the type docs).
    pub const fn from_words(words: [u64; IRIS_CODE_WORDS]) -> Self {
        Self { words }
    }

    /// The words of the array (layout: see the type docs).
    pub const fn words(&self) -> &[u64; IRIS_CODE_WORDS] {
        &self.words
    }

    /// Bit `i` (index convention in the module docs).
    ///
    /// # Panics
    /// If `i >= IRIS_CODE_BITS`, like slice indexing.
    #[inline]
    pub fn get(&self, i: usize) -> bool {
        (self.words[i / 64] >> (63 - i % 64)) & 1 == 1
    }

    /// Sets bit `i` to `value`.
    ///
    /// # Panics
    /// If `i >= IRIS_CODE_BITS`, like slice indexing.
    #[inline]
    pub fn set(&mut self, i: usize, value: bool) {
        let bit = 1u64 << (63 - i % 64);
        if value {
            self.words[i / 64] |= bit;
        } else {
            self.words[i / 64] &= !bit;
        }
    }

    /// Number of set bits.
    pub fn popcount(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// The interchange byte stream: bit i is bit `7 − i % 8` of byte `i / 8` (MSB-first).
    pub fn to_bytes(&self) -> [u8; IRIS_CODE_BYTES] {
        let mut out = [0u8; IRIS_CODE_BYTES];
        for (chunk, w) in out.chunks_exact_mut(8).zip(self.words.iter()) {
            chunk.copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    /// Parses the interchange byte stream (exactly 1,600 bytes, MSB-first bit order).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, IrisFormatError> {
        Self::from_bytes_named(bytes, "iris code")
    }

    fn from_bytes_named(bytes: &[u8], what: &'static str) -> Result<Self, IrisFormatError> {
        if bytes.len() != IRIS_CODE_BYTES {
            return Err(IrisFormatError::ByteLength {
                what,
                got: bytes.len(),
            });
        }
        let mut words = [0u64; IRIS_CODE_WORDS];
        for (w, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *w = u64::from_be_bytes(b);
        }
        Ok(Self { words })
    }

    /// Parses the Open-IRIS / iris-mpc interchange format: standard padded base64 of the
    /// 1,600-byte MSB-first stream. Strict: whitespace anywhere, a non-canonical encoding or
    /// a wrong decoded length is an error naming the problem.
    pub fn from_base64(text: &str) -> Result<Self, IrisFormatError> {
        Self::from_base64_named(text, "iris code")
    }

    /// As [`IrisBits::from_base64`], with `what` ("iris code", "iris mask", …) naming the
    /// array in error messages.
    pub fn from_base64_named(text: &str, what: &'static str) -> Result<Self, IrisFormatError> {
        if let Some(offset) = text.bytes().position(|b| b.is_ascii_whitespace()) {
            return Err(IrisFormatError::Whitespace { what, offset });
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| IrisFormatError::Base64 {
                what,
                detail: e.to_string(),
            })?;
        if bytes.len() != IRIS_CODE_BYTES {
            return Err(IrisFormatError::DecodedLength {
                what,
                got: bytes.len(),
            });
        }
        Self::from_bytes_named(&bytes, what)
    }

    /// The interchange format: standard padded base64 of [`IrisBits::to_bytes`].
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.to_bytes())
    }

    /// Rotates every row by `k` columns: column c moves to column (c + k) mod 200
    /// (`numpy.roll(a, k, axis=1)`, the iris-mpc convention; see the module docs).
    pub fn rotate(&self, k: i32) -> Self {
        // Each row is 800 bits = 100 whole bytes and a column is one nibble, so the rotation
        // is a byte rotation by ⌊shift/2⌋ plus, for odd shifts, a nibble shift.
        let shift = k.rem_euclid(IRIS_COLS as i32) as usize;
        let byte_shift = shift / 2;
        let odd = !shift.is_multiple_of(2);
        let src = self.to_bytes();
        let mut dst = [0u8; IRIS_CODE_BYTES];
        for (s, d) in src
            .chunks_exact(ROW_BYTES)
            .zip(dst.chunks_exact_mut(ROW_BYTES))
        {
            d.copy_from_slice(s);
            d.rotate_right(byte_shift);
            if odd {
                // Shift the row right by 4 bits, wrapping the last nibble to the front.
                let mut carry = d[ROW_BYTES - 1] << 4;
                for byte in d.iter_mut() {
                    let next_carry = *byte << 4;
                    *byte = carry | (*byte >> 4);
                    carry = next_carry;
                }
            }
        }
        let mut words = [0u64; IRIS_CODE_WORDS];
        for (w, chunk) in words.iter_mut().zip(dst.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *w = u64::from_be_bytes(b);
        }
        Self { words }
    }

    /// Whether the real and imaginary bits agree at every (row, column, wavelet), i.e. the
    /// array is duplicated along its last axis (true of Open-IRIS masks).
    pub fn is_duplicated_along_last_axis(&self) -> bool {
        self.first_real_imag_mismatch().is_none()
    }

    /// The first (row, column, wavelet) whose real and imaginary bits differ, if any.
    pub fn first_real_imag_mismatch(&self) -> Option<(usize, usize, usize)> {
        // Bits 2m (real) and 2m+1 (imaginary) sit at adjacent positions (odd, even) of a word.
        const EVEN_POSITIONS: u64 = 0x5555_5555_5555_5555;
        for (wi, w) in self.words.iter().enumerate() {
            let diff = (w ^ (w >> 1)) & EVEN_POSITIONS;
            if diff != 0 {
                // Highest differing even position p holds bit index 64·wi + 63 − p (imaginary).
                let p = 63 - diff.leading_zeros() as usize;
                let i = 64 * wi + 63 - p - 1;
                let row = i / IRIS_ROW_BITS;
                let col = (i % IRIS_ROW_BITS) / 4;
                let wavelet = (i % 4) / 2;
                return Some((row, col, wavelet));
            }
        }
        None
    }
}

impl BitAnd for IrisBits {
    type Output = Self;

    /// Bitwise AND.
    fn bitand(mut self, rhs: Self) -> Self {
        for (a, b) in self.words.iter_mut().zip(rhs.words.iter()) {
            *a &= b;
        }
        self
    }
}

impl BitOr for IrisBits {
    type Output = Self;

    /// Bitwise OR.
    fn bitor(mut self, rhs: Self) -> Self {
        for (a, b) in self.words.iter_mut().zip(rhs.words.iter()) {
            *a |= b;
        }
        self
    }
}

impl BitXor for IrisBits {
    type Output = Self;

    /// Bitwise XOR.
    fn bitxor(mut self, rhs: Self) -> Self {
        for (a, b) in self.words.iter_mut().zip(rhs.words.iter()) {
            *a ^= b;
        }
        self
    }
}

impl Not for IrisBits {
    type Output = Self;

    /// Bitwise complement.
    fn not(mut self) -> Self {
        for a in self.words.iter_mut() {
            *a = !*a;
        }
        self
    }
}

/// An iris template: code and mask (mask bit 1 = the code bit is valid).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct IrisTemplate {
    /// The iris code bits.
    pub code: IrisBits,
    /// The mask bits (1 = valid).
    pub mask: IrisBits,
}

impl IrisTemplate {
    /// Pairs a code with its mask.
    pub const fn new(code: IrisBits, mask: IrisBits) -> Self {
        Self { code, mask }
    }

    /// Parses code and mask from the interchange base64 (errors say which one is wrong).
    pub fn from_base64(code: &str, mask: &str) -> Result<Self, IrisFormatError> {
        Ok(Self {
            code: IrisBits::from_base64_named(code, "iris code")?,
            mask: IrisBits::from_base64_named(mask, "iris mask")?,
        })
    }

    /// Rotates code and mask together by `k` columns ([`IrisBits::rotate`]).
    pub fn rotate(&self, k: i32) -> Self {
        Self {
            code: self.code.rotate(k),
            mask: self.mask.rotate(k),
        }
    }

    /// Whether the mask's real and imaginary bits agree everywhere (required to share the
    /// mask, which shares only the real half; docs/protocols/iris.md).
    pub fn is_mask_duplicated_along_last_axis(&self) -> bool {
        self.mask.is_duplicated_along_last_axis()
    }

    /// The same template with code bits outside the mask cleared. Distances only depend on
    /// masked bits, and the share encoding cannot carry the others, so this is the canonical
    /// form a share round trip returns.
    pub fn with_masked_code(&self) -> Self {
        Self {
            code: self.code & self.mask,
            mask: self.mask,
        }
    }
}

/// The integer parts of the fractional Hamming distance:
/// `(popcount((ca ⊕ cb) ∧ ma ∧ mb), popcount(ma ∧ mb))`.
pub fn masked_code_distance_counts(a: &IrisTemplate, b: &IrisTemplate) -> (u32, u32) {
    let mut hamming = 0u32;
    let mut common = 0u32;
    let words = a
        .code
        .words
        .iter()
        .zip(b.code.words.iter())
        .zip(a.mask.words.iter().zip(b.mask.words.iter()));
    for ((ca, cb), (ma, mb)) in words {
        let m = ma & mb;
        hamming += ((ca ^ cb) & m).count_ones();
        common += m.count_ones();
    }
    (hamming, common)
}

/// The fractional Hamming distance popcount((ca ⊕ cb) ∧ ma ∧ mb) / popcount(ma ∧ mb), without
/// rotation (Open-IRIS `normalise=False`). `None` when the masks have no bit in common.
pub fn fractional_hamming_distance(a: &IrisTemplate, b: &IrisTemplate) -> Option<f64> {
    let (hamming, common) = masked_code_distance_counts(a, b);
    (common != 0).then(|| f64::from(hamming) / f64::from(common))
}

/// The minimum fractional Hamming distance over column rotations k ∈ −max..=max, together
/// with the rotation attaining it.
///
/// The query is rotated by k ([`IrisTemplate::rotate`]) and compared with the unrotated
/// enrolled template, as Open-IRIS `HammingDistanceMatcher(rotation_shift=max,
/// normalise=False)` rolls the probe. Ties keep the first k in increasing order (as
/// Open-IRIS does); rotations with an empty common mask are skipped; `None` when all are
/// empty. `max_rotation` is clamped to 0..=100 (100 columns each way already covers all 200
/// rotations).
///
/// This rotates the query on every call; to match one query against many templates, rotate
/// it once per k and reuse the rotations with [`masked_code_distance_counts`].
pub fn min_fhd_with_rotation(
    query: &IrisTemplate,
    enrolled: &IrisTemplate,
    max_rotation: i32,
) -> Option<(f64, i32)> {
    let m = max_rotation.clamp(0, IRIS_COLS as i32 / 2);
    let mut best: Option<(f64, i32)> = None;
    for k in -m..=m {
        if let Some(d) = fractional_hamming_distance(&query.rotate(k), enrolled) {
            if best.is_none_or(|(b, _)| d < b) {
                best = Some((d, k));
            }
        }
    }
    best
}

/// The minimum fractional Hamming distance over rotations k ∈ −max..=max (see
/// [`min_fhd_with_rotation`] for the convention); 15 is the deployed maximum.
pub fn min_fhd_over_rotations(
    query: &IrisTemplate,
    enrolled: &IrisTemplate,
    max_rotation: i32,
) -> Option<f64> {
    min_fhd_with_rotation(query, enrolled, max_rotation).map(|(d, _)| d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{RngCore, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    const TESTDATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/iris/");

    fn read_vector(name: &str) -> String {
        let path = format!("{TESTDATA}{name}");
        std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "iris test vector {path} cannot be read ({e}); it ships with the repository \
                 (core/testdata/iris, see its README) and this test must not be skipped"
            )
        })
    }

    fn random_bits(rng: &mut ChaCha20Rng) -> IrisBits {
        let mut words = [0u64; IRIS_CODE_WORDS];
        for w in words.iter_mut() {
            *w = rng.next_u64();
        }
        IrisBits::from_words(words)
    }

    fn bits_strategy() -> impl Strategy<Value = IrisBits> {
        any::<u64>().prop_map(|seed| random_bits(&mut ChaCha20Rng::seed_from_u64(seed)))
    }

    /// Bit-by-bit reference rotation straight from the definition.
    fn reference_rotate(b: &IrisBits, k: i32) -> IrisBits {
        let mut out = IrisBits::zeros();
        for row in 0..IRIS_ROWS {
            for col in 0..IRIS_COLS {
                let to = (col as i32 + k).rem_euclid(IRIS_COLS as i32) as usize;
                for j in 0..4 {
                    out.set(
                        IRIS_ROW_BITS * row + 4 * to + j,
                        b.get(IRIS_ROW_BITS * row + 4 * col + j),
                    );
                }
            }
        }
        out
    }

    #[test]
    fn bit_order_is_msb_first() {
        let mut b = IrisBits::zeros();
        b.set(0, true);
        b.set(9, true);
        b.set(IRIS_CODE_BITS - 1, true);
        let bytes = b.to_bytes();
        assert_eq!(bytes[0], 0x80);
        assert_eq!(bytes[1], 0x40);
        assert_eq!(bytes[IRIS_CODE_BYTES - 1], 0x01);
        assert_eq!(b.popcount(), 3);
        assert!(b.get(9) && !b.get(8));
        b.set(9, false);
        assert!(!b.get(9));
        assert_eq!(bit_index(1, 2, 1, 1), 800 + 8 + 3);
    }

    #[test]
    fn base64_round_trip_and_vectors_parse() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let b = random_bits(&mut rng);
        let text = b.to_base64();
        assert_eq!(text.len(), 2136);
        assert_eq!(IrisBits::from_base64(&text), Ok(b));
        assert_eq!(IrisBits::from_bytes(&b.to_bytes()), Ok(b));
        for line in read_vector("open_iris_random_codes.txt").lines().take(4) {
            let parsed = IrisBits::from_base64(line).expect("test vector parses");
            assert_eq!(parsed.to_base64(), line, "re-encoding is byte-identical");
        }
    }

    #[test]
    fn base64_errors_name_the_problem() {
        let text = IrisBits::ones().to_base64();
        // 1599 bytes encode to 2132 characters.
        let short = base64::engine::general_purpose::STANDARD.encode([0xFFu8; 1599]);
        let err = IrisBits::from_base64(&short).expect_err("short input");
        assert_eq!(
            err.to_string(),
            "iris code: expected 1600 bytes after base64 decoding, got 1599"
        );
        let mut spaced = text.clone();
        spaced.insert(100, ' ');
        let err = IrisBits::from_base64(&spaced).expect_err("whitespace");
        assert_eq!(
            err,
            IrisFormatError::Whitespace {
                what: "iris code",
                offset: 100
            }
        );
        assert!(err.to_string().contains("whitespace at byte offset 100"));
        let trailing = format!("{text}\n");
        assert!(matches!(
            IrisBits::from_base64(&trailing),
            Err(IrisFormatError::Whitespace { offset: 2136, .. })
        ));
        let mut bad = text.clone();
        bad.replace_range(10..11, "-");
        let err = IrisBits::from_base64(&bad).expect_err("url-safe char");
        assert!(
            err.to_string()
                .starts_with("iris code: invalid standard base64"),
            "{err}"
        );
        let unpadded = text.trim_end_matches('=');
        assert!(matches!(
            IrisBits::from_base64(unpadded),
            Err(IrisFormatError::Base64 { .. })
        ));
        assert!(matches!(
            IrisBits::from_bytes(&[0u8; 12]),
            Err(IrisFormatError::ByteLength { got: 12, .. })
        ));
        let err = IrisTemplate::from_base64(&text, &short).expect_err("bad mask");
        assert!(err.to_string().starts_with("iris mask:"), "{err}");
    }

    #[test]
    fn rotations_match_iris_mpc_vectors() {
        let data = read_vector("iris_mpc_all_rotations.txt");
        let mut lines = data.lines();
        let code = IrisBits::from_base64(lines.next().expect("line 1 is the code"))
            .expect("line 1 parses");
        let mut seen = Vec::new();
        for line in lines.filter(|l| !l.trim().is_empty()) {
            let (k, bits) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("rotation line without ':' : {line:.40}"));
            let k: i32 = k.trim().parse().expect("rotation amount is an integer");
            let bits: Vec<bool> = bits
                .chars()
                .filter(|c| !c.is_whitespace())
                .map(|c| match c {
                    '0' => false,
                    '1' => true,
                    other => panic!("unexpected character {other:?} in rotation {k}"),
                })
                .collect();
            assert_eq!(
                bits.len(),
                IRIS_CODE_BITS,
                "rotation {k} has a full bit string"
            );
            let rotated = code.rotate(k);
            for (i, &expected) in bits.iter().enumerate() {
                assert_eq!(rotated.get(i), expected, "rotation {k}, bit {i}");
            }
            seen.push(k);
        }
        assert_eq!(seen, (-MAX_ROTATION..=MAX_ROTATION).collect::<Vec<_>>());
        assert_eq!(seen.len(), NUM_ROTATIONS);
    }

    #[test]
    fn open_iris_distances() {
        let data = read_vector("open_iris_random_codes.txt");
        let lines: Vec<&str> = data.lines().collect();
        assert!(lines.len() >= 6, "open_iris_random_codes.txt has 6 lines");
        let a = IrisTemplate::from_base64(lines[0], lines[1]).expect("A parses");
        let b = IrisTemplate::from_base64(lines[2], lines[3]).expect("B parses");
        let fhd: f64 = lines[4].trim().parse().expect("line 5 is a number");
        let min_fhd: f64 = lines[5].trim().parse().expect("line 6 is a number");

        let d = fractional_hamming_distance(&a, &b).expect("non-empty mask");
        assert!((d - fhd).abs() < 1e-9, "{d} vs {fhd}");
        assert_eq!(fractional_hamming_distance(&b, &a), Some(d));

        let (m, k) = min_fhd_with_rotation(&a, &b, MAX_ROTATION).expect("non-empty mask");
        assert!((m - min_fhd).abs() < 1e-9, "{m} vs {min_fhd}");
        // Rotating the other side gives the same minimum at the opposite rotation.
        let (m2, k2) = min_fhd_with_rotation(&b, &a, MAX_ROTATION).expect("non-empty mask");
        assert!((m2 - min_fhd).abs() < 1e-9, "{m2} vs {min_fhd}");
        assert_eq!(k2, -k);
        assert_eq!(k, 9, "best rotation of A against B");
        assert_eq!(min_fhd_over_rotations(&a, &b, MAX_ROTATION), Some(m));
        assert!(a.is_mask_duplicated_along_last_axis());
        assert!(b.is_mask_duplicated_along_last_axis());
    }

    #[test]
    fn empty_common_mask_gives_none() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let a = IrisTemplate::new(random_bits(&mut rng), IrisBits::zeros());
        let b = IrisTemplate::new(random_bits(&mut rng), IrisBits::ones());
        assert_eq!(fractional_hamming_distance(&a, &b), None);
        assert_eq!(min_fhd_over_rotations(&a, &b, MAX_ROTATION), None);
        assert_eq!(masked_code_distance_counts(&a, &b), (0, 0));
        // Identical templates: distance 0 at rotation 0, whatever the clamp.
        assert_eq!(min_fhd_with_rotation(&b, &b, -4), Some((0.0, 0)));
        assert_eq!(min_fhd_with_rotation(&b, &b, i32::MAX), Some((0.0, 0)));
    }

    #[test]
    fn duplication_check_finds_the_position() {
        let mut m = IrisBits::ones();
        assert!(m.is_duplicated_along_last_axis());
        m.set(bit_index(5, 17, 1, 1), false);
        assert_eq!(m.first_real_imag_mismatch(), Some((5, 17, 1)));
        let mut m = IrisBits::zeros();
        m.set(bit_index(15, 199, 0, 0), true);
        assert_eq!(m.first_real_imag_mismatch(), Some((15, 199, 0)));
        m.set(bit_index(15, 199, 0, 1), true);
        assert!(m.is_duplicated_along_last_axis());
    }

    proptest! {
        #[test]
        fn rotate_matches_reference(b in bits_strategy(), k in -250i32..250) {
            prop_assert_eq!(b.rotate(k), reference_rotate(&b, k));
        }

        #[test]
        fn rotations_compose(b in bits_strategy(), j in -20i32..20, k in -20i32..20) {
            prop_assert_eq!(b.rotate(j).rotate(k), b.rotate(j + k));
            prop_assert_eq!(b.rotate(200), b);
        }

        #[test]
        fn counts_match_naive(seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let a = IrisTemplate::new(random_bits(&mut rng), random_bits(&mut rng));
            let b = IrisTemplate::new(random_bits(&mut rng), random_bits(&mut rng));
            let mut h = 0;
            let mut m = 0;
            for i in 0..IRIS_CODE_BITS {
                if a.mask.get(i) && b.mask.get(i) {
                    m += 1;
                    if a.code.get(i) != b.code.get(i) {
                        h += 1;
                    }
                }
            }
            prop_assert_eq!(masked_code_distance_counts(&a, &b), (h, m));
            prop_assert_eq!(((a.code ^ b.code) & a.mask & b.mask).popcount(), h);
            prop_assert_eq!((!(!a.mask | !b.mask)).popcount(), m);
        }

        #[test]
        fn duplication_check_matches_naive(b in bits_strategy()) {
            let naive = (0..IRIS_CODE_BITS / 2).all(|m| b.get(2 * m) == b.get(2 * m + 1));
            prop_assert_eq!(b.is_duplicated_along_last_axis(), naive);
            // Forcing duplication makes it pass.
            let mut d = b;
            for m in 0..IRIS_CODE_BITS / 2 {
                d.set(2 * m + 1, d.get(2 * m));
            }
            prop_assert!(d.is_duplicated_along_last_axis());
        }
    }
}
