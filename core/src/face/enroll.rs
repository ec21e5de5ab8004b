//! Face enrolment: one evaluator's share of one template with its metadata, sealed to P0 and
//! P1 in an envelope of bundles ([`crate::wire::envelope`] framing, purpose
//! [`FACE_ENROLL_PURPOSE`]), and the digest that binds a comparison to the templates compared.
//!
//! Bundle layout: `PMFE`, version 1, party (0/1), bundle id (16), subject length (u16) and
//! subject, then the [`EmbeddingShare`] (see [`super::encoding`]).

use rand_core::{CryptoRng, RngCore};

use super::encoding::{evaluator, share_embedding, EmbeddingShare, Reader, VERSION};
use super::quantize::check_dim;
use super::FaceError;
use crate::crypto::seal::{open_sealed_box, PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;
use crate::wire::envelope::{envelope_bundles, seal_envelopes, validate_subject, BundleId};

/// Sealing purpose of face enrollment envelopes.
pub const FACE_ENROLL_PURPOSE: &str = "face-enrol";

const ENROLL_MAGIC: &[u8; 4] = b"PMFE";

/// One evaluator's share of one enrolled face template, with its metadata.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FaceEnrollBundle {
    /// Random id shared by the two bundles of one record; parties record it to refuse replays.
    pub bundle_id: BundleId,
    /// The subject the template belongs to.
    pub subject: String,
    /// The evaluator this share belongs to (0 or 1).
    pub party: u8,
    /// The share.
    pub share: EmbeddingShare,
}

impl FaceEnrollBundle {
    fn encode(&self) -> Vec<u8> {
        let subject = self.subject.as_bytes();
        let mut out = Vec::with_capacity(24 + subject.len() + self.share.encoded_len());
        out.extend_from_slice(ENROLL_MAGIC);
        out.push(VERSION);
        out.push(self.party);
        out.extend_from_slice(&self.bundle_id);
        out.extend_from_slice(&(subject.len() as u16).to_le_bytes());
        out.extend_from_slice(subject);
        self.share.encode_into(&mut out);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, FaceError> {
        let mut r = Reader::new(bytes);
        r.magic(ENROLL_MAGIC)?;
        let party = r.u8()?;
        let bundle_id = r.array::<16>()?;
        let len = usize::from(r.u16()?);
        let subject = std::str::from_utf8(r.take(len)?)
            .map_err(|_| FaceError::Malformed("subject id is not UTF-8"))?
            .to_owned();
        validate_subject(&subject)?;
        let share = EmbeddingShare::decode(r.rest())?;
        Ok(FaceEnrollBundle {
            bundle_id,
            subject,
            party,
            share,
        })
    }
}

/// One face template to enrol, quantised, as the client holds it.
pub struct FaceEnrollRequest<'a> {
    /// Subject id (one face template per subject).
    pub subject: &'a str,
    /// The quantised embedding ([`super::quantize::Quantizer::quantize`]).
    pub embedding: &'a [i32],
}

/// Client side: shares every record and seals, for P0 and P1, one envelope with that party's
/// bundles. Returns the two sealed envelopes (P0's, P1's) and the bundle ids in record order.
pub fn seal_face_enrollment<R: RngCore + CryptoRng>(
    records: &[FaceEnrollRequest<'_>],
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<([Vec<u8>; 2], Vec<BundleId>), FaceError> {
    let mut per_party: [Vec<Vec<u8>>; 2] = Default::default();
    let mut ids = Vec::with_capacity(records.len());
    for record in records {
        validate_subject(record.subject)?;
        check_dim(record.embedding.len())?;
        let mut bundle_id = [0u8; 16];
        rng.fill_bytes(&mut bundle_id);
        for (party, share) in share_embedding(record.embedding, rng)
            .into_iter()
            .enumerate()
        {
            let bundle = FaceEnrollBundle {
                bundle_id,
                subject: record.subject.to_owned(),
                party: party as u8,
                share,
            };
            per_party[party].push(bundle.encode());
        }
        ids.push(bundle_id);
    }
    let sealed = seal_envelopes(&per_party, party_keys, FACE_ENROLL_PURPOSE, rng);
    Ok((sealed, ids))
}

/// Party side: opens a face enrolment envelope as evaluator `me`, checking that every share
/// inside is this party's.
pub fn open_face_enrollment(
    me: PartyIndex,
    secret: &PartySecretKey,
    sealed: &[u8],
) -> Result<Vec<FaceEnrollBundle>, FaceError> {
    let mine = evaluator(me)? as u8;
    let plaintext = open_sealed_box(me, secret, FACE_ENROLL_PURPOSE, sealed)?;
    envelope_bundles(&plaintext)?
        .into_iter()
        .map(|bytes| {
            let bundle = FaceEnrollBundle::decode(bytes)?;
            if bundle.party != mine {
                return Err(FaceError::PartyMismatch {
                    inside: bundle.party,
                    me: mine,
                });
            }
            Ok(bundle)
        })
        .collect()
}

/// SHA-256 over the compared templates, in comparison order: each subject (length-prefixed)
/// and the bundle id of its enrolment. P0 and P1 must compare the same templates in the same
/// order, and each template's two halves must come from the same enrolment (halves of two
/// different enrolments would add up to a random vector).
pub fn template_set_digest<S: AsRef<str>>(templates: &[(S, BundleId)]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(b"privmatch face template set v2");
    for (subject, bundle_id) in templates {
        let bytes = subject.as_ref().as_bytes();
        hash.update((bytes.len() as u32).to_le_bytes());
        hash.update(bytes);
        hash.update(bundle_id);
    }
    hash.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::face::encoding::reconstruct_embedding;
    use crate::face::encoding::test_support::{embedding, seeded_keys};

    #[test]
    fn enrollment_round_trips_and_refuses_the_wrong_party() {
        let (mut rng, secrets, publics) = seeded_keys(2);
        let q = embedding(&mut rng, 256);
        let records = [FaceEnrollRequest {
            subject: "alice",
            embedding: &q,
        }];
        let (sealed, ids) = seal_face_enrollment(&records, &publics, &mut rng).unwrap();
        let b0 = open_face_enrollment(PartyIndex::ALL[0], &secrets[0], &sealed[0]).unwrap();
        let b1 = open_face_enrollment(PartyIndex::ALL[1], &secrets[1], &sealed[1]).unwrap();
        assert_eq!(b0[0].bundle_id, ids[0]);
        assert_eq!(b0[0].subject, "alice");
        assert_eq!(reconstruct_embedding(&b0[0].share, &b1[0].share).0, q);
        assert!(open_face_enrollment(PartyIndex::ALL[1], &secrets[1], &sealed[0]).is_err());
        assert!(open_face_enrollment(PartyIndex::ALL[2], &secrets[2], &sealed[0]).is_err());
        let mut tampered = sealed[0].clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(open_face_enrollment(PartyIndex::ALL[0], &secrets[0], &tampered).is_err());
    }
}
