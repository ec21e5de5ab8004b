//! Atomic commitment across the three parties: the naming of distributed transactions and the
//! rule that resolves one left in doubt by a crash.
//!
//! A distributed transaction runs at every party, each writes a marker row (its global id,
//! `gid`) inside it, each prepares it (`PREPARE TRANSACTION gid`), and then P0 is committed
//! **first**: P0's commit is the decision. Afterwards the others are committed. Recovery needs
//! no coordinator log: for a transaction still prepared somewhere, P0 tells the outcome —
//! marker visible at P0 → it committed → commit everywhere; P0 still prepared or marker
//! absent → no decision was made (or it was rolled back) → roll back everywhere. Presumed
//! abort, with P0 as the durable decision record. A rollback by recovery starts at P0 (rolling
//! back P0's prepared transaction *is* the abort decision), so it can never race with a commit.

/// Prefix of every privmatch global transaction id.
pub const GID_PREFIX: &str = "privmatch";

/// What P0 says about a distributed transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionRecord {
    /// P0 committed it: its marker row is visible.
    Committed,
    /// P0 still holds it prepared: no decision yet.
    StillPrepared,
    /// P0 neither holds it prepared nor has its marker: rolled back or never prepared there.
    Absent,
}

/// How to finish an in-doubt prepared transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// `COMMIT PREPARED` it wherever it is still prepared.
    Commit,
    /// `ROLLBACK PREPARED` it wherever it is still prepared (P0 included).
    Rollback,
}

/// The recovery rule (see the module docs).
pub fn resolve(p0: DecisionRecord) -> Resolution {
    match p0 {
        DecisionRecord::Committed => Resolution::Commit,
        DecisionRecord::StillPrepared | DecisionRecord::Absent => Resolution::Rollback,
    }
}

/// Builds the global id of transaction `sequence` of coordinator instance `instance`
/// (a random hex string chosen at start-up).
pub fn make_gid(instance: &str, sequence: u64) -> String {
    format!("{GID_PREFIX}:{instance}:{sequence}")
}

/// The instance part of a privmatch gid, or `None` for a gid privmatch did not make.
pub fn gid_instance(gid: &str) -> Option<&str> {
    let rest = gid.strip_prefix(GID_PREFIX)?.strip_prefix(':')?;
    let (instance, sequence) = rest.split_once(':')?;
    sequence.parse::<u64>().ok()?;
    Some(instance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_p0_commit_commits() {
        assert_eq!(resolve(DecisionRecord::Committed), Resolution::Commit);
        assert_eq!(resolve(DecisionRecord::StillPrepared), Resolution::Rollback);
        assert_eq!(resolve(DecisionRecord::Absent), Resolution::Rollback);
    }

    #[test]
    fn gids_round_trip() {
        let gid = make_gid("ab12", 7);
        assert_eq!(gid, "privmatch:ab12:7");
        assert_eq!(gid_instance(&gid), Some("ab12"));
        assert_eq!(gid_instance("other:ab12:7"), None);
        assert_eq!(gid_instance("privmatch:ab12:x"), None);
    }
}
