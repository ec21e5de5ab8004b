//! # Π1: matching with all parties semi-honest ([ABMR20] §5, Fig. 3)
//!
//! [ABMR20] = Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile
//! Devices for Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363.
//!
//! * **Enrolment** (Fig. 3): the device D encodes its template u into t level-1 plaintexts
//!   u_c* and encrypts them under its own Paillier key by the owner's CRT path
//!   ([`encrypt_template`]); the service provider just stores them.
//! * **Round 1** D → T ([`Pi1Round1`]): (epk, ⟦u_1*⟧ … ⟦u_t*⟧), with the canonical
//!   parameters. Reusable across sessions.
//! * **Round 2** T → D ([`Pi1Round2`]): ⟦Mask(z + ρ)⟧ with z = Σ_c u_c*·w_c* computed
//!   homomorphically (multi-exponentiation, see `encoding.rs`), ρ a zero-sum vector on the
//!   diagonal slots, Mask's random values on the others, re-randomised with a fresh r^N so that
//!   the ciphertext is a fresh encryption and says nothing about how T computed it.
//! * **Round 3** D → T ([`Pi1Round3`]): D decrypts, decodes, sums the n slots into
//!   IP = ⟨u, w⟩ and sends the bit [IP ≥ threshold]. Both output the bit.
//!
//! Leakage: D learns IP (the paper's L_dev); T learns only the bit. The threshold T is a public
//! parameter in [ABMR20] Fig. 1; here it travels in Round 2 next to the ciphertext (D checks
//! |T| ≤ ζ²), and it is the service provider's policy threshold, which the SP's signature on
//! Round 2 covers ([`Pi1Device::round3_signed`], `signed_round2.rs`).
//!
//! **Cost** (the `timings` test; release, one core of a 2-vCPU AMD EPYC, ℓ = 256, m = 16,
//! |N| = 3072, n = 8, t = 32): T's Round 2 about 23 ms with an r^N taken from a pool filled
//! offline (about 51 ms computing r^N on the spot), D's Round 3 about 11 ms (the CRT
//! decryption), Round 1 25 KB (reusable), Round 2 778 bytes. [ABMR20] §9 reports 24 ms for the
//! whole matching phase on a laptop.

use super::cipher::{Ciphertext, PublicKey, SecretKey};
use super::encoding::{check_template, decode_sum, encode_template, mask_affine_product};
use super::messages::{
    check_session_params, decode_bit, encode_bit, header, put_template, read_template, to_i64,
    MatchError, MessageKind, Reader,
};
use super::params::{Params, Protocol};
use super::precomputed::{inner_product_with, PrecomputedTemplate};
use super::signed_round2::VerifiedRound2;
use rand_core::{CryptoRng, RngCore};
use rug::Integer;
use std::sync::Arc;

/// Π1 enrolment ([ABMR20] Fig. 3, enrolment steps 1–2): Encode1 of the template u (checked:
/// length ℓ, m-bit elements, ‖u‖² ≤ ζ²) into t plaintexts, each encrypted by the key owner
/// with the CRT.
pub fn encrypt_template<R: RngCore + CryptoRng + ?Sized>(
    secret: &SecretKey,
    params: &Params,
    u: &[i32],
    rng: &mut R,
) -> Result<Vec<Ciphertext>, MatchError> {
    if secret.public_key().modulus_bits() != params.modulus_bits() {
        return Err(MatchError::Argument {
            argument: "secret",
            reason: format!(
                "{}-bit key, the parameters say {} bits",
                secret.public_key().modulus_bits(),
                params.modulus_bits()
            ),
        });
    }
    let pk = secret.public_key();
    encode_template(params.layout(), "u", u)?
        .iter()
        .map(|x| {
            let m = pk.reduce_signed(x)?;
            Ok(secret.encrypt(&m, rng)?)
        })
        .collect()
}

/// Π1 Round 1, D → T ([ABMR20] Fig. 3 Round 1): the public key and the t packed template
/// ciphertexts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pi1Round1 {
    /// epk.
    pub public_key: PublicKey,
    /// ⟦u_1*⟧ … ⟦u_t*⟧.
    pub template: Vec<Ciphertext>,
}

impl Pi1Round1 {
    /// `version ‖ kind ‖ template fields` (see `messages.rs`).
    pub fn to_bytes(&self, params: &Params) -> Vec<u8> {
        let mut out = header(MessageKind::Pi1Template);
        put_template(&mut out, params, &self.public_key, &self.template);
        out
    }

    /// Strict decoding against the expected parameters.
    pub fn from_bytes(params: &Params, bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("Π1 round 1", bytes, MessageKind::Pi1Template)?;
        let (public_key, template) = read_template(&mut r, params)?;
        r.finish()?;
        Ok(Self {
            public_key,
            template,
        })
    }
}

/// Π1 Round 2, T → D ([ABMR20] Fig. 3 Round 2 step 4): ⟦Mask(z + ρ)⟧, and the threshold the
/// device compares with (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pi1Round2 {
    /// The threshold T of the terminal.
    pub threshold: i64,
    /// The masked level-2 encoding of the inner product.
    pub ciphertext: Ciphertext,
}

impl Pi1Round2 {
    /// `version ‖ kind ‖ threshold (i64 BE, two's complement) ‖ ciphertext`.
    pub fn to_bytes(&self, pk: &PublicKey) -> Vec<u8> {
        let mut out = header(MessageKind::Pi1Masked);
        out.extend_from_slice(&self.threshold.to_be_bytes());
        out.extend_from_slice(&pk.ciphertext_to_bytes(&self.ciphertext));
        out
    }

    /// Strict decoding for the key `pk`.
    pub fn from_bytes(pk: &PublicKey, bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("Π1 round 2", bytes, MessageKind::Pi1Masked)?;
        let t = r.take(8, "threshold")?;
        let threshold = i64::from_be_bytes([t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]]);
        let ciphertext = r.ciphertext(pk, "masked ciphertext")?;
        r.finish()?;
        Ok(Self {
            threshold,
            ciphertext,
        })
    }
}

/// Π1 Round 3, D → T ([ABMR20] Fig. 3 Round 3 step 2): the match bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pi1Round3 {
    /// [IP ≥ threshold].
    pub matched: bool,
}

impl Pi1Round3 {
    /// `version ‖ kind ‖ bit`.
    pub fn to_bytes(&self) -> Vec<u8> {
        encode_bit(MessageKind::Pi1Outcome, self.matched)
    }

    /// Strict decoding: one byte 0 or 1.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MatchError> {
        let matched = decode_bit("Π1 round 3", MessageKind::Pi1Outcome, bytes)?;
        Ok(Self { matched })
    }
}

/// What the device outputs in Π1 ([ABMR20] Fig. 3 "Output Computation", and L_dev = IP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOutcome {
    /// The match bit [IP ≥ threshold].
    pub matched: bool,
    /// IP = ⟨u, w⟩, the leakage to the device.
    pub inner_product: i64,
}

/// The device D of Π1: its key and its enrolled encrypted template. Answers Round 2
/// messages statelessly (each session is one Round 2 → Round 3 exchange).
pub struct Pi1Device {
    params: Params,
    secret: SecretKey,
    template: Vec<Ciphertext>,
}

impl std::fmt::Debug for Pi1Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pi1Device")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl Pi1Device {
    /// Enrolment ([ABMR20] Fig. 3): encrypts `u` with [`encrypt_template`].
    pub fn enrol<R: RngCore + CryptoRng + ?Sized>(
        params: Params,
        secret: SecretKey,
        u: &[i32],
        rng: &mut R,
    ) -> Result<Self, MatchError> {
        let template = encrypt_template(&secret, &params, u, rng)?;
        Self::from_encrypted(params, secret, template)
    }

    /// A device from an encrypted template enrolled earlier (e.g. restored from storage).
    pub fn from_encrypted(
        params: Params,
        secret: SecretKey,
        template: Vec<Ciphertext>,
    ) -> Result<Self, MatchError> {
        check_session_params(&params, Protocol::Pi1, 0)?;
        if secret.public_key().modulus_bits() != params.modulus_bits() {
            return Err(MatchError::Argument {
                argument: "secret",
                reason: "key size differs from the parameters".into(),
            });
        }
        if template.len() != params.layout().ciphertexts() {
            return Err(MatchError::Argument {
                argument: "template",
                reason: format!(
                    "{} ciphertexts, expected t = {}",
                    template.len(),
                    params.layout().ciphertexts()
                ),
            });
        }
        Ok(Self {
            params,
            secret,
            template,
        })
    }

    /// The encrypted template (what the service provider stores).
    pub fn template(&self) -> &[Ciphertext] {
        &self.template
    }

    /// The public key.
    pub fn public_key(&self) -> &PublicKey {
        self.secret.public_key()
    }

    /// Round 1 ([ABMR20] Fig. 3 Round 1), encoded.
    pub fn round1(&self) -> Vec<u8> {
        Pi1Round1 {
            public_key: self.secret.public_key().clone(),
            template: self.template.clone(),
        }
        .to_bytes(&self.params)
    }

    /// Round 3 on a Round 2 the pinned service provider signed for this device and session
    /// (`signed_round2`), whose threshold must be the signed policy threshold: the only Round 3
    /// a device that talks through an untrusted relay makes (a relay's own Round 2, or the SP's
    /// ciphertext beside a lowered threshold, gets no answer and so no signed bit).
    pub fn round3_signed(
        &self,
        round2: &VerifiedRound2,
    ) -> Result<(Vec<u8>, DeviceOutcome), MatchError> {
        if round2.fields().protocol != Protocol::Pi1 {
            return Err(MatchError::Unsigned("not a Π1 Round 2".into()));
        }
        let msg = Pi1Round2::from_bytes(self.secret.public_key(), round2.payload())?;
        round2.require_threshold(msg.threshold)?;
        self.round3(round2.payload())
    }

    /// Round 3 ([ABMR20] Fig. 3 Round 3): decrypts the Round 2 ciphertext, decodes and sums
    /// the slots into IP, compares with the threshold; returns the encoded bit for T and the
    /// device's outcome.
    pub fn round3(&self, round2: &[u8]) -> Result<(Vec<u8>, DeviceOutcome), MatchError> {
        let msg = Pi1Round2::from_bytes(self.secret.public_key(), round2)?;
        check_session_params(&self.params, Protocol::Pi1, msg.threshold)?;
        let ip = decode_sum(&self.secret, self.params.layout(), &msg.ciphertext)?;
        if ip.clone().abs() > *self.params.norm_bound() {
            return Err(MatchError::Wire {
                message: "Π1 round 2",
                reason: "the decoded inner product exceeds ζ²".into(),
            });
        }
        let inner_product = to_i64("inner product", &ip)?;
        let matched = inner_product >= msg.threshold;
        Ok((
            Pi1Round3 { matched }.to_bytes(),
            DeviceOutcome {
                matched,
                inner_product,
            },
        ))
    }
}

#[derive(Debug)]
enum TerminalState {
    AwaitingRound1,
    AwaitingRound3,
    Done(bool),
}

/// The terminal T of Π1 for one session: its measurement w and the threshold.
#[derive(Debug)]
pub struct Pi1Terminal {
    params: Params,
    w: Vec<i32>,
    threshold: i64,
    state: TerminalState,
    /// The offline tables of the device's template (see [`super::precomputed`]), if any.
    precomputed: Option<Arc<PrecomputedTemplate>>,
}

impl Pi1Terminal {
    /// A session with measurement `w` (checked: length ℓ, m-bit elements, ‖w‖² ≤ ζ²).
    pub fn new(params: Params, w: Vec<i32>, threshold: i64) -> Result<Self, MatchError> {
        check_session_params(&params, Protocol::Pi1, threshold)?;
        check_template(params.layout(), "w", &w)?;
        Ok(Self {
            params,
            w,
            threshold,
            state: TerminalState::AwaitingRound1,
            precomputed: None,
        })
    }

    /// Uses the terminal's offline tables of the device's Round 1 template for Round 2 (see
    /// [`super::precomputed`]): the same Round 2 message, fewer squarings. A Round 1 whose
    /// template is not the tables' is refused.
    pub fn with_precomputed(mut self, tables: Arc<PrecomputedTemplate>) -> Self {
        self.precomputed = Some(tables);
        self
    }

    /// Round 2 ([ABMR20] Fig. 3 Round 2) with a fresh r^N computed now.
    pub fn round2<R: RngCore + CryptoRng + ?Sized>(
        &mut self,
        round1: &[u8],
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        let msg = Pi1Round1::from_bytes(&self.params, round1)?;
        let r_to_n = msg.public_key.random_nonce_power(rng);
        self.respond(msg, &r_to_n, rng)
    }

    /// Round 2 with an r^N precomputed offline for the device's key (e.g. from a
    /// [`super::cipher::NoncePool`]; it must be fresh).
    pub fn round2_with_nonce_power<R: RngCore + CryptoRng + ?Sized>(
        &mut self,
        round1: &[u8],
        r_to_n: &Integer,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        let msg = Pi1Round1::from_bytes(&self.params, round1)?;
        self.respond(msg, r_to_n, rng)
    }

    fn respond<R: RngCore + CryptoRng + ?Sized>(
        &mut self,
        msg: Pi1Round1,
        r_to_n: &Integer,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        if !matches!(self.state, TerminalState::AwaitingRound1) {
            return Err(MatchError::State("Π1 round 2 was already sent".into()));
        }
        // Steps 1–4: Encode1(w), ⟦z⟧ = ⟦Σ u_c*·w_c*⟧, ρ, ⟦Mask(z + ρ)⟧ (a = 1, b = 0).
        let layout = self.params.layout();
        let (pk, tables) = (&msg.public_key, self.precomputed.as_deref());
        let product = inner_product_with(tables, pk, layout, &msg.template, &self.w)?;
        let (one, zero) = (Integer::from(1), Integer::new());
        let ciphertext = mask_affine_product(pk, layout, &product, &one, &zero, r_to_n, rng)?;
        self.state = TerminalState::AwaitingRound3;
        Ok(Pi1Round2 {
            threshold: self.threshold,
            ciphertext,
        }
        .to_bytes(&msg.public_key))
    }

    /// Output computation ([ABMR20] Fig. 3): the bit D sent in Round 3.
    pub fn finish(&mut self, round3: &[u8]) -> Result<bool, MatchError> {
        if !matches!(self.state, TerminalState::AwaitingRound3) {
            return Err(MatchError::State(
                "Π1 round 3 arrives only after round 2".into(),
            ));
        }
        let matched = Pi1Round3::from_bytes(round3)?.matched;
        self.state = TerminalState::Done(matched);
        Ok(matched)
    }

    /// The threshold of this session.
    pub fn threshold(&self) -> i64 {
        self.threshold
    }

    /// The output once the session is over.
    pub fn outcome(&self) -> Option<bool> {
        match self.state {
            TerminalState::Done(b) => Some(b),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::{key_2048, small_key};
    use super::super::messages::test_support::{clone_key, dot, random_vector};
    use super::super::params::DEFAULT_STAT_BITS;
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn params(dim: usize, m: u32, bits: u32, norm: Integer) -> Params {
        Params::new_allowing_test_modulus(Protocol::Pi1, dim, m, bits, DEFAULT_STAT_BITS, norm)
            .unwrap()
    }

    fn run(
        device: &Pi1Device,
        params: &Params,
        w: &[i32],
        threshold: i64,
        rng: &mut ChaCha20Rng,
    ) -> (bool, DeviceOutcome) {
        let mut terminal = Pi1Terminal::new(params.clone(), w.to_vec(), threshold).unwrap();
        let r2 = terminal.round2(&device.round1(), rng).unwrap();
        let (r3, outcome) = device.round3(&r2).unwrap();
        let t = terminal.finish(&r3).unwrap();
        assert_eq!(terminal.outcome(), Some(t));
        (t, outcome)
    }

    /// With the terminal's offline tables ([`super::super::precomputed`]): outputs equal the
    /// plaintext comparison at IP − 1, IP, IP + 1, and tables of another device's template are
    /// refused with an error naming them, leaving the terminal able to run.
    #[test]
    fn sessions_with_offline_tables_equal_the_plaintext_comparison() {
        let mut rng = ChaCha20Rng::seed_from_u64(101);
        let (dim, m) = (20, 16);
        let params = params(dim, m, 1024, Params::max_norm_bound(dim, m));
        let key = small_key();
        let other_u = random_vector(dim, m, &mut rng);
        let other = Pi1Device::enrol(params.clone(), clone_key(key), &other_u, &mut rng).unwrap();
        let stale = Arc::new(
            PrecomputedTemplate::new(key.public_key(), params.layout(), other.template()).unwrap(),
        );
        for i in 0..30 {
            let u = random_vector(dim, m, &mut rng);
            let w = random_vector(dim, m, &mut rng);
            let device = Pi1Device::enrol(params.clone(), clone_key(key), &u, &mut rng).unwrap();
            let tables = Arc::new(
                PrecomputedTemplate::new(key.public_key(), params.layout(), device.template())
                    .unwrap(),
            );
            let ip = dot(&u, &w);
            let threshold = ip - 1 + (i % 3);
            let mut terminal = Pi1Terminal::new(params.clone(), w.clone(), threshold)
                .unwrap()
                .with_precomputed(tables);
            let r2 = terminal.round2(&device.round1(), &mut rng).unwrap();
            let (r3, outcome) = device.round3(&r2).unwrap();
            assert_eq!(outcome.inner_product, ip);
            assert_eq!(terminal.finish(&r3).unwrap(), ip >= threshold);
            let mut wrong = Pi1Terminal::new(params.clone(), w, threshold)
                .unwrap()
                .with_precomputed(stale.clone());
            let err = wrong.round2(&device.round1(), &mut rng).unwrap_err();
            assert!(err.to_string().contains("precomputed"), "{err}");
        }
    }

    /// Thousands of random pairs (1024-bit key, small ℓ), thresholds at IP − 1, IP, IP + 1 and
    /// random: both outputs equal the plaintext comparison, and D's IP is exact.
    #[test]
    fn outputs_equal_the_plaintext_comparison_on_many_pairs() {
        let mut rng = ChaCha20Rng::seed_from_u64(100);
        let dim = 6;
        let m = 8;
        let params = params(dim, m, 1024, Params::max_norm_bound(dim, m));
        let bound = params.norm_bound().to_i64().unwrap();
        let mut matches = 0;
        let pairs = 1500;
        for i in 0..pairs {
            let u = random_vector(dim, m, &mut rng);
            let w = random_vector(dim, m, &mut rng);
            let ip = dot(&u, &w);
            let threshold = match i % 4 {
                0 => ip - 1,
                1 => ip,
                2 => ip + 1,
                _ => (rng.next_u64() % (2 * bound as u64)) as i64 - bound,
            }
            .clamp(-bound, bound);
            let device =
                Pi1Device::enrol(params.clone(), clone_key(small_key()), &u, &mut rng).unwrap();
            let (t, d) = run(&device, &params, &w, threshold, &mut rng);
            assert_eq!(d.inner_product, ip);
            assert_eq!(
                t,
                ip >= threshold,
                "pair {i}: ip {ip}, threshold {threshold}"
            );
            assert_eq!(d.matched, t);
            matches += usize::from(t);
        }
        assert!(matches > pairs / 4 && matches < pairs);
    }

    /// A small norm bound with extreme elements (the Cauchy–Schwarz sizing) and a few runs at
    /// 2048 bits with ℓ = 256, m = 16.
    #[test]
    fn extreme_and_realistic_shapes() {
        let mut rng = ChaCha20Rng::seed_from_u64(101);
        // ζ² = 2^14: one element may be ±2^7·… at most; vectors concentrated on a few entries.
        let p = params(40, 16, 1024, Integer::from(1u32 << 30));
        let mut u = vec![0i32; 40];
        let mut w = vec![0i32; 40];
        u[3] = -32768;
        w[3] = -32768;
        let device = Pi1Device::enrol(p.clone(), clone_key(small_key()), &u, &mut rng).unwrap();
        let (t, d) = run(&device, &p, &w, 1 << 30, &mut rng);
        assert_eq!(d.inner_product, 1 << 30);
        assert!(t);
        w[3] = 32767;
        let (t, d) = run(&device, &p, &w, -(1 << 30), &mut rng);
        assert_eq!(d.inner_product, -32768 * 32767);
        assert!(t);
        let p = params(256, 16, 2048, Params::max_norm_bound(256, 16));
        for i in 0..3 {
            let u = random_vector(256, 16, &mut rng);
            let w = random_vector(256, 16, &mut rng);
            let ip = dot(&u, &w);
            let threshold = ip + i - 1;
            let device = Pi1Device::enrol(p.clone(), clone_key(key_2048()), &u, &mut rng).unwrap();
            let (t, d) = run(&device, &p, &w, threshold, &mut rng);
            assert_eq!(d.inner_product, ip);
            assert_eq!(t, ip >= threshold);
        }
    }

    #[test]
    fn tampered_and_out_of_order_messages_are_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(102);
        let p = params(12, 8, 1024, Params::max_norm_bound(12, 8));
        let u = random_vector(12, 8, &mut rng);
        let w = random_vector(12, 8, &mut rng);
        let device = Pi1Device::enrol(p.clone(), clone_key(small_key()), &u, &mut rng).unwrap();
        let r1 = device.round1();
        let fresh = || Pi1Terminal::new(p.clone(), w.clone(), 0).unwrap();
        // Round 1: truncated, extended, wrong kind, wrong version, other parameters, a
        // ciphertext replaced by 0, an extra ciphertext with the count adjusted.
        let mut t = fresh();
        assert!(t.round2(&r1[..r1.len() - 1], &mut rng).is_err());
        let mut longer = r1.clone();
        longer.push(0);
        assert!(t.round2(&longer, &mut rng).is_err());
        let mut kind = r1.clone();
        kind[1] = MessageKind::Pi2Template as u8;
        assert!(t.round2(&kind, &mut rng).is_err());
        let mut version = r1.clone();
        version[0] = 9;
        assert!(t.round2(&version, &mut rng).is_err());
        let other = params(12, 8, 1024, Params::max_norm_bound(12, 8) - 1u32);
        let mut t_other = Pi1Terminal::new(other, w.clone(), 0).unwrap();
        let e = t_other.round2(&r1, &mut rng).unwrap_err();
        assert!(e.to_string().contains("parameters"), "{e}");
        let pk = device.public_key();
        let mut zeroed = r1.clone();
        let n = zeroed.len();
        for b in &mut zeroed[n - pk.ciphertext_bytes()..] {
            *b = 0;
        }
        let e = t.round2(&zeroed, &mut rng).unwrap_err();
        assert!(e.to_string().contains("ciphertext"), "{e}");
        let count_at = 2 + 2 + p.to_bytes().len() + pk.modulus_bytes();
        let mut count = r1.clone();
        count[count_at + 3] += 1;
        count.extend_from_slice(&pk.ciphertext_to_bytes(&device.template()[0]));
        let e = t.round2(&count, &mut rng).unwrap_err();
        assert!(e.to_string().contains("expected t"), "{e}");
        // A key of the wrong size.
        let big = Pi1Round1 {
            public_key: key_2048().public_key().clone(),
            template: device.template().to_vec(),
        };
        assert!(t.round2(&big.to_bytes(&p), &mut rng).is_err());
        // Out of order: round 3 before round 2.
        assert!(t.finish(&Pi1Round3 { matched: true }.to_bytes()).is_err());
        // The honest run still works after the refusals.
        let r2 = t.round2(&r1, &mut rng).unwrap();
        assert!(t.round2(&r1, &mut rng).is_err(), "round 2 only once");
        // Round 2 at the device: truncated, wrong kind, not a unit, not an encoding.
        assert!(device.round3(&r2[..r2.len() - 1]).is_err());
        let mut wrong = r2.clone();
        wrong[1] = MessageKind::Pi1Outcome as u8;
        assert!(device.round3(&wrong).is_err());
        let mut zero = r2.clone();
        for b in &mut zero[2..] {
            *b = 0;
        }
        assert!(device.round3(&zero).is_err());
        let junk = pk.encrypt(&(pk.n().clone() >> 1u32), &mut rng).unwrap();
        let e = device
            .round3(
                &Pi1Round2 {
                    threshold: 0,
                    ciphertext: junk.clone(),
                }
                .to_bytes(pk),
            )
            .unwrap_err();
        assert!(e.to_string().contains("decoding"), "{e}");
        let mut far = r2.clone();
        far[2..10].copy_from_slice(&i64::MAX.to_be_bytes());
        let e = device.round3(&far).unwrap_err();
        assert!(e.to_string().contains("threshold"), "{e}");
        // Round 3 at the terminal: not a bit, trailing byte.
        let (r3, _) = device.round3(&r2).unwrap();
        let mut not_bit = r3.clone();
        not_bit[2] = 2;
        assert!(t.finish(&not_bit).is_err());
        let mut trailing = r3.clone();
        trailing.push(1);
        assert!(t.finish(&trailing).is_err());
        assert_eq!(t.finish(&r3).unwrap(), dot(&u, &w) >= 0);
        assert!(t.finish(&r3).is_err(), "only once");
    }

    #[test]
    fn inputs_are_checked() {
        let mut rng = ChaCha20Rng::seed_from_u64(103);
        let p = params(4, 8, 1024, Integer::from(500));
        let e = Pi1Terminal::new(p.clone(), vec![1, 2, 3], 0).unwrap_err();
        assert!(e.to_string().contains('w'), "{e}");
        let e = Pi1Terminal::new(p.clone(), vec![20, 20, 0, 0], 0).unwrap_err();
        assert!(e.to_string().contains("norm"), "{e}");
        let e = Pi1Terminal::new(p.clone(), vec![1, 1, 1, 1], 501).unwrap_err();
        assert!(e.to_string().contains("threshold"), "{e}");
        let e = Pi1Device::enrol(p.clone(), clone_key(small_key()), &[300, 0, 0, 0], &mut rng)
            .unwrap_err();
        assert!(e.to_string().contains("u[0]"), "{e}");
        let e = Pi1Device::enrol(p.clone(), clone_key(key_2048()), &[1, 0, 0, 0], &mut rng)
            .unwrap_err();
        assert!(e.to_string().contains("secret"), "{e}");
        let pi2 =
            Params::new_allowing_test_modulus(Protocol::Pi2, 4, 8, 1024, 40, Integer::from(500))
                .unwrap();
        assert!(Pi1Terminal::new(pi2, vec![1, 1, 1, 1], 0).is_err());
    }
}
