//! # Enrolment Π_en as message-driven state machines ([ABMR20] §6.1, §8)
//!
//! Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020, ePrint 2020/1363.
//! The device D enrols its template u with the service provider SP, which signs the packed
//! encrypted template (σ of §6.1) that D presents in every matching session.
//!
//! * Π2 / Π3 (§6.1 "Overview", §8): D appends four slack coordinates so that
//!   Σu_i² + Σs_j² = ζ², encrypts the ℓ + 4 coordinates element by element, proves its key well
//!   formed ([`KeyProof`]) and its plaintexts known (Fig. 9); SP verifies both and challenges
//!   the norm (Fig. 10, y = ζ²); D answers; SP checks, packs the first ℓ ciphertexts (the
//!   slack ciphertexts are dropped) and signs the [`TemplateRecord`].
//! * Π1 (§5, Fig. 3): D packs and encrypts itself, no proofs (semi-honest); SP signs.
//!
//! Messages (all integers big endian, every decoder strict: exact lengths, no trailing bytes):
//!
//! ```text
//! EnrolRequest = "PMER" | version (1) | device id length (1) | device id
//!              | params length (2) | params | N length (2) | N
//!              | key proof length (4) | key proof            (Π2/Π3; length 0 for Π1)
//!              | ciphertext count (2) | ciphertexts (fixed |N²| bytes each)
//!              | plaintext-knowledge proof (fixed length; absent for Π1)
//! challenge    = L2Challenge bytes (proofs.rs), response = L2Response bytes
//! answer       = SignedTemplate bytes (record.rs)
//! ```
//!
//! Both proofs are bound to the caller's session id, the device id and the parameters
//! ([`bound_session`]).
//!
//! **SP state between the two calls** ([`ServiceEnrolment::to_bytes`]): [`L2Verifier`] has no
//! encoding and its coins (α, β, β̂, N̂) have no accessors, so the state keeps the 32-byte seed
//! of the ChaCha20 generator the challenge was drawn with, and [`ServiceEnrolment::from_bytes`]
//! rebuilds the verifier by replaying the coins, which the challenge draws first
//! ([`L2Verifier::redraw`]), without drawing the challenge again (its n + 2 fresh N-th powers
//! are most of the SP's cost: computing them twice doubled it). The state also keeps the
//! SHA-256 digest of the challenge sent, which identifies it; a restore does not recompute
//! the challenge to compare it (the state is written by the SP only, into a table no other
//! role reads). The seed is as secret as α: the stored state must be kept confidential by the
//! database.
use ed25519_dalek::{SigningKey, VerifyingKey};
use rand_chacha::ChaCha20Rng;
use rand_core::{CryptoRng, RngCore, SeedableRng};
use rug::Integer;
use sha2::{Digest, Sha256};

use super::cipher::{Ciphertext, PublicKey, SecretKey};
use super::encoding::{check_template, encode_template};
use super::key_proof::{KeyProof, RingPedersenParams};
use super::params::{Params, Protocol};
use super::pi1::encrypt_template;
use super::pi2::pack_element_ciphertexts;
use super::proofs::{
    encrypt_template_with_nonces_parallel, template_with_slack, L2Challenge, L2Response,
    L2Verifier, PlaintextKnowledgeProof, SLACK_COORDINATES,
};
use super::record::{check_device_id, SignedTemplate, TemplateRecord};

const REQUEST_MAGIC: &[u8; 4] = b"PMER";
const STATE_MAGIC: &[u8; 4] = b"PMES";
const VERSION: u8 = 1;
const SESSION_DOMAIN: &[u8] = b"privmatch paillier enrolment v1";
const REQUEST: &str = "enrolment request";
const STATE: &str = "service enrolment state";
const RESPONSE: &str = "L2 response";
const CHALLENGE: &str = "L2 challenge";
const ANSWER: &str = "signed template";

/// Why an enrolment ([ABMR20] §6.1, §8) was refused; nothing is produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnrolError {
    /// Bytes that do not decode (names the message and what is wrong).
    #[error("{message}: {reason}")]
    Malformed {
        /// The message.
        message: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The parameters differ from the expected ones, or do not fit the call.
    #[error("parameters: {0}")]
    Params(String),
    /// The device id is not acceptable.
    #[error("device id: {0}")]
    DeviceId(String),
    /// The device's own template is not acceptable (length, element size, norm).
    #[error("template: {0}")]
    Template(String),
    /// The key proof (Π^mod, Π^fac) was refused.
    #[error("key proof refused: {0}")]
    KeyProof(String),
    /// The plaintext-knowledge proof (Fig. 9) was refused.
    #[error("plaintext-knowledge proof refused: {0}")]
    PlaintextKnowledge(String),
    /// The L2 norm proof (Fig. 10) was refused: ‖u‖² ≤ ζ² is not shown.
    #[error("norm proof refused: {0}")]
    Norm(String),
    /// The service provider's answer is not the expected signed template.
    #[error("signed template refused: {0}")]
    Record(String),
    /// A cryptographic step failed on the local side (key, encryption, packing).
    #[error("{0}")]
    Internal(String),
}

fn malformed(message: &'static str, reason: impl Into<String>) -> EnrolError {
    EnrolError::Malformed {
        message,
        reason: reason.into(),
    }
}

fn internal(e: impl std::fmt::Display) -> EnrolError {
    EnrolError::Internal(e.to_string())
}

/// The session id both proofs of §8 are bound to: a domain tag, the caller's `session`, the
/// device id and the canonical parameters, each length-prefixed.
pub fn bound_session(session: &[u8], device_id: &str, params: &Params) -> Vec<u8> {
    let params = params.to_bytes();
    let mut out = Vec::with_capacity(SESSION_DOMAIN.len() + session.len() + 64 + params.len());
    for part in [SESSION_DOMAIN, session, device_id.as_bytes(), &params] {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

fn is_malicious(params: &Params) -> bool {
    params.protocol() != Protocol::Pi1
}

/// Ciphertexts D sends: t packed (Π1) or ℓ + 4 elements (Π2, Π3).
fn request_count(params: &Params) -> usize {
    if is_malicious(params) {
        params.dim() + SLACK_COORDINATES
    } else {
        params.layout().ciphertexts()
    }
}

fn clone_key(sk: &SecretKey) -> Result<SecretKey, EnrolError> {
    let (p, q) = sk.primes();
    SecretKey::from_primes(p.clone(), q.clone()).map_err(internal)
}

/// D → SP: the enrolment request ([ABMR20] §6.1 "Overview" / Fig. 3 enrolment).
struct EnrolRequest {
    device_id: String,
    params: Params,
    public_key: PublicKey,
    key_proof: Option<KeyProof>,
    ciphertexts: Vec<Ciphertext>,
    pok: Option<PlaintextKnowledgeProof>,
}

fn push_u16(out: &mut Vec<u8>, len: usize, message: &'static str) -> Result<(), EnrolError> {
    let len = u16::try_from(len).map_err(|_| malformed(message, "a field exceeds 65535"))?;
    out.extend_from_slice(&len.to_be_bytes());
    Ok(())
}

fn push_head(
    out: &mut Vec<u8>,
    magic: &[u8; 4],
    message: &'static str,
    device_id: &str,
    params: &Params,
    pk: &PublicKey,
) -> Result<(), EnrolError> {
    out.extend_from_slice(magic);
    out.push(VERSION);
    out.push(device_id.len() as u8);
    out.extend_from_slice(device_id.as_bytes());
    let params = params.to_bytes();
    push_u16(out, params.len(), message)?;
    out.extend_from_slice(&params);
    let n = pk.to_bytes();
    push_u16(out, n.len(), message)?;
    out.extend_from_slice(&n);
    Ok(())
}

impl EnrolRequest {
    fn to_bytes(&self) -> Result<Vec<u8>, EnrolError> {
        let pk = &self.public_key;
        let mut out = Vec::new();
        push_head(
            &mut out,
            REQUEST_MAGIC,
            REQUEST,
            &self.device_id,
            &self.params,
            pk,
        )?;
        let kp = self.key_proof.as_ref().map(KeyProof::to_bytes);
        let kp_len = kp.as_ref().map_or(0, Vec::len);
        let kp_len = u32::try_from(kp_len).map_err(|_| malformed(REQUEST, "key proof too long"))?;
        out.extend_from_slice(&kp_len.to_be_bytes());
        if let Some(kp) = kp {
            out.extend_from_slice(&kp);
        }
        push_u16(&mut out, self.ciphertexts.len(), REQUEST)?;
        for c in &self.ciphertexts {
            out.extend_from_slice(&pk.ciphertext_to_bytes(c));
        }
        if let Some(pok) = &self.pok {
            out.extend_from_slice(&pok.to_bytes(pk));
        }
        Ok(out)
    }

    /// Strict decoding against SP's configured `expected` parameters.
    fn from_bytes(bytes: &[u8], expected: &Params) -> Result<Self, EnrolError> {
        let mut r = Reader::new(REQUEST, bytes);
        let (device_id, params, public_key) = r.head(REQUEST_MAGIC, Some(expected))?;
        let kp_len = r.u32("key proof length")? as usize;
        let malicious = is_malicious(&params);
        let key_proof = if malicious {
            let raw = r.take(kp_len, "key proof")?;
            Some(KeyProof::from_bytes(raw).map_err(|e| malformed(REQUEST, e.to_string()))?)
        } else if kp_len != 0 {
            return Err(malformed(REQUEST, "a key proof under Π1 parameters"));
        } else {
            None
        };
        let count = r.u16("ciphertext count")?;
        if count != request_count(&params) {
            return Err(malformed(
                REQUEST,
                format!("{count} ciphertexts; expected {}", request_count(&params)),
            ));
        }
        let ciphertexts = r.ciphertexts(&public_key, count)?;
        let pok = if malicious {
            let raw = r.take(
                PlaintextKnowledgeProof::encoded_len(&public_key),
                "plaintext-knowledge proof",
            )?;
            Some(
                PlaintextKnowledgeProof::from_bytes(&public_key, raw)
                    .map_err(|e| malformed(REQUEST, e.to_string()))?,
            )
        } else {
            None
        };
        r.end()?;
        Ok(Self {
            device_id,
            params,
            public_key,
            key_proof,
            ciphertexts,
            pok,
        })
    }
}

/// A cursor that names the message and field when bytes run out.
struct Reader<'a> {
    message: &'static str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(message: &'static str, bytes: &'a [u8]) -> Self {
        Self {
            message,
            bytes,
            at: 0,
        }
    }

    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], EnrolError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| malformed(self.message, format!("truncated in {what}")))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, EnrolError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<usize, EnrolError> {
        let b = self.take(2, what)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u32(&mut self, what: &str) -> Result<u32, EnrolError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn array32(&mut self, what: &str) -> Result<[u8; 32], EnrolError> {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.take(32, what)?);
        Ok(out)
    }

    /// magic | version | id | params | N, with the params checked against `expected`.
    fn head(
        &mut self,
        magic: &[u8; 4],
        expected: Option<&Params>,
    ) -> Result<(String, Params, PublicKey), EnrolError> {
        if self.take(4, "magic")? != magic {
            return Err(malformed(self.message, "wrong magic"));
        }
        let version = self.u8("version")?;
        if version != VERSION {
            return Err(malformed(
                self.message,
                format!("version {version}; expected {VERSION}"),
            ));
        }
        let id_len = usize::from(self.u8("device id length")?);
        let id = std::str::from_utf8(self.take(id_len, "device id")?)
            .map_err(|_| malformed(self.message, "device id is not UTF-8"))?
            .to_owned();
        check_device_id(&id).map_err(|e| EnrolError::DeviceId(e.to_string()))?;
        let params_len = self.u16("params length")?;
        let params = Params::from_bytes(self.take(params_len, "params")?)
            .map_err(|e| malformed(self.message, e.to_string()))?;
        if let Some(expected) = expected {
            if &params != expected {
                return Err(EnrolError::Params(format!(
                    "the device enrols under {:?}, the service provider expects {:?}",
                    params, expected
                )));
            }
        }
        let n_len = self.u16("public key length")?;
        let pk = PublicKey::from_bytes(self.take(n_len, "public key")?)
            .map_err(|e| malformed(self.message, e.to_string()))?;
        if pk.modulus_bytes() != n_len || pk.modulus_bits() != params.modulus_bits() {
            return Err(malformed(
                self.message,
                format!(
                    "a {}-bit public key in {n_len} bytes; the parameters say {} bits",
                    pk.modulus_bits(),
                    params.modulus_bits()
                ),
            ));
        }
        Ok((id, params, pk))
    }

    fn ciphertexts(&mut self, pk: &PublicKey, count: usize) -> Result<Vec<Ciphertext>, EnrolError> {
        (0..count)
            .map(|i| {
                let raw = self.take(pk.ciphertext_bytes(), "ciphertexts")?;
                pk.ciphertext_from_bytes(raw)
                    .map_err(|e| malformed(self.message, format!("ciphertext {i}: {e}")))
            })
            .collect()
    }

    fn end(&self) -> Result<(), EnrolError> {
        if self.at != self.bytes.len() {
            return Err(malformed(
                self.message,
                format!("{} trailing bytes", self.bytes.len() - self.at),
            ));
        }
        Ok(())
    }
}

/// Builds the Π2/Π3 request for the given coordinates (template and slack), without checking
/// them: [`DeviceEnrolment::start`] checks; the tests use it to lie.
#[allow(clippy::too_many_arguments)]
fn malicious_request<R: RngCore + CryptoRng + ?Sized>(
    secret: &SecretKey,
    params: &Params,
    device_id: &str,
    values: &[i64],
    sp_aux: &RingPedersenParams,
    session: &[u8],
    threads: usize,
    rng: &mut R,
) -> Result<EnrolRequest, EnrolError> {
    let bound = bound_session(session, device_id, params);
    let (ciphertexts, mut nonces) =
        encrypt_template_with_nonces_parallel(secret, values, threads, rng).map_err(internal)?;
    let pok = PlaintextKnowledgeProof::prove(secret, &bound, &ciphertexts, values, &nonces, rng)
        .map_err(internal);
    for r in &mut nonces {
        *r = Integer::new();
    }
    let pok = pok?;
    let key_proof = KeyProof::prove(secret, &bound, sp_aux, rng).map_err(internal)?;
    Ok(EnrolRequest {
        device_id: device_id.to_owned(),
        params: params.clone(),
        public_key: secret.public_key().clone(),
        key_proof: Some(key_proof),
        ciphertexts,
        pok: Some(pok),
    })
}

/// The device id and parameters an enrolment request ([ABMR20] §6.1 "Overview", Fig. 3
/// enrolment) names, decoded from its header only (nothing is verified): what the service
/// provider needs to pick the parameters it expects before [`ServiceEnrolment::receive`]
/// decodes and verifies the whole request against them.
pub fn request_header(request: &[u8]) -> Result<(String, Params), EnrolError> {
    let mut r = Reader::new(REQUEST, request);
    let (device_id, params, _) = r.head(REQUEST_MAGIC, None)?;
    Ok((device_id, params))
}

/// The device D's side of Π_en ([ABMR20] §6.1 "Overview" and §8 for Π2/Π3, Fig. 3 enrolment
/// for Π1): its key, the template, and what it expects back.
pub struct DeviceEnrolment {
    secret: SecretKey,
    params: Params,
    device_id: String,
    template: Vec<i32>,
    /// Threads for the encryption and the norm response.
    threads: usize,
}

impl std::fmt::Debug for DeviceEnrolment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceEnrolment")
            .field("device_id", &self.device_id)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl Drop for DeviceEnrolment {
    fn drop(&mut self) {
        for x in &mut self.template {
            // Best effort: the template is the secret the protocol protects.
            wipe_i32(x);
        }
    }
}

fn wipe_i32(x: &mut i32) {
    *x = 0;
    std::hint::black_box(x);
}

impl DeviceEnrolment {
    /// D's first step of Π_en: for Π2/Π3 ([ABMR20] §6.1 "Overview", §8) the ℓ + 4 coordinates
    /// (u and the slack with Σu² + Σs² = ζ²) encrypted element by element, the plaintext-
    /// knowledge proof (Fig. 9) over all of them and the key proof; for Π1 (Fig. 3 enrolment
    /// steps 1–2) the t packed ciphertexts only. Returns the state and the request bytes.
    pub fn start<R: RngCore + CryptoRng + ?Sized>(
        secret: &SecretKey,
        params: &Params,
        device_id: &str,
        template: &[i32],
        sp_aux: &RingPedersenParams,
        session: &[u8],
        rng: &mut R,
    ) -> Result<(Self, Vec<u8>), EnrolError> {
        Self::start_parallel(secret, params, device_id, template, sp_aux, session, 1, rng)
    }

    /// [`Self::start`] with the encryption of the ℓ + 4 coordinates (most of the device's
    /// work) spread over `threads` threads, and the norm response of [`Self::respond`] too.
    #[allow(clippy::too_many_arguments)]
    pub fn start_parallel<R: RngCore + CryptoRng + ?Sized>(
        secret: &SecretKey,
        params: &Params,
        device_id: &str,
        template: &[i32],
        sp_aux: &RingPedersenParams,
        session: &[u8],
        threads: usize,
        rng: &mut R,
    ) -> Result<(Self, Vec<u8>), EnrolError> {
        let threads = threads.max(1);
        check_device_id(device_id).map_err(|e| EnrolError::DeviceId(e.to_string()))?;
        let pk = secret.public_key();
        if pk.modulus_bits() != params.modulus_bits() {
            return Err(EnrolError::Params(format!(
                "{}-bit key, the parameters say {} bits",
                pk.modulus_bits(),
                params.modulus_bits()
            )));
        }
        check_template(params.layout(), "u", template)
            .map_err(|e| EnrolError::Template(e.to_string()))?;
        let request = if is_malicious(params) {
            let bound = params
                .norm_bound()
                .to_u64()
                .ok_or_else(|| EnrolError::Params("ζ² does not fit 64 bits".into()))?;
            let values: Vec<i64> = template.iter().map(|&x| i64::from(x)).collect();
            let values = template_with_slack(&values, bound, rng)
                .map_err(|e| EnrolError::Template(e.to_string()))?;
            malicious_request(
                secret, params, device_id, &values, sp_aux, session, threads, rng,
            )?
        } else {
            let packed = encrypt_template(secret, params, template, rng)
                .map_err(|e| EnrolError::Template(e.to_string()))?;
            EnrolRequest {
                device_id: device_id.to_owned(),
                params: params.clone(),
                public_key: pk.clone(),
                key_proof: None,
                ciphertexts: packed,
                pok: None,
            }
        };
        let bytes = request.to_bytes()?;
        let state = Self {
            secret: clone_key(secret)?,
            params: params.clone(),
            device_id: device_id.to_owned(),
            template: template.to_vec(),
            threads,
        };
        Ok((state, bytes))
    }

    /// D's answer to SP's norm challenge (Π2/Π3, [ABMR20] Fig. 10, P's step): z, ẑ, encoded.
    pub fn respond(&self, challenge: &[u8]) -> Result<Vec<u8>, EnrolError> {
        if !is_malicious(&self.params) {
            return Err(EnrolError::Params(
                "Π1 enrolment has no norm challenge".into(),
            ));
        }
        let pk = self.secret.public_key();
        let count = request_count(&self.params);
        let challenge = L2Challenge::from_bytes(pk, count, challenge)
            .map_err(|e| malformed(CHALLENGE, e.to_string()))?;
        let response = L2Response::respond_parallel(&self.secret, &challenge, self.threads)
            .map_err(|e| malformed(CHALLENGE, e.to_string()))?;
        Ok(response.to_bytes(pk))
    }

    /// D's last step: checks SP's answer (σ of [ABMR20] §6.1: the signature under
    /// `sp_verifying_key` at `now`, its own device id, parameters and key, and that the packed
    /// ciphertexts decrypt to Encode1 of its template) and keeps it for Round 1.
    pub fn finish(
        self,
        signed: &[u8],
        sp_verifying_key: &VerifyingKey,
        now: i64,
    ) -> Result<SignedTemplate, EnrolError> {
        let signed =
            SignedTemplate::from_bytes(signed).map_err(|e| malformed(ANSWER, e.to_string()))?;
        signed
            .verify(sp_verifying_key, now)
            .map_err(|e| EnrolError::Record(e.to_string()))?;
        let record = &signed.record;
        if record.device_id != self.device_id {
            return Err(EnrolError::Record(format!(
                "signed for device {:?}",
                record.device_id
            )));
        }
        if record.params != self.params {
            return Err(EnrolError::Record("signed under other parameters".into()));
        }
        if &record.public_key != self.secret.public_key() {
            return Err(EnrolError::Record("signed for another public key".into()));
        }
        let expected = encode_template(self.params.layout(), "u", &self.template)
            .map_err(|e| EnrolError::Template(e.to_string()))?;
        if record.packed.len() != expected.len()
            || record
                .packed
                .iter()
                .zip(&expected)
                .any(|(c, e)| self.secret.decrypt_signed(c) != *e)
        {
            return Err(EnrolError::Record(
                "the packed template does not decrypt to Encode1(u)".into(),
            ));
        }
        Ok(signed)
    }

    /// The device's key (to build the matching device, e.g. `pi2::Pi2Device`).
    pub fn secret(&self) -> &SecretKey {
        &self.secret
    }
}

/// SP's norm-proof state: the verifier and how to rebuild it.
struct L2State {
    seed: [u8; 32],
    digest: [u8; 32],
    verifier: Option<L2Verifier>,
}

impl Drop for L2State {
    fn drop(&mut self) {
        self.seed = [0u8; 32];
        std::hint::black_box(&mut self.seed);
    }
}

/// Draws the Fig. 10 challenge from `seed` (deterministic): the verifier, the challenge bytes
/// and their digest.
fn seeded_challenge(
    pk: &PublicKey,
    params: &Params,
    ciphertexts: &[Ciphertext],
    seed: [u8; 32],
    threads: usize,
) -> Result<(L2Verifier, Vec<u8>, [u8; 32]), EnrolError> {
    let mut rng = ChaCha20Rng::from_seed(seed);
    let (verifier, challenge) =
        L2Verifier::challenge_parallel(pk, ciphertexts, params.norm_bound(), threads, &mut rng)
            .map_err(internal)?;
    let bytes = challenge.to_bytes(pk);
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    Ok((verifier, bytes, digest))
}

/// The service provider SP's side of Π_en ([ABMR20] §6.1 "Overview", §8; Fig. 3 for Π1):
/// what it received and, for Π2/Π3, the pending norm challenge.
pub struct ServiceEnrolment {
    device_id: String,
    params: Params,
    public_key: PublicKey,
    ciphertexts: Vec<Ciphertext>,
    l2: Option<L2State>,
}

impl std::fmt::Debug for ServiceEnrolment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceEnrolment")
            .field("device_id", &self.device_id)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl ServiceEnrolment {
    /// SP's first step of Π_en: decodes the request strictly (its parameters must equal
    /// `expected`), and for Π2/Π3 ([ABMR20] §8) verifies the key proof in `sp_aux` and the
    /// plaintext-knowledge proof (Fig. 9), then draws the norm challenge (Fig. 10, y = ζ²)
    /// over the ℓ + 4 ciphertexts. Returns the state and the challenge (`None` for Π1).
    pub fn receive<R: RngCore + CryptoRng + ?Sized>(
        request: &[u8],
        expected: &Params,
        sp_aux: &RingPedersenParams,
        session: &[u8],
        rng: &mut R,
    ) -> Result<(Self, Option<Vec<u8>>), EnrolError> {
        Self::receive_parallel(request, expected, sp_aux, session, 1, rng)
    }

    /// [`Self::receive`] with the norm challenge's exponentiations (its n + 2 fresh N-th
    /// powers, most of the SP's work) spread over `threads` threads; the same challenge for
    /// the same coins whatever `threads`.
    pub fn receive_parallel<R: RngCore + CryptoRng + ?Sized>(
        request: &[u8],
        expected: &Params,
        sp_aux: &RingPedersenParams,
        session: &[u8],
        threads: usize,
        rng: &mut R,
    ) -> Result<(Self, Option<Vec<u8>>), EnrolError> {
        let request = EnrolRequest::from_bytes(request, expected)?;
        let EnrolRequest {
            device_id,
            params,
            public_key,
            key_proof,
            ciphertexts,
            pok,
        } = request;
        let mut state = Self {
            device_id,
            params,
            public_key,
            ciphertexts,
            l2: None,
        };
        let (Some(key_proof), Some(pok)) = (key_proof, pok) else {
            return Ok((state, None));
        };
        let bound = bound_session(session, &state.device_id, &state.params);
        key_proof
            .verify(&state.public_key, &bound, sp_aux)
            .map_err(|e| EnrolError::KeyProof(e.to_string()))?;
        pok.verify(&state.public_key, &bound, &state.ciphertexts)
            .map_err(|e| EnrolError::PlaintextKnowledge(e.to_string()))?;
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let (verifier, challenge, digest) = seeded_challenge(
            &state.public_key,
            &state.params,
            &state.ciphertexts,
            seed,
            threads,
        )?;
        state.l2 = Some(L2State {
            seed,
            digest,
            verifier: Some(verifier),
        });
        seed = [0u8; 32];
        std::hint::black_box(&mut seed);
        Ok((state, Some(challenge)))
    }

    /// The state as bytes, for a database to keep between the two calls:
    /// "PMES" | version | id | params | N | count (2) | ciphertexts | has L2 (1)
    /// | [seed (32) | challenge digest (32)]. The seed is secret (it gives α).
    pub fn to_bytes(&self) -> Result<Vec<u8>, EnrolError> {
        let pk = &self.public_key;
        let mut out = Vec::new();
        push_head(
            &mut out,
            STATE_MAGIC,
            STATE,
            &self.device_id,
            &self.params,
            pk,
        )?;
        push_u16(&mut out, self.ciphertexts.len(), STATE)?;
        for c in &self.ciphertexts {
            out.extend_from_slice(&pk.ciphertext_to_bytes(c));
        }
        match &self.l2 {
            Some(l2) => {
                out.push(1);
                out.extend_from_slice(&l2.seed);
                out.extend_from_slice(&l2.digest);
            }
            None => out.push(0),
        }
        Ok(out)
    }

    /// Decodes [`Self::to_bytes`] strictly and, for Π2/Π3, rebuilds the norm verifier by
    /// replaying its coins from the seed ([`L2Verifier::redraw`]: no exponentiation).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnrolError> {
        let mut r = Reader::new(STATE, bytes);
        let (device_id, params, public_key) = r.head(STATE_MAGIC, None)?;
        let count = r.u16("ciphertext count")?;
        if count != request_count(&params) {
            return Err(malformed(STATE, format!("{count} ciphertexts")));
        }
        let ciphertexts = r.ciphertexts(&public_key, count)?;
        let has_l2 = r.u8("L2 flag")?;
        let l2 = match (has_l2, is_malicious(&params)) {
            (1, true) => {
                let seed = r.array32("seed")?;
                let digest = r.array32("digest")?;
                r.end()?;
                let verifier = L2Verifier::redraw(
                    &public_key,
                    ciphertexts.len(),
                    params.norm_bound(),
                    &mut ChaCha20Rng::from_seed(seed),
                )
                .map_err(internal)?;
                Some(L2State {
                    seed,
                    digest,
                    verifier: Some(verifier),
                })
            }
            (0, false) => {
                r.end()?;
                None
            }
            (flag, _) => {
                return Err(malformed(
                    STATE,
                    format!("L2 flag {flag} for {:?}", params.protocol()),
                ))
            }
        };
        Ok(Self {
            device_id,
            params,
            public_key,
            ciphertexts,
            l2,
        })
    }

    /// The device being enrolled.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }

    /// The parameters the device enrols under ([ABMR20] Fig. 1; checked at
    /// [`Self::receive`] against the SP's own).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// SP's last step of Π_en: for Π2/Π3 checks D's norm answer (Fig. 10, last step), packs
    /// the first ℓ element ciphertexts ([ABMR20] §6.1, D.1 step (2); the slack ones are
    /// dropped); for Π1 takes D's packed ciphertexts as they are; then signs the
    /// [`TemplateRecord`] (σ of §6.1) valid until `expires_at`.
    pub fn finish(
        mut self,
        response: Option<&[u8]>,
        sp_key: &SigningKey,
        expires_at: i64,
    ) -> Result<SignedTemplate, EnrolError> {
        let packed = match self.l2.take() {
            Some(mut l2) => {
                let response = response.ok_or_else(|| malformed(RESPONSE, "missing"))?;
                let response = L2Response::from_bytes(&self.public_key, response)
                    .map_err(|e| malformed(RESPONSE, e.to_string()))?;
                let verifier = l2
                    .verifier
                    .take()
                    .ok_or_else(|| malformed(STATE, "the norm challenge was already answered"))?;
                verifier
                    .check(&response)
                    .map_err(|e| EnrolError::Norm(e.to_string()))?;
                let dim = self.params.dim();
                pack_element_ciphertexts(&self.public_key, &self.params, &self.ciphertexts[..dim])
                    .map_err(internal)?
            }
            None => {
                if response.is_some() {
                    return Err(malformed(RESPONSE, "Π1 enrolment has no norm response"));
                }
                std::mem::take(&mut self.ciphertexts)
            }
        };
        TemplateRecord {
            device_id: self.device_id.clone(),
            params: self.params.clone(),
            public_key: self.public_key.clone(),
            packed,
            expires_at,
        }
        .sign(sp_key)
        .map_err(|e| EnrolError::Record(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::key_2048;
    use super::super::params::DEFAULT_STAT_BITS;
    use super::super::pi2::{Pi2Device, Pi2Terminal};
    use super::super::pi3::{Pi3Device, Pi3Terminal};
    use super::super::record::verify_round1_signature;
    use super::*;
    use std::sync::OnceLock;

    const NOW: i64 = 1_700_000_000;
    const EXPIRES: i64 = NOW + 86_400;
    const SESSION: &[u8] = b"enrol session 1";
    const ID: &str = "device-1";

    fn aux() -> &'static RingPedersenParams {
        static AUX: OnceLock<RingPedersenParams> = OnceLock::new();
        AUX.get_or_init(|| {
            let mut rng = ChaCha20Rng::seed_from_u64(0xa0c5);
            RingPedersenParams::generate(1024, &mut rng).expect("ring-Pedersen parameters")
        })
    }

    fn params(protocol: Protocol) -> Params {
        Params::new_allowing_test_modulus(
            protocol,
            6,
            8,
            2048,
            DEFAULT_STAT_BITS,
            Params::max_norm_bound(6, 8),
        )
        .unwrap()
    }

    fn sp_key() -> SigningKey {
        SigningKey::from_bytes(&[9u8; 32])
    }

    fn template(rng: &mut ChaCha20Rng) -> Vec<i32> {
        (0..6)
            .map(|_| (rng.next_u32() % 256) as i32 - 128)
            .collect()
    }

    fn dot(u: &[i32], w: &[i32]) -> i64 {
        u.iter()
            .zip(w)
            .map(|(&a, &b)| i64::from(a) * i64::from(b))
            .sum()
    }

    /// A full honest enrolment; the SP state goes through its bytes between the two calls.
    fn enrol(p: &Params, u: &[i32], rng: &mut ChaCha20Rng) -> SignedTemplate {
        let sk = key_2048();
        let (device, request) = DeviceEnrolment::start(sk, p, ID, u, aux(), SESSION, rng).unwrap();
        let (sp, challenge) = ServiceEnrolment::receive(&request, p, aux(), SESSION, rng).unwrap();
        let sp = ServiceEnrolment::from_bytes(&sp.to_bytes().unwrap()).unwrap();
        let response = challenge.map(|c| device.respond(&c).unwrap());
        let signed = sp.finish(response.as_deref(), &sp_key(), EXPIRES).unwrap();
        let signed = device
            .finish(&signed.to_bytes().unwrap(), &sp_key().verifying_key(), NOW)
            .unwrap();
        signed.verify(&sp_key().verifying_key(), NOW).unwrap();
        let expected = encode_template(p.layout(), "u", u).unwrap();
        assert_eq!(signed.record.packed.len(), expected.len());
        for (c, e) in signed.record.packed.iter().zip(&expected) {
            assert_eq!(sk.decrypt_signed(c), *e);
        }
        signed
    }

    fn verifier() -> impl Fn(&[u8], &[u8]) -> bool {
        let vk = sp_key().verifying_key();
        move |m: &[u8], s: &[u8]| verify_round1_signature(&vk, NOW, m, s).is_ok()
    }

    #[test]
    fn honest_pi2_enrolment_matches_with_a_terminal() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let p = params(Protocol::Pi2);
        let u = template(&mut rng);
        let signed = enrol(&p, &u, &mut rng);
        let device = Pi2Device::new(
            p.clone(),
            clone_key(key_2048()).unwrap(),
            signed.record.packed.clone(),
            signed.round1_signature(),
        )
        .unwrap();
        let w = template(&mut rng);
        let threshold = dot(&u, &w);
        let mut terminal = Pi2Terminal::new(p, w, threshold).unwrap();
        let r2 = terminal
            .round2(&device.round1(), &verifier(), &mut rng)
            .unwrap();
        let mut session = device.session();
        let r3 = session.round3(&r2).unwrap();
        let (r4, outcome) = terminal.round4(&r3).unwrap();
        assert!(outcome.matched);
        assert_eq!(outcome.inner_product, threshold);
        assert!(session.finish(&r4).unwrap());
    }

    #[test]
    fn honest_pi3_enrolment_matches_with_a_terminal() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let p = params(Protocol::Pi3);
        let u = template(&mut rng);
        let signed = enrol(&p, &u, &mut rng);
        let device = Pi3Device::new(
            p.clone(),
            clone_key(key_2048()).unwrap(),
            signed.record.packed.clone(),
            signed.round1_signature(),
        )
        .unwrap();
        let w = template(&mut rng);
        let threshold = dot(&u, &w) + 1;
        let mut terminal = Pi3Terminal::new(p, w, threshold).unwrap();
        let r2 = terminal
            .round2(&device.round1(), &verifier(), &mut rng)
            .unwrap();
        let mut session = device.session();
        let r3 = session.round3(&r2, &mut rng).unwrap();
        let r4 = terminal.round4(&r3, &mut rng).unwrap();
        let (r5, d) = session.round5(&r4).unwrap();
        let t = terminal.finish(&r5).unwrap();
        assert!(!t && !d, "IP = T − 1 must not match");
    }

    #[test]
    fn pi1_enrolment_signs_the_device_packing() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let p = params(Protocol::Pi1);
        let u = template(&mut rng);
        let (device, request) =
            DeviceEnrolment::start(key_2048(), &p, ID, &u, aux(), SESSION, &mut rng).unwrap();
        let (sp, challenge) =
            ServiceEnrolment::receive(&request, &p, aux(), SESSION, &mut rng).unwrap();
        assert!(challenge.is_none());
        assert!(device.respond(b"x").is_err());
        let sp = ServiceEnrolment::from_bytes(&sp.to_bytes().unwrap()).unwrap();
        let signed = sp.finish(None, &sp_key(), EXPIRES).unwrap();
        device
            .finish(&signed.to_bytes().unwrap(), &sp_key().verifying_key(), NOW)
            .unwrap();
        enrol(&p, &u, &mut rng);
    }

    /// Π2 request for given coordinates (template and slack), by hand.
    fn request_for(values: &[i64], rng: &mut ChaCha20Rng) -> EnrolRequest {
        malicious_request(
            key_2048(),
            &params(Protocol::Pi2),
            ID,
            values,
            aux(),
            SESSION,
            1,
            rng,
        )
        .unwrap()
    }

    /// SP's refusal of `request` (after answering the challenge honestly, if any).
    fn sp_outcome(request: &[u8], rng: &mut ChaCha20Rng) -> Result<SignedTemplate, EnrolError> {
        let p = params(Protocol::Pi2);
        let (sp, challenge) = ServiceEnrolment::receive(request, &p, aux(), SESSION, rng)?;
        let challenge = challenge.unwrap();
        let ch = L2Challenge::from_bytes(key_2048().public_key(), p.dim() + 4, &challenge).unwrap();
        let response = L2Response::respond(key_2048(), &ch)
            .unwrap()
            .to_bytes(key_2048().public_key());
        sp.finish(Some(&response), &sp_key(), EXPIRES)
    }

    fn honest_values(rng: &mut ChaCha20Rng) -> Vec<i64> {
        let p = params(Protocol::Pi2);
        let u: Vec<i64> = template(rng).into_iter().map(i64::from).collect();
        template_with_slack(&u, p.norm_bound().to_u64().unwrap(), rng).unwrap()
    }

    #[test]
    fn a_lying_slack_or_a_long_template_is_refused_by_the_norm_proof() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let mut values = honest_values(&mut rng);
        let bytes = request_for(&values, &mut rng).to_bytes().unwrap();
        assert!(sp_outcome(&bytes, &mut rng).is_ok());
        values[6] += 1;
        let bytes = request_for(&values, &mut rng).to_bytes().unwrap();
        assert!(matches!(
            sp_outcome(&bytes, &mut rng),
            Err(EnrolError::Norm(_))
        ));
        // A template whose norm alone exceeds ζ², no slack.
        let p = params(Protocol::Pi2);
        let mut long = vec![0i64; 10];
        long[0] = p.norm_bound().to_i64().unwrap().isqrt() + 1;
        let bytes = request_for(&long, &mut rng).to_bytes().unwrap();
        assert!(matches!(
            sp_outcome(&bytes, &mut rng),
            Err(EnrolError::Norm(_))
        ));
    }

    #[test]
    fn forged_proofs_and_tampered_messages_are_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let pk = key_2048().public_key();
        let values = honest_values(&mut rng);
        let request = request_for(&values, &mut rng);
        let good = request.to_bytes().unwrap();
        let len = good.len();
        let pok_len = PlaintextKnowledgeProof::encoded_len(pk);
        let ct_end = len - pok_len;
        let ct_start = ct_end - 10 * pk.ciphertext_bytes();

        // Plaintext-knowledge proof: a byte of w flipped.
        let mut bad = good.clone();
        bad[ct_end + pk.ciphertext_bytes() + pk.modulus_bytes() - 1] ^= 1;
        assert!(matches!(
            sp_outcome(&bad, &mut rng),
            Err(EnrolError::PlaintextKnowledge(_))
        ));
        // A tampered ciphertext.
        let mut bad = good.clone();
        bad[ct_start + pk.ciphertext_bytes() - 1] ^= 2;
        assert!(matches!(
            sp_outcome(&bad, &mut rng),
            Err(EnrolError::PlaintextKnowledge(_) | EnrolError::Malformed { .. })
        ));
        // Key proof for another session, and for another key.
        let p = params(Protocol::Pi2);
        let (_, other_session) =
            DeviceEnrolment::start(key_2048(), &p, ID, &[1; 6], aux(), b"other", &mut rng).unwrap();
        assert!(matches!(
            sp_outcome(&other_session, &mut rng),
            Err(EnrolError::KeyProof(_))
        ));
        let other_key = SecretKey::generate(2048, &mut rng).unwrap();
        let bound = bound_session(SESSION, ID, &p);
        let mut swapped = request_for(&values, &mut rng);
        swapped.key_proof = Some(KeyProof::prove(&other_key, &bound, aux(), &mut rng).unwrap());
        assert!(matches!(
            sp_outcome(&swapped.to_bytes().unwrap(), &mut rng),
            Err(EnrolError::KeyProof(_))
        ));
        // Other parameters than the SP's.
        let (_, pi3) = DeviceEnrolment::start(
            key_2048(),
            &params(Protocol::Pi3),
            ID,
            &[1; 6],
            aux(),
            SESSION,
            &mut rng,
        )
        .unwrap();
        assert!(matches!(
            sp_outcome(&pi3, &mut rng),
            Err(EnrolError::Params(_))
        ));
        // Truncations and trailing bytes.
        for cut in [0, 3, 5, 9, 40, ct_start, ct_end, len - 1] {
            assert!(matches!(
                sp_outcome(&good[..cut], &mut rng),
                Err(EnrolError::Malformed { .. })
            ));
        }
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            sp_outcome(&long, &mut rng),
            Err(EnrolError::Malformed { .. })
        ));
    }

    #[test]
    fn a_tampered_response_or_state_is_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(6);
        let p = params(Protocol::Pi2);
        let u = template(&mut rng);
        let (device, request) =
            DeviceEnrolment::start(key_2048(), &p, ID, &u, aux(), SESSION, &mut rng).unwrap();
        let (sp, challenge) =
            ServiceEnrolment::receive(&request, &p, aux(), SESSION, &mut rng).unwrap();
        let state = sp.to_bytes().unwrap();
        let mut response = device.respond(&challenge.unwrap()).unwrap();
        // The state: a tampered seed decodes (restoring replays the coins, it does not draw
        // the challenge again to compare) but is another α: the honest answer is refused.
        let mut bad = state.clone();
        let at = bad.len() - 40;
        bad[at] ^= 1;
        let tampered = ServiceEnrolment::from_bytes(&bad).unwrap();
        assert!(matches!(
            tampered.finish(Some(&response), &sp_key(), EXPIRES),
            Err(EnrolError::Norm(_))
        ));
        for cut in [0, 4, 20, state.len() - 1] {
            assert!(ServiceEnrolment::from_bytes(&state[..cut]).is_err());
        }
        // The response: flipped byte, wrong length, none.
        let sp2 = ServiceEnrolment::from_bytes(&state).unwrap();
        assert!(matches!(
            sp2.finish(Some(&response[1..]), &sp_key(), EXPIRES),
            Err(EnrolError::Malformed { .. })
        ));
        let sp3 = ServiceEnrolment::from_bytes(&state).unwrap();
        assert!(sp3.finish(None, &sp_key(), EXPIRES).is_err());
        let last = response.len() - 1;
        response[last] ^= 1;
        assert!(matches!(
            sp.finish(Some(&response), &sp_key(), EXPIRES),
            Err(EnrolError::Norm(_))
        ));
        // The device refuses an answer for another key or signed by another SP.
        let other = SigningKey::from_bytes(&[3u8; 32]);
        let (sp4, ch) = ServiceEnrolment::receive(&request, &p, aux(), SESSION, &mut rng).unwrap();
        let answer = sp4
            .finish(
                Some(&device.respond(&ch.unwrap()).unwrap()),
                &other,
                EXPIRES,
            )
            .unwrap()
            .to_bytes()
            .unwrap();
        assert!(matches!(
            device.finish(&answer, &sp_key().verifying_key(), NOW),
            Err(EnrolError::Record(_))
        ));
    }
}
