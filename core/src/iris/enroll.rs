//! Iris enrolment bundles: what a client sends each party to enrol templates.
//!
//! A bundle is one party's Shamir share of one template (code and mask, see
//! [`crate::iris::encoding`]) with the record's metadata, in a fixed binary layout. The
//! bundles of a batch of records that go to one party travel in one **envelope**: their list,
//! sealed to that party ([`crate::crypto::seal::seal_to_party`], purpose [`IRIS_ENROLL_PURPOSE`]). One
//! envelope per party per batch keeps the public-key work (two X25519 operations) off the
//! per-record path. The coordinator routes the three envelopes of a batch but can open none
//! of them; a tampered, misdirected or truncated envelope is refused whole.
//!
//! The envelope framing is [`crate::wire::envelope`]'s.
//!
//! Bundle layout (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `PMIE` |
//! | 4 | 1 | layout version (1) |
//! | 5 | 1 | party index the share belongs to |
//! | 6 | 16 | bundle id: random, the same in the three bundles of one record; parties record it to refuse replays |
//! | 22 | 1 | eye: 0 left, 1 right |
//! | 23 | 2 | subject length n (1..=[`MAX_SUBJECT_LEN`](crate::wire::envelope::MAX_SUBJECT_LEN)) |
//! | 25 | n | subject id, UTF-8 |
//! | 25+n | 2·12,800 | code share coefficients (u16) |
//! | … | 2·6,400 | mask share coefficients (u16) |

use rand_chacha::ChaCha20Rng;
use rand_core::{CryptoRng, RngCore, SeedableRng};
use rayon::prelude::*;
use zeroize::Zeroizing;

use crate::crypto::seal::{open_sealed_box, PartyPublicKey, PartySecretKey, SealError};
use crate::iris::encoding::{
    share_template, EncodingError, IrisShare, CODE_SHARE_COEFS, MASK_SHARE_COEFS,
};
use crate::iris::template::IrisTemplate;
use crate::parallel::{on_threads, worth_a_pool};
use crate::party::PartyIndex;
use crate::wire::envelope::{
    envelope_bundles, seal_envelopes, validate_subject, BundleId, EnvelopeError, SealedEnvelopes,
};
use crate::wire::storage::{coefs_from_le_bytes, push_coefs_le};

/// The sealing purpose label of iris enrolment bundles.
pub const IRIS_ENROLL_PURPOSE: &str = "iris-enrol";

const MAGIC: &[u8; 4] = b"PMIE";
const VERSION: u8 = 1;
const FIXED_HEADER_LEN: usize = 4 + 1 + 1 + 16 + 1 + 2;

/// Which eye a template belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Eye {
    /// The left eye (the default when input does not say).
    Left,
    /// The right eye.
    Right,
}

impl Eye {
    /// Parses `"left"` or `"right"` (exactly, lower case).
    pub fn parse(text: &str) -> Result<Self, BundleError> {
        match text {
            "left" => Ok(Eye::Left),
            "right" => Ok(Eye::Right),
            other => Err(BundleError::BadEye(other.chars().take(32).collect())),
        }
    }

    /// `"left"` or `"right"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Eye::Left => "left",
            Eye::Right => "right",
        }
    }

    /// The eye as stored in binary layouts: 0 left, 1 right.
    pub fn to_byte(self) -> u8 {
        match self {
            Eye::Left => 0,
            Eye::Right => 1,
        }
    }

    /// Parses the byte written by `to_byte`.
    pub fn from_byte(byte: u8) -> Result<Self, BundleError> {
        match byte {
            0 => Ok(Eye::Left),
            1 => Ok(Eye::Right),
            _ => Err(BundleError::Malformed("eye byte is neither 0 nor 1")),
        }
    }
}

/// Errors building, sealing or opening an enrolment bundle. Never contains share values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// The envelope framing or a subject id is malformed.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The eye is not "left" or "right".
    #[error("invalid eye {0:?}: expected \"left\" or \"right\"")]
    BadEye(String),
    /// The opened bytes do not follow the bundle layout.
    #[error("malformed iris enrolment bundle: {0}")]
    Malformed(&'static str),
    /// The bundle opened, but carries another party's share.
    #[error("iris enrolment bundle carries the share of {inside}, but was opened by {me}")]
    PartyMismatch {
        /// The party index written inside the bundle.
        inside: PartyIndex,
        /// The party that opened it.
        me: PartyIndex,
    },
    /// A search probe of a layout this party no longer opens (version 2 and older carry no
    /// reply key: their outputs would go to the coordinator in the clear).
    #[error("iris probe layout version {0} is not supported: this party opens version 3 (with the client's reply key, privmatch 0.12.0); seal the probe again with a current client")]
    UnsupportedProbeVersion(u8),
    /// Sealing or opening failed.
    #[error(transparent)]
    Seal(#[from] SealError),
    /// The template could not be encoded.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
}

impl BundleError {
    /// Whether the bundle or probe was meant for another party or sealed to another key (see
    /// [`SealError::is_for_another_party`]): it opened elsewhere, or not at all here, without
    /// being altered.
    pub fn is_for_another_party(&self) -> bool {
        match self {
            BundleError::Seal(e) => e.is_for_another_party(),
            BundleError::PartyMismatch { .. } => true,
            _ => false,
        }
    }
}

/// One party's share of one enrolled template, with its metadata.
#[derive(Clone, PartialEq, Eq)]
pub struct IrisEnrollBundle {
    /// Random id shared by the three bundles of one record; used to refuse replays.
    pub bundle_id: [u8; 16],
    /// The subject the template belongs to.
    pub subject: String,
    /// Which eye.
    pub eye: Eye,
    /// The party's share (code 12,800 and mask 6,400 coefficients).
    pub share: IrisShare,
}

impl std::fmt::Debug for IrisEnrollBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IrisEnrolBundle {{ id: {}, subject: {:?}, eye: {}, party: {}, share: <redacted> }}",
            hex::encode(self.bundle_id),
            self.subject,
            self.eye.as_str(),
            self.share.party
        )
    }
}

impl IrisEnrollBundle {
    /// Serialises the bundle in the documented layout.
    pub fn encode(&self) -> Vec<u8> {
        let subject = self.subject.as_bytes();
        let mut out = Vec::with_capacity(
            FIXED_HEADER_LEN + subject.len() + 2 * (CODE_SHARE_COEFS + MASK_SHARE_COEFS),
        );
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.share.party.as_u8());
        out.extend_from_slice(&self.bundle_id);
        out.push(self.eye.to_byte());
        out.extend_from_slice(&(subject.len() as u16).to_le_bytes());
        out.extend_from_slice(subject);
        push_coefs_le(&mut out, &self.share.code);
        push_coefs_le(&mut out, &self.share.mask);
        out
    }

    /// Parses and validates a serialised bundle.
    pub fn decode(bytes: &[u8]) -> Result<Self, BundleError> {
        if bytes.len() < FIXED_HEADER_LEN || &bytes[..4] != MAGIC {
            return Err(BundleError::Malformed("bad magic or truncated header"));
        }
        if bytes[4] != VERSION {
            return Err(BundleError::Malformed("unsupported layout version"));
        }
        let party = PartyIndex::new(i64::from(bytes[5]))
            .map_err(|_| BundleError::Malformed("party index out of range"))?;
        let mut bundle_id = [0u8; 16];
        bundle_id.copy_from_slice(&bytes[6..22]);
        let eye = Eye::from_byte(bytes[22])?;
        let subject_len = usize::from(u16::from_le_bytes([bytes[23], bytes[24]]));
        let expected = FIXED_HEADER_LEN + subject_len + 2 * (CODE_SHARE_COEFS + MASK_SHARE_COEFS);
        if bytes.len() != expected {
            return Err(BundleError::Malformed("length does not match the layout"));
        }
        let subject_end = FIXED_HEADER_LEN + subject_len;
        let subject = std::str::from_utf8(&bytes[FIXED_HEADER_LEN..subject_end])
            .map_err(|_| BundleError::Malformed("subject id is not UTF-8"))?
            .to_owned();
        validate_subject(&subject)?;
        let code_end = subject_end + 2 * CODE_SHARE_COEFS;
        Ok(IrisEnrollBundle {
            bundle_id,
            subject,
            eye,
            share: IrisShare {
                party,
                code: coefs_from_le_bytes(&bytes[subject_end..code_end]),
                mask: coefs_from_le_bytes(&bytes[code_end..]),
            },
        })
    }
}

/// One template to enrol, as the client holds it.
pub struct EnrollRequest<'a> {
    /// The plaintext template (it never leaves the client unshared).
    pub template: &'a IrisTemplate,
    /// Subject id.
    pub subject: &'a str,
    /// Which eye.
    pub eye: Eye,
}

/// Client side: splits every template of the batch into three Shamir shares and seals, per
/// party, one envelope with that party's bundles to its pinned key. Returns the three sealed
/// envelopes (indexed by party) and the bundle ids, in record order. Runs on the caller's
/// thread; [`seal_iris_enrollment_batch_on`] spreads the sharing over a pool.
pub fn seal_iris_enrollment_batch<R: RngCore + CryptoRng>(
    records: &[EnrollRequest<'_>],
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<(SealedEnvelopes, Vec<BundleId>), BundleError> {
    seal_iris_enrollment_batch_on(records, party_keys, 1, rng)
}

/// Fewest records worth a pool thread: sharing one template takes tens of microseconds, so
/// smaller pieces would cost more in hand-offs than they save.
const MIN_SHARING_PIECE: usize = 16;

/// What the sharing of one record needs from the caller's generator, drawn up front in record
/// order so that the envelopes do not depend on the thread count: its bundle id and the seed
/// of the generator its shares are drawn from (with one share it would reveal the template;
/// this copy is wiped when dropped, the generator's state is not — no more than the plaintext
/// template the caller holds).
struct RecordDraw {
    bundle_id: BundleId,
    seed: Zeroizing<[u8; 32]>,
}

/// [`seal_iris_enrollment_batch`] with the records' sharing spread over a pool of `threads`
/// threads ([`crate::parallel`]); the sealing of the three envelopes stays on the caller's
/// thread. For a given generator state the result is the same for every `threads`.
pub fn seal_iris_enrollment_batch_on<R: RngCore + CryptoRng>(
    records: &[EnrollRequest<'_>],
    party_keys: &[PartyPublicKey; 3],
    threads: usize,
    rng: &mut R,
) -> Result<(SealedEnvelopes, Vec<BundleId>), BundleError> {
    let draws: Vec<RecordDraw> = records
        .iter()
        .map(|_| {
            let mut draw = RecordDraw {
                bundle_id: [0u8; 16],
                seed: Zeroizing::new([0u8; 32]),
            };
            rng.fill_bytes(&mut draw.bundle_id);
            rng.fill_bytes(draw.seed.as_mut());
            draw
        })
        .collect();
    let sequential = || -> Vec<Result<[Vec<u8>; 3], BundleError>> {
        records
            .iter()
            .zip(&draws)
            .map(|(record, draw)| share_record(record, draw))
            .collect()
    };
    let bundles = if worth_a_pool(records.len(), MIN_SHARING_PIECE, threads) {
        // A pool that cannot start (or a panic, which the caller's thread then meets again)
        // falls back to the caller's thread: the result is the same.
        on_threads(threads, || {
            records
                .par_iter()
                .zip(&draws)
                .map(|(record, draw)| share_record(record, draw))
                .collect()
        })
        .unwrap_or_else(|_| sequential())
    } else {
        sequential()
    };
    let mut per_party: [Vec<Vec<u8>>; 3] = Default::default();
    for record in bundles {
        for (party, bundle) in record?.into_iter().enumerate() {
            per_party[party].push(bundle);
        }
    }
    let sealed = seal_envelopes(&per_party, party_keys, IRIS_ENROLL_PURPOSE, rng);
    Ok((sealed, draws.iter().map(|d| d.bundle_id).collect()))
}

/// One record's three encoded bundles, indexed by party: its template shared with a
/// generator seeded from `draw`.
fn share_record(
    record: &EnrollRequest<'_>,
    draw: &RecordDraw,
) -> Result<[Vec<u8>; 3], BundleError> {
    validate_subject(record.subject)?;
    let mut rng = ChaCha20Rng::from_seed(*draw.seed);
    let mut out: [Vec<u8>; 3] = Default::default();
    for share in share_template(record.template, &mut rng)? {
        let party = share.party.as_usize();
        out[party] = IrisEnrollBundle {
            bundle_id: draw.bundle_id,
            subject: record.subject.to_owned(),
            eye: record.eye,
            share,
        }
        .encode();
    }
    Ok(out)
}

/// Client side, one record: as [`seal_iris_enrollment_batch`] with a batch of one. Returns the
/// three sealed envelopes and the bundle id.
pub fn seal_iris_enrollment<R: RngCore + CryptoRng>(
    template: &IrisTemplate,
    subject: &str,
    eye: Eye,
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<(SealedEnvelopes, BundleId), BundleError> {
    let request = EnrollRequest {
        template,
        subject,
        eye,
    };
    let (sealed, ids) = seal_iris_enrollment_batch(&[request], party_keys, rng)?;
    Ok((sealed, ids[0]))
}

/// Party side: opens a sealed envelope as party `me` and returns its bundles, checking that
/// every share inside is this party's.
pub fn open_iris_enrollment(
    me: PartyIndex,
    secret: &PartySecretKey,
    sealed: &[u8],
) -> Result<Vec<IrisEnrollBundle>, BundleError> {
    let plaintext = open_sealed_box(me, secret, IRIS_ENROLL_PURPOSE, sealed)?;
    envelope_bundles(&plaintext)?
        .into_iter()
        .map(|bytes| {
            let bundle = IrisEnrollBundle::decode(bytes)?;
            if bundle.share.party != me {
                return Err(BundleError::PartyMismatch {
                    inside: bundle.share.party,
                    me,
                });
            }
            Ok(bundle)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::encoding::reconstruct_template;
    use crate::iris::synth::random_template;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn setup() -> (ChaCha20Rng, Vec<PartySecretKey>, [PartyPublicKey; 3]) {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let secrets: Vec<PartySecretKey> =
            (0..3).map(|_| PartySecretKey::generate(&mut rng)).collect();
        let publics = [
            secrets[0].public_key(),
            secrets[1].public_key(),
            secrets[2].public_key(),
        ];
        (rng, secrets, publics)
    }

    /// `n` random templates and their subjects `s0`, `s1`, ….
    fn records(n: usize, rng: &mut ChaCha20Rng) -> (Vec<IrisTemplate>, Vec<String>) {
        let templates = (0..n).map(|_| random_template(rng)).collect();
        (templates, (0..n).map(|i| format!("s{i}")).collect())
    }

    fn requests<'a>(
        templates: &'a [IrisTemplate],
        subjects: &'a [String],
        eye: Eye,
    ) -> Vec<EnrollRequest<'a>> {
        templates
            .iter()
            .zip(subjects)
            .map(|(template, subject)| EnrollRequest {
                template,
                subject,
                eye,
            })
            .collect()
    }

    #[test]
    fn sealed_bundles_open_and_reconstruct() {
        let (mut rng, secrets, publics) = setup();
        let template = random_template(&mut rng);
        let (sealed, id) =
            seal_iris_enrollment(&template, "subject-1", Eye::Right, &publics, &mut rng)
                .expect("seal");
        let opened: Vec<IrisEnrollBundle> = PartyIndex::ALL
            .iter()
            .flat_map(|&p| {
                open_iris_enrollment(p, &secrets[p.as_usize()], &sealed[p.as_usize()])
                    .expect("open")
            })
            .collect();
        for b in &opened {
            assert_eq!(b.bundle_id, id);
            assert_eq!(b.subject, "subject-1");
            assert_eq!(b.eye, Eye::Right);
        }
        let shares: Vec<IrisShare> = opened.into_iter().map(|b| b.share).collect();
        assert!(reconstruct_template(&shares).expect("reconstruct") == template.with_masked_code());
    }

    #[test]
    fn batch_envelopes_carry_every_record_in_order() {
        let (mut rng, secrets, publics) = setup();
        let (templates, subjects) = records(5, &mut rng);
        let requests = requests(&templates, &subjects, Eye::Left);
        let (sealed, ids) =
            seal_iris_enrollment_batch(&requests, &publics, &mut rng).expect("seal");
        let opened: Vec<Vec<IrisEnrollBundle>> = PartyIndex::ALL
            .iter()
            .map(|&p| {
                open_iris_enrollment(p, &secrets[p.as_usize()], &sealed[p.as_usize()])
                    .expect("open")
            })
            .collect();
        for (r, template) in templates.iter().enumerate() {
            let shares: Vec<IrisShare> = opened
                .iter()
                .map(|bundles| bundles[r].share.clone())
                .collect();
            assert_eq!(opened[0][r].bundle_id, ids[r]);
            assert_eq!(opened[2][r].subject, subjects[r]);
            assert!(
                reconstruct_template(&shares).expect("reconstruct") == template.with_masked_code()
            );
        }
        let mut truncated = sealed[0].clone();
        truncated.truncate(truncated.len() - 100);
        assert!(open_iris_enrollment(PartyIndex::ALL[0], &secrets[0], &truncated).is_err());
    }

    #[test]
    fn a_batch_shared_on_a_pool_is_the_one_shared_on_the_callers_thread() {
        let (mut rng, secrets, publics) = setup();
        let (templates, subjects) = records(70, &mut rng);
        let requests = requests(&templates, &subjects, Eye::Right);
        let seal_on = |threads: usize| {
            let mut rng = ChaCha20Rng::seed_from_u64(5);
            seal_iris_enrollment_batch_on(&requests, &publics, threads, &mut rng).expect("seal")
        };
        let (sequential, ids) = seal_on(1);
        // 70 records make four pieces of 16 or more: the pool is used at 3 threads.
        assert!(worth_a_pool(requests.len(), MIN_SHARING_PIECE, 3));
        for threads in [2, 3] {
            let (pooled, pooled_ids) = seal_on(threads);
            assert_eq!(pooled_ids, ids, "{threads} threads");
            assert!(pooled == sequential, "{threads} threads");
        }
        let last = open_iris_enrollment(PartyIndex::ALL[2], &secrets[2], &sequential[2])
            .expect("open")
            .pop()
            .expect("70 bundles");
        assert_eq!((last.subject.as_str(), last.bundle_id), ("s69", ids[69]));
    }

    #[test]
    fn a_bad_subject_anywhere_in_a_pooled_batch_refuses_the_batch() {
        let (mut rng, _, publics) = setup();
        let (templates, mut subjects) = records(40, &mut rng);
        subjects[33].clear();
        let requests = requests(&templates, &subjects, Eye::Left);
        assert!(seal_iris_enrollment_batch_on(&requests, &publics, 2, &mut rng).is_err());
    }

    #[test]
    fn misdirected_bundle_is_refused() {
        let (mut rng, secrets, publics) = setup();
        let template = random_template(&mut rng);
        let (sealed, _) =
            seal_iris_enrollment(&template, "s", Eye::Left, &publics, &mut rng).expect("seal");
        let err = open_iris_enrollment(PartyIndex::ALL[0], &secrets[0], &sealed[1]);
        assert!(matches!(
            err,
            Err(BundleError::Seal(SealError::WrongRecipient { .. }))
        ));
    }

    #[test]
    fn decode_rejects_malformed() {
        let (mut rng, _, _) = setup();
        let template = random_template(&mut rng);
        let share = share_template(&template, &mut rng).expect("share")[0].clone();
        let bundle = IrisEnrollBundle {
            bundle_id: [3; 16],
            subject: "abc".into(),
            eye: Eye::Left,
            share,
        };
        let good = bundle.encode();
        assert!(IrisEnrollBundle::decode(&good).expect("decode") == bundle);
        assert!(IrisEnrollBundle::decode(&good[..good.len() - 1]).is_err());
        let mut bad_eye = good.clone();
        bad_eye[22] = 7;
        assert!(IrisEnrollBundle::decode(&bad_eye).is_err());
        let mut bad_version = good.clone();
        bad_version[4] = 2;
        assert!(IrisEnrollBundle::decode(&bad_version).is_err());
        let mut bad_party = good;
        bad_party[5] = 3;
        assert!(IrisEnrollBundle::decode(&bad_party).is_err());
    }

    #[test]
    fn eyes_parse_exactly() {
        assert_eq!(Eye::parse("left"), Ok(Eye::Left));
        assert!(Eye::parse("Left").is_err());
    }
}
