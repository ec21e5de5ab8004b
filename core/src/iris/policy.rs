//! The iris threshold policy: the match threshold τ is deployment policy, held by each party and
//! changed only by a command its operator signed (`crate::crypto::sign`, action
//! [`IRIS_POLICY_ACTION`]), never chosen per search. A caller who could pick τ per search could
//! bisect the distance between a probe and an enrolled template with a dozen searches (each
//! answers "fhd < τ?"), so every party refuses a search whose threshold is not its policy.
//!
//! Payload of the signed command: `version (1) | numerator P (4, big endian)`, τ = P / 10,000,
//! with the same range as a search's threshold ([`crate::iris::params::SearchParams::new`]):
//! 0 < τ ≤ 0.5.

use crate::iris::mpc::compare::{Threshold, Q};
use crate::iris::params::MAX_THRESHOLD;

/// The action of a signed iris policy command.
pub const IRIS_POLICY_ACTION: &str = "iris-policy";

/// The threshold numerator every party holds at install: τ = 0.345 (3,450 / 10,000). The one
/// definition of the default iris threshold (docs/protocols/iris.md).
pub const DEFAULT_TAU_NUMERATOR: u32 = 3_450;

/// The default threshold [`DEFAULT_TAU_NUMERATOR`] as a ratio (0.345), for command-line
/// defaults and benchmarks.
pub const DEFAULT_TAU: f64 = DEFAULT_TAU_NUMERATOR as f64 / Q as f64;

const VERSION: u8 = 1;
const PAYLOAD_LEN: usize = 5;

/// A policy payload that cannot be accepted; the message names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("iris policy: {0}")]
pub struct PolicyError(pub String);

/// The iris search policy of a deployment: the match threshold every search must use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IrisPolicy {
    threshold: Threshold,
}

impl IrisPolicy {
    /// The policy with threshold `numerator` / 10,000; refuses 0 and anything above 0.5.
    pub fn from_numerator(numerator: u32) -> Result<Self, PolicyError> {
        let max = (MAX_THRESHOLD * 10_000.0) as u32;
        if numerator == 0 || numerator > max {
            return Err(PolicyError(format!(
                "the threshold must be in (0, {MAX_THRESHOLD}], not {}",
                f64::from(numerator) / 10_000.0
            )));
        }
        let threshold = Threshold::from_ten_thousandths(numerator)
            .map_err(|e| PolicyError(format!("threshold {numerator}/10000: {e}")))?;
        Ok(IrisPolicy { threshold })
    }

    /// The policy with threshold ratio `tau` (at most four decimals, in (0, 0.5]).
    pub fn from_ratio(tau: f64) -> Result<Self, PolicyError> {
        if !(tau > 0.0 && tau <= MAX_THRESHOLD) {
            return Err(PolicyError(format!(
                "the threshold must be a ratio in (0, {MAX_THRESHOLD}], not {tau}"
            )));
        }
        let threshold = Threshold::from_ratio(tau)
            .map_err(|_| PolicyError(format!("threshold {tau} has more than four decimals")))?;
        Ok(IrisPolicy { threshold })
    }

    /// The policy whose threshold is `threshold` (a search's, e.g. the one sealed in a probe);
    /// refuses what [`Self::from_numerator`] refuses.
    pub fn from_threshold(threshold: Threshold) -> Result<Self, PolicyError> {
        let numerator = u32::try_from(threshold.numerator())
            .map_err(|_| PolicyError(format!("threshold numerator {}", threshold.numerator())))?;
        Self::from_numerator(numerator)
    }

    /// The policy every party holds at install (τ = 0.345).
    pub fn default_policy() -> Self {
        IrisPolicy {
            threshold: Threshold::from_ten_thousandths(DEFAULT_TAU_NUMERATOR)
                .unwrap_or_else(|_| unreachable!("3450/10000 is a valid threshold")),
        }
    }

    /// The exact threshold.
    pub fn threshold(&self) -> Threshold {
        self.threshold
    }

    /// The numerator P of τ = P / 10,000 (what the party stores).
    pub fn numerator(&self) -> u32 {
        // In (0, 5000] by construction.
        self.threshold.numerator() as u32
    }

    /// τ as a ratio (exactly P / 10,000 as an f64).
    pub fn ratio(&self) -> f64 {
        f64::from(self.numerator()) / 10_000.0
    }

    /// Whether a search at threshold `threshold` is allowed by this policy (exact comparison
    /// of the numerators, no tolerance).
    pub fn allows(&self, threshold: Threshold) -> bool {
        threshold.numerator() == self.threshold.numerator()
    }

    /// The payload of a signed policy command.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PAYLOAD_LEN);
        out.push(VERSION);
        out.extend_from_slice(&self.numerator().to_be_bytes());
        out
    }

    /// Parses [`IrisPolicy::encode`], refusing any other length, version or threshold.
    pub fn decode(bytes: &[u8]) -> Result<Self, PolicyError> {
        if bytes.len() != PAYLOAD_LEN || bytes[0] != VERSION {
            return Err(PolicyError(
                "a policy payload is version 1 and 5 bytes".into(),
            ));
        }
        let mut numerator = [0u8; 4];
        numerator.copy_from_slice(&bytes[1..]);
        Self::from_numerator(u32::from_be_bytes(numerator))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_round_trip_and_refuse_what_a_search_would() {
        for tau in [0.0001, 0.3, 0.345, 0.5] {
            let p = IrisPolicy::from_ratio(tau).expect("valid");
            assert_eq!(IrisPolicy::decode(&p.encode()), Ok(p));
            assert_eq!(p.ratio(), tau);
            assert_eq!(IrisPolicy::from_threshold(p.threshold()), Ok(p));
        }
        assert_eq!(IrisPolicy::default_policy().numerator(), 3_450);
        for bad in [0.0, 0.5001, -0.1, f64::NAN, 0.34512] {
            assert!(IrisPolicy::from_ratio(bad).is_err(), "{bad}");
        }
        assert!(IrisPolicy::decode(&[1, 0, 0, 0, 0]).is_err(), "zero");
        assert!(
            IrisPolicy::decode(&[1, 0, 0, 0x13, 0x89]).is_err(),
            "0.5001"
        );
        assert!(
            IrisPolicy::decode(&[2, 0, 0, 0x0d, 0x7a]).is_err(),
            "version"
        );
        assert!(IrisPolicy::decode(&[1, 0, 0x0d, 0x7a]).is_err(), "length");
    }

    #[test]
    fn only_the_exact_policy_threshold_is_allowed() {
        let p = IrisPolicy::default_policy();
        let same = Threshold::from_ratio(0.345).expect("t");
        let near = Threshold::from_ratio(0.3451).expect("t");
        assert!(p.allows(same));
        assert!(!p.allows(near));
    }
}
