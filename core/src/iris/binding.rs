//! What binds the three parties' copies of one enrolled template together: its **enrolment
//! id**, a value all three parties agree on when they store it, and which enters the set
//! digest of every search ([`crate::iris::store`]) and so the session binding of its messages
//! ([`crate::iris::service`]).
//!
//! At enrolment the coordinator gives each party, beside its own sealed envelope, the hashes of
//! the three envelopes of the record (`h_i` = [`envelope_hash`] of P_i's sealed envelope); the
//! party checks that its own envelope hashes to its slot ([`check_envelope_hashes`]) and
//! stores `enrolment_id = SHA-256("privmatch iris enrolment v1" ‖ h0 ‖ h1 ‖ h2)`
//! ([`enrolment_id`]). The coordinator, or anyone acting with its role at one party, can still
//! delete an entry there or store a share sealed by itself: but the entry then has another
//! enrolment id at that party than at the others (a second preimage of SHA-256 would be needed
//! to keep it), so that party's set digest differs, the parties cannot authenticate each
//! other's first message of the next search, and the search fails naming the party whose set
//! diverges, instead of silently computing with a forged share.
//!
//! Rows stored before 0.11.0 have no envelope hashes; the upgrade gives them
//! [`legacy_enrolment_id`], which every party computes alike from the subject and the eye. Such
//! rows are **not** bound: a share swapped at one party keeps its digest. They are bound once
//! re-enrolled.

use sha2::{Digest, Sha256};

use crate::iris::enroll::Eye;
use crate::party::PartyIndex;

/// Bytes of an envelope hash and of an enrolment id.
pub const HASH_LEN: usize = 32;

/// Bytes of the envelope hashes of one record as the parties receive them: h0 ‖ h1 ‖ h2.
pub const ENVELOPE_HASHES_LEN: usize = 3 * HASH_LEN;

const ENVELOPE_DOMAIN: &[u8] = b"privmatch iris envelope v1";
const ENROLMENT_DOMAIN: &[u8] = b"privmatch iris enrolment v1";
/// The domain of [`legacy_enrolment_id`]; the upgrade script computes the same in SQL.
pub const LEGACY_DOMAIN: &[u8] = b"privmatch iris legacy enrolment v1";

/// The enrolment id of one stored template (module docs).
pub type EnrolmentId = [u8; HASH_LEN];

/// Why the envelope hashes given with an envelope were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    /// Not 3 × 32 bytes.
    #[error("the envelope hashes are {0} bytes, expected {ENVELOPE_HASHES_LEN} (h0 ‖ h1 ‖ h2)")]
    BadLength(usize),
    /// This party's own envelope does not hash to its slot.
    #[error("the envelope does not hash to {0}'s slot of the envelope hashes")]
    NotMine(PartyIndex),
}

/// The hash of one party's sealed enrolment envelope, as the coordinator relays it.
pub fn envelope_hash(sealed: &[u8]) -> [u8; HASH_LEN] {
    let mut h = Sha256::new();
    h.update(ENVELOPE_DOMAIN);
    h.update(sealed);
    h.finalize().into()
}

/// h0 ‖ h1 ‖ h2 of the three sealed envelopes of one record (indexed by party).
pub fn envelope_hashes(sealed: [&[u8]; 3]) -> [u8; ENVELOPE_HASHES_LEN] {
    let mut out = [0u8; ENVELOPE_HASHES_LEN];
    for (slot, envelope) in out.chunks_exact_mut(HASH_LEN).zip(sealed) {
        slot.copy_from_slice(&envelope_hash(envelope));
    }
    out
}

/// The enrolment id of a record whose envelopes hash to `hashes` (h0 ‖ h1 ‖ h2).
pub fn enrolment_id(hashes: &[u8; ENVELOPE_HASHES_LEN]) -> EnrolmentId {
    let mut h = Sha256::new();
    h.update(ENROLMENT_DOMAIN);
    h.update(hashes);
    h.finalize().into()
}

/// Checks, at party `me`, that its own `sealed` envelope hashes to its slot of `hashes`, and
/// returns the record's enrolment id.
pub fn check_envelope_hashes(
    me: PartyIndex,
    sealed: &[u8],
    hashes: &[u8],
) -> Result<EnrolmentId, BindingError> {
    let hashes: &[u8; ENVELOPE_HASHES_LEN] = hashes
        .try_into()
        .map_err(|_| BindingError::BadLength(hashes.len()))?;
    let slot = &hashes[me.as_usize() * HASH_LEN..(me.as_usize() + 1) * HASH_LEN];
    if slot != envelope_hash(sealed) {
        return Err(BindingError::NotMine(me));
    }
    Ok(enrolment_id(hashes))
}

/// The enrolment id of a template stored before enrolments were bound (module docs):
/// SHA-256(`LEGACY_DOMAIN` ‖ eye (`left`/`right`) ‖ 0x00 ‖ subject), the same at every party.
pub fn legacy_enrolment_id(subject: &str, eye: Eye) -> EnrolmentId {
    let mut h = Sha256::new();
    h.update(LEGACY_DOMAIN);
    h.update(eye.as_str().as_bytes());
    h.update([0u8]);
    h.update(subject.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_party_accepts_only_hashes_with_its_own_envelope_in_its_slot() {
        let envelopes: [&[u8]; 3] = [b"sealed for P0", b"sealed for P1", b"sealed for P2"];
        let hashes = envelope_hashes(envelopes);
        let id = enrolment_id(&hashes);
        for p in PartyIndex::ALL {
            assert_eq!(
                check_envelope_hashes(p, envelopes[p.as_usize()], &hashes),
                Ok(id)
            );
            let other = envelopes[p.next().as_usize()];
            assert_eq!(
                check_envelope_hashes(p, other, &hashes),
                Err(BindingError::NotMine(p))
            );
        }
        assert_eq!(
            check_envelope_hashes(PartyIndex::ALL[0], envelopes[0], &hashes[..95]),
            Err(BindingError::BadLength(95))
        );
        // A forged envelope at one party gives that party another enrolment id, whatever
        // hashes come with it.
        let forged: [&[u8]; 3] = [envelopes[0], envelopes[1], b"forged for P2"];
        let forged_hashes = envelope_hashes(forged);
        let at_p2 = check_envelope_hashes(PartyIndex::ALL[2], forged[2], &forged_hashes);
        assert!(matches!(at_p2, Ok(other) if other != id));
    }

    #[test]
    fn legacy_ids_are_the_sql_upgrades() {
        // sha256(convert_to('privmatch iris legacy enrolment v1' || 'left', 'UTF8')
        //        || '\x00'::bytea || convert_to('alice', 'UTF8')), as the upgrade script
        // computes it.
        assert_eq!(
            hex::encode(legacy_enrolment_id("alice", Eye::Left)),
            LEGACY_ALICE_LEFT
        );
        assert_ne!(
            legacy_enrolment_id("alice", Eye::Left),
            legacy_enrolment_id("alice", Eye::Right)
        );
    }

    const LEGACY_ALICE_LEFT: &str =
        "e7a335082606529c2b23534d80f884b1db713ff2c4b74a4e5db1bc2b533b488c";
}
