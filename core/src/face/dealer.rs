//! What the dealer P2 receives and sends: its configuration, sealed to it by the client, and
//! the key batches it deals to P0 and P1.
//!
//! Dealer configuration (purpose [`FACE_CONFIG_PURPOSE`]): `PMFC`, version 1, metric (1 cosine,
//! 2 euclidean), dimension (u16), threshold (f64). Sealed so that the coordinator never sees θ.
//!
//! Key batch (P2 to P_b): `PMFK`, version 1, party, batch number (u64), generation (u64: the
//! dealer configuration it was made under), metric, dimension (u16), key count (u32), key
//! length (u32), then the keys ([`super::funshade`] layout). It travels as a message of the
//! pairwise channel between P2 and P_b ([`crate::crypto::seal::Channel`], session id derived
//! from the batch number), so it is encrypted *and authenticated as coming from P2*: a
//! coordinator cannot forge keys (it would know r_in and could open z) nor a newer generation.

use rand_core::{CryptoRng, RngCore};

use super::encoding::{evaluator, Reader, VERSION};
use super::funshade::DealerParams;
use super::quantize::check_dim;
use super::{FaceError, Metric};
use crate::crypto::seal::{
    self, open_sealed_box, seal_to_party, PairwiseSecrets, PartyPublicKey, PartySecretKey,
};
use crate::party::PartyIndex;
use crate::wire::session::SESSION_ID_LEN;

/// Sealing purpose of the dealer configuration.
pub const FACE_CONFIG_PURPOSE: &str = "face-dealer-config";
/// The action of the operator command (`crate::crypto::sign`) that carries a sealed dealer
/// configuration to P2, signed by P2's operator.
pub const DEALER_CONFIG_ACTION: &str = "face-dealer-config";

const CONFIG_MAGIC: &[u8; 4] = b"PMFC";
const KEYS_MAGIC: &[u8; 4] = b"PMFK";

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

impl DealerParams {
    /// The key-making parameters of a dealer configuration (its threshold quantised).
    pub fn new(config: &DealerConfig) -> Result<Self, FaceError> {
        DealerParams::quantise(config.metric, config.dim, config.threshold)
    }
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

/// The session id a channel message names in its (authenticated) header.
fn channel_message_session(sealed: &[u8]) -> Result<[u8; SESSION_ID_LEN], FaceError> {
    seal::channel_message_session(sealed).ok_or(FaceError::Malformed(
        "key batch: not a privmatch channel message",
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::face::encoding::test_support::{pairwise, seeded_keys};

    #[test]
    fn key_batches_are_authenticated_as_the_dealers() {
        let (mut rng, secrets, publics) = seeded_keys(6);
        let pair = |a: usize, b: usize| pairwise(&secrets, &publics, a, b);
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
        let (mut rng, secrets, publics) = seeded_keys(4);
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
