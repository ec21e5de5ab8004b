//! Funshade 1:N with **dealer-masked templates** (Ibarrondo, Chabanne, Önen, "Funshade",
//! PETS 2023, ePrint 2022/1688, Alg. 1, with the enrolled input masked once instead of per
//! comparison; sign gate of Boyle et al., EUROCRYPT 2021, ePrint 2020/1392).
//!
//! In the per-comparison protocol of [`super::funshade`] both inputs are masked afresh for
//! every comparison, so round 1 opens x + δx *and* y + δy per comparison: 8·l bytes per
//! comparison per party. Here an enrolled template y is masked once, with a mask δy that only
//! the dealer P2 knows in full:
//!
//! * **Template masks.** P2 holds a 32-byte master key. For a template with bundle id `id`,
//!   HKDF-SHA256(master, "privmatch face template mask v1" ‖ id) gives two 16-byte seeds;
//!   evaluator b receives seed_b (once) and expands it to δy_b ([`expand_template_mask`]).
//!   δy = δy_0 + δy_1. P2 keeps no per-template state: it re-derives δy from the bundle id.
//! * **Opening once.** Evaluator b sends Y_b = y_b + δy_b once per template
//!   ([`masked_template_share`]); both learn Δy = y + δy and keep Δy and their own δy_b
//!   ([`MaskedTemplateSet`]), never y in the clear. δy_{1−b} is uniform and unknown to P_b,
//!   so Δy is a one-time pad of y; it is opened only once (the same Δy again tells nothing
//!   new).
//! * **Per identification** the dealer deals ([`deal_identification`]) a fresh probe mask
//!   seed sx_b (δx = δx_0 + δx_1) and, per template j, shares c_j,b of ⟨δx, δy_j⟩, the shares
//!   r_j,b of r_in,j ∓ θ and one sign-gate key pair: single use, as in [`super::funshade`].
//! * **Online** ([`probe_round`], [`distance_round`], [`sign_round`]): the probe's masked
//!   vector X_b = x_b + δx_b is exchanged once (4·l bytes per party per identification); then
//!   per comparison only z_b (4 bytes) and the output share o_b (4 bytes):
//!
//! ```text
//! d_b = b·⟨Δx, Δy_j⟩ − ⟨Δx, δy_j,b⟩ − ⟨δx_b, Δy_j⟩ + c_j,b  =  ⟨b·Δx − δx_b, Δy_j⟩ − ⟨Δx, δy_j,b⟩ + c_j,b
//! ```
//!
//! and d_0 + d_1 = ⟨x, y_j⟩, as in Funshade's `eval_dist`; z_b and o_b then follow
//! [`super::funshade::distance_shares`] and [`super::funshade::sign_shares`].
//!
//! The dealer binds an identification's keys to the ordered list of compared templates by
//! the SHA-256 digest of their bundle ids ([`template_digest`]); an evaluator refuses keys
//! made for another list, since ⟨δx, δy_j⟩ is only right for the template it was made for.
//!
//! A **1:1 verification** does not tell P2 which template it compares: each evaluator derives
//! its probe mask seed and a fresh template mask seed from the PRF it shares with P2 and the
//! session id ([`verification_probe_seed`], [`verification_template_seed`]), re-shares the
//! template as y'_b = b·Δy − δy_b and sends X_b ‖ Y'_b = y'_b + δy'_b from its open
//! ([`verification_message`]); P2 deals c = ⟨δx, δy'⟩ from the session id alone
//! ([`deal_verification`]), at the same time as the opens, and round 2 is
//! [`verification_distance`] — Funshade's per-comparison masking, with masks from the seeds.

use hkdf::Hkdf;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use rand_core::{CryptoRng, RngCore};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::encoding::{EmbeddingShare, Reader, VERSION};
use super::funshade::DealerParams;
use super::quantize::check_dim;
use super::{FaceError, Metric};
use crate::crypto::fss::aes::{expand_u32, expand_u32_domain};
use crate::crypto::fss::ic::{self, IcKeyBatch, IC_KEY_LEN};
use crate::crypto::seal::PairwiseSecrets;
use crate::parallel::{on_threads, piece_len, worth_a_pool};

/// Bytes of the dealer's template-mask master key.
pub const TEMPLATE_MASTER_LEN: usize = 32;
/// Bytes of a template's bundle id (the same in both halves of an enrolment).
pub const BUNDLE_ID_LEN: usize = 16;
/// Bytes per comparison per evaluator of an identification's keys: c_b (4), r_b (4) and the
/// sign-gate key.
pub const MASKED_KEY_LEN: usize = 8 + IC_KEY_LEN;
/// Bytes of an identification key half before the per-comparison keys.
pub const IDENTIFICATION_HEADER_LEN: usize = 4 + 1 + 1 + 1 + 2 + 4 + 32 + 16;
/// Online bytes per comparison per evaluator beyond the probe's one vector: z_b and o_b.
pub const ONLINE_BYTES_PER_COMPARISON: usize = 8;
/// Sign-gate keys are decoded into batches of this many, the unit of parallel evaluation.
pub const GATE_CHUNK: usize = 4096;
/// Fewest comparisons per thread of a distance round worth a pool (each is one l-dimensional
/// dot product, about a microsecond; a hop to a pool thread costs tens).
const MIN_DISTANCE_PIECE: usize = 64;

const IDENTIFICATION_MAGIC: &[u8; 4] = b"PMFI";
const MASK_INFO: &[u8] = b"privmatch face template mask v1";
const DEALING_INFO: &[u8] = b"privmatch face identification dealing v1";
const STOCK_DEALING_INFO: &[u8] = b"privmatch face stocked identification dealing v1";
/// HKDF label of a verification's dealing ([`KeysFor::Verification`]).
const VERIFICATION_DEALING_INFO: &[u8] = b"privmatch face verification dealing v1";
/// PRF context label of a verification's probe mask seeds ([`verification_probe_seed`]).
const VERIFICATION_PROBE_INFO: &[u8] = b"privmatch face verification probe mask v1";
/// PRF context label of a verification's fresh template mask seeds
/// ([`verification_template_seed`]).
const VERIFICATION_TEMPLATE_INFO: &[u8] = b"privmatch face verification template mask v1";
/// Expansion domain of template masks, so a template seed never yields the stream of a
/// probe seed (domain 0, [`expand_u32`]).
const TEMPLATE_MASK_DOMAIN: u64 = 1;

/// What one dealing of identification keys is for (docs/protocols/face.md §11). Keys of
/// the two kinds are derived ([`TemplateMaskMaster::dealing_rng`]) and sealed
/// (`mask_dealer`) under different labels, so no choice of ids makes a stocked dealing equal
/// a session's: each kind's ids are single use at the evaluators in their own table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeysFor {
    /// Dealt on the path of the face session with this id, usable by that session only.
    Session([u8; 16]),
    /// Dealt ahead of time under this stock id for a known template list; an evaluator claims
    /// it for one session, once (`privmatch.face_stock_used`).
    Stock([u8; 16]),
    /// Dealt for the 1:1 verification session with this id, from the session id alone
    /// (docs/protocols/face.md §7); never opens in an identification session, nor
    /// identification keys in a verification session.
    Verification([u8; 16]),
}

impl KeysFor {
    /// The session or stock id.
    pub fn id(&self) -> &[u8; 16] {
        match self {
            KeysFor::Session(id) | KeysFor::Stock(id) | KeysFor::Verification(id) => id,
        }
    }
}

/// The dealer's master key for template masks. Zeroised on drop; never printed.
pub struct TemplateMaskMaster {
    key: [u8; TEMPLATE_MASTER_LEN],
}

impl Drop for TemplateMaskMaster {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

impl std::fmt::Debug for TemplateMaskMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TemplateMaskMaster(<secret>)")
    }
}

impl TemplateMaskMaster {
    /// A fresh master key from `rng`.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        let mut key = [0u8; TEMPLATE_MASTER_LEN];
        rng.fill_bytes(&mut key);
        TemplateMaskMaster { key }
    }

    /// The master key stored as `bytes` (exactly [`TEMPLATE_MASTER_LEN`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, FaceError> {
        let key = bytes
            .try_into()
            .map_err(|_| FaceError::Malformed("template mask master key: wrong length"))?;
        Ok(TemplateMaskMaster { key })
    }

    /// The stored form of the key (for the dealer's own table only).
    pub fn to_bytes(&self) -> [u8; TEMPLATE_MASTER_LEN] {
        self.key
    }

    /// The two evaluators' mask seeds of the template with bundle id `id`:
    /// HKDF-SHA256 expand (PRF) of the master key with info = label ‖ id, 32 bytes, seed_0 ‖
    /// seed_1. Deterministic, so the dealer keeps no per-template state.
    pub fn template_seeds(&self, id: &[u8; BUNDLE_ID_LEN]) -> [[u8; 16]; 2] {
        self.seeder().seeds(id)
    }

    /// [`TemplateMaskMaster::template_seeds`] for many ids: HKDF's extract step (two HMAC key
    /// schedules and a compression) made once, each id then costs its expand alone — a
    /// dealing derives the seeds of every compared template.
    pub fn seeder(&self) -> TemplateSeeder {
        TemplateSeeder(Hkdf::<Sha256>::new(Some(MASK_INFO), &self.key))
    }

    /// The randomness of the dealing `keys_for` against the template list with digest
    /// `digest` ([`template_digest`]): ChaCha20 keyed by HKDF-SHA256(master; info = label ‖
    /// id ‖ digest), the label naming the kind ([`KeysFor`]). Pseudorandom to everyone but the
    /// dealer, and the same for the same (kind, id, list): a second request deals exactly the
    /// keys of the first, so no evaluator can ever be handed two different dealings of one
    /// session or stock id (whatever the coordinator does with transactions), and every
    /// other id, kind or list gets independent keys.
    pub fn dealing_rng(&self, keys_for: KeysFor, digest: &[u8; 32]) -> ChaCha20Rng {
        let label = match keys_for {
            KeysFor::Session(_) => DEALING_INFO,
            KeysFor::Stock(_) => STOCK_DEALING_INFO,
            KeysFor::Verification(_) => VERIFICATION_DEALING_INFO,
        };
        let hk = Hkdf::<Sha256>::new(Some(label), &self.key);
        let mut seed = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's limit of 255 · 32, so expand cannot fail.
        let _ = hk.expand_multi_info(&[label, keys_for.id(), digest], &mut seed);
        let rng = ChaCha20Rng::from_seed(seed);
        seed.zeroize();
        rng
    }
}

/// The template seeds of one master key ([`TemplateMaskMaster::seeder`]), HKDF extracted once.
pub struct TemplateSeeder(Hkdf<Sha256>);

impl TemplateSeeder {
    /// The two evaluators' mask seeds of the template `id`
    /// ([`TemplateMaskMaster::template_seeds`]).
    pub fn seeds(&self, id: &[u8; BUNDLE_ID_LEN]) -> [[u8; 16]; 2] {
        let mut okm = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's limit of 255 · 32, so expand cannot fail.
        let _ = self.0.expand_multi_info(&[MASK_INFO, id], &mut okm);
        let mut seeds = [[0u8; 16]; 2];
        seeds[0].copy_from_slice(&okm[..16]);
        seeds[1].copy_from_slice(&okm[16..]);
        okm.zeroize();
        seeds
    }

    /// δy = δy_0 + δy_1 of the template `id` into `out` (l words) — the dealer's view.
    fn template_mask(&self, id: &[u8; BUNDLE_ID_LEN], scratch: &mut [u32], out: &mut [u32]) {
        let mut seeds = self.seeds(id);
        expand_template_mask(&seeds[0], out);
        expand_template_mask(&seeds[1], scratch);
        for (o, s) in out.iter_mut().zip(scratch.iter()) {
            *o = o.wrapping_add(*s);
        }
        seeds.zeroize();
    }
}

impl std::fmt::Debug for TemplateSeeder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TemplateSeeder(<secret>)")
    }
}

/// Evaluator b's template mask δy_b from its seed (AES-CTR expansion, domain 1).
pub fn expand_template_mask(seed: &[u8; 16], out: &mut [u32]) {
    expand_u32_domain(seed, TEMPLATE_MASK_DOMAIN, out);
}

/// Evaluator b's half of the one opening of a template: Y_b = y_b + δy_b.
pub fn masked_template_share(share: &EmbeddingShare, seed: &[u8; 16]) -> Vec<u32> {
    let mut out = vec![0u32; share.elements.len()];
    expand_template_mask(seed, &mut out);
    for (o, y) in out.iter_mut().zip(&share.elements) {
        *o = o.wrapping_add(*y);
    }
    out
}

/// SHA-256 over the ordered bundle ids of the compared templates: what an identification's
/// keys are bound to.
pub fn template_digest<'a>(ids: impl IntoIterator<Item = &'a [u8; BUNDLE_ID_LEN]>) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(b"privmatch face masked templates v1");
    for id in ids {
        hash.update(id);
    }
    hash.finalize().into()
}

/// Evaluator b's enrolled templates, held in memory: per template the opened masked template
/// Δy_j (l words), the seed of its own mask δy_j,b (re-expanded at each use: a 16-byte seed
/// instead of l more words halves the memory each identification streams through), its
/// share of ‖y_j‖² and its bundle id. Never holds y_j. Zeroised on drop; never printed.
pub struct MaskedTemplateSet {
    party: usize,
    dim: usize,
    rows: Vec<u32>,
    seeds: Vec<[u8; 16]>,
    norms: Vec<u32>,
    ids: Vec<[u8; BUNDLE_ID_LEN]>,
    /// Position of each held bundle id in `ids`.
    known: std::collections::HashMap<[u8; BUNDLE_ID_LEN], usize>,
}

impl Drop for MaskedTemplateSet {
    fn drop(&mut self) {
        self.rows.zeroize();
        self.seeds.zeroize();
        self.norms.zeroize();
    }
}

impl std::fmt::Debug for MaskedTemplateSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MaskedTemplateSet {{ party: {}, dim: {}, templates: {}, <redacted> }}",
            self.party,
            self.dim,
            self.ids.len()
        )
    }
}

impl MaskedTemplateSet {
    /// An empty set of evaluator `party` (0 or 1) for dimension `dim`.
    pub fn new(party: usize, dim: usize) -> Result<Self, FaceError> {
        if party > 1 {
            return Err(FaceError::NotAnEvaluator(party as u8));
        }
        check_dim(dim)?;
        Ok(MaskedTemplateSet {
            party,
            dim,
            rows: Vec::new(),
            seeds: Vec::new(),
            norms: Vec::new(),
            ids: Vec::new(),
            known: std::collections::HashMap::new(),
        })
    }

    /// Adds a template after its one opening: `own` = Y_b this party sent, `peer` = Y_{1−b}
    /// received, `seed` its mask seed, `norm` its share of ‖y‖², `id` its bundle id.
    pub fn push(
        &mut self,
        id: [u8; BUNDLE_ID_LEN],
        own: &[u32],
        peer: &[u32],
        seed: &[u8; 16],
        norm: u32,
    ) -> Result<(), FaceError> {
        if peer.len() != own.len() {
            return Err(FaceError::WrongDimension {
                expected: own.len(),
                got: peer.len(),
            });
        }
        let opened: Vec<u32> = own
            .iter()
            .zip(peer)
            .map(|(a, b)| a.wrapping_add(*b))
            .collect();
        self.push_opened(id, &opened, seed, norm)
    }

    /// Adds a template whose opened masked value Δy = Y_0 + Y_1 is already known (reloaded
    /// from where this party kept it after the opening).
    pub fn push_opened(
        &mut self,
        id: [u8; BUNDLE_ID_LEN],
        opened: &[u32],
        seed: &[u8; 16],
        norm: u32,
    ) -> Result<(), FaceError> {
        if opened.len() != self.dim {
            return Err(FaceError::WrongDimension {
                expected: self.dim,
                got: opened.len(),
            });
        }
        // A bundle id masks exactly one template: opening a second template under the same
        // id (the same δy) would reveal the difference of the two.
        if self.known.contains_key(&id) {
            return Err(FaceError::Malformed(
                "a template with this bundle id is already held",
            ));
        }
        self.known.insert(id, self.ids.len());
        self.rows.extend_from_slice(opened);
        self.seeds.push(*seed);
        self.norms.push(norm);
        self.ids.push(id);
        Ok(())
    }

    /// Drops the template with bundle id `id` (a deleted enrolment), keeping the order of the
    /// others, so both evaluators still hold the same ordered list after the same deletes.
    /// Returns whether it was held. The id may be opened again afterwards: the same template
    /// under the same id opens to the same Δy (face.md §8); that a *different* template never comes
    /// under a used id is the enrolment's replay guard (`consumed_bundles`).
    pub fn remove(&mut self, id: &[u8; BUNDLE_ID_LEN]) -> bool {
        let Some(j) = self.known.remove(id) else {
            return false;
        };
        let l = self.dim;
        self.rows[j * l..(j + 1) * l].zeroize();
        self.rows.drain(j * l..(j + 1) * l);
        self.seeds[j].zeroize();
        self.seeds.remove(j);
        self.norms.remove(j);
        self.ids.remove(j);
        for (k, later) in self.ids.iter().enumerate().skip(j) {
            self.known.insert(*later, k);
        }
        true
    }

    /// Keeps only the templates whose bundle id `keep` accepts, in their order (one pass,
    /// however many are dropped). Returns how many were dropped.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8; BUNDLE_ID_LEN]) -> bool) -> usize {
        let l = self.dim;
        let mut kept = 0;
        for j in 0..self.ids.len() {
            if !keep(&self.ids[j]) {
                self.rows[j * l..(j + 1) * l].zeroize();
                self.seeds[j].zeroize();
                continue;
            }
            if kept != j {
                self.rows.copy_within(j * l..(j + 1) * l, kept * l);
                self.seeds[kept] = self.seeds[j];
                self.norms[kept] = self.norms[j];
                self.ids[kept] = self.ids[j];
            }
            kept += 1;
        }
        let dropped = self.ids.len() - kept;
        self.rows[kept * l..].zeroize();
        self.rows.truncate(kept * l);
        for seed in &mut self.seeds[kept..] {
            seed.zeroize();
        }
        self.seeds.truncate(kept);
        self.norms.truncate(kept);
        self.ids.truncate(kept);
        self.reindex();
        dropped
    }

    /// Rebuilds the id → position map after the order changed.
    fn reindex(&mut self) {
        self.known = self
            .ids
            .iter()
            .enumerate()
            .map(|(k, id)| (*id, k))
            .collect();
    }

    /// Whether the templates are held in ascending bundle-id order.
    pub fn is_sorted_by_id(&self) -> bool {
        self.ids.windows(2).all(|w| w[0] < w[1])
    }

    /// Puts the templates in ascending bundle-id order, in place (each row moved once along
    /// the cycles of the permutation; one row of scratch). Two evaluators holding the same
    /// templates then hold the same ordered list, whatever order they loaded them in, so an
    /// identification over the whole set compares the same list at both (the order is what
    /// its keys and digest are bound to). Returns whether anything moved.
    pub fn sort_by_id(&mut self) -> bool {
        let n = self.ids.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by(|&a, &b| self.ids[a].cmp(&self.ids[b]));
        if order.iter().enumerate().all(|(k, &from)| k == from) {
            return false;
        }
        let l = self.dim;
        let mut scratch = vec![0u32; l];
        let mut placed = vec![false; n];
        for start in 0..n {
            if placed[start] {
                continue;
            }
            // The cycle through `start`: position k receives the template at order[k].
            scratch.copy_from_slice(&self.rows[start * l..(start + 1) * l]);
            let (seed, norm, id) = (self.seeds[start], self.norms[start], self.ids[start]);
            let mut k = start;
            loop {
                placed[k] = true;
                let from = order[k];
                if from == start {
                    self.rows[k * l..(k + 1) * l].copy_from_slice(&scratch);
                    self.seeds[k] = seed;
                    self.norms[k] = norm;
                    self.ids[k] = id;
                    break;
                }
                self.rows.copy_within(from * l..(from + 1) * l, k * l);
                self.seeds[k] = self.seeds[from];
                self.norms[k] = self.norms[from];
                self.ids[k] = self.ids[from];
                k = from;
            }
        }
        scratch.zeroize();
        self.reindex();
        true
    }

    /// Where the template with bundle id `id` is held, if it is.
    pub fn position(&self, id: &[u8; BUNDLE_ID_LEN]) -> Option<usize> {
        self.known.get(id).copied()
    }

    /// Whether the template with bundle id `id` is held.
    pub fn contains(&self, id: &[u8; BUNDLE_ID_LEN]) -> bool {
        self.known.contains_key(id)
    }

    /// Number of templates.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when no template is held.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The bundle ids, in order.
    pub fn ids(&self) -> &[[u8; BUNDLE_ID_LEN]] {
        &self.ids
    }

    /// [`template_digest`] of the held templates.
    pub fn digest(&self) -> [u8; 32] {
        template_digest(&self.ids)
    }
}

/// Dealer (Funshade `setup` for one identification against the templates `ids`, in order):
/// fresh probe mask seeds, and per template c_j = ⟨δx, δy_j⟩ shared, r_j shares and one
/// sign-gate key pair. Returns the two evaluators' halves (layout: [`IdentificationKeys`]).
/// One thread; the same dealing as [`deal_identification_on`] with any number of threads.
pub fn deal_identification<R: RngCore + CryptoRng>(
    params: &DealerParams,
    master: &TemplateMaskMaster,
    ids: &[[u8; BUNDLE_ID_LEN]],
    rng: &mut R,
) -> Result<[Vec<u8>; 2], FaceError> {
    deal_identification_on(params, master, ids, rng, 1)
}

/// Templates per independently seeded piece of a dealing: each piece draws from its own
/// ChaCha20 stream seeded from `rng`, so the dealing does not depend on the thread count.
const DEAL_PIECE: usize = 1024;

/// One piece of a dealing: per template, both evaluators' c, r and sign-gate keys.
#[derive(Default)]
struct DealtPiece {
    c: [Vec<u32>; 2],
    r: [Vec<u32>; 2],
    gates: [Vec<u8>; 2],
}

impl Drop for DealtPiece {
    fn drop(&mut self) {
        for v in self.c.iter_mut().chain(self.r.iter_mut()) {
            v.zeroize();
        }
        for g in self.gates.iter_mut() {
            g.zeroize();
        }
    }
}

fn deal_piece(
    master: &TemplateMaskMaster,
    ids: &[[u8; BUNDLE_ID_LEN]],
    delta_x: &[u32],
    offset: u32,
    seed: [u8; 32],
) -> DealtPiece {
    let mut rng = ChaCha20Rng::from_seed(seed);
    let l = delta_x.len();
    let n = ids.len();
    let mut piece = DealtPiece {
        c: [Vec::with_capacity(n), Vec::with_capacity(n)],
        r: [Vec::with_capacity(n), Vec::with_capacity(n)],
        gates: [
            Vec::with_capacity(n * IC_KEY_LEN),
            Vec::with_capacity(n * IC_KEY_LEN),
        ],
    };
    let mut scratch = vec![0u32; l];
    let mut delta_y = vec![0u32; l];
    let seeder = master.seeder();
    for id in ids {
        seeder.template_mask(id, &mut scratch, &mut delta_y);
        deal_comparison(delta_x, &delta_y, offset, &mut rng, &mut piece);
    }
    delta_y.zeroize();
    scratch.zeroize();
    piece
}

/// One comparison's keys (Funshade `setup`): c = ⟨δx, δy⟩ shared, r_in ∓ θ (`offset`)
/// shared, one sign-gate key pair for r_in; appended to `piece`.
fn deal_comparison<R: RngCore + CryptoRng>(
    delta_x: &[u32],
    delta_y: &[u32],
    offset: u32,
    rng: &mut R,
    piece: &mut DealtPiece,
) {
    let cj = dot_wrapping(delta_x, delta_y);
    let c0 = rng.next_u32();
    let r_in = rng.next_u32();
    let r0 = rng.next_u32();
    let (k0, k1) = ic::gen_sign_gate(rng, r_in);
    piece.c[0].push(c0);
    piece.c[1].push(cj.wrapping_sub(c0));
    piece.r[0].push(r0);
    piece.r[1].push(r_in.wrapping_add(offset).wrapping_sub(r0));
    k0.encode_into(&mut piece.gates[0]);
    k1.encode_into(&mut piece.gates[1]);
}

/// [`deal_identification`] on `threads` threads (the dealer's work grows with N; P2 runs it
/// for every identification).
pub fn deal_identification_on<R: RngCore + CryptoRng>(
    params: &DealerParams,
    master: &TemplateMaskMaster,
    ids: &[[u8; BUNDLE_ID_LEN]],
    rng: &mut R,
    threads: usize,
) -> Result<[Vec<u8>; 2], FaceError> {
    let mut probe_seeds = [[0u8; 16]; 2];
    for seed in probe_seeds.iter_mut() {
        rng.fill_bytes(seed);
    }
    let halves = deal_with_probe_seeds(params, master, ids, &probe_seeds, rng, threads);
    probe_seeds.zeroize();
    halves
}

/// The dealing of a 1:1 verification (docs/protocols/face.md §7): Funshade's
/// per-comparison `setup` for one comparison whose two masks are not drawn but derived from the
/// secrets P2 shares with each evaluator and the session id — evaluator b's probe mask seed
/// ([`verification_probe_seed`]) and its fresh template mask seed
/// ([`verification_template_seed`]; `from[b]`: P2's pairwise secrets with P_b). The dealer
/// needs neither the probe nor which template is compared, so it deals while the evaluators
/// open; each evaluator re-masks its template share with its fresh seed at the open
/// ([`verification_message`]). c = ⟨δx, δy'⟩ is shared, the threshold offset and one sign-gate
/// key pair come from `rng`. The keys name no template list ([`VERIFICATION_LIST_DIGEST`]).
pub fn deal_verification<R: RngCore + CryptoRng>(
    params: &DealerParams,
    session: &[u8; 16],
    from: [&PairwiseSecrets; 2],
    rng: &mut R,
) -> Result<[Vec<u8>; 2], FaceError> {
    let l = params.dim();
    let mut probe_seeds = from.map(|pair| verification_probe_seed(pair, session));
    let mut template_seeds = from.map(|pair| verification_template_seed(pair, session));
    let mut delta_x = summed_mask(&probe_seeds, l, expand_u32);
    let mut delta_y = summed_mask(&template_seeds, l, expand_template_mask);
    let mut piece = DealtPiece::default();
    deal_comparison(
        &delta_x,
        &delta_y,
        params.threshold_offset(),
        rng,
        &mut piece,
    );
    let halves = encode_halves(
        params,
        &VERIFICATION_LIST_DIGEST,
        &probe_seeds,
        std::slice::from_ref(&piece),
        1,
    );
    probe_seeds.zeroize();
    template_seeds.zeroize();
    delta_x.zeroize();
    delta_y.zeroize();
    Ok(halves)
}

/// The template digest a verification's keys carry: none (P2 does not learn which template a
/// verification compares, so its keys name no list).
pub const VERIFICATION_LIST_DIGEST: [u8; 32] = [0u8; 32];

/// δ = expand(seed_0) + expand(seed_1), of length `l`.
fn summed_mask(seeds: &[[u8; 16]; 2], l: usize, expand: fn(&[u8; 16], &mut [u32])) -> Vec<u32> {
    let mut sum = vec![0u32; l];
    let mut scratch = vec![0u32; l];
    for seed in seeds {
        expand(seed, &mut scratch);
        for (d, s) in sum.iter_mut().zip(&scratch) {
            *d = d.wrapping_add(*s);
        }
    }
    scratch.zeroize();
    sum
}

/// Evaluator b's probe mask seed sx_b of verification session `session`: 16 bytes of the PRF
/// that P_b and the dealer P2 share (`pair`, either side's [`PairwiseSecrets`]) on the
/// context label ‖ session. Session ids are single use at the evaluators, so no mask serves
/// two probes; the other evaluator and the coordinator do not know it, so X_b = x_b + δx_b
/// hides x_b from them as a fresh dealer-drawn seed would.
pub fn verification_probe_seed(pair: &PairwiseSecrets, session: &[u8; 16]) -> [u8; 16] {
    session_seed(pair, VERIFICATION_PROBE_INFO, session)
}

/// Evaluator b's fresh template mask seed sy'_b of verification session `session`, derived
/// as [`verification_probe_seed`] under its own label. The template's opened Δy was masked
/// with δy, which only the template's id lets P2 re-derive; re-masking with δy' (fresh per
/// session, single use like the session id) lets P2 deal without learning the template.
pub fn verification_template_seed(pair: &PairwiseSecrets, session: &[u8; 16]) -> [u8; 16] {
    session_seed(pair, VERIFICATION_TEMPLATE_INFO, session)
}

/// Evaluator b's two seeds of verification session `session`: its probe mask seed
/// ([`verification_probe_seed`]) and its fresh template mask seed
/// ([`verification_template_seed`]). Zeroised on drop; never printed.
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop)]
pub struct VerificationSeeds {
    /// sx_b: expands to δx_b.
    pub probe: [u8; 16],
    /// sy'_b: expands to δy'_b.
    pub template: [u8; 16],
}

impl VerificationSeeds {
    /// Both seeds from the secrets P_b shares with P2 (`pair`, either side's).
    pub fn derive(pair: &PairwiseSecrets, session: &[u8; 16]) -> Self {
        VerificationSeeds {
            probe: verification_probe_seed(pair, session),
            template: verification_template_seed(pair, session),
        }
    }
}

impl std::fmt::Debug for VerificationSeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VerificationSeeds(..)")
    }
}

/// 16 bytes of the PRF of `pair` on `label` ‖ `session`.
fn session_seed(pair: &PairwiseSecrets, label: &[u8], session: &[u8; 16]) -> [u8; 16] {
    let context = [label, session.as_slice()].concat();
    let mut seed = [0u8; 16];
    pair.prf().stream(&context).fill_bytes(&mut seed);
    seed
}

/// What evaluator b of a verification sends the other evaluator from its open (its round-2
/// message, 2·l words): X_b = x_b + δx_b (probe share `probe`, mask from `probe_seed`), then
/// Y'_b = y'_b + δy'_b, where y'_b = b·Δy − δy_b is this evaluator's share of the template at
/// `position` of `set` (so y'_0 + y'_1 = Δy − δy = y) and δy'_b comes from `seeds.template`
/// (δx_b from `seeds.probe`).
/// Δy' = Y'_0 + Y'_1 = y + δy' is a one-time pad of y under the session's fresh δy'.
pub fn verification_message(
    set: &MaskedTemplateSet,
    position: usize,
    probe: &EmbeddingShare,
    seeds: &VerificationSeeds,
) -> Result<Vec<u32>, FaceError> {
    let l = set.dim;
    if position >= set.len() {
        return Err(FaceError::Malformed("a selected template is not held"));
    }
    if probe.elements.len() != l {
        return Err(FaceError::WrongDimension {
            expected: l,
            got: probe.elements.len(),
        });
    }
    let mut out = masked_probe(probe, &seeds.probe);
    out.resize(2 * l, 0);
    let (_, big_y) = out.split_at_mut(l);
    let mut old_mask = vec![0u32; l];
    expand_template_mask(&set.seeds[position], &mut old_mask);
    expand_template_mask(&seeds.template, big_y);
    let lead = u32::from(set.party == 1);
    let opened = &set.rows[position * l..(position + 1) * l];
    for ((y, dy), m) in big_y.iter_mut().zip(opened).zip(&old_mask) {
        *y = y.wrapping_add(lead.wrapping_mul(*dy)).wrapping_sub(*m);
    }
    old_mask.zeroize();
    Ok(out)
}

/// Online round 2 of a verification (Funshade `eval_dist` for one comparison with both inputs
/// masked for the session): from this evaluator's message `own` and the peer's `peer` (each
/// [`verification_message`]: X ‖ Y'), Δx = X_0 + X_1 and Δy' = Y'_0 + Y'_1,
/// d_b = ⟨b·Δx − δx_b, Δy'⟩ − ⟨Δx, δy'_b⟩ + c_b, and z_b as [`distance_round`] (the norm share
/// of the template at `position`). Refuses keys that are not a verification's for this
/// evaluator's probe mask seed (`seeds`).
pub fn verification_distance(
    keys: &IdentificationKeys,
    set: &MaskedTemplateSet,
    position: usize,
    probe: &EmbeddingShare,
    seeds: &VerificationSeeds,
    own: &[u32],
    peer: &[u32],
) -> Result<u32, FaceError> {
    let l = set.dim;
    if keys.party != set.party {
        return Err(FaceError::PartyMismatch {
            inside: keys.party as u8,
            me: set.party as u8,
        });
    }
    if keys.len() != 1 || keys.digest != VERIFICATION_LIST_DIGEST {
        return Err(FaceError::Malformed(
            "the keys were not dealt for a verification",
        ));
    }
    if !keys.masks_probe_with(&seeds.probe) {
        return Err(FaceError::Malformed(
            "the keys were dealt for another probe mask",
        ));
    }
    if position >= set.len() {
        return Err(FaceError::Malformed("a selected template is not held"));
    }
    if keys.dim != l || probe.elements.len() != l {
        return Err(FaceError::WrongDimension {
            expected: l,
            got: keys.dim,
        });
    }
    if own.len() != 2 * l || peer.len() != 2 * l {
        return Err(FaceError::Malformed(
            "verification messages have the wrong length",
        ));
    }
    let sum = |k: usize| own[k].wrapping_add(peer[k]);
    let big_x: Vec<u32> = (0..l).map(sum).collect();
    let mut big_y: Vec<u32> = (l..2 * l).map(sum).collect();
    let mut u = probe_term(keys.party, &big_x, own, probe);
    let mut mask = vec![0u32; l];
    expand_template_mask(&seeds.template, &mut mask);
    let d = row_distance(&u, &big_x, &big_y, &mask).wrapping_add(keys.c[0]);
    u.zeroize();
    mask.zeroize();
    big_y.zeroize();
    Ok(distance_share(
        keys.metric,
        d,
        keys.r[0],
        probe.norm,
        set.norms[position],
    ))
}

/// u = b·Δx − δx_b of evaluator `party` (b = 1 for P1), with δx_b = X_b − x_b (`own`'s first
/// l words are X_b, `probe` is x_b): the probe's term of d_b in every comparison.
fn probe_term(party: usize, big_x: &[u32], own: &[u32], probe: &EmbeddingShare) -> Vec<u32> {
    let lead = u32::from(party == 1);
    big_x
        .iter()
        .zip(own.iter().zip(&probe.elements))
        .map(|(bx, (o, x))| lead.wrapping_mul(*bx).wrapping_sub(o.wrapping_sub(*x)))
        .collect()
}

/// z_b from d_b: d_b + r_b (cosine), or 2·d_b − ‖x‖²_b − ‖y‖²_b + r_b (Euclidean).
#[inline(always)]
fn distance_share(metric: Metric, d: u32, r: u32, probe_norm: u32, template_norm: u32) -> u32 {
    match metric {
        Metric::Cosine => d.wrapping_add(r),
        Metric::Euclidean => d
            .wrapping_mul(2)
            .wrapping_sub(probe_norm)
            .wrapping_sub(template_norm)
            .wrapping_add(r),
    }
}

/// The dealing for the ordered list `ids` with the evaluators' probe mask seeds
/// `probe_seeds`; per-template randomness from `rng` (pieces of [`DEAL_PIECE`], on
/// `threads` threads).
fn deal_with_probe_seeds<R: RngCore + CryptoRng>(
    params: &DealerParams,
    master: &TemplateMaskMaster,
    ids: &[[u8; BUNDLE_ID_LEN]],
    probe_seeds: &[[u8; 16]; 2],
    rng: &mut R,
    threads: usize,
) -> Result<[Vec<u8>; 2], FaceError> {
    let l = params.dim();
    let count = u32::try_from(ids.len())
        .map_err(|_| FaceError::Malformed("too many templates for one identification"))?;
    let digest = template_digest(ids);
    let mut delta_x = summed_mask(probe_seeds, l, expand_u32);
    let offset = params.threshold_offset();
    let slices: Vec<&[[u8; BUNDLE_ID_LEN]]> = ids.chunks(DEAL_PIECE).collect();
    let mut seeds: Vec<[u8; 32]> = slices
        .iter()
        .map(|_| {
            let mut seed = [0u8; 32];
            rng.fill_bytes(&mut seed);
            seed
        })
        .collect();
    let deal = |(ids, seed): (&&[[u8; BUNDLE_ID_LEN]], &[u8; 32])| {
        deal_piece(master, ids, &delta_x, offset, *seed)
    };
    let pieces: Vec<DealtPiece> = if worth_a_pool(slices.len(), 1, threads) {
        on_threads(threads, || {
            slices.par_iter().zip(&seeds).map(deal).collect()
        })
        .map_err(|_| FaceError::Malformed("a dealing thread panicked"))?
    } else {
        slices.iter().zip(&seeds).map(deal).collect()
    };
    seeds.zeroize();
    delta_x.zeroize();
    Ok(encode_halves(params, &digest, probe_seeds, &pieces, count))
}

/// Both evaluators' key halves (layout: [`IdentificationKeys`]) from the dealt `pieces` (in
/// comparison order, `count` comparisons in all).
fn encode_halves(
    params: &DealerParams,
    digest: &[u8; 32],
    probe_seeds: &[[u8; 16]; 2],
    pieces: &[DealtPiece],
    count: u32,
) -> [Vec<u8>; 2] {
    let n = count as usize;
    let mut halves = [Vec::new(), Vec::new()];
    for (b, half) in halves.iter_mut().enumerate() {
        half.reserve(IDENTIFICATION_HEADER_LEN + n * MASKED_KEY_LEN);
        half.extend_from_slice(IDENTIFICATION_MAGIC);
        half.push(VERSION);
        half.push(b as u8);
        half.push(params.metric().to_byte());
        half.extend_from_slice(&(params.dim() as u16).to_le_bytes());
        half.extend_from_slice(&count.to_le_bytes());
        half.extend_from_slice(digest);
        half.extend_from_slice(&probe_seeds[b]);
        for piece in pieces {
            half.extend(piece.c[b].iter().flat_map(|w| w.to_le_bytes()));
        }
        for piece in pieces {
            half.extend(piece.r[b].iter().flat_map(|w| w.to_le_bytes()));
        }
        for piece in pieces {
            half.extend_from_slice(&piece.gates[b]);
        }
    }
    halves
}

/// ⟨a, b⟩ in Z_2^32.
fn dot_wrapping(a: &[u32], b: &[u32]) -> u32 {
    a.iter()
        .zip(b)
        .fold(0u32, |acc, (&x, &y)| acc.wrapping_add(x.wrapping_mul(y)))
}

/// Evaluator b's keys for one identification, decoded. Byte layout of a half,
/// little-endian: `PMFI`, version 1, party, metric, dimension (u16), count N (u32), template
/// digest (32), probe mask seed sx_b (16), then c_b[N] (u32), r_b[N] (u32), N sign-gate keys
/// ([`IC_KEY_LEN`] each). Zeroised on drop; never printed.
pub struct IdentificationKeys {
    party: usize,
    metric: Metric,
    dim: usize,
    digest: [u8; 32],
    probe_seed: [u8; 16],
    c: Vec<u32>,
    r: Vec<u32>,
    gates: Vec<IcKeyBatch>,
}

impl Drop for IdentificationKeys {
    fn drop(&mut self) {
        self.probe_seed.zeroize();
        self.c.zeroize();
        self.r.zeroize();
    }
}

impl std::fmt::Debug for IdentificationKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IdentificationKeys {{ party: {}, metric: {}, dim: {}, comparisons: {}, <redacted> }}",
            self.party,
            self.metric,
            self.dim,
            self.c.len()
        )
    }
}

impl IdentificationKeys {
    /// Decodes evaluator `party`'s half; refuses another party's half, a malformed layout
    /// or key.
    pub fn decode(party: usize, bytes: &[u8]) -> Result<Self, FaceError> {
        let mut rd = Reader::new(bytes);
        rd.magic(IDENTIFICATION_MAGIC)?;
        let inside = rd.u8()?;
        if usize::from(inside) != party {
            return Err(FaceError::PartyMismatch {
                inside,
                me: party as u8,
            });
        }
        let metric = Metric::from_byte(rd.u8()?)?;
        let dim = usize::from(rd.u16()?);
        check_dim(dim)?;
        let n = rd.u32()? as usize;
        let digest = rd.array::<32>()?;
        let probe_seed = rd.array::<16>()?;
        if rd.rest().len() != n.saturating_mul(MASKED_KEY_LEN) {
            return Err(FaceError::Malformed(
                "identification keys: length does not match the count",
            ));
        }
        let mut rd = Reader::new(&bytes[IDENTIFICATION_HEADER_LEN..]);
        let c = rd.words(n)?;
        let r = rd.words(n)?;
        let gate_bytes = rd.rest();
        let gates = gate_bytes
            .chunks(GATE_CHUNK * IC_KEY_LEN)
            .map(|chunk| IcKeyBatch::decode_concatenated(chunk, 32))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IdentificationKeys {
            party,
            metric,
            dim,
            digest,
            probe_seed,
            c,
            r,
            gates,
        })
    }

    /// Number of comparisons the keys serve.
    pub fn len(&self) -> usize {
        self.c.len()
    }

    /// True for keys of an identification against nothing.
    pub fn is_empty(&self) -> bool {
        self.c.is_empty()
    }

    /// The template digest the keys were made for.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The metric the keys evaluate.
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// Whether the keys were dealt for the probe mask seed `seed` (a verification's evaluator
    /// masked its probe at the open with the seed it derived; keys for another mask would
    /// give wrong distances). Both seeds are the evaluator's own, so the comparison need not
    /// be constant-time.
    pub fn masks_probe_with(&self, seed: &[u8; 16]) -> bool {
        &self.probe_seed == seed
    }
}

/// Online round 1 (Funshade `share`, probe only): X_b = x_b + δx_b, the one vector this
/// evaluator sends per identification.
pub fn probe_round(
    keys: &IdentificationKeys,
    probe: &EmbeddingShare,
) -> Result<Vec<u32>, FaceError> {
    if probe.elements.len() != keys.dim {
        return Err(FaceError::WrongDimension {
            expected: keys.dim,
            got: probe.elements.len(),
        });
    }
    Ok(masked_probe(probe, &keys.probe_seed))
}

/// X_b = x_b + δx_b for the probe share `probe` and the probe mask seed `seed` (Funshade
/// `share`, probe only): what [`probe_round`] sends, and what an evaluator of a verification
/// sends from its open with the seed of [`verification_probe_seed`].
pub fn masked_probe(probe: &EmbeddingShare, seed: &[u8; 16]) -> Vec<u32> {
    let mut out = vec![0u32; probe.elements.len()];
    expand_u32(seed, &mut out);
    for (o, x) in out.iter_mut().zip(&probe.elements) {
        *o = o.wrapping_add(*x);
    }
    out
}

/// One template's ⟨u, Δy⟩ − ⟨Δx, δy_b⟩.
#[inline(always)]
fn row_distance(u: &[u32], big_x: &[u32], big_y: &[u32], mask: &[u32]) -> u32 {
    let mut acc = [0u32; 8];
    for (((u8s, x8s), y8s), m8s) in u
        .chunks_exact(8)
        .zip(big_x.chunks_exact(8))
        .zip(big_y.chunks_exact(8))
        .zip(mask.chunks_exact(8))
    {
        for k in 0..8 {
            acc[k] = acc[k]
                .wrapping_add(u8s[k].wrapping_mul(y8s[k]))
                .wrapping_sub(x8s[k].wrapping_mul(m8s[k]));
        }
    }
    let tail = u.len() - u.len() % 8;
    let mut sum = acc.iter().fold(0u32, |a, &v| a.wrapping_add(v));
    for i in tail..u.len() {
        sum = sum
            .wrapping_add(u[i].wrapping_mul(big_y[i]))
            .wrapping_sub(big_x[i].wrapping_mul(mask[i]));
    }
    sum
}

/// What every distance thread reads.
struct DistanceJob<'a> {
    keys: &'a IdentificationKeys,
    set: &'a MaskedTemplateSet,
    /// Comparison j uses the set's template `selection[j]` (all of them in order: None).
    selection: Option<&'a [usize]>,
    u: &'a [u32],
    big_x: &'a [u32],
    probe_norm: u32,
}

impl DistanceJob<'_> {
    #[inline(always)]
    fn run_body(&self, range: std::ops::Range<usize>, out: &mut [u32]) {
        let l = self.set.dim;
        let mut mask = vec![0u32; l];
        for (j, z) in range.zip(out.iter_mut()) {
            let t = self.selection.map_or(j, |s| s[j]);
            let big_y = &self.set.rows[t * l..(t + 1) * l];
            expand_template_mask(&self.set.seeds[t], &mut mask);
            let d = row_distance(self.u, self.big_x, big_y, &mask).wrapping_add(self.keys.c[j]);
            *z = distance_share(
                self.keys.metric,
                d,
                self.keys.r[j],
                self.probe_norm,
                self.set.norms[t],
            );
        }
        mask.zeroize();
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(&self, range: std::ops::Range<usize>, out: &mut [u32]) {
        // The same code, compiled with AVX2 so the multiply-adds use 8-lane vpmulld.
        self.run_body(range, out)
    }

    fn run(&self, range: std::ops::Range<usize>, out: &mut [u32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 support was checked just above.
            unsafe { self.run_avx2(range, out) };
            return;
        }
        self.run_body(range, out)
    }
}

/// Online round 2 (Funshade `eval_dist` against every held template): from the probe share,
/// this evaluator's round-1 vector `own` and the peer's `peer`, z_b,j = d_b,j + r_b,j
/// (cosine) or 2·d_b,j − ‖x‖²_b − ‖y_j‖²_b + r_b,j (Euclidean), one word per template, on
/// `threads` threads. Refuses keys made for another template list.
pub fn distance_round(
    keys: &IdentificationKeys,
    set: &MaskedTemplateSet,
    probe: &EmbeddingShare,
    own: &[u32],
    peer: &[u32],
    threads: usize,
) -> Result<Vec<u32>, FaceError> {
    if keys.len() != set.len() || keys.digest != set.digest() {
        return Err(FaceError::Malformed(
            "identification keys were made for another template list",
        ));
    }
    distance_job(keys, set, None, probe, own, peer, threads)
}

/// Online round 2 against the held templates at positions `selection`, in that order (a
/// verification, or an identification whose list the other evaluator fixed): as
/// [`distance_round`], comparison j against the template at `selection[j]`. Refuses keys
/// made for another list, and positions outside the set.
pub fn distance_round_selected(
    keys: &IdentificationKeys,
    set: &MaskedTemplateSet,
    selection: &[usize],
    probe: &EmbeddingShare,
    own: &[u32],
    peer: &[u32],
    threads: usize,
) -> Result<Vec<u32>, FaceError> {
    if selection.iter().any(|&t| t >= set.len()) {
        return Err(FaceError::Malformed("a selected template is not held"));
    }
    let digest = template_digest(selection.iter().map(|&t| &set.ids[t]));
    if keys.len() != selection.len() || keys.digest != digest {
        return Err(FaceError::Malformed(
            "identification keys were made for another template list",
        ));
    }
    distance_job(keys, set, Some(selection), probe, own, peer, threads)
}

fn distance_job(
    keys: &IdentificationKeys,
    set: &MaskedTemplateSet,
    selection: Option<&[usize]>,
    probe: &EmbeddingShare,
    own: &[u32],
    peer: &[u32],
    threads: usize,
) -> Result<Vec<u32>, FaceError> {
    let l = set.dim;
    if keys.party != set.party {
        return Err(FaceError::PartyMismatch {
            inside: keys.party as u8,
            me: set.party as u8,
        });
    }
    if keys.dim != l || probe.elements.len() != l {
        return Err(FaceError::WrongDimension {
            expected: l,
            got: keys.dim,
        });
    }
    if own.len() != l || peer.len() != l {
        return Err(FaceError::Malformed(
            "masked probe vectors have the wrong length",
        ));
    }
    let big_x: Vec<u32> = own
        .iter()
        .zip(peer)
        .map(|(a, b)| a.wrapping_add(*b))
        .collect();
    let mut u = probe_term(keys.party, &big_x, own, probe);
    let count = keys.len();
    let job = DistanceJob {
        keys,
        set,
        selection,
        u: &u,
        big_x: &big_x,
        probe_norm: probe.norm,
    };
    let mut out = vec![0u32; count];
    if worth_a_pool(count, MIN_DISTANCE_PIECE, threads) {
        let piece = piece_len(count, threads).max(MIN_DISTANCE_PIECE);
        on_threads(threads, || {
            out.par_chunks_mut(piece)
                .enumerate()
                .for_each(|(i, mine)| job.run(i * piece..i * piece + mine.len(), mine))
        })
        .map_err(|_| FaceError::Malformed("a distance thread panicked"))?;
    } else {
        job.run(0..count, &mut out);
    }
    u.zeroize();
    Ok(out)
}

/// Online round 3 (Funshade `eval_sign`): z = z_b + z_{1−b} per comparison, then
/// o_b = Eval^IC(b, key_b, z), on `threads` threads. o_0 + o_1 = 1 exactly when the
/// comparison matches ([`super::funshade::reconstruct`] adds them).
pub fn sign_round(
    keys: &IdentificationKeys,
    own: &[u32],
    peer: &[u32],
    threads: usize,
) -> Result<Vec<u32>, FaceError> {
    if own.len() != keys.len() || peer.len() != keys.len() {
        return Err(FaceError::Malformed(
            "distance shares have the wrong length",
        ));
    }
    let z: Vec<u32> = own
        .iter()
        .zip(peer)
        .map(|(a, b)| a.wrapping_add(*b))
        .collect();
    let mut out = vec![0u32; keys.len()];
    let party = keys.party as u8;
    let chunks: Vec<(&IcKeyBatch, &[u32], &mut [u32])> = keys
        .gates
        .iter()
        .zip(z.chunks(GATE_CHUNK).zip(out.chunks_mut(GATE_CHUNK)))
        .map(|(g, (zs, os))| (g, zs, os))
        .collect();
    if worth_a_pool(chunks.len(), 1, threads) {
        on_threads(threads, || {
            chunks
                .into_par_iter()
                .try_for_each(|(g, zs, os)| ic::eval_batch(party, g, zs, os))
        })
        .map_err(|_| FaceError::Malformed("a sign-gate thread panicked"))??;
    } else {
        for (g, zs, os) in chunks {
            ic::eval_batch(party, g, zs, os)?;
        }
    }
    Ok(out)
}

/// Runs the whole masked-template protocol in process — template opening, dealing, both
/// evaluators and the verifier — the reference the tests and the benchmark check against.
/// Returns the bits in template order.
pub fn identify_in_process<R: RngCore + CryptoRng>(
    params: &DealerParams,
    master: &TemplateMaskMaster,
    probe: &[EmbeddingShare; 2],
    sets: &[MaskedTemplateSet; 2],
    threads: usize,
    rng: &mut R,
) -> Result<Vec<bool>, FaceError> {
    let halves = deal_identification(params, master, sets[0].ids(), rng)?;
    let keys = [
        IdentificationKeys::decode(0, &halves[0])?,
        IdentificationKeys::decode(1, &halves[1])?,
    ];
    let x0 = probe_round(&keys[0], &probe[0])?;
    let x1 = probe_round(&keys[1], &probe[1])?;
    let z0 = distance_round(&keys[0], &sets[0], &probe[0], &x0, &x1, threads)?;
    let z1 = distance_round(&keys[1], &sets[1], &probe[1], &x1, &x0, threads)?;
    let o0 = sign_round(&keys[0], &z0, &z1, threads)?;
    let o1 = sign_round(&keys[1], &z1, &z0, threads)?;
    super::funshade::reconstruct(&o0, &o1)
}

/// Enrols shared templates into both evaluators' sets in process: the dealer's seeds, each
/// evaluator's Y_b, the exchange. The distributed system does the same over its channels.
pub fn open_templates_in_process(
    master: &TemplateMaskMaster,
    templates: &[([u8; BUNDLE_ID_LEN], [EmbeddingShare; 2])],
    dim: usize,
) -> Result<[MaskedTemplateSet; 2], FaceError> {
    let mut sets = [
        MaskedTemplateSet::new(0, dim)?,
        MaskedTemplateSet::new(1, dim)?,
    ];
    for (id, shares) in templates {
        let seeds = master.template_seeds(id);
        let y0 = masked_template_share(&shares[0], &seeds[0]);
        let y1 = masked_template_share(&shares[1], &seeds[1]);
        sets[0].push(*id, &y0, &y1, &seeds[0], shares[0].norm)?;
        sets[1].push(*id, &y1, &y0, &seeds[1], shares[1].norm)?;
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::dot;
    use crate::face::encoding::share_embedding;
    use crate::face::encoding::test_support::{embedding, property_case};
    use crate::face::quantize::{plaintext_match, squared_distance, Quantizer};
    use proptest::prelude::{any, prop, proptest, ProptestConfig};
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    fn id(rng: &mut ChaCha20Rng) -> [u8; BUNDLE_ID_LEN] {
        let mut id = [0u8; BUNDLE_ID_LEN];
        rng.fill_bytes(&mut id);
        id
    }

    fn check(
        metric: Metric,
        dim: usize,
        threshold: i64,
        probe: &[i32],
        templates: &[Vec<i32>],
        threads: usize,
        rng: &mut ChaCha20Rng,
    ) {
        let params = DealerParams::for_tests(metric, dim, threshold);
        let master = TemplateMaskMaster::generate(rng);
        let shared: Vec<_> = templates
            .iter()
            .map(|t| (id(rng), share_embedding(t, rng)))
            .collect();
        let sets = open_templates_in_process(&master, &shared, dim).unwrap();
        let probe_shares = share_embedding(probe, rng);
        let got =
            identify_in_process(&params, &master, &probe_shares, &sets, threads, rng).unwrap();
        assert_eq!(got.len(), templates.len());
        for (t, &bit) in templates.iter().zip(&got) {
            assert_eq!(bit, plaintext_match(metric, probe, t, threshold));
        }
    }

    #[test]
    fn thresholds_at_the_exact_value_decide_like_the_plaintext() {
        let mut rng = ChaCha20Rng::seed_from_u64(21);
        let dim = 128;
        let x = embedding(&mut rng, dim);
        let ys: Vec<Vec<i32>> = (0..5).map(|_| embedding(&mut rng, dim)).collect();
        for y in &ys {
            for delta in [-1i64, 0, 1] {
                check(
                    Metric::Cosine,
                    dim,
                    dot(&x, y) + delta,
                    &x,
                    &ys,
                    1,
                    &mut rng,
                );
                let e = squared_distance(&x, y) + delta;
                check(Metric::Euclidean, dim, e, &x, &ys, 2, &mut rng);
            }
        }
    }

    #[test]
    fn many_templates_on_many_threads_equal_the_plaintext() {
        // More templates than one gate chunk, so both rounds split across threads and
        // chunks; extreme vectors included (overflow bound).
        let mut rng = ChaCha20Rng::seed_from_u64(22);
        let dim = 128;
        let m = Quantizer::new(dim).unwrap().magnitude() as i32;
        let x = embedding(&mut rng, dim);
        let mut ys: Vec<Vec<i32>> = (0..GATE_CHUNK + 37)
            .map(|_| embedding(&mut rng, dim))
            .collect();
        ys.push(x.clone());
        ys.push(vec![m; dim]);
        ys.push(vec![-m; dim]);
        let theta = dot(&x, &ys[3]);
        for threads in [1, 3] {
            check(Metric::Cosine, dim, theta, &x, &ys, threads, &mut rng);
            let e = squared_distance(&x, &ys[5]);
            check(Metric::Euclidean, dim, e, &x, &ys, threads, &mut rng);
        }
    }

    #[test]
    fn a_selected_list_in_any_order_equals_the_plaintext_after_drops() {
        // A verification (one template) and an identification over a reordered subset, each
        // evaluator holding the set in its own order, after some templates were dropped.
        let mut rng = ChaCha20Rng::seed_from_u64(25);
        let dim = 128;
        let params_for = |theta| DealerParams::for_tests(Metric::Cosine, dim, theta);
        let master = TemplateMaskMaster::generate(&mut rng);
        let x = embedding(&mut rng, dim);
        let ys: Vec<Vec<i32>> = (0..40).map(|_| embedding(&mut rng, dim)).collect();
        let shared: Vec<_> = ys
            .iter()
            .map(|t| (id(&mut rng), share_embedding(t, &mut rng)))
            .collect();
        let mut sets = open_templates_in_process(&master, &shared, dim).unwrap();
        // P1 holds the same templates in reverse order.
        let reversed: Vec<_> = shared.iter().rev().cloned().collect();
        let [_, reversed1] = open_templates_in_process(&master, &reversed, dim).unwrap();
        sets[1] = reversed1;
        let dropped: Vec<[u8; BUNDLE_ID_LEN]> = shared.iter().step_by(3).map(|s| s.0).collect();
        for set in &mut sets {
            assert_eq!(set.retain(|id| !dropped.contains(id)), dropped.len());
            assert!(dropped.iter().all(|id| !set.contains(id)));
        }
        let probe = share_embedding(&x, &mut rng);
        let wanted: Vec<usize> = vec![31, 1, 2, 38, 17];
        let theta = dot(&x, &ys[17]);
        let ids: Vec<[u8; BUNDLE_ID_LEN]> = wanted.iter().map(|&j| shared[j].0).collect();
        for list in [&ids[..1], &ids[..]] {
            let halves = deal_identification(&params_for(theta), &master, list, &mut rng).unwrap();
            let keys = [0, 1].map(|b| IdentificationKeys::decode(b, &halves[b]).unwrap());
            let x0 = probe_round(&keys[0], &probe[0]).unwrap();
            let x1 = probe_round(&keys[1], &probe[1]).unwrap();
            let at = |b: usize| -> Vec<usize> {
                list.iter()
                    .map(|id| sets[b].position(id).unwrap())
                    .collect()
            };
            let z0 = distance_round_selected(&keys[0], &sets[0], &at(0), &probe[0], &x0, &x1, 2)
                .unwrap();
            let z1 = distance_round_selected(&keys[1], &sets[1], &at(1), &probe[1], &x1, &x0, 1)
                .unwrap();
            let o0 = sign_round(&keys[0], &z0, &z1, 1).unwrap();
            let o1 = sign_round(&keys[1], &z1, &z0, 1).unwrap();
            let bits = crate::face::funshade::reconstruct(&o0, &o1).unwrap();
            for (j, bit) in wanted.iter().zip(bits) {
                assert_eq!(bit, dot(&x, &ys[*j]) >= theta, "template {j}");
            }
            // Another selection (the same templates in another order) is refused, and so is
            // a position outside the set.
            let mut swapped = at(0);
            swapped.reverse();
            if swapped.len() > 1 {
                assert!(distance_round_selected(
                    &keys[0], &sets[0], &swapped, &probe[0], &x0, &x1, 1
                )
                .is_err());
            }
            let outside = vec![sets[0].len(); list.len()];
            assert!(
                distance_round_selected(&keys[0], &sets[0], &outside, &probe[0], &x0, &x1, 1)
                    .is_err()
            );
        }
    }

    #[test]
    fn a_verification_is_dealt_from_the_session_alone_and_matches_the_plaintext() {
        // Each evaluator masks its probe and re-masks its template share at the open, with
        // seeds it shares with P2 for the session; P2 deals from the session id alone (no
        // template id), and the bits equal the plaintext at and around the threshold, for
        // both metrics. Keys of another session, or an identification's, are refused.
        use crate::face::encoding::test_support::{pairwise, seeded_keys};
        let (mut rng, secrets, publics) = seeded_keys(28);
        let pair = |a: usize, b: usize| pairwise(&secrets, &publics, a, b);
        let dim = 128;
        let master = TemplateMaskMaster::generate(&mut rng);
        let x = embedding(&mut rng, dim);
        let ys: Vec<Vec<i32>> = (0..3).map(|_| embedding(&mut rng, dim)).collect();
        let shared: Vec<_> = ys
            .iter()
            .map(|t| (id(&mut rng), share_embedding(t, &mut rng)))
            .collect();
        let sets = open_templates_in_process(&master, &shared, dim).unwrap();
        let probe = share_embedding(&x, &mut rng);
        let dealer = [pair(2, 0), pair(2, 1)];
        let sq = |v: &[i32]| v.iter().map(|&a| i64::from(a) * i64::from(a)).sum::<i64>();
        for (n, metric) in [Metric::Cosine, Metric::Euclidean].into_iter().enumerate() {
            for j in 0..3 {
                // Cosine compares ⟨x, y⟩ ≥ θ; Euclidean 2⟨x, y⟩ − ‖x‖² − ‖y‖² ≥ −θ.
                let score = match metric {
                    Metric::Cosine => dot(&x, &ys[j]),
                    Metric::Euclidean => 2 * dot(&x, &ys[j]) - sq(&x) - sq(&ys[j]),
                };
                for delta in [-1i64, 0, 1] {
                    let theta = match metric {
                        Metric::Cosine => score + delta,
                        Metric::Euclidean => -(score + delta),
                    };
                    let params = DealerParams::for_tests(metric, dim, theta);
                    let session = [(n * 9 + j * 3) as u8 + (delta + 1) as u8; 16];
                    let seeds = |b: usize| VerificationSeeds::derive(&pair(b, 2), &session);
                    let at = |b: usize| sets[b].position(&shared[j].0).unwrap();
                    // At the opens, before any dealing: each evaluator's own seeds.
                    let msgs: Vec<Vec<u32>> = (0..2)
                        .map(|b| {
                            verification_message(&sets[b], at(b), &probe[b], &seeds(b)).unwrap()
                        })
                        .collect();
                    let halves =
                        deal_verification(&params, &session, [&dealer[0], &dealer[1]], &mut rng)
                            .unwrap();
                    let keys = [0, 1].map(|b| IdentificationKeys::decode(b, &halves[b]).unwrap());
                    let z: Vec<u32> = (0..2)
                        .map(|b| {
                            verification_distance(
                                &keys[b],
                                &sets[b],
                                at(b),
                                &probe[b],
                                &seeds(b),
                                &msgs[b],
                                &msgs[1 - b],
                            )
                            .unwrap()
                        })
                        .collect();
                    let o0 = sign_round(&keys[0], &z[..1], &z[1..], 1).unwrap();
                    let o1 = sign_round(&keys[1], &z[1..], &z[..1], 1).unwrap();
                    let bits = crate::face::funshade::reconstruct(&o0, &o1).unwrap();
                    assert_eq!(bits, vec![delta <= 0], "{metric:?}, template {j}, {delta}");
                }
            }
        }
        // Keys of another session mask with other seeds; an identification's name a list.
        let session = [5u8; 16];
        let params = DealerParams::for_tests(Metric::Cosine, dim, 0);
        let seeds = VerificationSeeds::derive(&pair(0, 2), &session);
        assert_eq!(seeds, VerificationSeeds::derive(&dealer[0], &session));
        assert_ne!(seeds.probe, seeds.template);
        assert_ne!(seeds.probe, verification_probe_seed(&pair(1, 2), &session));
        let at = sets[0].position(&shared[0].0).unwrap();
        let msg = verification_message(&sets[0], at, &probe[0], &seeds).unwrap();
        let other =
            deal_verification(&params, &[6u8; 16], [&dealer[0], &dealer[1]], &mut rng).unwrap();
        let identification =
            deal_identification(&params, &master, &[shared[0].0], &mut rng).unwrap();
        for half in [&other[0], &identification[0]] {
            let keys = IdentificationKeys::decode(0, half).unwrap();
            assert!(
                verification_distance(&keys, &sets[0], at, &probe[0], &seeds, &msg, &msg).is_err()
            );
        }
        // A message of the wrong length, or a template that is not held, is refused.
        let keys = IdentificationKeys::decode(
            0,
            &deal_verification(&params, &session, [&dealer[0], &dealer[1]], &mut rng).unwrap()[0],
        )
        .unwrap();
        let short = &msg[..msg.len() - 1];
        assert!(
            verification_distance(&keys, &sets[0], at, &probe[0], &seeds, &msg, short).is_err()
        );
        assert!(verification_message(&sets[0], sets[0].len(), &probe[0], &seeds).is_err());
    }

    #[test]
    fn a_verification_message_hides_the_template_behind_a_fresh_mask() {
        // Y'_0 + Y'_1 − δy' is the template, and the same template in two sessions travels
        // under unrelated masks (the opened Δy is never sent again).
        use crate::face::encoding::test_support::{pairwise, seeded_keys};
        let (mut rng, secrets, publics) = seeded_keys(29);
        let pair = |a: usize, b: usize| pairwise(&secrets, &publics, a, b);
        let dim = 128;
        let master = TemplateMaskMaster::generate(&mut rng);
        let y = embedding(&mut rng, dim);
        let shared = vec![(id(&mut rng), share_embedding(&y, &mut rng))];
        let sets = open_templates_in_process(&master, &shared, dim).unwrap();
        let probe = share_embedding(&embedding(&mut rng, dim), &mut rng);
        let big_y = |session: &[u8; 16]| {
            let mut sum = vec![0u32; dim];
            let mut mask = vec![0u32; dim];
            for b in 0..2 {
                let seeds = VerificationSeeds::derive(&pair(b, 2), session);
                let msg = verification_message(&sets[b], 0, &probe[b], &seeds).unwrap();
                let mut own = vec![0u32; dim];
                expand_template_mask(&seeds.template, &mut own);
                for k in 0..dim {
                    sum[k] = sum[k].wrapping_add(msg[dim + k]);
                    mask[k] = mask[k].wrapping_add(own[k]);
                }
            }
            (sum, mask)
        };
        let (a, mask_a) = big_y(&[1u8; 16]);
        let (b, _) = big_y(&[2u8; 16]);
        let plain: Vec<u32> = a
            .iter()
            .zip(&mask_a)
            .map(|(s, m)| s.wrapping_sub(*m))
            .collect();
        assert_eq!(plain, y.iter().map(|&v| v as u32).collect::<Vec<_>>());
        assert_ne!(a, b);
    }

    #[test]
    fn a_dealing_does_not_depend_on_the_thread_count() {
        let mut rng = ChaCha20Rng::seed_from_u64(26);
        let params = DealerParams::for_tests(Metric::Euclidean, 128, 77);
        let master = TemplateMaskMaster::generate(&mut rng);
        let ids: Vec<[u8; BUNDLE_ID_LEN]> = (0..2 * DEAL_PIECE + 5).map(|_| id(&mut rng)).collect();
        let dealt = |threads| {
            let mut rng = ChaCha20Rng::seed_from_u64(27);
            deal_identification_on(&params, &master, &ids, &mut rng, threads).unwrap()
        };
        let one = dealt(1);
        assert_eq!(one, dealt(3));
        assert_eq!(
            IdentificationKeys::decode(1, &one[1]).unwrap().len(),
            ids.len()
        );
    }

    #[test]
    fn keys_for_another_template_list_or_party_are_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(23);
        let dim = 128;
        let params = DealerParams::for_tests(Metric::Cosine, dim, 0);
        let master = TemplateMaskMaster::generate(&mut rng);
        let shared: Vec<_> = (0..3)
            .map(|_| (id(&mut rng), share_embedding(&vec![1; dim], &mut rng)))
            .collect();
        let sets = open_templates_in_process(&master, &shared, dim).unwrap();
        let mut other = sets[0].ids().to_vec();
        other.swap(0, 1);
        let halves = deal_identification(&params, &master, &other, &mut rng).unwrap();
        let keys = IdentificationKeys::decode(0, &halves[0]).unwrap();
        let probe = share_embedding(&vec![1; dim], &mut rng);
        let x0 = probe_round(&keys, &probe[0]).unwrap();
        assert!(distance_round(&keys, &sets[0], &probe[0], &x0, &x0, 1).is_err());
        assert!(matches!(
            IdentificationKeys::decode(1, &halves[0]),
            Err(FaceError::PartyMismatch { .. })
        ));
        assert!(IdentificationKeys::decode(0, &halves[0][..halves[0].len() - 1]).is_err());
        let keys1 = IdentificationKeys::decode(1, &halves[1]).unwrap();
        let x1 = probe_round(&keys1, &probe[1]).unwrap();
        assert!(distance_round(&keys1, &sets[0], &probe[0], &x1, &x0, 1).is_err());
        assert!(sign_round(&keys, &[1, 2], &[3, 4], 1).is_err());
        assert!(!format!("{keys:?} {:?} {master:?}", sets[0]).contains("PMFI"));
    }

    #[test]
    fn masks_are_per_template_per_party_and_deterministic() {
        let mut rng = ChaCha20Rng::seed_from_u64(24);
        let master = TemplateMaskMaster::generate(&mut rng);
        let (a, b) = (id(&mut rng), id(&mut rng));
        let sa = master.template_seeds(&a);
        assert_eq!(sa, master.template_seeds(&a));
        assert_ne!(sa[0], sa[1]);
        assert_ne!(sa, master.template_seeds(&b));
        let again = TemplateMaskMaster::from_bytes(&master.to_bytes()).unwrap();
        assert_eq!(again.template_seeds(&a), sa);
        assert!(TemplateMaskMaster::from_bytes(&[0u8; 31]).is_err());
        // The template mask stream is not the probe mask stream of the same seed.
        let (mut t, mut p) = ([0u32; 8], [0u32; 8]);
        expand_template_mask(&sa[0], &mut t);
        expand_u32(&sa[0], &mut p);
        assert_ne!(t, p);
    }

    #[test]
    fn session_dealings_repeat_for_one_session_and_list_only() {
        let mut rng = ChaCha20Rng::seed_from_u64(26);
        let params = DealerParams::for_tests(Metric::Cosine, 128, 3);
        let master = TemplateMaskMaster::generate(&mut rng);
        let ids = [id(&mut rng), id(&mut rng)];
        let digest = template_digest(&ids);
        let deal_for = |keys_for: KeysFor, digest: &[u8; 32]| {
            deal_identification(
                &params,
                &master,
                &ids,
                &mut master.dealing_rng(keys_for, digest),
            )
            .unwrap()
        };
        let deal =
            |session: [u8; 16], digest: &[u8; 32]| deal_for(KeysFor::Session(session), digest);
        let first = deal([1; 16], &digest);
        assert_eq!(first, deal([1; 16], &digest));
        assert_ne!(first[0], deal([2; 16], &digest)[0]);
        assert_ne!(first[0], deal([1; 16], &[0; 32])[0]);
        // A stock id equal to a session id deals other keys: the kinds never collide.
        let stocked = deal_for(KeysFor::Stock([1; 16]), &digest);
        assert_eq!(stocked, deal_for(KeysFor::Stock([1; 16]), &digest));
        assert_ne!(first[0], stocked[0]);
        assert_ne!(first[1], stocked[1]);
        let other = TemplateMaskMaster::generate(&mut rng);
        let mut other_rng = other.dealing_rng(KeysFor::Session([1; 16]), &digest);
        assert_ne!(
            first[0],
            deal_identification(&params, &other, &ids, &mut other_rng).unwrap()[0]
        );
    }

    #[test]
    fn sorting_by_id_gives_one_order_for_any_load_order_and_keeps_each_template() {
        let mut rng = ChaCha20Rng::seed_from_u64(91);
        let l = crate::face::quantize::MIN_DIM;
        // (bundle id, opened row, seed, norm) per template.
        type Held = ([u8; BUNDLE_ID_LEN], Vec<u32>, [u8; 16], u32);
        let templates: Vec<Held> = (0..50)
            .map(|_| {
                let row: Vec<u32> = (0..l).map(|_| rng.gen()).collect();
                let mut seed = [0u8; 16];
                rng.fill_bytes(&mut seed);
                (id(&mut rng), row, seed, rng.gen())
            })
            .collect();
        let load = |order: &[usize]| {
            let mut set = MaskedTemplateSet::new(0, l).unwrap();
            for &i in order {
                let (id, row, seed, norm) = &templates[i];
                set.push_opened(*id, row, seed, *norm).unwrap();
            }
            set
        };
        let forward: Vec<usize> = (0..templates.len()).collect();
        let mut shuffled = forward.clone();
        shuffled.shuffle(&mut rng);
        let (mut a, mut b) = (load(&forward), load(&shuffled));
        assert_ne!(a.ids(), b.ids());
        assert!(a.sort_by_id() && b.sort_by_id());
        assert!(a.is_sorted_by_id() && !a.sort_by_id(), "sorted once");
        assert_eq!(a.ids(), b.ids());
        assert_eq!(a.digest(), b.digest());
        assert_eq!(
            (a.rows.clone(), a.seeds.clone(), a.norms.clone()),
            (b.rows.clone(), b.seeds.clone(), b.norms.clone())
        );
        for (id, row, seed, norm) in &templates {
            let t = a.position(id).unwrap();
            assert_eq!(&a.rows[t * l..(t + 1) * l], row.as_slice());
            assert_eq!((&a.seeds[t], a.norms[t]), (seed, *norm));
        }
    }

    #[test]
    fn removed_templates_leave_the_others_in_order_and_matching() {
        let mut rng = ChaCha20Rng::seed_from_u64(27);
        let dim = 128;
        let metric = Metric::Euclidean;
        let master = TemplateMaskMaster::generate(&mut rng);
        let ys: Vec<Vec<i32>> = (0..6).map(|_| embedding(&mut rng, dim)).collect();
        let x = ys[4].clone();
        let theta = squared_distance(&x, &ys[2]);
        let params = DealerParams::for_tests(metric, dim, theta);
        let shared: Vec<_> = ys
            .iter()
            .map(|t| (id(&mut rng), share_embedding(t, &mut rng)))
            .collect();
        let mut sets = open_templates_in_process(&master, &shared, dim).unwrap();
        for set in sets.iter_mut() {
            assert!(set.remove(&shared[1].0));
            assert!(set.remove(&shared[5].0));
            assert!(!set.remove(&shared[5].0));
        }
        let kept = [0usize, 2, 3, 4];
        let want: Vec<[u8; BUNDLE_ID_LEN]> = kept.iter().map(|&j| shared[j].0).collect();
        assert_eq!(sets[0].ids(), &want[..]);
        assert_eq!(sets[0].digest(), sets[1].digest());
        let probe = share_embedding(&x, &mut rng);
        let got = identify_in_process(&params, &master, &probe, &sets, 2, &mut rng).unwrap();
        let expected: Vec<bool> = kept
            .iter()
            .map(|&j| plaintext_match(metric, &x, &ys[j], theta))
            .collect();
        assert_eq!(got, expected);
        // A removed template can be opened again (an engine reloading it).
        let (again, shares) = &shared[1];
        let seeds = master.template_seeds(again);
        let y0 = masked_template_share(&shares[0], &seeds[0]);
        let y1 = masked_template_share(&shares[1], &seeds[1]);
        assert!(sets[0]
            .push(*again, &y0, &y1, &seeds[0], shares[0].norm)
            .is_ok());
        assert_eq!(sets[0].len(), 5);
    }

    #[test]
    fn one_template_opening_is_a_one_time_pad_per_party() {
        // The same template enrolled twice (two bundle ids) opens to unrelated Δy: its
        // masks are independent, so two openings do not reveal y's difference (zero).
        let mut rng = ChaCha20Rng::seed_from_u64(25);
        let dim = 128;
        let master = TemplateMaskMaster::generate(&mut rng);
        let y = embedding(&mut rng, dim);
        let shared = vec![
            (id(&mut rng), share_embedding(&y, &mut rng)),
            (id(&mut rng), share_embedding(&y, &mut rng)),
        ];
        let mut sets = open_templates_in_process(&master, &shared, dim).unwrap();
        // The same id again is refused, and changes nothing.
        let (again, shares) = &shared[0];
        let seeds = master.template_seeds(again);
        let y = masked_template_share(&shares[0], &seeds[0]);
        assert!(sets[0].push(*again, &y, &y, &seeds[0], 0).is_err());
        assert_eq!(sets[0].len(), 2);
        let rows = &sets[0].rows;
        let equal = (0..dim).filter(|&i| rows[i] == rows[dim + i]).count();
        assert!(equal < 3, "{equal} equal words");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn bits_equal_the_plaintext_comparison(
            seed in any::<u64>(),
            dim in prop::sample::select(vec![128usize, 200, 512, 1024]),
            euclidean in any::<bool>(),
            near in any::<bool>(),
        ) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let metric = if euclidean { Metric::Euclidean } else { Metric::Cosine };
            let (x, ys, threshold) = property_case(&mut rng, dim, metric, near);
            check(metric, dim, threshold, &x, &ys, 2, &mut rng);
        }
    }
}
