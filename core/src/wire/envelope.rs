//! The envelope: how a batch of enrolment bundles travels from a client to a party, for every
//! modality. The bundles of a batch that go to one party are framed into one plaintext and
//! sealed to that party's pinned key once ([`crate::crypto::seal::seal_to_party`], with the
//! modality's purpose label), which keeps the public-key work off the per-record path. The
//! coordinator routes envelopes but can open none; a tampered, misdirected or truncated one is
//! refused whole.
//!
//! Envelope plaintext: magic `PMBL`, layout version (1 byte, 1), u32 number of bundles, then
//! per bundle a u32 length and the bundle (little-endian). An empty envelope is refused.
//!
//! Client → coordinator batch framing ([`encode_enroll_batch`]): magic `PMEB`, u32 record
//! count, then per record and party a u32 length and the sealed bundle.
//!
//! Subject ids ([`validate_subject`]) are 1..=[`MAX_SUBJECT_LEN`] bytes of UTF-8 without
//! control characters, in every modality.

use rand_core::{CryptoRng, RngCore};

use crate::crypto::seal::{seal_to_party, PartyPublicKey};
use crate::party::PartyIndex;

/// Longest accepted subject id, in bytes.
pub const MAX_SUBJECT_LEN: usize = 256;

/// A malformed envelope, batch framing or subject id. Never contains share values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The subject id is empty, too long, or contains control characters.
    #[error("invalid subject id: {0}")]
    BadSubject(String),
    /// The bytes do not follow the framing.
    #[error("malformed enrolment envelope: {0}")]
    Malformed(&'static str),
}

/// Checks a subject id: 1..=256 bytes of UTF-8 without control characters.
pub fn validate_subject(subject: &str) -> Result<(), EnvelopeError> {
    if subject.is_empty() {
        return Err(EnvelopeError::BadSubject("it is empty".into()));
    }
    if subject.len() > MAX_SUBJECT_LEN {
        return Err(EnvelopeError::BadSubject(format!(
            "it is {} bytes long; the limit is {MAX_SUBJECT_LEN}",
            subject.len()
        )));
    }
    if subject.chars().any(char::is_control) {
        return Err(EnvelopeError::BadSubject(
            "it contains control characters".into(),
        ));
    }
    Ok(())
}

/// Id of a record's three bundles (random, the same at every party).
pub type BundleId = [u8; 16];

/// The three sealed envelopes of a batch, indexed by party.
pub type SealedEnvelopes = [Vec<u8>; 3];

const ENVELOPE_MAGIC: &[u8; 4] = b"PMBL";
const ENVELOPE_VERSION: u8 = 1;

/// Builds the envelope plaintext from encoded bundles .
pub fn envelope_plaintext(bundles: &[Vec<u8>]) -> Vec<u8> {
    let size: usize = bundles.iter().map(|b| 4 + b.len()).sum();
    let mut out = Vec::with_capacity(9 + size);
    out.extend_from_slice(ENVELOPE_MAGIC);
    out.push(ENVELOPE_VERSION);
    out.extend_from_slice(&(bundles.len() as u32).to_le_bytes());
    for bundle in bundles {
        out.extend_from_slice(&(bundle.len() as u32).to_le_bytes());
        out.extend_from_slice(bundle);
    }
    out
}

/// Splits an envelope plaintext into its bundles .
pub fn envelope_bundles(plaintext: &[u8]) -> Result<Vec<&[u8]>, EnvelopeError> {
    let malformed = || EnvelopeError::Malformed("envelope framing is truncated or corrupt");
    if plaintext.len() < 9 || &plaintext[..4] != ENVELOPE_MAGIC || plaintext[4] != ENVELOPE_VERSION
    {
        return Err(malformed());
    }
    let count =
        u32::from_le_bytes([plaintext[5], plaintext[6], plaintext[7], plaintext[8]]) as usize;
    let mut rest = &plaintext[9..];
    let mut out = Vec::with_capacity(count.min(rest.len() / 4));
    for _ in 0..count {
        if rest.len() < 4 {
            return Err(malformed());
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if rest.len() < 4 + len {
            return Err(malformed());
        }
        out.push(&rest[4..4 + len]);
        rest = &rest[4 + len..];
    }
    if !rest.is_empty() || out.is_empty() {
        return Err(malformed());
    }
    Ok(out)
}

/// Client side: frames each party's encoded bundles into an envelope and seals it to that
/// party's pinned key under `purpose`; `per_party[p]` and `party_keys[p]` belong to party `p`
/// (the first `N` parties: three for iris, the evaluators P0 and P1 for faces; the pinned keys
/// of all three parties are passed).
pub fn seal_envelopes<const N: usize, R: RngCore + CryptoRng>(
    per_party: &[Vec<Vec<u8>>; N],
    party_keys: &[PartyPublicKey; 3],
    purpose: &str,
    rng: &mut R,
) -> [Vec<u8>; N] {
    const { assert!(N <= 3, "privmatch has three parties") };
    std::array::from_fn(|p| {
        seal_to_party(
            PartyIndex::ALL[p],
            &party_keys[p],
            purpose,
            &envelope_plaintext(&per_party[p]),
            rng,
        )
    })
}

const BATCH_MAGIC: &[u8; 4] = b"PMEB";

/// Frames the sealed bundles of a batch of records for transport from client to coordinator:
/// magic `PMEB`, u32 record count, then per record and party a u32 length and the sealed
/// bundle (little-endian). The coordinator only splits it by party; it cannot open anything.
pub fn encode_enroll_batch(records: &[[Vec<u8>; 3]]) -> Vec<u8> {
    let size: usize = records.iter().flatten().map(|b| 4 + b.len()).sum();
    let mut out = Vec::with_capacity(8 + size);
    out.extend_from_slice(BATCH_MAGIC);
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for bundle in records.iter().flatten() {
        out.extend_from_slice(&(bundle.len() as u32).to_le_bytes());
        out.extend_from_slice(bundle);
    }
    out
}

/// Splits a framed batch into the bundles for each party, in record order.
pub fn decode_enroll_batch(bytes: &[u8]) -> Result<[Vec<Vec<u8>>; 3], EnvelopeError> {
    let malformed = || EnvelopeError::Malformed("enrolment batch framing is truncated or corrupt");
    if bytes.len() < 8 || &bytes[..4] != BATCH_MAGIC {
        return Err(malformed());
    }
    let count = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    let mut per_party: [Vec<Vec<u8>>; 3] = Default::default();
    let mut rest = &bytes[8..];
    for _ in 0..count {
        for party in per_party.iter_mut() {
            if rest.len() < 4 {
                return Err(malformed());
            }
            let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            if rest.len() < 4 + len {
                return Err(malformed());
            }
            party.push(rest[4..4 + len].to_vec());
            rest = &rest[4 + len..];
        }
    }
    if !rest.is_empty() {
        return Err(malformed());
    }
    Ok(per_party)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_framing_is_checked() {
        let good = envelope_plaintext(&[vec![1, 2, 3], vec![4]]);
        assert_eq!(
            envelope_bundles(&good).expect("valid"),
            vec![&[1u8, 2, 3][..], &[4u8][..]]
        );
        assert!(envelope_bundles(&good[..good.len() - 1]).is_err());
        assert!(
            envelope_bundles(&envelope_plaintext(&[])).is_err(),
            "an empty envelope is refused"
        );
        let mut extra = good.clone();
        extra.push(9);
        assert!(envelope_bundles(&extra).is_err());
    }

    #[test]
    fn batch_framing_round_trips_and_rejects_truncation() {
        let records = vec![
            [vec![1u8, 2], vec![3], vec![]],
            [vec![4u8; 100], vec![5; 7], vec![6; 3]],
        ];
        let framed = encode_enroll_batch(&records);
        let parties = decode_enroll_batch(&framed).expect("decode");
        for (p, bundles) in parties.iter().enumerate() {
            assert_eq!(bundles.len(), 2);
            assert_eq!(bundles[1], records[1][p]);
        }
        assert!(decode_enroll_batch(&framed[..framed.len() - 1]).is_err());
        let mut extra = framed.clone();
        extra.push(0);
        assert!(decode_enroll_batch(&extra).is_err());
        assert!(decode_enroll_batch(b"PMEB").is_err());
    }

    #[test]
    fn subjects_are_validated() {
        assert!(validate_subject("").is_err());
        assert!(validate_subject("a\nb").is_err());
        assert!(validate_subject(&"x".repeat(257)).is_err());
        assert!(validate_subject("ok-subject ✓").is_ok());
    }
}
