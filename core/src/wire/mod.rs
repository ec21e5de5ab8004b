//! Wire and storage formats shared by every modality: the envelope that carries a batch of
//! sealed enrolment bundles ([`envelope`]), session ids ([`session`]) and the versioned byte
//! layout of the share types a party stores ([`storage`]), and the text form of the SQL front
//! door's sealed inputs ([`sealed_input`]). Modality-specific message layouts
//! live in the modality (`iris/enroll.rs`, `face/enroll.rs`, …).

pub mod envelope;
pub mod sealed_input;
pub mod session;
pub mod storage;
