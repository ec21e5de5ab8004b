//! A party's signed output of one iris search: what the party computed (the matching subjects
//! of the probe's eye, or the uniqueness bit), bound to the session, the parameters, the eye
//! and the set it searched, and signed with the party's signing key
//! ([`crate::crypto::party_sign`], context [`CONTEXT`]). The coordinator relays the three
//! signed outputs to the client (the CLI, or the party whose SQL front door was called), which
//! verifies them against the pinned keys and refuses, naming the party, a result that is not
//! what that party signed: a coordinator that changes a match, drops one or flips the bit is
//! caught.
//!
//! Signed message (little-endian):
//!
//! ```text
//! party (1) | session id (16) | parameters (4: mode, max rotation, threshold P u16)
//! | eye (1) | set digest (32) | entries (u64)
//! | result: 0 ‖ count (u32) ‖ (length (u32) ‖ subject)* sorted   (identification)
//!         | 1 ‖ unique (1)                                       (uniqueness)
//! ```

use crate::crypto::party_sign::{
    PartySignError, PartySigningKey, PartyVerifyingKey, SIGNATURE_LEN,
};
use crate::iris::enroll::Eye;
use crate::iris::params::SearchParams;
use crate::party::PartyIndex;
use crate::wire::session::SessionId;

/// The context label of a signed iris search output.
pub const CONTEXT: &[u8] = b"privmatch iris search output v1";

/// What a search answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IrisResult {
    /// Identification: the matching subjects of the probe's eye (signed sorted).
    Identified(Vec<String>),
    /// Uniqueness: true when no enrolled template matched.
    Unique(bool),
}

/// One party's output of one search, as it signs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IrisOutput {
    /// The party that computed it.
    pub party: PartyIndex,
    /// The session id the client drew.
    pub session: SessionId,
    /// The parameters sealed with the probe.
    pub params: SearchParams,
    /// The probe's eye.
    pub eye: Eye,
    /// The digest of the set searched ([`crate::iris::store::CanonicalOrder::digest`]).
    pub set_digest: [u8; 32],
    /// Entries searched.
    pub entries: u64,
    /// The result.
    pub result: IrisResult,
}

impl IrisOutput {
    /// The signed message (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        out.push(self.party.as_u8());
        out.extend_from_slice(&self.session);
        out.extend_from_slice(&self.params.to_bytes());
        out.push(self.eye.to_byte());
        out.extend_from_slice(&self.set_digest);
        out.extend_from_slice(&self.entries.to_le_bytes());
        match &self.result {
            IrisResult::Identified(subjects) => {
                let mut sorted: Vec<&String> = subjects.iter().collect();
                sorted.sort();
                out.push(0);
                out.extend_from_slice(&(sorted.len() as u32).to_le_bytes());
                for s in sorted {
                    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
            }
            IrisResult::Unique(u) => {
                out.push(1);
                out.push(u8::from(*u));
            }
        }
        out
    }

    /// The party's signature over it.
    pub fn sign(&self, key: &PartySigningKey) -> [u8; SIGNATURE_LEN] {
        key.sign(CONTEXT, &self.encode())
    }

    /// Checks `signature` under the party's pinned `key`.
    pub fn verify(&self, key: &PartyVerifyingKey, signature: &[u8]) -> Result<(), PartySignError> {
        key.verify(CONTEXT, &self.encode(), signature)
    }
}

/// Why a client refused the outputs the coordinator relayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputRefused {
    /// A party's signature does not cover the result as relayed.
    #[error("{party}'s signature does not cover this result of the {eye} eye's search: the coordinator changed the result, or relayed another party's or another session's output; refusing it")]
    BadSignature {
        /// The party whose signature failed.
        party: PartyIndex,
        /// The eye.
        eye: &'static str,
    },
}

/// Verifies the three parties' signed outputs of one search: the result, set digest and
/// entry count as relayed, with the client's own session id, parameters and eye. `keys[i]`
/// is party i's pinned signing key (`None`: not pinned, not checked; at least one must be).
/// Names the first party whose signature fails.
#[allow(clippy::too_many_arguments)]
pub fn verify_outputs(
    keys: &[Option<PartyVerifyingKey>; 3],
    session: SessionId,
    params: SearchParams,
    eye: Eye,
    set_digest: [u8; 32],
    entries: u64,
    result: &IrisResult,
    signatures: &[Vec<u8>; 3],
) -> Result<(), OutputRefused> {
    let mut checked = 0;
    for party in PartyIndex::ALL {
        let Some(key) = &keys[party.as_usize()] else {
            continue;
        };
        let output = IrisOutput {
            party,
            session,
            params,
            eye,
            set_digest,
            entries,
            result: result.clone(),
        };
        output
            .verify(key, &signatures[party.as_usize()])
            .map_err(|_| OutputRefused::BadSignature {
                party,
                eye: eye.as_str(),
            })?;
        checked += 1;
    }
    if checked == 0 {
        return Err(OutputRefused::BadSignature {
            party: PartyIndex::ALL[0],
            eye: eye.as_str(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::seal::PartySecretKey;
    use crate::iris::params::SearchMode;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn a_result_changed_in_transit_is_refused_naming_the_party() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let signers: Vec<PartySigningKey> = (0..3)
            .map(|_| PartySigningKey::derive(&PartySecretKey::generate(&mut rng)))
            .collect();
        let keys = [0, 1, 2].map(|i| Some(signers[i].verifying_key()));
        let params = SearchParams::new(SearchMode::Identify, 15, 0.345).expect("params");
        let result = IrisResult::Identified(vec!["bob".into(), "alice".into()]);
        let output = |party: usize, result: &IrisResult| IrisOutput {
            party: PartyIndex::ALL[party],
            session: [7; 16],
            params,
            eye: Eye::Left,
            set_digest: [9; 32],
            entries: 40,
            result: result.clone(),
        };
        let signatures: [Vec<u8>; 3] =
            std::array::from_fn(|i| output(i, &result).sign(&signers[i]).to_vec());
        let verify = |result: &IrisResult, signatures: &[Vec<u8>; 3]| {
            verify_outputs(
                &keys,
                [7; 16],
                params,
                Eye::Left,
                [9; 32],
                40,
                result,
                signatures,
            )
        };
        // The order of the subjects as relayed does not matter; their set does.
        let reordered = IrisResult::Identified(vec!["alice".into(), "bob".into()]);
        assert_eq!(verify(&reordered, &signatures), Ok(()));
        for changed in [
            IrisResult::Identified(vec!["alice".into()]),
            IrisResult::Identified(vec!["alice".into(), "bob".into(), "mallory".into()]),
            IrisResult::Unique(false),
        ] {
            assert_eq!(
                verify(&changed, &signatures),
                Err(OutputRefused::BadSignature {
                    party: PartyIndex::ALL[0],
                    eye: "left"
                })
            );
        }
        // One party's signature swapped for another's: that party is named.
        let mut swapped = signatures.clone();
        swapped[2] = signatures[1].clone();
        assert_eq!(
            verify(&result, &swapped),
            Err(OutputRefused::BadSignature {
                party: PartyIndex::ALL[2],
                eye: "left"
            })
        );
        // Another session, parameters or set: refused.
        let other = verify_outputs(
            &keys,
            [8; 16],
            params,
            Eye::Left,
            [9; 32],
            40,
            &result,
            &signatures,
        );
        assert!(other.is_err());
        let none = [None, None, None];
        assert!(verify_outputs(
            &none,
            [7; 16],
            params,
            Eye::Left,
            [9; 32],
            40,
            &result,
            &signatures
        )
        .is_err());
    }
}
