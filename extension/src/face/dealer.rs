//! The dealer (P2): its configuration (metric, dimension, secret threshold), the template-mask
//! master key, and the single-use keys of each session over dealer-masked templates, sealed
//! to P0 and P1 (Funshade `setup`, the offline phase, run per session or stocked ahead).

use pgrx::prelude::*;
use privmatch_core::crypto::at_rest::AtRestKey;
use privmatch_core::crypto::seal::PairwiseSecrets;
use privmatch_core::face::dealer::{open_dealer_config, DealerConfig, DEALER_CONFIG_ACTION};
use privmatch_core::face::funshade::DealerParams;
use privmatch_core::face::mask_dealer::{
    seal_identification_key_chunks, seal_template_seeds, KEY_CHUNK_BYTES,
};
use privmatch_core::face::masked::{
    deal_identification_on, deal_verification, template_digest, KeysFor, TemplateMaskMaster,
    BUNDLE_ID_LEN, TEMPLATE_MASTER_LEN, VERIFICATION_LIST_DIGEST,
};
use privmatch_core::face::Metric;
use privmatch_core::party::PartyIndex;
use rand::RngCore;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::raise_face;
use crate::errors::{get_one, log_session, parse_session_id, raise, run};
use crate::identity::{load_identity, pinned_peer, Identity};
use crate::operator::accept_command;

/// The at-rest purpose of the sealed threshold θ (`face_dealer.threshold_sealed`).
const THRESHOLD_PURPOSE: &str = "face-dealer-threshold";
/// The at-rest purpose of the sealed master key K (`face_template_master.master_key_sealed`).
const MASTER_PURPOSE: &str = "face-template-master";

/// θ sealed under this party's at-rest key (core's `crypto::at_rest`), so that it is in no
/// WAL record or backup in the clear.
fn seal_threshold(me: &Identity, threshold: f64) -> Vec<u8> {
    AtRestKey::derive(&me.secret, me.index, THRESHOLD_PURPOSE)
        .seal(&mut rand::rngs::OsRng, &threshold.to_bits().to_be_bytes())
}

/// Opens the stored θ; raises 55000 when it does not open under the current key file.
fn open_threshold(function: &str, me: &Identity, sealed: &[u8]) -> f64 {
    let opened = AtRestKey::derive(&me.secret, me.index, THRESHOLD_PURPOSE)
        .open(sealed)
        .ok()
        .and_then(|bytes| <[u8; 8]>::try_from(bytes.as_slice()).ok())
        .unwrap_or_else(|| sealed_under_another_key(function, "threshold"));
    f64::from_bits(u64::from_be_bytes(opened))
}

/// Raises 55000: a secret stored sealed does not open under this party's key file.
fn sealed_under_another_key(function: &str, what: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{function}: the dealer's stored {what} does not open under this party's key file (was the party key rotated?)"),
        Some("configure the dealer again (privmatch face configure); after a new template master key the evaluators open their templates again"),
    )
}

fn dealer_identity(function: &str) -> Identity {
    let me = load_identity();
    if me.index != PartyIndex::ALL[2] {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{function}: this party is {}; only P2 deals face keys",
                me.index
            ),
            None,
        );
    }
    me
}

/// Stores the dealer configuration sealed to this party (P2) by the operator's CLI: metric,
/// dimension and the secret threshold, which never leaves P2 in any form but the keys it
/// deals. `command` is an operator command (core's `crypto::sign`, action
/// [`DEALER_CONFIG_ACTION`]) signed by P2's operator key and carrying the sealed
/// configuration: the coordinator relays it but can neither forge one (a threshold of its
/// choosing would make every face match) nor replay an old one. Each configuration is a new
/// generation; keys dealt from then on use it, and the template-mask master key is kept, so
/// the evaluators' opened templates stay valid. Returns the metric, dimension and generation.
#[pg_extern(volatile)]
fn face_dealer_configure(
    command: &[u8],
) -> TableIterator<
    'static,
    (
        name!(metric, String),
        name!(dim, i32),
        name!(generation, i64),
    ),
> {
    const F: &str = "face_dealer_configure";
    let me = dealer_identity(F);
    let config = accept_command(F, DEALER_CONFIG_ACTION, command);
    let opened =
        open_dealer_config(me.index, &me.secret, &config).unwrap_or_else(|e| raise_face(F, e));
    let generation = get_one::<i64>(
        F,
        "INSERT INTO privmatch.face_dealer (metric, dim, threshold_sealed, generation) \
         VALUES ($1, $2, $3, 1) \
         ON CONFLICT (singleton) DO UPDATE SET metric = EXCLUDED.metric, dim = EXCLUDED.dim, \
             threshold_sealed = EXCLUDED.threshold_sealed, generation = privmatch.face_dealer.generation + 1, \
             configured_at = now() \
         RETURNING generation",
        &[
            opened.metric.as_str().into(),
            (opened.dim as i32).into(),
            seal_threshold(&me, opened.threshold).into(),
        ],
    )
    .unwrap_or_default();
    ensure_template_master(F, &me);
    TableIterator::once((
        opened.metric.as_str().to_owned(),
        opened.dim as i32,
        generation,
    ))
}

/// The dealer's public state: metric, dimension and generation (never the threshold or the
/// template-mask master key). No rows when unconfigured.
#[pg_extern(stable)]
fn face_dealer_status() -> TableIterator<
    'static,
    (
        name!(metric, String),
        name!(dim, i32),
        name!(generation, i64),
    ),
> {
    let row = Spi::get_three::<String, i32, i64>(
        "SELECT metric, dim, generation FROM privmatch.face_dealer",
    );
    match row {
        Ok((Some(metric), Some(dim), Some(generation))) => {
            TableIterator::once((metric, dim, generation))
        }
        _ => TableIterator::new(Vec::new()),
    }
}

/// Draws the template-mask master key K once (docs/protocols/face.md §5); an existing key is
/// kept, so templates the evaluators opened under it stay valid across reconfigurations.
fn ensure_template_master(function: &str, me: &Identity) {
    let mut key = [0u8; TEMPLATE_MASTER_LEN];
    rand::rngs::OsRng.fill_bytes(&mut key);
    let sealed =
        AtRestKey::derive(&me.secret, me.index, MASTER_PURPOSE).seal(&mut rand::rngs::OsRng, &key);
    zeroize::Zeroize::zeroize(&mut key);
    run(
        function,
        "INSERT INTO privmatch.face_template_master (master_key_sealed) VALUES ($1) \
         ON CONFLICT (singleton) DO NOTHING",
        &[sealed.into()],
    );
}

/// The master key K; raises 55000 when the dealer was never configured. A dealer configured
/// before 0.6.0 (no K yet) draws it here, once.
fn load_template_master(function: &str, me: &Identity) -> TemplateMaskMaster {
    let read = || {
        get_one::<Vec<u8>>(
            function,
            "SELECT (SELECT master_key_sealed FROM privmatch.face_template_master)",
            &[],
        )
    };
    // Read first: the insert is needed once per dealer, not on every dealing.
    let stored = read().or_else(|| {
        let configured = get_one::<bool>(
            function,
            "SELECT EXISTS (SELECT 1 FROM privmatch.face_dealer)",
            &[],
        )
        .unwrap_or(false);
        if !configured {
            return None;
        }
        ensure_template_master(function, me);
        read()
    });
    let Some(sealed) = stored else {
        not_configured(function);
    };
    let bytes = AtRestKey::derive(&me.secret, me.index, MASTER_PURPOSE)
        .open(&sealed)
        .unwrap_or_else(|_| sealed_under_another_key(function, "template master key"));
    TemplateMaskMaster::from_bytes(&bytes).unwrap_or_else(|e| raise_face(function, e))
}

/// The dealer's parameters (metric, dimension, secret threshold); raises 55000 when the
/// dealer was never configured.
fn load_params(function: &str, me: &Identity) -> DealerParams {
    let row = Spi::get_three::<String, i32, Vec<u8>>(
        "SELECT metric, dim, threshold_sealed FROM privmatch.face_dealer",
    );
    let Ok((Some(metric), Some(dim), Some(sealed))) = row else {
        not_configured(function);
    };
    let threshold = open_threshold(function, me, &sealed);
    dealer_params(function, &metric, dim, threshold)
}

/// Raises 55000: the dealer was never configured.
fn not_configured(function: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{function}: the dealer is not configured"),
        Some("run privmatch face configure --metric cosine|euclidean --threshold T --dim L"),
    )
}

/// The dealing parameters of the stored configuration.
fn dealer_params(function: &str, metric: &str, dim: i32, threshold: f64) -> DealerParams {
    let metric = Metric::parse(metric).unwrap_or_else(|e| raise_face(function, e));
    let config = DealerConfig {
        metric,
        dim: dim as usize,
        threshold,
    };
    DealerParams::new(&config).unwrap_or_else(|e| raise_face(function, e))
}

/// The bundle ids passed to `function` as `bundle_ids`: at least one, each 16 bytes, none
/// NULL (22023 / 22004 naming the argument and the position otherwise).
pub(super) fn parse_bundle_ids(
    function: &str,
    bundle_ids: Array<'_, &[u8]>,
) -> Vec<[u8; BUNDLE_ID_LEN]> {
    if bundle_ids.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: bundle_ids is empty"),
            None,
        );
    }
    bundle_ids
        .iter()
        .enumerate()
        .map(|(position, id)| {
            let Some(id) = id else {
                raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    format!("{function}: bundle_ids[{}] is NULL", position + 1),
                    None,
                );
            };
            id.try_into().unwrap_or_else(|_| {
                raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    format!(
                        "{function}: bundle_ids[{}] must be {BUNDLE_ID_LEN} bytes, got {}",
                        position + 1,
                        id.len()
                    ),
                    None,
                )
            })
        })
        .collect()
}

/// The pairwise secrets of this dealer with evaluator `b`.
fn channel_to(function: &str, me: &Identity, b: usize) -> PairwiseSecrets {
    let evaluator = PartyIndex::ALL[b];
    let peer = pinned_peer(function, evaluator);
    crate::identity::CHANNELS
        .derive(me.index, &me.secret, evaluator, &peer)
        .unwrap_or_else(|e| raise_face(function, e.into()))
}

/// Step 1 of docs/protocols/face.md §6 (the dealer's part of opening templates once):
/// evaluator `party`'s (0 or 1) mask seeds of the templates `bundle_ids`, in order, sealed on
/// the channel P2 → P_party under a session id bound to the digest of the list (core's
/// `seal_template_seeds`), so a reply opens only for the list asked for and only at that
/// evaluator. 32 bytes per template. The seeds are HKDF outputs of the master key K, so
/// asking twice returns the same seeds: P2 keeps no per-template state.
#[pg_extern(volatile)]
fn face_dealer_template_seeds(party: i32, bundle_ids: Array<'_, &[u8]>) -> Vec<u8> {
    const F: &str = "face_dealer_template_seeds";
    if !(0..=1).contains(&party) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: party must be 0 or 1 (an evaluator), got {party}"),
            None,
        );
    }
    let ids = parse_bundle_ids(F, bundle_ids);
    let me = dealer_identity(F);
    let master = load_template_master(F, &me);
    let pair = channel_to(F, &me, party as usize);
    let mut rng = ChaCha20Rng::from_entropy();
    seal_template_seeds(party as usize, &master, &ids, &pair, &mut rng)
        .unwrap_or_else(|e| raise_face(F, e))
}

/// Step 2 of docs/protocols/face.md §6: deals the keys of face session `session` (16
/// bytes) against the templates `bundle_ids`, in the order the evaluators compare them: a
/// fresh probe mask and, per template, the shares of ⟨δx, δy_j⟩, of r_in,j ∓ θ and one sign-gate
/// key pair (core's `deal_identification`, `PMFI` halves, 683 bytes per comparison). Each
/// half is sealed on the channel P2 → P_b under a session id derived from `session`, so it
/// opens for that session only, and bound to the digest of the list, which each evaluator
/// checks against its own template set. One row per chunk (`chunk` from 0) holding at most
/// 256 MiB of each half, so no number of templates exceeds a message; the evaluator opens the
/// chunks in order. The randomness is derived from K, the session and the list, so asking
/// again for the same session and list deals exactly the same keys (an evaluator never gets
/// two different dealings of one session); the session ids are single use at the evaluators.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile)]
fn face_dealer_identify(
    session: &[u8],
    bundle_ids: Array<'_, &[u8]>,
) -> TableIterator<
    'static,
    (
        name!(chunk, i32),
        name!(envelope_p0, Vec<u8>),
        name!(envelope_p1, Vec<u8>),
    ),
> {
    const F: &str = "face_dealer_identify";
    let session = parse_session_id(F, "session", session);
    let ids = parse_bundle_ids(F, bundle_ids);
    let (me, pairs) = dealer_channels(F);
    let rows = deal_rows(F, &me, &pairs, KeysFor::Session(session), &ids);
    log_session(F, &session, "dealt");
    TableIterator::new(rows)
}

/// Deals the keys of 1:1 verification session `session` (16 bytes; docs/protocols/face.md
/// §7) from the session id alone: each evaluator's probe mask and fresh template mask
/// are derived from what this dealer shares with it and the session id (core's
/// `deal_verification`), so the coordinator calls this while P0 and P1 open, and this dealer
/// learns neither the subject nor which template is compared. Dealt under the verification
/// label (core's `KeysFor::Verification`: such keys never open in an identification
/// session, nor identification keys in a verification); asking again for the same session
/// deals the same keys, and session ids are single use at the evaluators. Errors: 22023 bad
/// arguments, 55000 not configured or not P2.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile)]
fn face_dealer_verify(
    session: &[u8],
) -> TableIterator<
    'static,
    (
        name!(chunk, i32),
        name!(envelope_p0, Vec<u8>),
        name!(envelope_p1, Vec<u8>),
    ),
> {
    const F: &str = "face_dealer_verify";
    let session = parse_session_id(F, "session", session);
    let (me, pairs) = dealer_channels(F);
    let rows = deal_rows(F, &me, &pairs, KeysFor::Verification(session), &[]);
    log_session(F, &session, "dealt");
    TableIterator::new(rows)
}

/// Deals, ahead of any session, the keys of one identification against the templates
/// `bundle_ids` under the stock id `stock` (16 bytes; docs/protocols/face.md §11): the same
/// dealing as `face_dealer_identify`, derived and sealed under the stock label instead of
/// the session's, so no session id can ever be dealt the same keys. P0 and P1 keep the
/// halves in their engines (`face_masked_stock`) and let one identification over exactly
/// that list claim them, once (`privmatch.face_stock_used`). Asking again for the same stock
/// id and list deals the same keys.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile)]
fn face_dealer_stock(
    stock: &[u8],
    bundle_ids: Array<'_, &[u8]>,
) -> TableIterator<
    'static,
    (
        name!(chunk, i32),
        name!(envelope_p0, Vec<u8>),
        name!(envelope_p1, Vec<u8>),
    ),
> {
    const F: &str = "face_dealer_stock";
    let stock = parse_session_id(F, "stock", stock);
    let ids = parse_bundle_ids(F, bundle_ids);
    let (me, pairs) = dealer_channels(F);
    TableIterator::new(deal_rows(F, &me, &pairs, KeysFor::Stock(stock), &ids))
}

/// This dealer's identity and its pairwise secrets with P0 and P1 (loaded once per call).
fn dealer_channels(function: &str) -> (Identity, [PairwiseSecrets; 2]) {
    let me = dealer_identity(function);
    let pairs = [0, 1].map(|b| channel_to(function, &me, b));
    (me, pairs)
}

/// The dealing for `keys_for` against `bundle_ids` (none for a verification, which names no
/// template), sealed to P0 and P1 (`pairs`, this dealer's secrets with each, from
/// [`dealer_channels`]): one row per chunk (chunk number, P0's envelope, P1's envelope).
fn deal_rows(
    function: &str,
    me: &Identity,
    pairs: &[PairwiseSecrets; 2],
    keys_for: KeysFor,
    ids: &[[u8; BUNDLE_ID_LEN]],
) -> Vec<(i32, Vec<u8>, Vec<u8>)> {
    let params = load_params(function, me);
    let master = load_template_master(function, me);
    let list = match keys_for {
        KeysFor::Verification(_) => VERIFICATION_LIST_DIGEST,
        _ => template_digest(ids),
    };
    let mut dealing = master.dealing_rng(keys_for, &list);
    // On the party's CPUs (privmatch.engine_threads): the core's pool threads call nothing of
    // Postgres and start with every signal blocked (`signals::spawn_pool_thread`).
    let threads = match crate::engine::worker::ENGINE_THREADS.get() {
        n if n > 0 => n as usize,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut halves = match keys_for {
        // The evaluators mask their probes and templates at the open with seeds derived from
        // what each shares with P2 (docs/protocols/face.md §7).
        KeysFor::Verification(session) => {
            deal_verification(&params, &session, [&pairs[0], &pairs[1]], &mut dealing)
        }
        _ => deal_identification_on(&params, &master, ids, &mut dealing, threads),
    }
    .unwrap_or_else(|e| raise_face(function, e));
    let mut rng = ChaCha20Rng::from_entropy();
    let [p0, p1]: [Vec<Vec<u8>>; 2] = [0, 1].map(|b| {
        seal_identification_key_chunks(&halves[b], keys_for, &pairs[b], KEY_CHUNK_BYTES, &mut rng)
    });
    for half in halves.iter_mut() {
        zeroize::Zeroize::zeroize(half);
    }
    p0.into_iter()
        .zip(p1)
        .enumerate()
        .map(|(chunk, (a, b))| (chunk as i32, a, b))
        .collect()
}
