//! # The terminal's offline tables for one device: Round 2 without the Horner squarings
//!
//! [ABMR20] = Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020, ePrint
//! 2020/1363. Round 1 (the device's signed, packed template ⟦u_c*⟧, Fig. 3 / §6.1 / Fig. 5) is
//! reusable: the same ciphertexts come back in every session of a device. The homomorphic inner
//! product of Round 2 (Fig. 3 Round 2 steps 1–2, deviation 5 of [`super::encoding`]) is
//!
//! ```text
//! ⟦z⟧ = Π_c Π_j (⟦u_c*⟧^(2^(k·p_j)))^(w_(c,j))
//! ```
//!
//! with m-bit signed exponents w_(c,j). The online Horner evaluation spends about k·max(p)
//! squarings modulo N² (1,144 at |N| = 3072, ℓ = 256, m = 16 for Π1) to apply the slot shifts
//! 2^(k·p_j), the same in every session. [`PrecomputedTemplate`] does them once per device,
//! offline: for every ciphertext c and slot position j it stores the odd powers 1, 3, …,
//! 2^(W−1) − 1 of B_(c,j) = ⟦u_c*⟧^(2^(k·p_j)) and of B_(c,j)⁻¹. A session is then one
//! interleaved (Straus) multi-exponentiation over the n·t bases with the width-W NAF digits of
//! the w_(c,j): at most m + 1 squarings and about n·t·(m + 1)/(W + 1) multiplications, instead of
//! k·max(p) + m squarings plus the same number of multiplications with the window the online
//! tables can afford.
//!
//! The result is the same integer as [`super::encoding::homomorphic_inner_product`] (a product
//! of the same powers modulo N²), which the tests check. The tables are public data (powers of
//! the device's public ciphertexts) and bound to the exact template they were made from: a
//! session whose Round 1 carries other ciphertexts is refused rather than silently computed
//! with the wrong tables. Like the online path, the evaluation is variable-time in the digits
//! of w (see the side-channel note of [`super::encoding`]).

use super::cipher::{Ciphertext, PublicKey};
use super::encoding::{check_template, odd_powers, wnaf, EncodingError};
use super::params::Layout;
use rug::Integer;

/// The default NAF window W of the offline tables: 2^(W−2) odd powers per sign and base. W = 5
/// keeps a device's tables at 2·8 values modulo N² per base (about 3 MiB at |N| = 3072,
/// ℓ = 256, m = 16) for about (m + 1)/6 multiplications per base online.
pub const PRECOMPUTED_WINDOW: u32 = 5;

/// The windows [`PrecomputedTemplate::with_window`] accepts (2^(W−1) values per base).
pub const PRECOMPUTED_WINDOWS: std::ops::RangeInclusive<u32> = 2..=8;

/// The odd powers of one shifted base B and of B⁻¹ (see the module documentation).
struct BaseTable {
    positive: Vec<Integer>,
    negative: Vec<Integer>,
}

/// A device's Round 1 template with the terminal's offline tables (see the module
/// documentation), for the Round 2 of Π1, Π2 and Π3 ([ABMR20] Fig. 3, §6.1, Fig. 5).
pub struct PrecomputedTemplate {
    n_squared: Integer,
    window: u32,
    template: Vec<Ciphertext>,
    /// Tables of B_(c,j), index c·n + j.
    tables: Vec<BaseTable>,
}

impl std::fmt::Debug for PrecomputedTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrecomputedTemplate")
            .field("ciphertexts", &self.template.len())
            .field("bases", &self.tables.len())
            .finish_non_exhaustive()
    }
}

fn range(argument: &'static str, reason: impl Into<String>) -> EncodingError {
    EncodingError::Range {
        argument,
        reason: reason.into(),
    }
}

/// x^(2^count) mod m, by `count` squarings.
fn square_times(x: &mut Integer, count: u32, m: &Integer) {
    for _ in 0..count {
        x.square_mut();
        *x %= m;
    }
}

impl PrecomputedTemplate {
    /// The tables for `template` (the device's Round 1 ciphertexts under `pk`, laid out as
    /// `layout`): t·k·max(p) squarings, t·n inversions and 2·t·n·2^(W−2) multiplications
    /// modulo N², once per device.
    pub fn new(
        pk: &PublicKey,
        layout: &Layout,
        template: &[Ciphertext],
    ) -> Result<Self, EncodingError> {
        Self::with_window(pk, layout, template, PRECOMPUTED_WINDOW)
    }

    /// As [`Self::new`] with NAF window `window` (in [`PRECOMPUTED_WINDOWS`]): each step up
    /// doubles the tables and saves about a 1/(W + 2) of the online multiplications.
    pub fn with_window(
        pk: &PublicKey,
        layout: &Layout,
        template: &[Ciphertext],
        window: u32,
    ) -> Result<Self, EncodingError> {
        if !PRECOMPUTED_WINDOWS.contains(&window) {
            return Err(range(
                "window",
                format!("{window}; supported: {PRECOMPUTED_WINDOWS:?}"),
            ));
        }
        super::encoding::check_template_ciphertexts(pk, layout, template)?;
        let m = pk.n_squared();
        let count = 1usize << (window - 2);
        let k = layout.slot_bits();
        let mut tables = Vec::with_capacity(template.len() * layout.values_per_ciphertext());
        for (c, ct) in template.iter().enumerate() {
            let mut shifted = ct.as_integer().clone();
            let mut previous = 0u32;
            for &p in layout.positions() {
                square_times(&mut shifted, k.wrapping_mul(p.wrapping_sub(previous)), m);
                previous = p;
                let inverse = shifted.invert_ref(m).map(Integer::from).ok_or_else(|| {
                    range(
                        "template",
                        format!("ciphertext {c} is not a unit modulo N²"),
                    )
                })?;
                tables.push(BaseTable {
                    positive: odd_powers(&shifted, count, m),
                    negative: odd_powers(&inverse, count, m),
                });
            }
        }
        Ok(Self {
            n_squared: m.clone(),
            window,
            template: template.to_vec(),
            tables,
        })
    }

    /// Bytes of limbs the tables hold (for sizing a terminal's cache).
    pub fn table_bytes(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|t| t.positive.iter().chain(&t.negative))
            .map(|x| x.significant_digits::<u8>())
            .sum()
    }

    /// Whether these are the tables of `template` under `pk`.
    pub fn matches(&self, pk: &PublicKey, template: &[Ciphertext]) -> bool {
        pk.n_squared() == &self.n_squared && self.template == template
    }

    /// ⟦Σ_c u_c*·w_c*⟧ for the session whose Round 1 carried `template` ([ABMR20] Fig. 3
    /// Round 2 steps 1–2), equal to [`super::encoding::homomorphic_inner_product`]. `w` is
    /// checked like a template; the tables must be those of `template` under `pk`.
    pub fn inner_product(
        &self,
        pk: &PublicKey,
        layout: &Layout,
        template: &[Ciphertext],
        w: &[i32],
    ) -> Result<Ciphertext, EncodingError> {
        check_template(layout, "w", w)?;
        if !self.matches(pk, template) {
            return Err(range(
                "precomputed",
                "the tables were made for another template or key",
            ));
        }
        let n = layout.values_per_ciphertext();
        if self.tables.len() != template.len().wrapping_mul(n) {
            return Err(range(
                "precomputed",
                "the tables were made for another layout",
            ));
        }
        // Digits as (bit, base index, digit), highest bit first.
        let mut events: Vec<(u32, usize, i32)> = Vec::new();
        for (index, &e) in w.iter().enumerate() {
            for (bit, d) in wnaf(i128::from(e), self.window) {
                events.push((bit, index, d));
            }
        }
        events.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let x = self.straus(&events);
        Ok(pk.ciphertext_from_integer(x)?)
    }

    /// Π over the events of table[base]^digit · 2^bit, by one shared square-and-multiply
    /// (events sorted by bit, highest first).
    fn straus(&self, events: &[(u32, usize, i32)]) -> Integer {
        let m = &self.n_squared;
        let mut acc: Option<Integer> = None;
        let mut current = 0u32;
        for &(bit, index, d) in events {
            if let Some(x) = acc.as_mut() {
                square_times(x, current.wrapping_sub(bit), m);
            }
            let table = &self.tables[index];
            let entry = if d > 0 {
                &table.positive[(d.unsigned_abs() as usize) >> 1]
            } else {
                &table.negative[(d.unsigned_abs() as usize) >> 1]
            };
            match acc.as_mut() {
                Some(x) => {
                    *x *= entry;
                    *x %= m;
                }
                None => acc = Some(entry.clone()),
            }
            current = bit;
        }
        let mut x = acc.unwrap_or_else(|| Integer::from(1));
        square_times(&mut x, current, m);
        x
    }
}

/// ⟦Σ_c u_c*·w_c*⟧ with the offline tables when the terminal has them (and they are the
/// template's), else by the online Horner multi-exponentiation: the same ciphertext either way.
pub fn inner_product_with(
    precomputed: Option<&PrecomputedTemplate>,
    pk: &PublicKey,
    layout: &Layout,
    template: &[Ciphertext],
    w: &[i32],
) -> Result<Ciphertext, EncodingError> {
    match precomputed {
        Some(tables) => tables.inner_product(pk, layout, template, w),
        None => super::encoding::homomorphic_inner_product(pk, layout, template, w),
    }
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::{key_2048, small_key};
    use super::super::cipher::SecretKey;
    use super::super::encoding::{encode_template, homomorphic_inner_product};
    use super::super::messages::test_support::{max_params as params, random_vector as vector};
    use super::super::params::{Params, Protocol};
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn encrypt(sk: &SecretKey, l: &Layout, u: &[i32], rng: &mut ChaCha20Rng) -> Vec<Ciphertext> {
        let pk = sk.public_key();
        encode_template(l, "u", u)
            .unwrap()
            .iter()
            .map(|x| sk.encrypt(&pk.reduce_signed(x).unwrap(), rng).unwrap())
            .collect()
    }

    /// Π1 parameters of the key's size, a random template encrypted under it, and the rng.
    fn fixture(
        sk: &SecretKey,
        dim: usize,
        m: u32,
        seed: u64,
    ) -> (Params, Vec<Ciphertext>, ChaCha20Rng) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let p = params(Protocol::Pi1, dim, m, sk.public_key().modulus_bits());
        let u = vector(dim, m, &mut rng);
        let cts = encrypt(sk, p.layout(), &u, &mut rng);
        (p, cts, rng)
    }

    /// The tables give the same integer as the online Horner path, for random and extreme w
    /// (every element −2^(m−1), 2^(m−1) − 1, 0, ±1) at several shapes and both protocols'
    /// layouts, with the smallest, default and largest window.
    #[test]
    fn tables_give_the_online_ciphertext_bit_for_bit() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(0x7ab1e5);
        for (protocol, dim, m) in [
            (Protocol::Pi1, 1usize, 2u32),
            (Protocol::Pi1, 9, 8),
            (Protocol::Pi1, 20, 16),
            (Protocol::Pi2, 17, 24),
            (Protocol::Pi3, 12, 16),
        ] {
            let p = params(protocol, dim, m, 1024);
            let l = p.layout();
            let u = vector(dim, m, &mut rng);
            let cts = encrypt(sk, l, &u, &mut rng);
            let tables: Vec<PrecomputedTemplate> = [2, PRECOMPUTED_WINDOW, 8]
                .into_iter()
                .map(|window| PrecomputedTemplate::with_window(pk, l, &cts, window).unwrap())
                .collect();
            let half = 1i32 << (m - 1);
            let mut ws: Vec<Vec<i32>> = (0..6).map(|_| vector(dim, m, &mut rng)).collect();
            for fill in [-half, half - 1, 0, 1, -1] {
                let w = vec![fill; dim];
                if check_template(l, "w", &w).is_ok() {
                    ws.push(w);
                }
            }
            for w in ws {
                let online = homomorphic_inner_product(pk, l, &cts, &w).unwrap();
                for table in &tables {
                    let offline = table.inner_product(pk, l, &cts, &w).unwrap();
                    assert_eq!(online, offline, "{protocol:?} ℓ = {dim}, m = {m}");
                }
            }
        }
    }

    /// At 2048 bits, ℓ = 256, m = 16 (the benchmark's shape), one random pair.
    #[test]
    fn tables_match_at_the_benchmark_shape() {
        let sk = key_2048();
        let pk = sk.public_key();
        let (p, cts, mut rng) = fixture(sk, 256, 16, 0x2048_7ab1);
        let l = p.layout();
        let w = vector(256, 16, &mut rng);
        let tables = PrecomputedTemplate::new(pk, l, &cts).unwrap();
        assert!(tables.table_bytes() > 0);
        assert_eq!(
            tables.inner_product(pk, l, &cts, &w).unwrap(),
            homomorphic_inner_product(pk, l, &cts, &w).unwrap()
        );
    }

    /// Tables of one template are refused for another template, another key, and a bad w.
    #[test]
    fn tables_are_bound_to_their_template() {
        let sk = small_key();
        let pk = sk.public_key();
        let (p, cts, mut rng) = fixture(sk, 20, 8, 3);
        let l = p.layout();
        let tables = PrecomputedTemplate::new(pk, l, &cts).unwrap();
        let w = vector(20, 8, &mut rng);
        let mut other = cts.clone();
        other.swap(0, 1);
        let err = tables.inner_product(pk, l, &other, &w).unwrap_err();
        assert!(err.to_string().contains("precomputed"), "{err}");
        let other_key = key_2048().public_key();
        assert!(tables.inner_product(other_key, l, &cts, &w).is_err());
        assert!(tables.inner_product(pk, l, &cts, &w[..19]).is_err());
        assert!(PrecomputedTemplate::new(pk, l, &cts[..1]).is_err());
        for window in [0, 1, 9, u32::MAX] {
            let err = PrecomputedTemplate::with_window(pk, l, &cts, window).unwrap_err();
            assert!(err.to_string().contains("window"), "{err}");
        }
        assert_eq!(
            inner_product_with(Some(&tables), pk, l, &cts, &w).unwrap(),
            inner_product_with(None, pk, l, &cts, &w).unwrap()
        );
    }
}
