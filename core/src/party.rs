//! Party identities: the three computing parties P0, P1, P2.

use std::fmt;

/// Number of computing parties in every privmatch protocol.
pub const NUM_PARTIES: usize = 3;

/// The index of a computing party (0, 1 or 2). Constructed only through [`PartyIndex::new`],
/// so every value in circulation is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartyIndex(u8);

/// A party index outside 0..=2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("party index {0} is out of range: privmatch has parties 0, 1 and 2")]
pub struct InvalidPartyIndex(pub i64);

impl PartyIndex {
    /// All three parties in order.
    pub const ALL: [PartyIndex; NUM_PARTIES] = [PartyIndex(0), PartyIndex(1), PartyIndex(2)];

    /// Checks that `index` names one of the three parties.
    pub fn new(index: i64) -> Result<Self, InvalidPartyIndex> {
        match index {
            0..=2 => Ok(PartyIndex(index as u8)),
            _ => Err(InvalidPartyIndex(index)),
        }
    }

    /// The index as a `usize`, for array indexing.
    pub fn as_usize(self) -> usize {
        self.0 as usize
    }

    /// The index as a byte, for wire formats.
    pub fn as_u8(self) -> u8 {
        self.0
    }

    /// The next party in the ring P0 → P1 → P2 → P0 (replicated sharing hands shares this way).
    pub fn next(self) -> Self {
        PartyIndex((self.0 + 1) % NUM_PARTIES as u8)
    }

    /// The previous party in the ring P0 → P1 → P2 → P0.
    pub fn prev(self) -> Self {
        PartyIndex((self.0 + NUM_PARTIES as u8 - 1) % NUM_PARTIES as u8)
    }
}

impl fmt::Display for PartyIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "P{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_checked() {
        assert!(PartyIndex::new(-1).is_err());
        assert!(PartyIndex::new(3).is_err());
        assert_eq!(PartyIndex::new(2).map(|p| p.as_u8()), Ok(2));
    }

    #[test]
    fn ring_order() {
        let p0 = PartyIndex::ALL[0];
        assert_eq!(p0.next().next().next(), p0);
        assert_eq!(p0.prev(), PartyIndex::ALL[2]);
    }
}
