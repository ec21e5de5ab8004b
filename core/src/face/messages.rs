//! What travels for the face modality, and its byte layouts: the client's additive sharing of
//! a quantised embedding, enrolment bundles and search probes sealed to P0 and P1, the
//! dealer's configuration sealed to P2, and the dealer's key batches sealed to P0 and P1.
//! All integers are little-endian; every decoder checks magic, version, party and exact
//! length, so a truncated or misrouted message is an error, never a panic.
//!
//! Enrolment bundle (in an envelope of bundles, [`crate::iris::enroll`] framing, purpose
//! [`FACE_ENROLL_PURPOSE`]): `PMFE`, version 1, party (0/1), bundle id (16), subject length
//! (u16) and subject, then the [`EmbeddingShare`] (dimension u16, norm share u32, l element
//! shares u32).
//!
//! Probe (purpose [`FACE_PROBE_PURPOSE`]): `PMFP`, version 1, party, session id (16), target
//! length (u16) and target (the subject of a 1:1 verification, UTF-8; empty for a 1:N
//! identification), then the [`EmbeddingShare`]. The target is sealed with the probe, so a
//! probe given for a verification cannot be run as an identification (which would reveal who
//! the person is) or against another subject.
//!
//! Dealer configuration (to P2, purpose [`FACE_CONFIG_PURPOSE`]): `PMFC`, version 1, metric
//! (1 cosine, 2 euclidean), dimension (u16), threshold (f64). Sealed so that the coordinator
//! never sees θ.
//!
//! Key batch (P2 to P_b): `PMFK`, version 1, party, batch number (u64), generation (u64: the
//! dealer configuration it was made under), metric, dimension (u16), key count (u32), key
//! length (u32), then the keys ([`super::funshade`] layout). It travels as a message of the
//! pairwise channel between P2 and P_b ([`crate::crypto::seal::Channel`], session id derived from the
//! batch number), so it is encrypted *and authenticated as coming from P2*: a coordinator
//! cannot forge keys (it would know r_in and could open z) nor a newer generation.

use rand_core::{CryptoRng, RngCore};

use super::quantize::check_dim;
use super::{FaceError, Metric};
use crate::crypto::seal::{
    open_sealed_box, seal_to_party, PairwiseSecrets, PartyPublicKey, PartySecretKey,
};
use crate::party::PartyIndex;
use crate::wire::envelope::{envelope_bundles, envelope_plaintext, validate_subject, BundleId};
use crate::wire::session::SESSION_ID_LEN;

/// Sealing purpose of face enrolment envelopes.
pub const FACE_ENROLL_PURPOSE: &str = "face-enrol";
/// Sealing purpose of face search probes.
pub const FACE_PROBE_PURPOSE: &str = "face-probe";
/// Sealing purpose of the dealer configuration.
pub const FACE_CONFIG_PURPOSE: &str = "face-dealer-config";

/// One evaluator's additive share of a quantised embedding and of its squared norm.
#[derive(Clone, PartialEq, Eq)]
pub struct EmbeddingShare {
    /// Share of each element q_i (as u32 in Z_2^32).
    pub elements: Vec<u32>,
    /// Share of ‖q‖².
    pub norm: u32,
}

impl std::fmt::Debug for EmbeddingShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EmbeddingShare {{ dim: {}, <redacted> }}",
            self.elements.len()
        )
    }
}

impl EmbeddingShare {
    fn encoded_len(&self) -> usize {
        2 + 4 + 4 * self.elements.len()
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.elements.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.norm.to_le_bytes());
        out.extend(self.elements.iter().flat_map(|w| w.to_le_bytes()));
    }

    fn decode(bytes: &[u8]) -> Result<Self, FaceError> {
        let mut r = Reader::new(bytes);
        let dim = usize::from(r.u16()?);
        check_dim(dim)?;
        let norm = r.u32()?;
        let elements = r.words(dim)?;
        r.finish()?;
        Ok(EmbeddingShare { elements, norm })
    }
}

/// Splits a quantised embedding into the two evaluators' additive shares (P0's uniformly
/// random, P1's the difference), with shares of its squared norm.
pub fn share_embedding<R: RngCore + CryptoRng>(q: &[i32], rng: &mut R) -> [EmbeddingShare; 2] {
    let norm = q.iter().fold(0u32, |acc, &v| {
        acc.wrapping_add((v as u32).wrapping_mul(v as u32))
    });
    let first: Vec<u32> = q.iter().map(|_| rng.next_u32()).collect();
    let second = q
        .iter()
        .zip(&first)
        .map(|(&v, &s)| (v as u32).wrapping_sub(s))
        .collect();
    let norm_first = rng.next_u32();
    [
        EmbeddingShare {
            elements: first,
            norm: norm_first,
        },
        EmbeddingShare {
            elements: second,
            norm: norm.wrapping_sub(norm_first),
        },
    ]
}

/// Adds two shares back together (tests and the plaintext reference only).
pub fn reconstruct_embedding(a: &EmbeddingShare, b: &EmbeddingShare) -> (Vec<i32>, u32) {
    let q = a
        .elements
        .iter()
        .zip(&b.elements)
        .map(|(x, y)| x.wrapping_add(*y) as i32)
        .collect();
    (q, a.norm.wrapping_add(b.norm))
}

/// The evaluator index of a party: P0 → 0, P1 → 1; P2 holds no face shares.
pub fn evaluator(party: PartyIndex) -> Result<usize, FaceError> {
    match party.as_usize() {
        i @ (0 | 1) => Ok(i),
        other => Err(FaceError::NotAnEvaluator(other as u8)),
    }
}

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

const ENROLL_MAGIC: &[u8; 4] = b"PMFE";
const PROBE_MAGIC: &[u8; 4] = b"PMFP";
const CONFIG_MAGIC: &[u8; 4] = b"PMFC";
const KEYS_MAGIC: &[u8; 4] = b"PMFK";
const VERSION: u8 = 1;

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
    let sealed = std::array::from_fn(|p| {
        seal_to_party(
            PartyIndex::ALL[p],
            &party_keys[p],
            FACE_ENROLL_PURPOSE,
            &envelope_plaintext(&per_party[p]),
            rng,
        )
    });
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

/// Client side: shares a quantised probe and seals the two shares to P0 and P1 for search
/// session `session` (so a coordinator cannot replay it into another session) and its
/// target: `Some(subject)` for a 1:1 verification, `None` for a 1:N identification.
pub fn seal_face_probe<R: RngCore + CryptoRng>(
    embedding: &[i32],
    session: [u8; SESSION_ID_LEN],
    target: Option<&str>,
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<[Vec<u8>; 2], FaceError> {
    check_dim(embedding.len())?;
    if let Some(subject) = target {
        validate_subject(subject)?;
    }
    let target = target.unwrap_or_default().as_bytes();
    let shares = share_embedding(embedding, rng);
    Ok(std::array::from_fn(|p| {
        let mut plain = Vec::with_capacity(24 + target.len() + shares[p].encoded_len());
        plain.extend_from_slice(PROBE_MAGIC);
        plain.push(VERSION);
        plain.push(p as u8);
        plain.extend_from_slice(&session);
        plain.extend_from_slice(&(target.len() as u16).to_le_bytes());
        plain.extend_from_slice(target);
        shares[p].encode_into(&mut plain);
        seal_to_party(
            PartyIndex::ALL[p],
            &party_keys[p],
            FACE_PROBE_PURPOSE,
            &plain,
            rng,
        )
    }))
}

/// Party side: opens a sealed probe as evaluator `me` for session `session` and checks that
/// it was sealed for `target` (the verified subject, or `None` for an identification).
pub fn open_face_probe(
    me: PartyIndex,
    secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    target: Option<&str>,
    sealed: &[u8],
) -> Result<EmbeddingShare, FaceError> {
    let mine = evaluator(me)? as u8;
    let plain = open_sealed_box(me, secret, FACE_PROBE_PURPOSE, sealed)?;
    let mut r = Reader::new(&plain);
    r.magic(PROBE_MAGIC)?;
    let party = r.u8()?;
    if party != mine {
        return Err(FaceError::PartyMismatch {
            inside: party,
            me: mine,
        });
    }
    if &r.array::<SESSION_ID_LEN>()? != session {
        return Err(FaceError::WrongSession);
    }
    let len = usize::from(r.u16()?);
    if r.take(len)? != target.unwrap_or_default().as_bytes() {
        return Err(FaceError::WrongTarget);
    }
    EmbeddingShare::decode(r.rest())
}

/// The dealer's configuration: metric, dimension and the (secret) threshold in float units.
#[derive(Clone, Copy, PartialEq)]
pub struct DealerConfig {
    /// The metric.
    pub metric: Metric,
    /// The embedding dimension keys are made for.
    pub dim: usize,
    /// θ in the metric's float units (see [`super::quantize::Quantizer::quantize_threshold`]).
    pub threshold: f64,
}

impl std::fmt::Debug for DealerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DealerConfig {{ metric: {}, dim: {}, threshold: <secret> }}",
            self.metric, self.dim
        )
    }
}

/// Operator side: validates a dealer configuration and seals it to P2.
pub fn seal_dealer_config<R: RngCore + CryptoRng>(
    config: &DealerConfig,
    p2_key: &PartyPublicKey,
    rng: &mut R,
) -> Result<Vec<u8>, FaceError> {
    super::quantize::Quantizer::new(config.dim)?
        .quantize_threshold(config.metric, config.threshold)?;
    let mut plain = Vec::with_capacity(16);
    plain.extend_from_slice(CONFIG_MAGIC);
    plain.push(VERSION);
    plain.push(config.metric.to_byte());
    plain.extend_from_slice(&(config.dim as u16).to_le_bytes());
    plain.extend_from_slice(&config.threshold.to_le_bytes());
    Ok(seal_to_party(
        PartyIndex::ALL[2],
        p2_key,
        FACE_CONFIG_PURPOSE,
        &plain,
        rng,
    ))
}

/// Dealer side: opens and validates a sealed configuration.
pub fn open_dealer_config(
    me: PartyIndex,
    secret: &PartySecretKey,
    sealed: &[u8],
) -> Result<DealerConfig, FaceError> {
    let plain = open_sealed_box(me, secret, FACE_CONFIG_PURPOSE, sealed)?;
    let mut r = Reader::new(&plain);
    r.magic(CONFIG_MAGIC)?;
    let metric = Metric::from_byte(r.u8()?)?;
    let dim = usize::from(r.u16()?);
    let threshold = f64::from_le_bytes(r.array::<8>()?);
    r.finish()?;
    let config = DealerConfig {
        metric,
        dim,
        threshold,
    };
    super::quantize::Quantizer::new(dim)?.quantize_threshold(metric, threshold)?;
    Ok(config)
}

/// The public header of a key batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyBatchHeader {
    /// The evaluator the keys belong to (0 or 1).
    pub party: u8,
    /// The dealer's batch number: unique, the same in both halves of a batch.
    pub batch: u64,
    /// The dealer configuration generation the keys were made under.
    pub generation: u64,
    /// The metric the keys evaluate.
    pub metric: Metric,
    /// The embedding dimension the keys are made for.
    pub dim: usize,
    /// Number of keys.
    pub count: usize,
    /// Bytes per key.
    pub key_len: usize,
}

const KEY_BATCH_HEADER_LEN: usize = 4 + 1 + 1 + 8 + 8 + 1 + 2 + 4 + 4;

/// The session id of the P2–P_b channel message that carries key batch `batch`.
fn key_batch_channel(batch: u64) -> [u8; SESSION_ID_LEN] {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"privmatch face key batch v1")
        .chain_update(batch.to_le_bytes())
        .finalize();
    let mut out = [0u8; SESSION_ID_LEN];
    out.copy_from_slice(&digest[..SESSION_ID_LEN]);
    out
}

/// Dealer side: seals one evaluator's half of a key batch (`keys`: `count` keys of
/// `key_len` bytes, contiguous) for that evaluator, authenticated as P2's: `to_evaluator` are
/// the pairwise secrets of P2 (this party) with P_b.
pub fn seal_key_batch<R: RngCore + CryptoRng>(
    header: &KeyBatchHeader,
    keys: &[u8],
    to_evaluator: &PairwiseSecrets,
    rng: &mut R,
) -> Vec<u8> {
    let mut plain = Vec::with_capacity(KEY_BATCH_HEADER_LEN + keys.len());
    plain.extend_from_slice(KEYS_MAGIC);
    plain.push(VERSION);
    plain.push(header.party);
    plain.extend_from_slice(&header.batch.to_le_bytes());
    plain.extend_from_slice(&header.generation.to_le_bytes());
    plain.push(header.metric.to_byte());
    plain.extend_from_slice(&(header.dim as u16).to_le_bytes());
    plain.extend_from_slice(&(header.count as u32).to_le_bytes());
    plain.extend_from_slice(&(header.key_len as u32).to_le_bytes());
    plain.extend_from_slice(keys);
    to_evaluator
        .channel(key_batch_channel(header.batch))
        .seal(0, &plain, rng)
}

/// The session id a channel message names in its (authenticated) header: magic `PMCH`,
/// sender, receiver, then the 16-byte session id.
fn channel_message_session(sealed: &[u8]) -> Result<[u8; SESSION_ID_LEN], FaceError> {
    if sealed.len() < 6 + SESSION_ID_LEN || &sealed[..4] != b"PMCH" {
        return Err(FaceError::Malformed(
            "key batch: not a privmatch channel message",
        ));
    }
    let mut id = [0u8; SESSION_ID_LEN];
    id.copy_from_slice(&sealed[6..6 + SESSION_ID_LEN]);
    Ok(id)
}

/// Evaluator side: opens a key batch as `me` with `from_dealer`, the pairwise secrets of this
/// party with P2: refuses anything not sealed by P2 for this party. Returns the header and
/// the key bytes; checks party, dimension, and that the length matches count × key length.
pub fn open_key_batch(
    me: PartyIndex,
    from_dealer: &PairwiseSecrets,
    sealed: &[u8],
) -> Result<(KeyBatchHeader, Vec<u8>), FaceError> {
    let mine = evaluator(me)? as u8;
    // The channel's session id binds the batch number; the header names it, the AEAD
    // authenticates it, and the number inside must match it.
    let channel_id = channel_message_session(sealed)?;
    let mut plain = from_dealer.channel(channel_id).open(0, sealed)?;
    let mut r = Reader::new(&plain);
    r.magic(KEYS_MAGIC)?;
    let party = r.u8()?;
    if party != mine {
        return Err(FaceError::PartyMismatch {
            inside: party,
            me: mine,
        });
    }
    let batch = u64::from_le_bytes(r.array::<8>()?);
    if key_batch_channel(batch) != channel_id {
        return Err(FaceError::Malformed(
            "key batch: the batch number does not match its channel",
        ));
    }
    let generation = u64::from_le_bytes(r.array::<8>()?);
    let metric = Metric::from_byte(r.u8()?)?;
    let dim = usize::from(r.u16()?);
    check_dim(dim)?;
    let count = r.u32()? as usize;
    let key_len = r.u32()? as usize;
    if key_len != super::funshade::COMPARISON_KEY_LEN {
        return Err(FaceError::Malformed("key batch: unexpected key length"));
    }
    if count == 0 || r.rest().len() != count.saturating_mul(key_len) {
        return Err(FaceError::Malformed(
            "key batch: length does not match count × key length",
        ));
    }
    let header = KeyBatchHeader {
        party,
        batch,
        generation,
        metric,
        dim,
        count,
        key_len,
    };
    let keys = plain.split_off(KEY_BATCH_HEADER_LEN);
    Ok((header, keys))
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

/// The id the P0–P1 channel of a session runs under: the session id bound to its key
/// claims, template set, metric and dimension, so two parties that disagree on any of them
/// cannot authenticate each other's first message.
pub fn channel_session(
    session: &[u8; SESSION_ID_LEN],
    claims: &[u8],
    set_digest: &[u8],
    metric: Metric,
    dim: usize,
) -> [u8; SESSION_ID_LEN] {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(b"privmatch face channel v1");
    hash.update(session);
    hash.update((claims.len() as u32).to_le_bytes());
    hash.update(claims);
    hash.update((set_digest.len() as u32).to_le_bytes());
    hash.update(set_digest);
    hash.update([metric.to_byte()]);
    hash.update((dim as u32).to_le_bytes());
    let digest = hash.finalize();
    let mut out = [0u8; SESSION_ID_LEN];
    out.copy_from_slice(&digest[..SESSION_ID_LEN]);
    out
}

/// A bounds-checked little-endian reader.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], FaceError> {
        if self.bytes.len() < n {
            return Err(FaceError::Malformed("truncated"));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], FaceError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, FaceError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, FaceError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, FaceError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn words(&mut self, n: usize) -> Result<Vec<u32>, FaceError> {
        Ok(self
            .take(4 * n)?
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect())
    }

    fn magic(&mut self, magic: &[u8; 4]) -> Result<(), FaceError> {
        if self.take(4)? != magic || self.u8()? != VERSION {
            return Err(FaceError::Malformed("bad magic or unsupported version"));
        }
        Ok(())
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    fn finish(&self) -> Result<(), FaceError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(FaceError::Malformed("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::face::quantize::Quantizer;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn keys(rng: &mut ChaCha20Rng) -> ([PartySecretKey; 3], [PartyPublicKey; 3]) {
        let secrets: [PartySecretKey; 3] = std::array::from_fn(|_| PartySecretKey::generate(rng));
        let publics = std::array::from_fn(|i| secrets[i].public_key());
        (secrets, publics)
    }

    fn embedding(rng: &mut ChaCha20Rng, dim: usize) -> Vec<i32> {
        let q = Quantizer::new(dim).unwrap();
        let m = q.magnitude() as i32;
        (0..dim)
            .map(|_| (rng.next_u32() % (2 * m as u32 + 1)) as i32 - m)
            .collect()
    }

    #[test]
    fn shares_add_up_to_the_embedding_and_its_norm() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let q = embedding(&mut rng, 128);
        let [a, b] = share_embedding(&q, &mut rng);
        let (back, norm) = reconstruct_embedding(&a, &b);
        assert_eq!(back, q);
        assert_eq!(i64::from(norm), crate::face::quantize::dot(&q, &q));
    }

    #[test]
    fn enrollment_round_trips_and_refuses_the_wrong_party() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let (secrets, publics) = keys(&mut rng);
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

    #[test]
    fn probes_are_bound_to_their_session_party_and_target() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let (secrets, publics) = keys(&mut rng);
        let q = embedding(&mut rng, 128);
        let session = [5u8; 16];
        let sealed = seal_face_probe(&q, session, Some("alice"), &publics, &mut rng).unwrap();
        let open = |p: usize, s: &[u8; 16], t: Option<&str>, m: &[u8]| {
            open_face_probe(PartyIndex::ALL[p], &secrets[p], s, t, m)
        };
        let s0 = open(0, &session, Some("alice"), &sealed[0]).unwrap();
        let s1 = open(1, &session, Some("alice"), &sealed[1]).unwrap();
        assert_eq!(reconstruct_embedding(&s0, &s1).0, q);
        assert_eq!(
            open(0, &[6u8; 16], Some("alice"), &sealed[0]),
            Err(FaceError::WrongSession)
        );
        // A verification probe cannot be run as an identification or against someone else.
        assert_eq!(
            open(0, &session, None, &sealed[0]),
            Err(FaceError::WrongTarget)
        );
        assert_eq!(
            open(0, &session, Some("bob"), &sealed[0]),
            Err(FaceError::WrongTarget)
        );
        assert!(open(1, &session, Some("alice"), &sealed[0]).is_err());
        assert!(seal_face_probe(&q[..100], session, None, &publics, &mut rng).is_err());
        let identify = seal_face_probe(&q, session, None, &publics, &mut rng).unwrap();
        assert!(open(0, &session, None, &identify[0]).is_ok());
        assert_eq!(
            open(0, &session, Some("alice"), &identify[0]),
            Err(FaceError::WrongTarget)
        );
    }

    #[test]
    fn key_batches_are_authenticated_as_the_dealers() {
        let mut rng = ChaCha20Rng::seed_from_u64(6);
        let (secrets, publics) = keys(&mut rng);
        let pair = |a: usize, b: usize| {
            PairwiseSecrets::derive(
                PartyIndex::ALL[a],
                &secrets[a],
                PartyIndex::ALL[b],
                &publics[b],
            )
            .unwrap()
        };
        let header = KeyBatchHeader {
            party: 0,
            batch: 7,
            generation: 1,
            metric: Metric::Cosine,
            dim: 128,
            count: 2,
            key_len: crate::face::funshade::COMPARISON_KEY_LEN,
        };
        let keys = vec![9u8; 2 * header.key_len];
        let sealed = seal_key_batch(&header, &keys, &pair(2, 0), &mut rng);
        let (opened, bytes) = open_key_batch(PartyIndex::ALL[0], &pair(0, 2), &sealed).unwrap();
        assert_eq!((opened, bytes), (header, keys.clone()));
        // Not from P2 (P1 forging a batch for P0), or for P1: refused.
        let forged = seal_key_batch(&header, &keys, &pair(1, 0), &mut rng);
        assert!(open_key_batch(PartyIndex::ALL[0], &pair(0, 2), &forged).is_err());
        assert!(open_key_batch(PartyIndex::ALL[1], &pair(1, 2), &sealed).is_err());
        let mut tampered = sealed.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(open_key_batch(PartyIndex::ALL[0], &pair(0, 2), &tampered).is_err());
        assert!(open_key_batch(PartyIndex::ALL[0], &pair(0, 2), &sealed[..10]).is_err());
    }

    #[test]
    fn dealer_config_is_validated_on_both_sides() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let (secrets, publics) = keys(&mut rng);
        let config = DealerConfig {
            metric: Metric::Euclidean,
            dim: 512,
            threshold: 1.1,
        };
        let sealed = seal_dealer_config(&config, &publics[2], &mut rng).unwrap();
        let opened = open_dealer_config(PartyIndex::ALL[2], &secrets[2], &sealed).unwrap();
        assert_eq!(opened, config);
        assert!(!format!("{opened:?}").contains("1.1"));
        let bad = DealerConfig {
            threshold: 2.0,
            metric: Metric::Cosine,
            dim: 512,
        };
        assert!(seal_dealer_config(&bad, &publics[2], &mut rng).is_err());
    }
}
