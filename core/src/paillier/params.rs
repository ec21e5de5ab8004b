//! # Parameters of the packed Paillier matching protocols and their derived slot layout
//!
//! [ABMR20] = Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile
//! Devices for Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363.
//!
//! [`Params`] are what the device D, the service provider SP and the terminal T agree on: the
//! template length ℓ, the bit length m of an element (two's complement, so an element lies in
//! [−2^(m−1), 2^(m−1))), the Paillier modulus size, the statistical parameter λ, the bound ζ²
//! on the squared L2 norm of the templates (the enrolment of Π2/Π3 proves ‖u‖² ≤ ζ² with the
//! proof of [ABMR20] §8.3; the terminal's own measurement must obey it too), and the protocol
//! (Π1 §5, Π2 §6, Π3 §7). Their canonical byte encoding ([`Params::to_bytes`]) is bound into
//! the service provider's signature on an encrypted template.
//!
//! [`Layout`] is derived from them: the slot width k, the slot positions, the values per
//! ciphertext n and the ciphertexts per template t = ⌈ℓ/n⌉ of the packing of [ABMR20] §4
//! (see `encoding.rs` for the packing itself and the derivation of the bounds used here).
//!
//! ## Slot positions: a 3-term-progression-free set
//!
//! The level-1 encoding puts value i in slot p_i; the product of two level-1 encodings puts
//! u_i·w_j in slot p_i + p_j. The wanted u_i·w_i sits in slot 2p_i and must not share it with
//! any u_j·w_k, j ≠ k: 2p_i = p_j + p_k has no solution with j ≠ k exactly when {p_i} contains
//! no three-term arithmetic progression (a Salem–Spencer set). [ABMR20] §4.2 uses
//! p_i = 2^(i−1) − 1, which is such a set but spends 2^n level-2 slots on n values; we use a
//! largest progression-free subset of [0, P) for the smallest P that holds n values: found by
//! exhaustive backtracking for P ≤ [`EXACT_SEARCH_LIMIT`] (computed once per process,
//! deterministic: the lexicographically first largest set), and beyond that the Salem–Spencer
//! set of the integers whose base-3 digits are all 0 or 1. For n = 8 this gives span 14
//! instead of 128 level-1 slots (27 instead of 255 level-2 slots).

use rug::integer::Order;
use rug::{Complete, Integer};
use std::sync::OnceLock;

/// The encoding version of [`Params::to_bytes`].
pub const PARAMS_VERSION: u8 = 1;

/// Magic prefix of the canonical parameter encoding.
const PARAMS_MAGIC: &[u8; 4] = b"PMPP";

/// The default statistical parameter λ (bits), as in [ABMR20] §9.
pub const DEFAULT_STAT_BITS: u32 = 40;

/// Template lengths ℓ accepted.
pub const DIM_RANGE: std::ops::RangeInclusive<usize> = 1..=4096;

/// Element bit lengths m accepted.
pub const VALUE_BITS_RANGE: std::ops::RangeInclusive<u32> = 2..=24;

/// Statistical parameters λ accepted.
pub const STAT_BITS_RANGE: std::ops::RangeInclusive<u32> = 40..=128;

/// Paillier modulus sizes the protocols accept (1024 bits only through the test-only
/// constructor).
pub const PROTOCOL_MODULUS_BITS: [u32; 2] = [2048, 3072];

/// The largest P for which the slot positions come from an exhaustive search. Every layout
/// with λ ≥ 40 and |N| ≤ 3072 needs P ≤ 32 (a slot is then at least 47 bits wide, and the 2P − 1
/// level-2 slots must fit in 3070 bits).
pub const EXACT_SEARCH_LIMIT: u32 = 60;

/// The smallest bit length of Π2's random prime multiplier a (see [`Layout::multiplier_bits`]).
pub const MIN_PRIME_MULTIPLIER_BITS: u32 = 64;

/// Which protocol of [ABMR20] the parameters are for; it decides the slot width (Π2 and Π3
/// multiply the inner product by a random a and add a random b before decryption).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Π1, [ABMR20] §5, Fig. 3: all parties semi-honest; D learns the inner product.
    Pi1,
    /// Π2, [ABMR20] §6: malicious device; T learns the inner product.
    Pi2,
    /// Π3, [ABMR20] §7, Fig. 5: malicious device, no leakage (garbled circuit comparison).
    Pi3,
}

impl Protocol {
    /// The protocols, in order.
    pub const ALL: [Protocol; 3] = [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3];

    /// The protocols' names in the API, the CLI, SQL and the docs (the one spelling), in the
    /// order of [`Self::ALL`].
    pub const NAMES: [&'static str; 3] = ["pi1", "pi2", "pi3"];

    /// The protocol's name: `pi1`, `pi2` or `pi3`.
    pub fn name(self) -> &'static str {
        Self::NAMES[usize::from(self.code() - 1)]
    }

    /// The protocol named `name` (one of [`Self::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The byte naming the protocol in [`Params::to_bytes`].
    pub fn code(self) -> u8 {
        match self {
            Protocol::Pi1 => 1,
            Protocol::Pi2 => 2,
            Protocol::Pi3 => 3,
        }
    }

    /// The protocol named by `code` (see [`Self::code`]).
    pub fn from_code(code: u8) -> Result<Self, ParamsError> {
        match code {
            1 => Ok(Protocol::Pi1),
            2 => Ok(Protocol::Pi2),
            3 => Ok(Protocol::Pi3),
            other => Err(ParamsError::Field {
                field: "protocol",
                reason: format!("unknown protocol code {other}"),
            }),
        }
    }
}

/// What can be wrong with parameters (every message names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    /// A field out of its accepted range.
    #[error("Paillier parameters: field `{field}`: {reason}")]
    Field {
        /// The offending field.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// Not even one value per ciphertext fits the plaintext space.
    #[error("Paillier parameters: no slot layout fits: {0}")]
    NoLayout(String),
    /// A malformed canonical encoding.
    #[error("Paillier parameters encoding: {0}")]
    Encoding(String),
}

fn field(field: &'static str, reason: impl Into<String>) -> ParamsError {
    ParamsError::Field {
        field,
        reason: reason.into(),
    }
}

/// The agreed parameters of a matching deployment ([ABMR20] §3 Fig. 1 "Parameters": ℓ, m, ζ,
/// plus the Paillier modulus size, the statistical parameter λ of §9 and the protocol).
/// Construct with [`Params::new`]; the fields are validated and the [`Layout`] is derived once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// Every field of the parameters is kept once, in the layout derived from them.
    layout: Layout,
}

impl Params {
    /// Validated parameters: `dim` (ℓ) in 1..=4096, `value_bits` (m) in 2..=24,
    /// `modulus_bits` 2048 or 3072, `stat_bits` (λ) in 40..=128, `norm_bound` (ζ², the bound on
    /// ‖u‖² and ‖w‖²) in 1..=ℓ·2^(2(m−1)), and a slot layout that holds at least one value.
    pub fn new(
        protocol: Protocol,
        dim: usize,
        value_bits: u32,
        modulus_bits: u32,
        stat_bits: u32,
        norm_bound: Integer,
    ) -> Result<Self, ParamsError> {
        if !PROTOCOL_MODULUS_BITS.contains(&modulus_bits) {
            return Err(field(
                "modulus_bits",
                format!("{modulus_bits}; accepted: {PROTOCOL_MODULUS_BITS:?}"),
            ));
        }
        Self::build(
            protocol,
            dim,
            value_bits,
            modulus_bits,
            stat_bits,
            norm_bound,
        )
    }

    /// [`Params::new`] with λ = [`DEFAULT_STAT_BITS`].
    pub fn with_default_stat_bits(
        protocol: Protocol,
        dim: usize,
        value_bits: u32,
        modulus_bits: u32,
        norm_bound: Integer,
    ) -> Result<Self, ParamsError> {
        Self::new(
            protocol,
            dim,
            value_bits,
            modulus_bits,
            DEFAULT_STAT_BITS,
            norm_bound,
        )
    }

    /// Test-only: as [`Params::new`] but also accepts a 1024-bit modulus (fast test keys).
    #[cfg(test)]
    pub(crate) fn new_allowing_test_modulus(
        protocol: Protocol,
        dim: usize,
        value_bits: u32,
        modulus_bits: u32,
        stat_bits: u32,
        norm_bound: Integer,
    ) -> Result<Self, ParamsError> {
        if modulus_bits != 1024 && !PROTOCOL_MODULUS_BITS.contains(&modulus_bits) {
            return Err(field("modulus_bits", format!("{modulus_bits}")));
        }
        Self::build(
            protocol,
            dim,
            value_bits,
            modulus_bits,
            stat_bits,
            norm_bound,
        )
    }

    fn build(
        protocol: Protocol,
        dim: usize,
        value_bits: u32,
        modulus_bits: u32,
        stat_bits: u32,
        norm_bound: Integer,
    ) -> Result<Self, ParamsError> {
        // Layout::derive validates the fields.
        let layout = Layout::derive(
            protocol,
            dim,
            value_bits,
            modulus_bits,
            stat_bits,
            &norm_bound,
        )?;
        Ok(Self { layout })
    }

    /// ℓ·2^(2(m−1)): the largest squared norm of an ℓ-vector of m-bit elements, and the largest
    /// accepted `norm_bound`.
    pub fn max_norm_bound(dim: usize, value_bits: u32) -> Integer {
        Integer::from(dim) << (2 * value_bits.saturating_sub(1))
    }

    /// The protocol.
    pub fn protocol(&self) -> Protocol {
        self.layout.protocol()
    }

    /// ℓ, the template length.
    pub fn dim(&self) -> usize {
        self.layout.dim()
    }

    /// m, the bit length of a template element (two's complement).
    pub fn value_bits(&self) -> u32 {
        self.layout.value_bits()
    }

    /// |N| in bits.
    pub fn modulus_bits(&self) -> u32 {
        self.layout.modulus_bits()
    }

    /// λ, the statistical parameter.
    pub fn stat_bits(&self) -> u32 {
        self.layout.stat_bits()
    }

    /// ζ², the bound on ‖u‖² and ‖w‖²; also IP_max, the bound on |⟨u, w⟩| (Cauchy–Schwarz).
    pub fn norm_bound(&self) -> &Integer {
        self.layout.ip_bound()
    }

    /// The derived slot layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The canonical, versioned encoding, bound into the service provider's signature on an
    /// encrypted template ([ABMR20] §6.1: σ signs (epk, ⟦u*⟧); we add the parameters so that a
    /// signed template cannot be replayed under another layout):
    /// `"PMPP" ‖ version (1) ‖ protocol (1) ‖ ℓ (u32 BE) ‖ m (1) ‖ |N| (u16 BE) ‖ λ (u16 BE) ‖
    /// len (u16 BE) ‖ ζ² (len bytes, big-endian, no leading zero)`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let norm = self.norm_bound().to_digits::<u8>(Order::Msf);
        let mut out = Vec::with_capacity(16 + norm.len());
        out.extend_from_slice(PARAMS_MAGIC);
        out.push(PARAMS_VERSION);
        out.push(self.protocol().code());
        // dim ≤ 4096, value_bits ≤ 24, modulus_bits ≤ 3072, stat_bits ≤ 128: the narrowing
        // conversions below are exact for validated parameters.
        out.extend_from_slice(&(self.dim() as u32).to_be_bytes());
        out.push(self.value_bits() as u8);
        out.extend_from_slice(&(self.modulus_bits() as u16).to_be_bytes());
        out.extend_from_slice(&(self.stat_bits() as u16).to_be_bytes());
        out.extend_from_slice(&(norm.len() as u16).to_be_bytes());
        out.extend_from_slice(&norm);
        out
    }

    /// Parameters from their canonical encoding ([`Self::to_bytes`]), validated as by
    /// [`Params::new`] (so a 1024-bit modulus is refused); anything but the exact canonical
    /// form (wrong magic or version, a leading zero byte in ζ², trailing bytes) is refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ParamsError> {
        let bad = |reason: &str| ParamsError::Encoding(reason.to_owned());
        // magic 4, version 1, protocol 1, ℓ 4, m 1, |N| 2, λ 2, length 2.
        const HEADER: usize = 17;
        if bytes.len() < HEADER {
            return Err(bad("shorter than the fixed header"));
        }
        if &bytes[0..4] != PARAMS_MAGIC {
            return Err(bad("wrong magic"));
        }
        if bytes[4] != PARAMS_VERSION {
            return Err(ParamsError::Encoding(format!(
                "version {}, expected {PARAMS_VERSION}",
                bytes[4]
            )));
        }
        let protocol = Protocol::from_code(bytes[5])?;
        let dim = u32::from_be_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]) as usize;
        let value_bits = u32::from(bytes[10]);
        let modulus_bits = u32::from(u16::from_be_bytes([bytes[11], bytes[12]]));
        let stat_bits = u32::from(u16::from_be_bytes([bytes[13], bytes[14]]));
        let len = usize::from(u16::from_be_bytes([bytes[15], bytes[16]]));
        let norm = &bytes[HEADER..];
        if norm.len() != len {
            return Err(ParamsError::Encoding(format!(
                "norm bound: {} bytes, length field says {len}",
                norm.len()
            )));
        }
        if norm.first() == Some(&0) {
            return Err(bad("norm bound has a leading zero byte"));
        }
        let norm_bound = Integer::from_digits(norm, Order::Msf);
        Self::new(
            protocol,
            dim,
            value_bits,
            modulus_bits,
            stat_bits,
            norm_bound,
        )
    }
}

/// The range checks of [`Params::new`] that do not concern the modulus.
fn validate_fields(
    dim: usize,
    value_bits: u32,
    stat_bits: u32,
    norm_bound: &Integer,
) -> Result<(), ParamsError> {
    if !DIM_RANGE.contains(&dim) {
        return Err(field("dim", format!("{dim}; accepted: {DIM_RANGE:?}")));
    }
    if !VALUE_BITS_RANGE.contains(&value_bits) {
        return Err(field(
            "value_bits",
            format!("{value_bits}; accepted: {VALUE_BITS_RANGE:?}"),
        ));
    }
    if !STAT_BITS_RANGE.contains(&stat_bits) {
        return Err(field(
            "stat_bits",
            format!("{stat_bits}; accepted: {STAT_BITS_RANGE:?}"),
        ));
    }
    let max_norm = Params::max_norm_bound(dim, value_bits);
    if *norm_bound < 1 || *norm_bound > max_norm {
        return Err(field(
            "norm_bound",
            format!("{norm_bound}; accepted: 1..={max_norm} (ℓ·2^(2(m−1)))"),
        ));
    }
    Ok(())
}

/// The slot layout of the packing ([ABMR20] §4, with the deviations documented in
/// `encoding.rs`): every quantity the encoder, the terminal and the device need, derived from
/// [`Params`] by [`Layout::derive`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    protocol: Protocol,
    dim: usize,
    value_bits: u32,
    modulus_bits: u32,
    stat_bits: u32,
    ip_bound: Integer,
    slot_bits: u32,
    positions: Vec<u32>,
    ciphertexts: usize,
    multiplier_bits: u32,
    max_multiplier: Integer,
    content_bits: u32,
    mask_bits: u32,
    addend_bits: u32,
}

/// ⌈log2 x⌉ for x ≥ 1 (0 for x = 1).
fn ceil_log2(x: u64) -> u32 {
    if x <= 1 {
        0
    } else {
        u64::BITS - (x - 1).leading_zeros()
    }
}

/// The smallest e with 2^e ≥ x, for x ≥ 1.
fn ceil_log2_integer(x: &Integer) -> u32 {
    if *x <= 1 {
        return 0;
    }
    (x - 1u32).complete().significant_bits()
}

impl Layout {
    /// Derives the layout (this is where the slot width is chosen; the bounds are justified
    /// in `encoding.rs`'s module documentation):
    ///
    /// * a ∈ [1, A]: A = 1 for Π1; Π2: a is a random prime of κ bits (see
    ///   [`Self::multiplier_bits`]); Π3: a is uniform in [1, 2^λ);
    /// * γ = bits(A·ζ²): every slot of a·Σ_c u_c*·w_c* is below 2^γ in absolute value;
    /// * masks (and the zero-sum ρ) are uniform in [−2^W, 2^W) with W = γ + λ + ⌈log2 S⌉, S the
    ///   level-2 slot count, so that the S masked values together are within 2^−(λ+1) of
    ///   uniform;
    /// * b (Π2, Π3) is uniform in [0, 2^B) with B = γ + λ + 1;
    /// * the fullest slot (the last diagonal one, which also carries b and −Σρ) is below
    ///   2^γ + 2^B + (n − 1)·2^W, and k is the smallest width whose signed range holds it;
    /// * n is the largest count whose 2·max(p) + 1 level-2 slots of k bits fit in |N| − 2
    ///   bits (so the signed plaintext stays below N/2 in absolute value); then t = ⌈ℓ/n⌉ and n
    ///   is lowered to ⌈ℓ/t⌉ (same t, fewer slots, less work).
    pub fn derive(
        protocol: Protocol,
        dim: usize,
        value_bits: u32,
        modulus_bits: u32,
        stat_bits: u32,
        norm_bound: &Integer,
    ) -> Result<Self, ParamsError> {
        // Params::new has checked all this; repeated so that a direct call cannot overflow.
        validate_fields(dim, value_bits, stat_bits, norm_bound)?;
        if !(1024..=4096).contains(&modulus_bits) {
            return Err(field("modulus_bits", format!("{modulus_bits}")));
        }
        let ip_bits = norm_bound.significant_bits();
        let (multiplier_bits, max_multiplier) = match protocol {
            Protocol::Pi1 => (0, Integer::from(1)),
            Protocol::Pi2 => {
                let kappa = prime_multiplier_bits(stat_bits, ip_bits);
                (kappa, (Integer::from(1) << kappa) - 1u32)
            }
            Protocol::Pi3 => (stat_bits, (Integer::from(1) << stat_bits) - 1u32),
        };
        let content_bits = (&max_multiplier * norm_bound).complete().significant_bits();
        let addend_bits = match protocol {
            Protocol::Pi1 => 0,
            Protocol::Pi2 | Protocol::Pi3 => content_bits + stat_bits + 1,
        };
        let budget = u64::from(modulus_bits.saturating_sub(2));
        let shape = |n: usize| -> (Vec<u32>, u32, u32, u32) {
            let positions = ap_free_positions(n);
            let span2 = 2 * positions.last().copied().unwrap_or(0) + 1;
            let mask_bits = content_bits + stat_bits + ceil_log2(u64::from(span2));
            let mut bound = Integer::from(1) << content_bits;
            bound += Integer::from(1) << addend_bits;
            bound += Integer::from(n.saturating_sub(1).max(1)) << mask_bits;
            let slot_bits = 1 + ceil_log2_integer(&bound);
            (positions, span2, mask_bits, slot_bits)
        };
        let fits = |span2: u32, slot_bits: u32| u64::from(span2) * u64::from(slot_bits) <= budget;
        let mut best = 0usize;
        for n in 1..=dim {
            let (_, span2, _, slot_bits) = shape(n);
            if !fits(span2, slot_bits) {
                break;
            }
            best = n;
        }
        if best == 0 {
            let (_, _, _, slot_bits) = shape(1);
            return Err(ParamsError::NoLayout(format!(
                "one {slot_bits}-bit slot does not fit a {modulus_bits}-bit modulus"
            )));
        }
        let ciphertexts = dim.div_ceil(best);
        let n = dim.div_ceil(ciphertexts);
        let (positions, _, mask_bits, slot_bits) = shape(n);
        Ok(Self {
            protocol,
            dim,
            value_bits,
            modulus_bits,
            stat_bits,
            ip_bound: norm_bound.clone(),
            slot_bits,
            positions,
            ciphertexts,
            multiplier_bits,
            max_multiplier,
            content_bits,
            mask_bits,
            addend_bits,
        })
    }

    /// The protocol the layout is for.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// ℓ.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// m.
    pub fn value_bits(&self) -> u32 {
        self.value_bits
    }

    /// |N| in bits.
    pub fn modulus_bits(&self) -> u32 {
        self.modulus_bits
    }

    /// λ.
    pub fn stat_bits(&self) -> u32 {
        self.stat_bits
    }

    /// IP_max = ζ²: |⟨u, w⟩| ≤ ‖u‖·‖w‖ ≤ ζ² ([ABMR20] §6.1's IP_Max, signed).
    pub fn ip_bound(&self) -> &Integer {
        &self.ip_bound
    }

    /// k, the width of a slot in bits; a slot holds a signed value v with |v| < 2^(k−1).
    pub fn slot_bits(&self) -> u32 {
        self.slot_bits
    }

    /// The level-1 slot positions p_0 < … < p_(n−1) (a 3-AP-free set, p_0 = 0).
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// n, the template values per ciphertext.
    pub fn values_per_ciphertext(&self) -> usize {
        self.positions.len()
    }

    /// t = ⌈ℓ/n⌉, the ciphertexts per template.
    pub fn ciphertexts(&self) -> usize {
        self.ciphertexts
    }

    /// Slots of a level-1 encoding: max(p) + 1.
    pub fn level1_slots(&self) -> u32 {
        self.positions.last().copied().unwrap_or(0) + 1
    }

    /// Slots of a level-2 encoding: 2·max(p) + 1 (all of them fit in |N| − 2 bits).
    pub fn level2_slots(&self) -> u32 {
        2 * self.positions.last().copied().unwrap_or(0) + 1
    }

    /// The level-2 slots holding the wanted products: 2p_i.
    pub fn diagonal_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.positions.iter().map(|p| 2 * p)
    }

    /// Whether level-2 slot `s` is a diagonal slot (some 2p_i).
    pub fn is_diagonal(&self, s: u32) -> bool {
        s.is_multiple_of(2) && self.positions.binary_search(&(s / 2)).is_ok()
    }

    /// The bit length κ of the multiplier a: 0 for Π1 (a = 1); for Π2 a random prime of κ
    /// bits, κ the smallest value ≥ [`MIN_PRIME_MULTIPLIER_BITS`] with
    /// ⌊(κ + 1 + bits(ζ²))/(κ − 1)⌋ · κ / 2^(κ−1) ≤ 2^−λ (the chance that a κ-bit prime divides
    /// a shift the device picks without knowing a: such a shift is below 2^(κ+1+bits(ζ²)) when
    /// the shifted result stays in range, so it has at most the first factor's count of κ-bit
    /// prime factors, among at least 2^(κ−1)/κ κ-bit primes); for Π3 λ (a uniform in [1, 2^λ):
    /// the garbled circuit checks an equation, not a divisibility).
    pub fn multiplier_bits(&self) -> u32 {
        self.multiplier_bits
    }

    /// A, the largest multiplier a the layout leaves room for (1 for Π1).
    pub fn max_multiplier(&self) -> &Integer {
        &self.max_multiplier
    }

    /// γ = bits(A·ζ²): every slot of a·Σ_c u_c*·w_c* is below 2^γ in absolute value.
    pub fn content_bits(&self) -> u32 {
        self.content_bits
    }

    /// W: masks and zero-sum shares are uniform in [−2^W, 2^W).
    pub fn mask_bits(&self) -> u32 {
        self.mask_bits
    }

    /// B: the addend b (Π2, Π3) is below 2^B (0 for Π1: b = 0).
    pub fn addend_bits(&self) -> u32 {
        self.addend_bits
    }
}

/// κ for Π2 (see [`Layout::multiplier_bits`]).
fn prime_multiplier_bits(stat_bits: u32, ip_bits: u32) -> u32 {
    let mut kappa = MIN_PRIME_MULTIPLIER_BITS;
    loop {
        let factors = (kappa + 1 + ip_bits) / (kappa - 1);
        let log2_error = f64::from(factors.max(1) * kappa).log2() - f64::from(kappa - 1);
        if log2_error <= -f64::from(stat_bits) {
            return kappa;
        }
        kappa += 1;
    }
}

/// For each P in 0..=[`EXACT_SEARCH_LIMIT`], a largest 3-AP-free subset of [0, P): the
/// lexicographically first one found by the search (deterministic).
fn exact_table() -> &'static [Vec<u32>] {
    static TABLE: OnceLock<Vec<Vec<u32>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let limit = EXACT_SEARCH_LIMIT as usize;
        let mut best: Vec<Vec<u32>> = vec![Vec::new(), vec![0]];
        let mut sizes: Vec<usize> = vec![0, 1];
        for p in 2..=limit {
            // r3(P) ≤ r3(P − 1) + 1; a set one larger than r3(P − 1) fits neither in [0, P − 1)
            // nor in [1, P), so it contains 0 and P − 1.
            let target = sizes[p - 1] + 1;
            match search_with_ends(p as u32, target, &sizes) {
                Some(set) => {
                    best.push(set);
                    sizes.push(target);
                }
                None => {
                    best.push(best[p - 1].clone());
                    sizes.push(sizes[p - 1]);
                }
            }
        }
        best
    })
}

/// A 3-AP-free subset of [0, p) of `target` elements containing 0 and p − 1, if one exists.
/// Backtracking in increasing order; `sizes[q]` = r3(q) for q < p prunes: at most r3(p − y)
/// elements lie in [y, p).
fn search_with_ends(p: u32, target: usize, sizes: &[usize]) -> Option<Vec<u32>> {
    fn dfs(p: u32, target: usize, sizes: &[usize], chosen: &mut Vec<u32>, forbidden: u64) -> bool {
        if chosen.len() == target {
            return chosen.last() == Some(&(p - 1));
        }
        let last = chosen.last().copied().unwrap_or(0);
        for y in last + 1..p {
            if chosen.len() + sizes[(p - y) as usize] < target {
                return false;
            }
            if forbidden >> y & 1 == 1 {
                continue;
            }
            // y is the largest element so far: adding it forbids 2y − x for every chosen x.
            let mut next = forbidden;
            for &x in chosen.iter() {
                let z = 2 * y - x;
                if z < p {
                    next |= 1u64 << z;
                }
            }
            chosen.push(y);
            if dfs(p, target, sizes, chosen, next) {
                return true;
            }
            chosen.pop();
        }
        false
    }
    let mut chosen = vec![0u32];
    if p == 1 {
        return (target == 1).then_some(chosen);
    }
    dfs(p, target, sizes, &mut chosen, 0).then_some(chosen)
}

/// `n` slot positions without a 3-term arithmetic progression, 0 first, with the smallest
/// maximum the exact search knows; beyond it the first n integers whose base-3 digits are 0
/// or 1 (Salem–Spencer; x + z = 2y has no carries in base 3 there, so it forces x = z).
/// Layouts ask for n ≤ ℓ ≤ 4096; fewer than n come back only past 2^20 positions.
pub fn ap_free_positions(n: usize) -> Vec<u32> {
    let table = exact_table();
    if let Some(set) = table.iter().find(|s| s.len() >= n) {
        return set[..n].to_vec();
    }
    (0u32..=u32::MAX)
        .filter(|&x| {
            let mut y = x;
            while y > 0 {
                if y % 3 == 2 {
                    return false;
                }
                y /= 3;
            }
            true
        })
        .take(n)
        .collect()
}

/// Whether `set` (sorted, distinct) has no three-term arithmetic progression.
pub fn is_ap_free(set: &[u32]) -> bool {
    for (i, &x) in set.iter().enumerate() {
        for &z in &set[i + 1..] {
            let sum = u64::from(x) + u64::from(z);
            if sum.is_multiple_of(2) && set.binary_search(&((sum / 2) as u32)).is_ok() {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_protocol_has_one_name_and_one_code() {
        for (i, p) in Protocol::ALL.into_iter().enumerate() {
            assert_eq!(p.name(), Protocol::NAMES[i]);
            assert_eq!(Protocol::from_name(p.name()), Some(p));
            assert_eq!(Protocol::from_code(p.code()), Ok(p));
        }
        assert_eq!(Protocol::NAMES, ["pi1", "pi2", "pi3"]);
        for other in ["", "Pi1", "pi4", "semi-honest", "1"] {
            assert_eq!(Protocol::from_name(other), None, "{other:?}");
        }
    }

    fn max_params(protocol: Protocol, dim: usize, m: u32, bits: u32) -> Params {
        Params::new_allowing_test_modulus(
            protocol,
            dim,
            m,
            bits,
            DEFAULT_STAT_BITS,
            Params::max_norm_bound(dim, m),
        )
        .unwrap()
    }

    #[test]
    fn exact_search_matches_known_r3_values() {
        // OEIS A003002 (r3(P) for P = 1..): 1, 2, 2, 3, 4, 4, 4, 4, 5, 5, 6, 6, 7, 8, 8, 8, 8, 8,
        // 8, 9, 9, 9, 9, 10, 10, 11, 11, 11, 11, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 16.
        let known = [
            1, 2, 2, 3, 4, 4, 4, 4, 5, 5, 6, 6, 7, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 11, 11,
            11, 11, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 16,
        ];
        let table = exact_table();
        for (i, &r) in known.iter().enumerate() {
            assert_eq!(table[i + 1].len(), r, "r3({})", i + 1);
        }
        assert_eq!(table[EXACT_SEARCH_LIMIT as usize].len(), 19);
        for set in table {
            assert!(is_ap_free(set), "{set:?}");
            assert!(set.iter().all(|&x| x < 64));
        }
    }

    #[test]
    fn positions_are_ap_free_and_compact() {
        for n in 1..=40 {
            let p = ap_free_positions(n);
            assert_eq!(p.len(), n);
            assert_eq!(p[0], 0);
            assert!(p.windows(2).all(|w| w[0] < w[1]));
            assert!(is_ap_free(&p), "{p:?}");
            // Far better than the paper's 2^(n−1) − 1.
            if n >= 4 {
                assert!(u64::from(*p.last().unwrap()) < (1u64 << (n - 1)) - 1);
            }
        }
        assert_eq!(ap_free_positions(8), vec![0, 1, 3, 4, 9, 10, 12, 13]);
        assert!(!is_ap_free(&[0, 1, 2]));
        assert!(!is_ap_free(&[1, 4, 7]));
    }

    #[test]
    fn layouts_fit_and_leave_room() {
        for protocol in [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3] {
            for bits in [1024u32, 2048, 3072] {
                for dim in [1usize, 7, 128, 256, 1024, 4096] {
                    for m in [2u32, 8, 16, 24] {
                        let params = max_params(protocol, dim, m, bits);
                        let l = params.layout();
                        assert!(l.level2_slots() * l.slot_bits() <= bits - 2);
                        assert!(l.values_per_ciphertext() * l.ciphertexts() >= dim);
                        assert!(
                            (l.values_per_ciphertext() - 1) * l.ciphertexts() < dim,
                            "n is as small as t allows"
                        );
                        assert!(is_ap_free(l.positions()));
                        assert!(l.mask_bits() >= l.content_bits() + DEFAULT_STAT_BITS);
                        assert!(l.slot_bits() > l.mask_bits());
                        if protocol != Protocol::Pi1 {
                            assert!(l.slot_bits() > l.addend_bits());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn prime_multiplier_bits_meet_the_error_bound() {
        assert_eq!(prime_multiplier_bits(40, 59), 64);
        for lambda in STAT_BITS_RANGE {
            let kappa = prime_multiplier_bits(lambda, 60);
            assert!(kappa >= 64);
            let f = (kappa + 1 + 60) / (kappa - 1);
            assert!(f64::from(f * kappa).log2() - f64::from(kappa - 1) <= -f64::from(lambda));
        }
    }

    #[test]
    fn validation_names_the_field() {
        let ok = |p: Protocol, dim, m, bits, lambda, norm: Integer| {
            Params::new(p, dim, m, bits, lambda, norm)
        };
        let norm = Integer::from(1000);
        let err = |r: Result<Params, ParamsError>, f: &str| {
            let e = r.unwrap_err();
            assert!(e.to_string().contains(f), "{e} should name {f}");
        };
        err(ok(Protocol::Pi1, 0, 8, 2048, 40, norm.clone()), "dim");
        err(ok(Protocol::Pi1, 4097, 8, 2048, 40, norm.clone()), "dim");
        err(
            ok(Protocol::Pi1, 16, 1, 2048, 40, norm.clone()),
            "value_bits",
        );
        err(
            ok(Protocol::Pi1, 16, 25, 2048, 40, norm.clone()),
            "value_bits",
        );
        err(
            ok(Protocol::Pi1, 16, 8, 1024, 40, norm.clone()),
            "modulus_bits",
        );
        err(
            ok(Protocol::Pi1, 16, 8, 4096, 40, norm.clone()),
            "modulus_bits",
        );
        err(
            ok(Protocol::Pi1, 16, 8, 2048, 39, norm.clone()),
            "stat_bits",
        );
        err(
            ok(Protocol::Pi1, 16, 8, 2048, 40, Integer::from(0)),
            "norm_bound",
        );
        let max = Params::max_norm_bound(16, 8);
        assert_eq!(max, 16 * (1 << 14));
        err(
            ok(Protocol::Pi1, 16, 8, 2048, 40, max.clone() + 1u32),
            "norm_bound",
        );
        assert!(ok(Protocol::Pi1, 16, 8, 2048, 40, max).is_ok());
        // λ = 128 with the widest elements: still at least one value per ciphertext.
        let p = ok(
            Protocol::Pi2,
            4096,
            24,
            2048,
            128,
            Params::max_norm_bound(4096, 24),
        )
        .unwrap();
        assert!(p.layout().values_per_ciphertext() >= 1);
    }

    #[test]
    fn canonical_encoding_round_trips_and_is_strict() {
        let p =
            Params::with_default_stat_bits(Protocol::Pi2, 256, 16, 3072, Integer::from(1u64 << 30))
                .unwrap();
        let bytes = p.to_bytes();
        assert_eq!(&bytes[..4], b"PMPP");
        assert_eq!(Params::from_bytes(&bytes).unwrap(), p);
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Params::from_bytes(&longer).is_err());
        assert!(Params::from_bytes(&bytes[..bytes.len() - 1]).is_err());
        let mut version = bytes.clone();
        version[4] = 2;
        assert!(Params::from_bytes(&version).is_err());
        let mut proto = bytes.clone();
        proto[5] = 9;
        assert!(Params::from_bytes(&proto)
            .unwrap_err()
            .to_string()
            .contains("protocol"));
        let test_only = max_params(Protocol::Pi1, 8, 8, 1024);
        assert!(Params::from_bytes(&test_only.to_bytes()).is_err());
        // Every field is bound: changing one changes the bytes.
        let other =
            Params::with_default_stat_bits(Protocol::Pi3, 256, 16, 3072, Integer::from(1u64 << 30))
                .unwrap();
        assert_ne!(other.to_bytes(), bytes);
    }
}
