//! Sealed search probes: what a client sends each party to search with one iris template.
//!
//! The client shares the probe with [`share_query_template`] (probes need the constant-term
//! layout applied before sharing) and seals party i's share to party i's pinned key
//! ([`seal_to_party`], purpose [`IRIS_PROBE_PURPOSE`]). The plaintext names the search
//! session it belongs to, so a coordinator cannot replay a probe into another session; the
//! party it belongs to, so a misrouted probe is refused; the **search parameters** the client
//! chose (mode, rotations, threshold), so a coordinator cannot run a client's probe as
//! another kind of search (a uniqueness probe as an identification, or at other thresholds
//! to bisect a distance): the party compares them with the parameters it is called with; and
//! the time it was sealed, so a party refuses a probe older than [`PROBE_LIFETIME_SECS`] and
//! need remember used session ids only that long; and (since layout version 3, privmatch
//! 0.12.0) the client's **reply key**, to which each party seals its signed output
//! ([`crate::iris::output`]), and the **disclosure** the client allows: none (the result is
//! sealed to the reply key only), or, for enroll-if-unique, the uniqueness bit also in the
//! clear to the coordinator, which must know whether to enrol ([`Disclosure`]). Inside the
//! sealed plaintext, the coordinator can change neither. Since layout version 4 an
//! enroll-if-unique probe also names **the record it asks to enrol**, by its enrolment id
//! ([`crate::iris::binding::enrolment_id`] of the record's envelope hashes): in a batch of
//! enroll-if-unique requests a party compares later probes with a request's record only when
//! that request's own probe, naming that record, was admitted with it, so a coordinator cannot
//! put records of its choice in front of a probe (docs/protocols/iris.md §13.4). Probes that
//! name no record are still sealed in layout 3. A probe of an older layout is refused
//! ([`BundleError::UnsupportedProbeVersion`]).
//!
//! Plaintext layout (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `PMPR` |
//! | 4 | 1 | layout version (3) |
//! | 5 | 1 | party index the share belongs to |
//! | 6 | 16 | search session id |
//! | 22 | 1 | eye: 0 left, 1 right |
//! | 23 | 4 | search parameters ([`SearchParams::to_bytes`]) |
//! | 27 | 8 | sealed at, seconds since the Unix epoch |
//! | 35 | 32 | reply key (X25519 public key) |
//! | 67 | 1 | disclosure: 0 sealed only, 1 the uniqueness bit also to the coordinator (layout 3); 2 the uniqueness bit to the coordinator, for the record named next (layout 4) |
//! | 68 | 32 | layout 4 only: the enrolment id of the record the probe asks to enrol |
//! | 68 (layout 4: 100) | 2·12,800 | code share coefficients (u16) |
//! | … | 2·6,400 | mask share coefficients (u16) |

use rand_core::{CryptoRng, RngCore};

use crate::crypto::reply::REPLY_KEY_LEN;
use crate::crypto::seal::{open_sealed_box, seal_to_party, PartyPublicKey, PartySecretKey};
use crate::iris::binding::{EnrolmentId, HASH_LEN};
use crate::iris::encoding::{IrisShare, CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use crate::iris::enroll::{BundleError, Eye};
use crate::iris::params::{SearchParams, PARAMS_LEN};
use crate::iris::policy::IrisPolicy;
use crate::iris::query::share_query_template;
use crate::iris::template::IrisTemplate;
use crate::party::PartyIndex;
use crate::wire::storage::{coefs_from_le_bytes, push_coefs_le};

/// The sealing purpose label of iris search probes.
pub const IRIS_PROBE_PURPOSE: &str = "iris-probe";

use crate::wire::session::SESSION_ID_LEN;

/// How long after sealing a probe is accepted (seconds); parties record used session ids at
/// least this long.
pub const PROBE_LIFETIME_SECS: u64 = 600;
/// How far in the future a probe's sealing time may lie (clocks of client and party differ).
pub const CLOCK_SKEW_SECS: u64 = 60;

const MAGIC: &[u8; 4] = b"PMPR";
/// The layout of probes that name no record.
const VERSION: u8 = 3;
/// The layout of probes that name the record they ask to enrol.
const VERSION_WITH_RECORD: u8 = 4;
const HEADER_LEN: usize = 4 + 1 + 1 + SESSION_ID_LEN + 1 + PARAMS_LEN + 8 + REPLY_KEY_LEN + 1;
const SHARES_LEN: usize = 2 * (CODE_SHARE_COEFS + MASK_SHARE_COEFS);
const PLAINTEXT_LEN: usize = HEADER_LEN + SHARES_LEN;

/// What the client allows the parties to disclose besides the output sealed to its reply key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disclosure {
    /// Nothing: the result is sealed to the reply key only (searches).
    SealedOnly,
    /// The uniqueness bit also in the clear to the coordinator, the probe naming no record
    /// (layout 3; a single enroll-if-unique request's probe before privmatch 0.16.0's
    /// batches). Only with uniqueness searches; refused in a batch of enroll-if-unique
    /// requests, where each probe must name its record.
    UniqueBitToCoordinator,
    /// The uniqueness bit also in the clear to the coordinator, for enrolling the record with
    /// this enrolment id (`privmatch iris enroll --if-unique`: the coordinator must know
    /// whether to enrol, and sees whether it does). Only with uniqueness searches. In a batch
    /// of enroll-if-unique requests, the record takes part in the later probes' comparisons
    /// only with this probe (module docs).
    UniqueBitForRecord(EnrolmentId),
}

impl Disclosure {
    /// Whether the parties disclose the uniqueness bit to the coordinator.
    pub fn discloses_bit(self) -> bool {
        !matches!(self, Disclosure::SealedOnly)
    }

    /// The record the probe asks to enrol, if it names one.
    pub fn record(self) -> Option<EnrolmentId> {
        match self {
            Disclosure::UniqueBitForRecord(id) => Some(id),
            _ => None,
        }
    }

    fn to_byte(self) -> u8 {
        match self {
            Disclosure::SealedOnly => 0,
            Disclosure::UniqueBitToCoordinator => 1,
            Disclosure::UniqueBitForRecord(_) => 2,
        }
    }

    /// The probe's layout version: 4 for a probe naming a record, else 3.
    fn layout(self) -> u8 {
        match self {
            Disclosure::UniqueBitForRecord(_) => VERSION_WITH_RECORD,
            _ => VERSION,
        }
    }

    /// The disclosure of a probe of layout `version` from its byte and, in layout 4, the
    /// record field after it.
    fn decode(version: u8, b: u8, record: &[u8]) -> Result<Self, BundleError> {
        match (version, b) {
            (VERSION, 0) => Ok(Disclosure::SealedOnly),
            (VERSION, 1) => Ok(Disclosure::UniqueBitToCoordinator),
            (VERSION_WITH_RECORD, 2) => {
                let id: EnrolmentId = record
                    .try_into()
                    .map_err(|_| BundleError::Malformed("probe: short record field"))?;
                Ok(Disclosure::UniqueBitForRecord(id))
            }
            _ => Err(BundleError::Malformed("probe: unknown disclosure")),
        }
    }
}

/// Where the parties send a search's output: the client's reply key, and what else the
/// client allows them to disclose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyTo {
    /// The X25519 public key the parties seal their outputs to (a fresh key of the client per
    /// request, or the static key of the party whose SQL front door will be called).
    pub key: PartyPublicKey,
    /// What may be disclosed besides.
    pub disclosure: Disclosure,
}

/// One party's opened probe.
#[derive(Clone, PartialEq, Eq)]
pub struct IrisProbe {
    /// The search session the probe was sealed for.
    pub session: [u8; SESSION_ID_LEN],
    /// Which eye the probe is; it is compared with enrolled templates of the same eye.
    pub eye: Eye,
    /// The search parameters the client sealed with the probe.
    pub params: SearchParams,
    /// When the client sealed it (seconds since the Unix epoch).
    pub sealed_at: u64,
    /// Where the output goes.
    pub reply: ReplyTo,
    /// The party's share of the probe (query layout, see [`share_query_template`]).
    pub share: IrisShare,
}

impl std::fmt::Debug for IrisProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IrisProbe {{ session: {}, eye: {}, params: {:?}, sealed_at: {}, reply: {:?}, party: {}, share: <redacted> }}",
            hex::encode(self.session),
            self.eye.as_str(),
            self.params,
            self.sealed_at,
            self.reply,
            self.share.party
        )
    }
}

impl IrisProbe {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PLAINTEXT_LEN + HASH_LEN);
        out.extend_from_slice(MAGIC);
        out.push(self.reply.disclosure.layout());
        out.push(self.share.party.as_u8());
        out.extend_from_slice(&self.session);
        out.push(self.eye.to_byte());
        out.extend_from_slice(&self.params.to_bytes());
        out.extend_from_slice(&self.sealed_at.to_le_bytes());
        out.extend_from_slice(self.reply.key.as_bytes());
        out.push(self.reply.disclosure.to_byte());
        if let Some(record) = self.reply.disclosure.record() {
            out.extend_from_slice(&record);
        }
        push_coefs_le(&mut out, &self.share.code);
        push_coefs_le(&mut out, &self.share.mask);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, BundleError> {
        if bytes.len() < 5 || &bytes[..4] != MAGIC {
            return Err(BundleError::Malformed("probe: bad magic"));
        }
        let version = bytes[4];
        let header_len = match version {
            VERSION => HEADER_LEN,
            VERSION_WITH_RECORD => HEADER_LEN + HASH_LEN,
            other => return Err(BundleError::UnsupportedProbeVersion(other)),
        };
        if bytes.len() != header_len + SHARES_LEN {
            return Err(BundleError::Malformed(
                "probe: the length does not match the layout",
            ));
        }
        let party = PartyIndex::new(i64::from(bytes[5]))
            .map_err(|_| BundleError::Malformed("probe: party index out of range"))?;
        let mut session = [0u8; SESSION_ID_LEN];
        session.copy_from_slice(&bytes[6..22]);
        let eye = Eye::from_byte(bytes[22])?;
        let mut params = [0u8; PARAMS_LEN];
        params.copy_from_slice(&bytes[23..23 + PARAMS_LEN]);
        let params = SearchParams::from_bytes(params)
            .map_err(|_| BundleError::Malformed("probe: invalid sealed search parameters"))?;
        let mut sealed_at = [0u8; 8];
        let at = 23 + PARAMS_LEN;
        sealed_at.copy_from_slice(&bytes[at..at + 8]);
        let mut key = [0u8; REPLY_KEY_LEN];
        key.copy_from_slice(&bytes[at + 8..at + 8 + REPLY_KEY_LEN]);
        let disclosure = Disclosure::decode(
            version,
            bytes[HEADER_LEN - 1],
            &bytes[HEADER_LEN..header_len],
        )?;
        if disclosure.discloses_bit()
            && params.mode() != crate::iris::params::SearchMode::Uniqueness
        {
            return Err(BundleError::Malformed(
                "probe: a disclosed bit is only for uniqueness searches",
            ));
        }
        let code_end = header_len + 2 * CODE_SHARE_COEFS;
        Ok(IrisProbe {
            session,
            eye,
            params,
            sealed_at: u64::from_le_bytes(sealed_at),
            reply: ReplyTo {
                key: PartyPublicKey::from_bytes(key),
                disclosure,
            },
            share: IrisShare {
                party,
                code: coefs_from_le_bytes(&bytes[header_len..code_end]),
                mask: coefs_from_le_bytes(&bytes[code_end..]),
            },
        })
    }
}

/// What a client seals with a probe besides the template: the session, the eye, the search
/// parameters and the time (seconds since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeContext {
    /// The search session.
    pub session: [u8; SESSION_ID_LEN],
    /// Which eye the probe is.
    pub eye: Eye,
    /// The search parameters.
    pub params: SearchParams,
    /// When it is sealed.
    pub sealed_at: u64,
}

/// Client side: shares `template` as a probe and seals party i's share to `party_keys[i]`
/// with `context` and `reply` (the parties seal their outputs to `reply.key`). Returns the
/// three sealed probes, indexed by party. Fails if the template cannot be encoded (e.g. a
/// mask that is not doubled), or when `reply` discloses a bit of an identification.
pub fn seal_iris_probe_to<R: RngCore + CryptoRng>(
    template: &IrisTemplate,
    context: &ProbeContext,
    reply: &ReplyTo,
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<[Vec<u8>; 3], BundleError> {
    if reply.disclosure.discloses_bit()
        && context.params.mode() != crate::iris::params::SearchMode::Uniqueness
    {
        return Err(BundleError::Malformed(
            "probe: a disclosed bit is only for uniqueness searches",
        ));
    }
    let shares = share_query_template(template, rng)?;
    let mut sealed: [Vec<u8>; 3] = Default::default();
    for share in shares {
        let p = share.party;
        let probe = IrisProbe {
            session: context.session,
            eye: context.eye,
            params: context.params,
            sealed_at: context.sealed_at,
            reply: *reply,
            share,
        };
        sealed[p.as_usize()] = seal_to_party(
            p,
            &party_keys[p.as_usize()],
            IRIS_PROBE_PURPOSE,
            &probe.encode(),
            rng,
        );
    }
    Ok(sealed)
}

/// Client side, for searches whose output nobody opens (benchmarks of the scan, tests that
/// read a party's own view of the result): [`seal_iris_probe_to`] with a fresh reply key
/// whose secret is dropped, disclosing nothing.
pub fn seal_iris_probe<R: RngCore + CryptoRng>(
    template: &IrisTemplate,
    context: &ProbeContext,
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<[Vec<u8>; 3], BundleError> {
    let reply = ReplyTo {
        key: PartySecretKey::generate(rng).public_key(),
        disclosure: Disclosure::SealedOnly,
    };
    seal_iris_probe_to(template, context, &reply, party_keys, rng)
}

/// Party side: opens a sealed probe as party `me` for search session `session`. Refuses a
/// probe sealed to another party or key, tampered, of another session, or carrying another
/// party's share. The caller checks the sealed parameters and time ([`check_probe`]).
pub fn open_iris_probe(
    me: PartyIndex,
    secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    sealed: &[u8],
) -> Result<IrisProbe, BundleError> {
    let plaintext = open_sealed_box(me, secret, IRIS_PROBE_PURPOSE, sealed)?;
    let probe = IrisProbe::decode(&plaintext)?;
    if probe.share.party != me {
        return Err(BundleError::PartyMismatch {
            inside: probe.share.party,
            me,
        });
    }
    if &probe.session != session {
        return Err(BundleError::Malformed(
            "probe: sealed for another search session",
        ));
    }
    Ok(probe)
}

/// Why an opened probe may not be used for the search it was sent to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeRefusal {
    /// The threshold sealed with the probe is not the party's threshold policy.
    #[error("the threshold sealed with the probe ({}) is not this party's iris threshold policy ({}); the threshold is deployment policy, not a search parameter: seal the probe with the policy's threshold (`privmatch iris policy show`)", f64::from(*sealed) / 10_000.0, f64::from(*policy) / 10_000.0)]
    NotPolicy {
        /// The threshold the client sealed, in ten-thousandths.
        sealed: u32,
        /// The party's policy threshold, in ten-thousandths.
        policy: u32,
    },
    /// The probe was sealed for other search parameters or another eye than the batch it
    /// arrived in declares (the coordinator groups searches by what the client declared).
    #[error(
        "the probe was sealed for other search parameters or another eye than its batch declares"
    )]
    NotTheBatch,
    /// In a batch of enroll-if-unique requests, the probe does not name the record it came
    /// with (it names another, or none: a probe of layout 3, sealed by an older client).
    #[error("the probe does not name the record of its request (an enroll-if-unique probe in a batch must carry its own record's enrolment id, probe layout 4: seal it with a client that names the record)")]
    NotItsRecord,
    /// The probe's session id was used before (by a search or in another batch).
    #[error("the probe's session id was already used: session ids are single-use")]
    Replayed,
    /// The probe was sealed too long ago (or too far in the future).
    #[error("the probe was sealed at {sealed_at}, outside the accepted window at {now} (lifetime {PROBE_LIFETIME_SECS} s)")]
    Stale {
        /// When it was sealed.
        sealed_at: u64,
        /// The party's clock.
        now: u64,
    },
}

/// Checks that `probe` may run at a party whose threshold policy is `policy`, at time `now`
/// (seconds since the Unix epoch): the threshold sealed with it is the policy's (the search
/// parameters travel only sealed in the probe, so a caller cannot choose them), and the probe
/// is at most [`PROBE_LIFETIME_SECS`] old (and at most [`CLOCK_SKEW_SECS`] ahead).
pub fn check_probe(probe: &IrisProbe, policy: &IrisPolicy, now: u64) -> Result<(), ProbeRefusal> {
    if !policy.allows(probe.params.threshold()) {
        return Err(ProbeRefusal::NotPolicy {
            sealed: probe.params.threshold().numerator() as u32,
            policy: policy.numerator(),
        });
    }
    let fresh = probe.sealed_at <= now.saturating_add(CLOCK_SKEW_SECS)
        && now.saturating_sub(probe.sealed_at) <= PROBE_LIFETIME_SECS;
    if !fresh {
        return Err(ProbeRefusal::Stale {
            sealed_at: probe.sealed_at,
            now,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::params::SearchMode;
    use crate::iris::synth::random_template;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn keys(rng: &mut ChaCha20Rng) -> ([PartySecretKey; 3], [PartyPublicKey; 3]) {
        let secrets: [PartySecretKey; 3] = std::array::from_fn(|_| PartySecretKey::generate(rng));
        let publics = std::array::from_fn(|i| secrets[i].public_key());
        (secrets, publics)
    }

    fn context(session: [u8; 16], eye: Eye) -> ProbeContext {
        ProbeContext {
            session,
            eye,
            params: SearchParams::new(SearchMode::Uniqueness, 15, 0.345).expect("params"),
            sealed_at: 1_000_000,
        }
    }

    #[test]
    fn probe_round_trips_at_each_party() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let (secrets, publics) = keys(&mut rng);
        let t = random_template(&mut rng);
        let session = [9u8; 16];
        let ctx = context(session, Eye::Right);
        let sealed = seal_iris_probe(&t, &ctx, &publics, &mut rng).unwrap();
        for p in PartyIndex::ALL {
            let probe = open_iris_probe(p, &secrets[p.as_usize()], &session, &sealed[p.as_usize()])
                .unwrap();
            assert_eq!(probe.eye, Eye::Right);
            assert_eq!(probe.params, ctx.params);
            assert_eq!(probe.sealed_at, ctx.sealed_at);
            assert_eq!(probe.share.party, p);
            assert_eq!(probe.share.code.len(), CODE_SHARE_COEFS);
            assert_eq!(probe.share.mask.len(), MASK_SHARE_COEFS);
            assert_eq!(
                check_probe(&probe, &policy_of(&ctx), ctx.sealed_at + 5),
                Ok(())
            );
        }
    }

    /// The policy whose threshold `ctx` sealed.
    fn policy_of(ctx: &ProbeContext) -> IrisPolicy {
        IrisPolicy::from_threshold(ctx.params.threshold()).expect("policy")
    }

    #[test]
    fn a_probe_runs_only_at_the_threshold_policy_and_while_fresh() {
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let (secrets, publics) = keys(&mut rng);
        let t = random_template(&mut rng);
        let ctx = context([3u8; 16], Eye::Left);
        let sealed = seal_iris_probe(&t, &ctx, &publics, &mut rng).unwrap();
        let probe =
            open_iris_probe(PartyIndex::ALL[0], &secrets[0], &ctx.session, &sealed[0]).unwrap();
        let now = ctx.sealed_at;
        let policy = policy_of(&ctx);
        for other in [0.3449, 0.2, 0.5] {
            let other = IrisPolicy::from_ratio(other).expect("policy");
            assert!(matches!(
                check_probe(&probe, &other, now),
                Err(ProbeRefusal::NotPolicy { .. })
            ));
        }
        let late = now + PROBE_LIFETIME_SECS + 1;
        assert!(matches!(
            check_probe(&probe, &policy, late),
            Err(ProbeRefusal::Stale { .. })
        ));
        assert_eq!(
            check_probe(&probe, &policy, now + PROBE_LIFETIME_SECS),
            Ok(())
        );
        let early = now - CLOCK_SKEW_SECS - 1;
        assert!(check_probe(&probe, &policy, early).is_err());
    }

    #[test]
    fn the_reply_key_and_disclosure_travel_sealed_and_version_2_is_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(10);
        let (secrets, publics) = keys(&mut rng);
        let t = random_template(&mut rng);
        let ctx = context([4u8; 16], Eye::Left);
        let reply = ReplyTo {
            key: PartySecretKey::generate(&mut rng).public_key(),
            disclosure: Disclosure::UniqueBitToCoordinator,
        };
        let sealed = seal_iris_probe_to(&t, &ctx, &reply, &publics, &mut rng).unwrap();
        let p2 = PartyIndex::ALL[2];
        let probe = open_iris_probe(p2, &secrets[2], &ctx.session, &sealed[2]).unwrap();
        assert_eq!(probe.reply, reply);
        // A bit may be disclosed for a uniqueness search only.
        let identify = ProbeContext {
            params: SearchParams::new(SearchMode::Identify, 15, 0.345).expect("params"),
            ..ctx
        };
        assert!(seal_iris_probe_to(&t, &identify, &reply, &publics, &mut rng).is_err());
        // The layout of 0.11.0 (version 2: no reply key, no disclosure) is refused, naming
        // the version.
        let mut plain = probe.encode();
        plain[4] = 2;
        plain.drain(HEADER_LEN - 1 - REPLY_KEY_LEN..HEADER_LEN);
        let old = seal_to_party(p2, &publics[2], IRIS_PROBE_PURPOSE, &plain, &mut rng);
        let err = open_iris_probe(p2, &secrets[2], &ctx.session, &old).unwrap_err();
        assert_eq!(err, BundleError::UnsupportedProbeVersion(2));
        assert!(err.to_string().contains("version 2"), "{err}");
        assert!(err.to_string().contains("reply key"), "{err}");
    }

    #[test]
    fn a_probe_naming_its_record_is_layout_4_and_the_others_stay_layout_3() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let (secrets, publics) = keys(&mut rng);
        let t = random_template(&mut rng);
        let ctx = context([5u8; 16], Eye::Left);
        let p1 = PartyIndex::ALL[1];
        let plaintext = |sealed: &[u8]| {
            open_sealed_box(p1, &secrets[1], IRIS_PROBE_PURPOSE, sealed).expect("opens")
        };
        let record = [0xabu8; HASH_LEN];
        let mut layouts = Vec::new();
        for disclosure in [
            Disclosure::SealedOnly,
            Disclosure::UniqueBitToCoordinator,
            Disclosure::UniqueBitForRecord(record),
        ] {
            let reply = ReplyTo {
                key: PartySecretKey::generate(&mut rng).public_key(),
                disclosure,
            };
            let sealed = seal_iris_probe_to(&t, &ctx, &reply, &publics, &mut rng).unwrap();
            let probe = open_iris_probe(p1, &secrets[1], &ctx.session, &sealed[1]).unwrap();
            assert_eq!(probe.reply, reply);
            assert_eq!(probe.reply.disclosure.record(), disclosure.record());
            let plain = plaintext(&sealed[1]);
            layouts.push((plain[4], plain.len()));
        }
        assert_eq!(
            layouts,
            [
                (3, PLAINTEXT_LEN),
                (3, PLAINTEXT_LEN),
                (4, PLAINTEXT_LEN + HASH_LEN)
            ]
        );
        // A layout-4 probe whose disclosure byte is not "for the record", and a layout-3
        // probe claiming one, are malformed.
        let reply = ReplyTo {
            key: PartySecretKey::generate(&mut rng).public_key(),
            disclosure: Disclosure::UniqueBitForRecord(record),
        };
        let sealed = seal_iris_probe_to(&t, &ctx, &reply, &publics, &mut rng).unwrap();
        let mut plain = plaintext(&sealed[1]);
        plain[HEADER_LEN - 1] = 1;
        let reseal = |plain: &[u8], rng: &mut ChaCha20Rng| {
            let b = seal_to_party(p1, &publics[1], IRIS_PROBE_PURPOSE, plain, rng);
            open_iris_probe(p1, &secrets[1], &ctx.session, &b)
        };
        assert!(matches!(
            reseal(&plain, &mut rng),
            Err(BundleError::Malformed(_))
        ));
        plain[HEADER_LEN - 1] = 2;
        plain[4] = 3;
        assert!(matches!(
            reseal(&plain, &mut rng),
            Err(BundleError::Malformed(_))
        ));
        plain[4] = 4;
        assert!(reseal(&plain, &mut rng).is_ok());
    }

    #[test]
    fn probe_for_another_session_party_or_tampered_is_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let (secrets, publics) = keys(&mut rng);
        let t = random_template(&mut rng);
        let session = [1u8; 16];
        let sealed = seal_iris_probe(&t, &context(session, Eye::Left), &publics, &mut rng).unwrap();
        let p0 = PartyIndex::ALL[0];
        let p1 = PartyIndex::ALL[1];
        assert!(open_iris_probe(p0, &secrets[0], &[2u8; 16], &sealed[0]).is_err());
        assert!(open_iris_probe(p1, &secrets[1], &session, &sealed[0]).is_err());
        let mut tampered = sealed[0].clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(open_iris_probe(p0, &secrets[0], &session, &tampered).is_err());
        let err = format!(
            "{:?}",
            open_iris_probe(p0, &secrets[0], &session, &sealed[0]).unwrap()
        );
        assert!(err.contains("<redacted>"));
    }
}
