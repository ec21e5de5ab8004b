//! How the two eyes of one probe combine (the two-eye policy): a search runs one session per
//! eye, and the client — never the coordinator, which sees sealed outputs only — turns the
//! per-eye results it opened ([`crate::iris::output`]) into its answer. The one
//! implementation, used by the CLI and by a party's SQL front door.

use crate::iris::enroll::Eye;

/// Why uniqueness with policy `and` over both eyes is refused.
pub const UNIQUENESS_AND_UNSUPPORTED: &str = "uniqueness with eye policy \"and\" over both eyes is not supported: it needs per-subject matching inside the MPC (the uniqueness search reveals one bit per eye); use policy \"or\" (unique only if neither eye matches) or identify mode";

/// Combines per-eye identification results into the sorted list of matches (by subject, then
/// eye). With one eye the policy does not matter; with two, `both = false` (policy `or`) is
/// the union and `both = true` (policy `and`) keeps only subjects matched on every eye,
/// listed with each.
pub fn combine_matches(per_eye: &[(Eye, Vec<String>)], both: bool) -> Vec<(String, Eye)> {
    let matched_on_all = |subject: &String| per_eye.iter().all(|(_, list)| list.contains(subject));
    let mut out: Vec<(String, Eye)> = per_eye
        .iter()
        .flat_map(|(eye, subjects)| {
            subjects
                .iter()
                .filter(|s| !both || matched_on_all(s))
                .map(move |s| (s.clone(), *eye))
        })
        .collect();
    out.sort_by(|a, b| (&a.0, a.1.as_str()).cmp(&(&b.0, b.1.as_str())));
    out.dedup();
    out
}

/// Combines per-eye uniqueness results: with policy `or` (`both = false`; a match on either
/// eye makes the probe not unique) the probe is unique iff every eye is. Policy `and` over two
/// eyes is refused ([`UNIQUENESS_AND_UNSUPPORTED`]).
pub fn combine_uniqueness(per_eye: &[(Eye, bool)], both: bool) -> Result<bool, &'static str> {
    if both && per_eye.len() > 1 {
        return Err(UNIQUENESS_AND_UNSUPPORTED);
    }
    Ok(per_eye.iter().all(|(_, unique)| *unique))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn eye_policies_combine_matches() {
        let per_eye = [
            (Eye::Right, names(&["carol", "bob"])),
            (Eye::Left, names(&["bob", "alice"])),
        ];
        let or = combine_matches(&per_eye, false);
        assert_eq!(
            or,
            vec![
                ("alice".into(), Eye::Left),
                ("bob".into(), Eye::Left),
                ("bob".into(), Eye::Right),
                ("carol".into(), Eye::Right),
            ]
        );
        let and = combine_matches(&per_eye, true);
        assert_eq!(
            and,
            vec![("bob".into(), Eye::Left), ("bob".into(), Eye::Right)]
        );
        let single = [(Eye::Right, names(&["x"]))];
        assert_eq!(combine_matches(&single, true).len(), 1);
    }

    #[test]
    fn eye_policies_combine_uniqueness() {
        let both = [(Eye::Left, true), (Eye::Right, false)];
        assert_eq!(combine_uniqueness(&both, false), Ok(false));
        assert_eq!(
            combine_uniqueness(&[(Eye::Left, true), (Eye::Right, true)], false),
            Ok(true)
        );
        assert!(combine_uniqueness(&both, true).is_err());
        assert_eq!(combine_uniqueness(&[(Eye::Left, true)], true), Ok(true));
    }
}
