//! Wire and storage formats shared by every modality: the envelope that carries a batch of
//! sealed enrolment bundles ([`envelope`]), session ids ([`session`]) and the versioned byte
//! layout of the share types a party stores ([`storage`]). Modality-specific message layouts
//! live in the modality (`iris/enroll.rs`, `face/enroll.rs`, …).

pub mod envelope;
pub mod session;
pub mod storage;
