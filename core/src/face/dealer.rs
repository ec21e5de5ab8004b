//! What the dealer P2 receives: its configuration, sealed to it by the client. (The keys it
//! deals per session are [`super::mask_dealer`]'s; the key batches of the pool retired in
//! extension 0.13.0 are gone.)
//!
//! Dealer configuration (purpose [`FACE_CONFIG_PURPOSE`]): `PMFC`, version 1, metric (1 cosine,
//! 2 euclidean), dimension (u16), threshold (f64). Sealed so that the coordinator never sees θ.

use rand_core::{CryptoRng, RngCore};

use super::encoding::{Reader, VERSION};
use super::funshade::DealerParams;
use super::{FaceError, Metric};
use crate::crypto::seal::{open_sealed_box, seal_to_party, PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;

/// Sealing purpose of the dealer configuration.
pub const FACE_CONFIG_PURPOSE: &str = "face-dealer-config";
/// The action of the operator command (`crate::crypto::sign`) that carries a sealed dealer
/// configuration to P2, signed by P2's operator.
pub const DEALER_CONFIG_ACTION: &str = "face-dealer-config";

const CONFIG_MAGIC: &[u8; 4] = b"PMFC";

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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::face::encoding::test_support::seeded_keys;

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
