//! # Face matching with Funshade [ICO23]
//!
//! Two-party thresholded distance with function secret sharing (Ibarrondo, Chabanne, Önen,
//! "Funshade", ePrint 2022/1688; [BM25] describes its Rust re-implementation), mapped onto
//! privmatch's three parties:
//!
//! * **P0 and P1 evaluate.** Each holds an additive Z_2^32 share of every enrolled template
//!   (quantised embedding `y`, see [`quantize`]) and of its squared norm.
//! * **P2 is the dealer** (Funshade's R_setup, a trusted third party for correlated
//!   randomness). It alone knows the threshold θ and hides it in the keys it deals. It deals
//!   per session over templates masked once with masks only it can derive
//!   ([`mask_dealer`], [`masked`]), its keys sealed to P0 and P1 and used once; P2 never sees
//!   a template or a probe.
//! * **The client** (sensor / enrolment station) quantises the embedding and splits it into
//!   two additive shares sealed to P0 and P1.
//! * **The coordinator** routes sealed messages. The verifier (R_res) is the client that
//!   asked: the evaluators seal their output shares to the reply key in its probe
//!   ([`reply`]), so the coordinator relays ciphertext and learns no comparison bit.
//!
//! ## One comparison (party b ∈ {0, 1}; all arithmetic wraps in Z_2^32)
//!
//! Dealer ([`funshade::deal`], Funshade's `setup`): fresh seeds s_0, s_1 expand to the mask
//! shares δx_b, δy_b ∈ Z^l (so δx = δx_0 + δx_1, δy = δy_0 + δy_1); c = ⟨δx, δy⟩ is split
//! c = c_0 + c_1; a random input mask r_in of the sign gate and the threshold are split as
//! r_0 + r_1 = r_in − θ (cosine) or r_in + θ (squared Euclidean); the sign gate keys
//! (interval containment [0, 2^31 − 1] with input mask r_in, Boyle et al. 2020/1392, see
//! [`crate::crypto::fss`]). Party b's key is (s_b, c_b, r_b, IC key_b): its size does not grow with
//! l, because the mask vectors are expanded from the seed.
//!
//! Evaluation, given the probe shares x_b and the template shares y_b:
//! 1. ([`funshade::masked_inputs`], Funshade's `share`) send x_b + δx_b and y_b + δy_b; both
//!    learn Δx = x + δx and Δy = y + δy, which reveal nothing (δ is uniform and unknown).
//! 2. ([`funshade::distance_shares`], `eval_dist`) the share
//!    d_b = b·⟨Δx, Δy⟩ − ⟨Δx, δy_b⟩ − ⟨Δy, δx_b⟩ + c_b of ⟨x, y⟩ gives z_b = d_b + r_b
//!    (cosine) or 2·d_b − ‖x‖²_b − ‖y‖²_b + r_b (Euclidean). Send z_b; both learn
//!    z = v + r_in with v = ⟨x, y⟩ − θ or θ − ‖x − y‖².
//! 3. ([`funshade::sign_shares`], `eval_sign`) o_b = Eval^IC(b, key_b, z): o_0 + o_1 = 1
//!    exactly when v ≥ 0 (as a signed 32-bit value, guaranteed by [`quantize`]'s bound).
//! 4. ([`funshade::reconstruct`], `res`) the verifier (the client, [`reply::open_face_result`])
//!    adds o_0 + o_1.
//!
//! Unlike the Digidow setting of [BM25], neither evaluator holds an input in the clear (both are
//! secret-shared), so step 1 sends both masked vectors: 8·l bytes per comparison per party,
//! plus 4 bytes in step 2. Every key is single-use: reusing one with a different input would
//! reveal the difference of the inputs (Δx − Δx′ = x − x′). The party's database enforces
//! that (see the extension's `face` module).
//!
//! For 1:N at scale, [`masked`] masks each enrolled template once with a dealer-known mask
//! (opened once as Δy = y + δy) so that a comparison costs 8 online bytes per party; its
//! messages from the dealer are in [`mask_dealer`].

pub mod dealer;
pub mod encoding;
pub mod enroll;
pub mod funshade;
pub mod mask_dealer;
pub mod masked;
pub mod opening;
pub mod probe;
pub mod quantize;
pub mod reply;
pub mod service;

use crate::crypto::fss::FssError;
use crate::crypto::seal::SealError;
use crate::embedding::EmbeddingError;
use crate::wire::envelope::EnvelopeError;

/// The distance metric the dealer configures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Scalar product of L2-normalised embeddings: match when ⟨x, y⟩ ≥ θ.
    Cosine,
    /// Squared Euclidean distance: match when ‖x − y‖² ≤ θ.
    Euclidean,
}

impl Metric {
    /// Parses `"cosine"` or `"euclidean"`.
    pub fn parse(text: &str) -> Result<Self, FaceError> {
        match text {
            "cosine" => Ok(Metric::Cosine),
            "euclidean" => Ok(Metric::Euclidean),
            other => Err(FaceError::BadMetric(other.chars().take(32).collect())),
        }
    }

    /// `"cosine"` or `"euclidean"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::Euclidean => "euclidean",
        }
    }

    pub(crate) fn to_byte(self) -> u8 {
        match self {
            Metric::Cosine => 1,
            Metric::Euclidean => 2,
        }
    }

    pub(crate) fn from_byte(byte: u8) -> Result<Self, FaceError> {
        match byte {
            1 => Ok(Metric::Cosine),
            2 => Ok(Metric::Euclidean),
            _ => Err(FaceError::Malformed("unknown metric tag")),
        }
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the face modality. Never contains embedding values, shares or key material
/// (the one float it names is an out-of-range input element, reported to its owner).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaceError {
    /// The embedding dimension is outside 128..=1024.
    #[error("unsupported embedding dimension {0}: privmatch supports 128 to 1024")]
    UnsupportedDimension(usize),
    /// The embedding, probe, template or key has another dimension than expected.
    #[error("wrong embedding dimension: expected {expected}, got {got}")]
    WrongDimension {
        /// The dimension required.
        expected: usize,
        /// The dimension found.
        got: usize,
    },
    /// An element is not finite or outside [−1, 1], or the zero vector was to be normalised
    /// (the shared checks of [`crate::embedding`]).
    #[error(transparent)]
    Embedding(#[from] EmbeddingError),
    /// A threshold outside the metric's range.
    #[error("the threshold is outside the range of the {metric} metric (cosine: -1..1, euclidean: 0..4·l)")]
    BadThreshold {
        /// The metric.
        metric: Metric,
        /// The threshold given.
        value: f64,
    },
    /// An unknown metric name.
    #[error("unknown metric {0:?}: expected \"cosine\" or \"euclidean\"")]
    BadMetric(String),
    /// The bytes do not follow the documented layout.
    #[error("malformed face message: {0}")]
    Malformed(&'static str),
    /// A sealed object was opened by a party other than the one inside.
    #[error("face message carries the share of party {inside}, but was opened by party {me}")]
    PartyMismatch {
        /// The party index written inside.
        inside: u8,
        /// The party that opened it.
        me: u8,
    },
    /// A probe sealed for another session.
    #[error("face probe was sealed for another session")]
    WrongSession,
    /// A probe sealed for another target (another subject, or verification instead of
    /// identification).
    #[error("face probe was sealed for another comparison (another subject, or a verification rather than an identification)")]
    WrongTarget,
    /// A face probe in a layout this version no longer accepts (version 1 carried no reply
    /// key, so its result could only be revealed to the coordinator; version 2 left the
    /// verified subject to the coordinator).
    #[error("face probe format version {0} is no longer accepted: since extension 0.12.0 a probe (version 3 or later) carries the requesting client's reply key, to which P0 and P1 seal their outputs, and a verification's verified subject inside the sealed probe (version 1 had no reply key, version 2 sent the subject beside the probe, in the clear at the coordinator); seal it again with privmatch 0.12 or later")]
    UnsupportedProbeVersion(u8),
    /// An evaluator's sealed output does not open for the client or does not fit what was
    /// relayed beside it (docs/protocols/face.md §13).
    #[error("the sealed output of P{party} is refused: {why}")]
    SealedOutput {
        /// The evaluator whose output is refused.
        party: u8,
        /// Why.
        why: &'static str,
    },
    /// Only P0 and P1 hold face shares and keys.
    #[error("party {0} does not evaluate face comparisons (only P0 and P1 do)")]
    NotAnEvaluator(u8),
    /// The output shares do not add up to a bit: the parties disagree or a message was
    /// corrupted.
    #[error("comparison {0}: the output shares do not reconstruct to 0 or 1")]
    NotABit(usize),
    /// Sealing or opening failed.
    #[error(transparent)]
    Seal(#[from] SealError),
    /// A subject id or bundle framing was refused.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// A function-secret-sharing key could not be decoded.
    #[error(transparent)]
    Fss(#[from] FssError),
}

impl FaceError {
    /// Whether a face message or probe was meant for another party or sealed to another key
    /// (see [`SealError::is_for_another_party`]), rather than altered.
    pub fn is_for_another_party(&self) -> bool {
        match self {
            FaceError::Seal(e) => e.is_for_another_party(),
            FaceError::PartyMismatch { .. } => true,
            _ => false,
        }
    }
}
