//! The parameters of one iris search, the single definition the client, the coordinator and
//! the parties share: what the search reveals ([`SearchMode`]), how many rotations it tries
//! and the match threshold. The three parties bind their round messages to these values
//! (`service.rs`, "Binding"), so a search whose parties were given different parameters
//! aborts instead of computing something else.

use crate::iris::mpc::compare::Threshold;
use crate::iris::template::MAX_ROTATION;

/// Largest accepted threshold ratio. At τ = 0.5 the comparison constant A = 2Q − 4P is 0,
/// still exact; above it a search would match most random codes and is refused as a mistake.
pub const MAX_THRESHOLD: f64 = 0.5;

/// What a search reveals to the parties and the coordinator.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SearchMode {
    /// Which enrolled entries (of the probe's eye) match: per entry, the OR over the rotations
    /// of the per-rotation match bits.
    #[default]
    Identify,
    /// Only whether any enrolled template matches: one OR over all entries and rotations.
    Uniqueness,
}

impl SearchMode {
    /// `"identify"` or `"uniqueness"`: the spelling of the SQL functions and the HTTP API.
    pub fn as_str(self) -> &'static str {
        match self {
            SearchMode::Identify => "identify",
            SearchMode::Uniqueness => "uniqueness",
        }
    }

    /// Parses [`SearchMode::as_str`]'s spelling, exactly.
    pub fn parse(text: &str) -> Result<Self, ParamError> {
        match text {
            "identify" => Ok(SearchMode::Identify),
            "uniqueness" => Ok(SearchMode::Uniqueness),
            other => Err(ParamError(format!(
                "mode must be 'identify' or 'uniqueness', not {:?}",
                other.chars().take(32).collect::<String>()
            ))),
        }
    }

    /// The byte the session binding hashes and the engine socket carries: 0 identify,
    /// 1 uniqueness.
    pub fn to_byte(self) -> u8 {
        match self {
            SearchMode::Identify => 0,
            SearchMode::Uniqueness => 1,
        }
    }

    /// The mode [`SearchMode::to_byte`] wrote, `None` for any other byte.
    pub fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            0 => Some(SearchMode::Identify),
            1 => Some(SearchMode::Uniqueness),
            _ => None,
        }
    }
}

/// A search parameter out of range. The message names the parameter and the accepted range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParamError(pub String);

/// The parameters of one search, identical at the three parties. Constructed only through
/// [`SearchParams::new`], so every value in circulation is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchParams {
    mode: SearchMode,
    max_rotation: i32,
    threshold: Threshold,
}

impl SearchParams {
    /// Checks and builds the parameters: `max_rotation` in 0..=15 (rotations −max..=max
    /// columns), `threshold` a fractional Hamming distance ratio in (0, 0.5] with at most four
    /// decimals (a comparison matches when the minimum distance over the rotations is strictly
    /// below it).
    pub fn new(mode: SearchMode, max_rotation: i32, threshold: f64) -> Result<Self, ParamError> {
        if !(0..=MAX_ROTATION).contains(&max_rotation) {
            return Err(ParamError(format!(
                "max_rotation must be in 0..={MAX_ROTATION}, not {max_rotation}"
            )));
        }
        if !(threshold > 0.0 && threshold <= MAX_THRESHOLD) {
            return Err(ParamError(format!(
                "threshold must be a ratio in (0, {MAX_THRESHOLD}], not {threshold}"
            )));
        }
        let threshold = Threshold::from_ratio(threshold).map_err(|_| {
            ParamError(format!("threshold {threshold} has more than four decimals"))
        })?;
        Ok(SearchParams {
            mode,
            max_rotation,
            threshold,
        })
    }

    /// Identification or uniqueness.
    pub fn mode(&self) -> SearchMode {
        self.mode
    }

    /// Rotations −max..=max columns.
    pub fn max_rotation(&self) -> i32 {
        self.max_rotation
    }

    /// The exact threshold P / 10,000.
    pub fn threshold(&self) -> Threshold {
        self.threshold
    }

    /// The threshold as a ratio (exactly P / 10,000 as an f64, for display and the SQL call).
    pub fn threshold_ratio(&self) -> f64 {
        self.threshold.numerator() as f64 / 10_000.0
    }

    /// The parameters as sealed inside a probe ([`crate::iris::probe`]): mode byte, maximum
    /// rotation, threshold numerator P (u16, little-endian).
    pub fn to_bytes(&self) -> [u8; PARAMS_LEN] {
        // max_rotation is 0..=15 and P ≤ 5,000 by construction, so both fit.
        let p = self.threshold.numerator() as u16;
        let [p0, p1] = p.to_le_bytes();
        [self.mode.to_byte(), self.max_rotation as u8, p0, p1]
    }

    /// Parses [`SearchParams::to_bytes`], with the checks of [`SearchParams::new`].
    pub fn from_bytes(bytes: [u8; PARAMS_LEN]) -> Result<Self, ParamError> {
        let mode = SearchMode::from_byte(bytes[0])
            .ok_or_else(|| ParamError(format!("unknown search mode byte {}", bytes[0])))?;
        let numerator = u16::from_le_bytes([bytes[2], bytes[3]]);
        Self::new(mode, i32::from(bytes[1]), f64::from(numerator) / 10_000.0)
    }
}

/// Length of [`SearchParams::to_bytes`].
pub const PARAMS_LEN: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip_through_their_sealed_bytes() {
        for (mode, rotation, threshold) in [
            (SearchMode::Identify, 15, 0.345),
            (SearchMode::Uniqueness, 0, 0.0001),
            (SearchMode::Identify, 7, 0.5),
        ] {
            let params = SearchParams::new(mode, rotation, threshold).expect("valid");
            assert_eq!(SearchParams::from_bytes(params.to_bytes()), Ok(params));
        }
        assert!(SearchParams::from_bytes([9, 0, 1, 0]).is_err());
        assert!(SearchParams::from_bytes([0, 16, 1, 0]).is_err());
        assert!(
            SearchParams::from_bytes([0, 0, 0x89, 0x13]).is_err(),
            "0.5001"
        );
    }

    fn new(max_rotation: i32, threshold: f64) -> Result<SearchParams, ParamError> {
        SearchParams::new(SearchMode::Identify, max_rotation, threshold)
    }

    #[test]
    fn threshold_boundary_is_half_inclusive() {
        let half = new(15, 0.5).expect("0.5 is the largest accepted threshold");
        assert_eq!(half.threshold().numerator(), 5_000);
        assert_eq!(half.threshold().a(), 0, "A = 2Q - 4P vanishes at 0.5");
        assert_eq!(half.threshold_ratio(), 0.5);
        assert!(new(15, 0.4999).is_ok());
        assert!(new(15, 0.5001).is_err());
        assert!(new(15, 0.0).is_err());
        assert!(new(15, 0.0001).is_ok());
        assert!(new(15, -0.1).is_err());
    }

    #[test]
    fn out_of_range_parameters_are_named() {
        assert!(new(15, 0.345).is_ok());
        assert!(new(0, 0.345).is_ok());
        let err = new(16, 0.345).expect_err("rotation 16");
        assert!(err.0.contains("max_rotation"), "{err}");
        assert!(new(-1, 0.345).is_err());
        for bad in [f64::NAN, f64::INFINITY, 0.34512] {
            let err = new(15, bad).expect_err("bad threshold");
            assert!(err.0.contains("threshold"), "{err}");
        }
    }

    #[test]
    fn modes_round_trip_exactly() {
        for mode in [SearchMode::Identify, SearchMode::Uniqueness] {
            assert_eq!(SearchMode::parse(mode.as_str()), Ok(mode));
        }
        assert!(SearchMode::parse("Identify").is_err());
        assert!(SearchMode::parse("lookup").is_err());
        assert_eq!(SearchMode::Identify.to_byte(), 0);
        assert_eq!(SearchMode::Uniqueness.to_byte(), 1);
        for mode in [SearchMode::Identify, SearchMode::Uniqueness] {
            assert_eq!(SearchMode::from_byte(mode.to_byte()), Some(mode));
        }
        assert_eq!(SearchMode::from_byte(2), None);
    }
}
