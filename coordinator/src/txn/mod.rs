//! Distributed transactions across the three parties: two-phase commit with
//! `PREPARE TRANSACTION` / `COMMIT PREPARED`, and the recovery of transactions a crash left in
//! doubt. The commit rule and the gid format live in `privmatch_core::twophase`; this module
//! does the I/O, for any modality.
//!
//! A transaction: BEGIN and a marker row at every party; the work's table locks, taken party
//! by party in index order (so that transactions cannot deadlock across parties); the work's
//! phase one ([`work::Work`]: by default its SQL at every party, whose results the parties
//! that worked must agree on; a modality may add checks and calls across the transaction's
//! connections, as enroll-if-unique does); PREPARE everywhere; the decision (COMMIT PREPARED)
//! at P0 first, then at the others. Phase one may also decide not to write (a duplicate, a
//! record that is not unique): then it is rolled back everywhere before anything is prepared.
//!
//! A party that holds nothing of a modality (P2 for faces) takes part with its marker row
//! alone, so that the decision rule and recovery stay those of every other transaction.
//! Recovery is modality-neutral: it resolves prepared transactions by gid only.
//!
//! * [`work`]: what a modality supplies ([`work::Work`]), the table locks, phase one's
//!   context and the errors.
//! * [`twophase`]: the transaction manager ([`twophase::TwoPhase`]).
//! * [`recovery`]: finishing the transactions left in doubt.
//! * [`fault`]: the faults the end-to-end tests inject.

pub mod fault;
pub mod recovery;
pub mod twophase;
pub mod work;
