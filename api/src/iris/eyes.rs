//! How the two eyes of one probe combine: a search runs one session per eye, and the eye
//! policy ([`EyePolicy`]) turns the per-eye results into the answer the caller learns. The
//! client applies it to the outputs it opened (the coordinator sees sealed outputs only);
//! the combination itself is core's `iris::eyes`, shared with the SQL front door.

use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::eyes;
use serde::{Deserialize, Serialize};

/// How the results of the two eyes of one probe combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EyePolicy {
    /// Identify: a subject matched on either eye. Uniqueness: unique only if both eyes are.
    #[default]
    Or,
    /// Identify: only subjects matched on both eyes. Uniqueness: not supported.
    And,
}

impl EyePolicy {
    /// `"or"` or `"and"`.
    pub fn as_str(self) -> &'static str {
        match self {
            EyePolicy::Or => "or",
            EyePolicy::And => "and",
        }
    }
}

/// One matching enrolled template.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Match {
    /// Subject id.
    pub subject: String,
    /// `"left"` or `"right"`.
    pub eye: String,
}

impl EyePolicy {
    /// Whether a match must hold on both eyes (`and`), as core's `iris::eyes` takes it.
    pub fn both(self) -> bool {
        self == EyePolicy::And
    }
}

/// Combines per-eye identification results into the sorted list of matches (by subject, then
/// eye): core's `iris::eyes::combine_matches`, the one implementation the CLI and the front
/// door share. With one eye the policy does not matter; with two, `or` is the union and `and`
/// keeps only subjects matched on both eyes (listed with both).
pub fn combine_matches(per_eye: &[(Eye, Vec<String>)], policy: EyePolicy) -> Vec<Match> {
    eyes::combine_matches(per_eye, policy.both())
        .into_iter()
        .map(|(subject, eye)| Match {
            subject,
            eye: eye.as_str().to_owned(),
        })
        .collect()
}

/// Combines per-eye uniqueness results (core's `iris::eyes::combine_uniqueness`): with
/// policy `or` the probe is unique iff every eye is; `and` over two eyes is refused.
pub fn combine_uniqueness(per_eye: &[(Eye, bool)], policy: EyePolicy) -> Result<bool, String> {
    eyes::combine_uniqueness(per_eye, policy.both()).map_err(str::to_owned)
}

/// Why uniqueness with policy `and` over both eyes is refused.
pub use eyes::UNIQUENESS_AND_UNSUPPORTED;

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn eye_policies_combine_matches() {
        let per_eye = [
            (Eye::Left, names(&["bob", "alice"])),
            (Eye::Right, names(&["carol", "bob"])),
        ];
        let or: Vec<(String, String)> = combine_matches(&per_eye, EyePolicy::Or)
            .into_iter()
            .map(|m| (m.subject, m.eye))
            .collect();
        assert_eq!(
            or,
            vec![
                ("alice".into(), "left".into()),
                ("bob".into(), "left".into()),
                ("bob".into(), "right".into()),
                ("carol".into(), "right".into()),
            ]
        );
        let and: Vec<(String, String)> = combine_matches(&per_eye, EyePolicy::And)
            .into_iter()
            .map(|m| (m.subject, m.eye))
            .collect();
        assert_eq!(
            and,
            vec![
                ("bob".into(), "left".into()),
                ("bob".into(), "right".into())
            ]
        );
        let single = [(Eye::Right, names(&["x"]))];
        assert_eq!(combine_matches(&single, EyePolicy::And).len(), 1);
    }

    #[test]
    fn eye_policies_combine_uniqueness() {
        let both = [(Eye::Left, true), (Eye::Right, false)];
        assert_eq!(combine_uniqueness(&both, EyePolicy::Or), Ok(false));
        assert_eq!(
            combine_uniqueness(&[(Eye::Left, true), (Eye::Right, true)], EyePolicy::Or),
            Ok(true)
        );
        assert!(combine_uniqueness(&both, EyePolicy::And).is_err());
        assert_eq!(
            combine_uniqueness(&[(Eye::Left, true)], EyePolicy::And),
            Ok(true)
        );
    }
}
