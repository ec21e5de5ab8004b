//! # Function secret sharing: DCF and the interval-containment gate
//!
//! Pure-Rust implementation of two primitives of Boyle, Chandran, Gilboa, Gupta, Ishai, Kumar
//! and Rathee, "Function Secret Sharing for Mixed-Mode and Fixed-Point Secure Computation"
//! (ePrint 2020/1392, here "BCG+21"):
//!
//! * [`dcf`]: the distributed comparison function of BCG+21 Fig. 1 (Gen^< / Eval^<) for
//!   `f_{α,β}(x) = β if x < α else 0`, x and α n-bit unsigned (n ≤ 32, bits MSB first), output
//!   group Z_2^32;
//! * [`ic`]: the interval-containment gate of BCG+21 §4 (Fig. 3, Gen^IC_{n,p,q} / Eval^IC),
//!   one DCF key plus one correction share per party, with the Funshade sign gate
//!   ([`ic::gen_sign_gate`]: p = 0, q = 2^31 − 1, n = 32) as a special case;
//! * [`aes`]: the fixed-key AES-128 permutation behind the PRG (VAES / AES-NI with a portable
//!   fallback, runtime dispatch) and the seed expander [`aes::expand_u32`].
//!
//! All group arithmetic is in Z_2^32 with wrapping `u32` operations. Evaluating parties are
//! b ∈ {0, 1} (`u8`; anything else is [`FssError::BadParty`]).
//!
//! ## API at a glance
//!
//! | step | one key | many keys |
//! |---|---|---|
//! | DCF Gen (Fig. 1) | [`dcf::gen`] | [`dcf::gen_batch`] (4 keys in lockstep) |
//! | DCF Eval (Fig. 1) | [`dcf::eval`] | [`dcf::eval_batch`] on a [`dcf::DcfKeyBatch`] |
//! | IC Gen (Fig. 3) | [`ic::gen`], [`ic::gen_sign_gate`] | [`ic::gen_batch`], [`ic::gen_sign_gates`] |
//! | IC Eval (Fig. 3) | [`ic::eval`] | [`ic::eval_batch`] on an [`ic::IcKeyBatch`] |
//!
//! Every entry point has a `*_with(Backend, …)` twin that pins the AES backend (tests,
//! benchmarks); keys and shares are bit-identical on every backend.
//!
//! ## The PRG G
//!
//! BCG+21 needs G: {0,1}^λ → {0,1}^{2(λ+1)} × G² producing, from a seed s, the children
//! s^L‖t^L, s^R‖t^R and the values v^L, v^R. We use λ = 126 (a seed is a 128-bit block whose
//! two low bits are zero) and the fixed-key Matyas–Meyer–Oseas construction
//!
//! ```text
//! H_c(s) = π(s ⊕ c) ⊕ s ⊕ c,     π = AES-128 under the public key K_π
//! out_L = H_{c_L}(s)   s^L = out_L with bits 0,1 cleared   t^L = bit 0 of out_L
//! out_R = H_{c_R}(s)   s^R = out_R with bits 0,1 cleared   t^R = bit 1 of out_R
//! out_V = H_{c_V}(s)   v^L = bytes 0..4 of out_V (LE)      v^R = bytes 4..8 of out_V (LE)
//! Convert(s^(n)) = bytes 4..8 of s^(n) (LE)   (bits 32..63; never the cleared low bits)
//! ```
//!
//! K_π, c_L, c_R, c_V are the first four 128-bit words of the hexadecimal expansion of π's
//! fractional part (`243F6A88…`, the Blowfish P-array), i.e. nothing-up-my-sleeve values;
//! see [`aes::FIXED_KEY`]. Blocks are read as little-endian `u128`s. In the random-permutation
//! model π(s ⊕ c) ⊕ s ⊕ c is pseudorandom for a uniform secret s as long as nobody queries π
//! at s ⊕ c, which needs guessing a 126-bit seed. One key for all three outputs keeps the
//! round keys in registers; the tweaks separate the outputs.
//!
//! Evaluation only needs the branch it takes: H_{c_L} or H_{c_R} (1 block) and H_{c_V}
//! (1 block), i.e. **2 AES blocks per level**; generation needs all three per party (6 per
//! level). Taking t^R from bit 1 (not bit 0) lets the two correction bits t_CW^L, t_CW^R ride
//! in the two free low bits of s_CW, so the correction τ = out ⊕ t·(s_CW‖t_CW bits) is one
//! 128-bit XOR and the next t is bit `x_i` of τ.
//!
//! The AES-NI / VAES engines compute H without separate XORs: the input whitening becomes
//! `s ⊕ (c ⊕ rk_0)` (a table entry picked by the public bit x_i) and the feed-forward rides in
//! the last round key, `aesenclast(y, rk_10 ⊕ s ⊕ c) = π(s ⊕ c) ⊕ s ⊕ c`. With VAES a lane's
//! seed block and value block share one 256-bit register (evaluation), or the two parties'
//! blocks do (generation). The vector units are the bottleneck, so the scalar bookkeeping
//! (t, x_i, V) stays in general-purpose registers. All of this is branch-free and free of
//! secret-dependent memory addresses.
//!
//! ## Key layouts (all integers little-endian)
//!
//! DCF key ([`dcf::DcfKey`]), n levels, `22 + 20·n` bytes ([`dcf::DCF_KEY_LEN`] = 662 for
//! n = 32):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | format tag [`dcf::DCF_KEY_TAG`] = 0x01 (DCF, version 1) |
//! | 1 | 1 | n, 1 ≤ n ≤ 32 |
//! | 2 | 16 | s^(0), the party's root seed (bits 0 and 1 are zero) |
//! | 18 + 20·(i−1) | 16 | CW^(i) seed part: s_CW with bit 0 = t_CW^L, bit 1 = t_CW^R (i = 1..n) |
//! | 34 + 20·(i−1) | 4 | CW^(i) value part V_CW |
//! | 18 + 20·n | 4 | CW^(n+1) |
//!
//! IC key ([`ic::IcKey`]), `35 + 20·n` bytes ([`ic::IC_KEY_LEN`] = 675 for n = 32):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | format tag [`ic::IC_KEY_TAG`] = 0x02 (IC gate, version 1) |
//! | 1 | 4 | p (public interval start, < 2^n) |
//! | 5 | 4 | q (public interval end, < 2^n) |
//! | 9 | 4 | z_b, the party's share of the correction term |
//! | 13 | 22 + 20·n | the party's DCF key, layout above |
//!
//! Decoding checks tag, n, exact length, that p, q fit in n bits and that the root seed has
//! its two low bits clear, and returns [`FssError`] otherwise; it never panics.
//!
//! ## Batches
//!
//! [`dcf::DcfKeyBatch`] / [`ic::IcKeyBatch`] hold many keys of the same n in a
//! structure-of-arrays layout blocked by [`dcf::GROUP`] = 4 keys ("AoSoA"): for group g,
//! level i, lane j the correction word of key 4g + j is at index `g·4n + 4i + j` of
//! `cw_seed` / `cw_value`; root seeds, CW^(n+1) and (IC) p, q, z_b are plain per-key arrays.
//! Build one by decoding stored keys straight into it ([`ic::IcKeyBatch::decode_many`] over
//! any iterator of `&[u8]`, [`ic::IcKeyBatch::decode_concatenated`] over a contiguous
//! buffer with stride [`ic::IC_KEY_LEN`], or `push_encoded` one at a time) or from decoded
//! keys (`from_keys`, `push`). Batch evaluation walks 8 DCF paths (4 IC keys × 2 inputs, or 8
//! DCF keys) through the tree level by level, so every level feeds 16 independent AES blocks
//! into the pipeline, and reads memory sequentially. The storage is padded to a whole group
//! with all-zero keys that are never evaluated; a short last chunk repeats its last key in
//! the spare lanes and discards those results.
//!
//! ## Security notes
//!
//! * A key may be evaluated at any number of points without revealing α (that is what FSS
//!   guarantees); what must not serve two inputs is the *mask* r_in of an IC gate, since two
//!   masked values reveal the difference of the inputs. Funshade's single-use rule for keys
//!   is enforced above this module.
//! * Gen draws its root seeds and z_0 from the caller's `CryptoRng`; there is no internal or
//!   default generator.
//! * Key material is zeroised on drop (`zeroize`); `Debug` never prints it.

pub mod aes;
pub mod dcf;
pub mod ic;

/// Errors of the FSS module: malformed encoded keys and misuse of the evaluation API.
/// Nothing in this module panics on bad input; every failure ends up here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FssError {
    /// An encoded key has the wrong length (truncated, or trailing bytes).
    #[error("{what} has {got} bytes, expected {expected}")]
    BadLength {
        /// Which kind of key.
        what: &'static str,
        /// The length the header (or the minimum header) requires.
        expected: usize,
        /// The length that was given.
        got: usize,
    },
    /// The first byte of an encoded key is not the expected format tag/version.
    #[error("{what}: unknown format tag {tag:#04x}")]
    UnknownFormat {
        /// Which kind of key.
        what: &'static str,
        /// The tag found.
        tag: u8,
    },
    /// The input bit length n is not in 1..=32.
    #[error("input bit length n = {0} is out of range 1..=32")]
    BadBitLength(u32),
    /// A value that must be an n-bit number (α, p, q, r_in) is 2^n or larger.
    #[error("{what} = {value} does not fit in n = {n} bits")]
    OutOfDomain {
        /// Which parameter.
        what: &'static str,
        /// Its value.
        value: u32,
        /// The bit length.
        n: u32,
    },
    /// An encoded key is well-formed in length but not a canonical encoding.
    #[error("non-canonical key encoding: {0}")]
    NonCanonical(&'static str),
    /// Keys of different bit lengths were put into one batch.
    #[error("a batch of n = {expected} keys cannot take a key with n = {got}")]
    MixedBitLength {
        /// The batch's n.
        expected: u32,
        /// The key's n.
        got: u32,
    },
    /// Batch evaluation was given slices of different lengths.
    #[error("batch evaluation: {keys} keys, {inputs} inputs and {outputs} outputs")]
    LengthMismatch {
        /// Number of keys in the batch.
        keys: usize,
        /// Number of public inputs.
        inputs: usize,
        /// Size of the output slice.
        outputs: usize,
    },
    /// The evaluating party index is not 0 or 1 (BCG+21's b ∈ {0, 1}).
    #[error("evaluating party must be 0 or 1, got {0}")]
    BadParty(u8),
    /// A specific AES backend was requested that this CPU does not support.
    #[error("AES backend {0} is not available on this CPU")]
    BackendUnavailable(&'static str),
}

/// Checks an evaluating party index b ∈ {0, 1} (BCG+21's Eval(b, ·, ·)).
pub(crate) fn check_party(party: u8) -> Result<u32, FssError> {
    match party {
        0 | 1 => Ok(u32::from(party)),
        _ => Err(FssError::BadParty(party)),
    }
}

/// Checks 1 ≤ n ≤ 32 and returns the mask of the n-bit domain (2^n − 1).
pub(crate) fn domain_mask(n: u32) -> Result<u32, FssError> {
    if (1..=32).contains(&n) {
        Ok(u32::MAX >> (32 - n))
    } else {
        Err(FssError::BadBitLength(n))
    }
}
