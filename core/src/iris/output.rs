//! A party's output of one iris search, signed and sealed to the client that asked (issue 34,
//! "the coordinator learns no result"; docs/protocols/iris.md §13.2).
//!
//! What the party computed (the matching subjects of the probe's eye, or the uniqueness bit)
//! is bound to the session, the parameters, the eye and the set it searched, and signed with
//! the party's signing key ([`crate::crypto::party_sign`], context [`CONTEXT`]). The output
//! and its signature are then **sealed to the reply key** the client put inside its sealed
//! probe ([`crate::iris::probe`], layout version 3) with [`crate::crypto::reply`] (format
//! [`OUTPUT_FORMAT`]): the coordinator relays three ciphertexts and learns neither the
//! subjects nor the bit. The client (the CLI, or the party whose SQL front door was called,
//! whose own static key is then the reply key) opens the three ([`open_outputs`]), checks that
//! each is for its own session, parameters and eye, checks each signature against the pinned
//! signing keys, checks that the three parties agree, and only then applies the two-eye policy
//! ([`crate::iris::eyes`]). Anything that does not open or verify is refused, naming the
//! party.
//!
//! Signed message (little-endian):
//!
//! ```text
//! party (1) | session id (16) | parameters (4: mode, max rotation, threshold P u16)
//! | eye (1) | set digest (32) | entries (u64)
//! | result: 0 ‖ count (u32) ‖ (length (u32) ‖ subject)* sorted   (identification)
//!         | 1 ‖ unique (1: 1 unique, 0 not unique, 2 not unique: it matches only the
//!             record of an earlier request of its enrolment batch)  (uniqueness)
//! ```
//!
//! Sealed plaintext: `length of the signed message (u32) ‖ signed message ‖ signature (64) ‖
//! zeros`, padded to [`padded_len`] (at least [`MIN_PADDED`] bytes, else the next power of
//! two), so that the length of a sealed output tells the coordinator nothing about a result
//! list shorter than about 900 bytes of subject names, and only its order of magnitude beyond.

use rand_core::{CryptoRng, RngCore};

use crate::crypto::party_sign::{
    PartySignError, PartySigningKey, PartyVerifyingKey, SIGNATURE_LEN,
};
use crate::crypto::reply::{open_reply, ReplyFormat, ReplySealer};
use crate::crypto::seal::{PartyPublicKey, PartySecretKey};
use crate::iris::enroll::Eye;
use crate::iris::params::{SearchParams, PARAMS_LEN};
use crate::party::PartyIndex;
use crate::wire::session::{SessionId, SESSION_ID_LEN};

/// The context label of a signed iris search output.
pub const CONTEXT: &[u8] = b"privmatch iris search output v1";

/// The sealed-output format of iris search outputs ([`crate::crypto::reply`]).
pub const OUTPUT_FORMAT: ReplyFormat = ReplyFormat {
    magic: b"PMIO",
    version: 1,
    label: b"privmatch iris sealed output v1",
};

/// The smallest padded plaintext of a sealed output.
pub const MIN_PADDED: usize = 1024;

/// The padded length of a sealed plaintext of `n` bytes: [`MIN_PADDED`], or the next power of
/// two at or above `n`.
pub fn padded_len(n: usize) -> usize {
    n.checked_next_power_of_two().unwrap_or(n).max(MIN_PADDED)
}

/// What a search answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IrisResult {
    /// Identification: the matching subjects of the probe's eye (signed sorted).
    Identified(Vec<String>),
    /// Uniqueness: true when no enrolled template matched (in an enrolment batch: nor the
    /// record of an earlier request of the batch).
    Unique(bool),
    /// Uniqueness in an enrolment batch: not unique, because no enrolled template matched but
    /// the record of an earlier request of the same batch did (two requests of one person
    /// sent at once; docs/protocols/iris.md §13.4).
    MatchesEarlierRequest,
}

impl IrisResult {
    /// For a uniqueness search: whether the probe is unique (`None` for an identification).
    pub fn is_unique(&self) -> Option<bool> {
        match self {
            IrisResult::Unique(u) => Some(*u),
            IrisResult::MatchesEarlierRequest => Some(false),
            IrisResult::Identified(_) => None,
        }
    }
}

/// One party's output of one search, as it signs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IrisOutput {
    /// The party that computed it.
    pub party: PartyIndex,
    /// The session id the client drew.
    pub session: SessionId,
    /// The parameters sealed with the probe.
    pub params: SearchParams,
    /// The probe's eye.
    pub eye: Eye,
    /// The digest of the set searched ([`crate::iris::store::CanonicalOrder::digest`]).
    pub set_digest: [u8; 32],
    /// Entries searched.
    pub entries: u64,
    /// The result.
    pub result: IrisResult,
}

/// A cursor over a decoded message.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }
}

impl IrisOutput {
    /// The signed message (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        out.push(self.party.as_u8());
        out.extend_from_slice(&self.session);
        out.extend_from_slice(&self.params.to_bytes());
        out.push(self.eye.to_byte());
        out.extend_from_slice(&self.set_digest);
        out.extend_from_slice(&self.entries.to_le_bytes());
        match &self.result {
            IrisResult::Identified(subjects) => {
                let mut sorted: Vec<&String> = subjects.iter().collect();
                sorted.sort();
                out.push(0);
                out.extend_from_slice(&(sorted.len() as u32).to_le_bytes());
                for s in sorted {
                    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
            }
            IrisResult::Unique(u) => {
                out.push(1);
                out.push(u8::from(*u));
            }
            IrisResult::MatchesEarlierRequest => {
                out.push(1);
                out.push(2);
            }
        }
        out
    }

    /// Reads a signed message back ([`IrisOutput::encode`]); `None` when it is not one.
    pub fn decode(bytes: &[u8]) -> Option<IrisOutput> {
        let mut c = Cursor(bytes);
        let party = PartyIndex::new(i64::from(c.u8()?)).ok()?;
        let session: SessionId = c.array::<SESSION_ID_LEN>()?;
        let params = SearchParams::from_bytes(c.array::<PARAMS_LEN>()?).ok()?;
        let eye = Eye::from_byte(c.u8()?).ok()?;
        let set_digest = c.array::<32>()?;
        let entries = u64::from_le_bytes(c.array::<8>()?);
        let result = match c.u8()? {
            0 => {
                let count = c.u32()? as usize;
                // Each subject takes at least its 4-byte length: a count the bytes cannot
                // hold is refused before anything is allocated for it.
                if count > c.0.len() / 4 {
                    return None;
                }
                let mut subjects = Vec::with_capacity(count);
                for _ in 0..count {
                    let len = c.u32()? as usize;
                    subjects.push(String::from_utf8(c.take(len)?.to_vec()).ok()?);
                }
                IrisResult::Identified(subjects)
            }
            1 => match c.u8()? {
                0 => IrisResult::Unique(false),
                1 => IrisResult::Unique(true),
                2 => IrisResult::MatchesEarlierRequest,
                _ => return None,
            },
            _ => return None,
        };
        c.0.is_empty().then_some(IrisOutput {
            party,
            session,
            params,
            eye,
            set_digest,
            entries,
            result,
        })
    }

    /// The party's signature over it.
    pub fn sign(&self, key: &PartySigningKey) -> [u8; SIGNATURE_LEN] {
        key.sign(CONTEXT, &self.encode())
    }

    /// Checks `signature` under the party's pinned `key`.
    pub fn verify(&self, key: &PartyVerifyingKey, signature: &[u8]) -> Result<(), PartySignError> {
        key.verify(CONTEXT, &self.encode(), signature)
    }
}

/// Party side: the sealer of party `me`'s outputs of `session` to the client's `reply_key`.
pub fn output_sealer(
    me: PartyIndex,
    secret: &PartySecretKey,
    reply_key: &PartyPublicKey,
    session: &SessionId,
) -> ReplySealer {
    ReplySealer::new(OUTPUT_FORMAT, me, secret, reply_key, session)
}

/// Party side: signs `output` with `key` and seals output and signature with `sealer`
/// (module docs: length, message, signature, padding).
pub fn seal_output<R: RngCore + CryptoRng>(
    sealer: &ReplySealer,
    output: &IrisOutput,
    key: &PartySigningKey,
    rng: &mut R,
) -> Vec<u8> {
    let message = output.encode();
    let signature = output.sign(key);
    let used = 4 + message.len() + SIGNATURE_LEN;
    let mut plain = Vec::with_capacity(padded_len(used));
    plain.extend_from_slice(&(message.len() as u32).to_le_bytes());
    plain.extend_from_slice(&message);
    plain.extend_from_slice(&signature);
    plain.resize(padded_len(used), 0);
    sealer.seal(&plain, rng)
}

/// What a client expects of every party's output: its own session id, the parameters it
/// sealed and the probe's eye.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpectedSearch {
    /// The session id the client drew.
    pub session: SessionId,
    /// The parameters it sealed.
    pub params: SearchParams,
    /// The probe's eye.
    pub eye: Eye,
}

/// Why a client refused the outputs the coordinator relayed. Every variant names the party.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputRefused {
    /// The sealed output does not open (or is not one): altered, swapped, forged, or sealed
    /// for another session or client.
    #[error("{party}'s sealed output of the {eye} eye's search is refused: {why}; the coordinator altered or swapped it, or relayed an output sealed for another party, session or client")]
    Sealed {
        /// The party whose output is refused.
        party: PartyIndex,
        /// The eye.
        eye: &'static str,
        /// Why.
        why: &'static str,
    },
    /// It opened, but is for another search than the client asked for, or malformed.
    #[error(
        "{party}'s output of the {eye} eye's search is not for this search ({what}): refusing it"
    )]
    OtherSearch {
        /// The party whose output is refused.
        party: PartyIndex,
        /// The eye.
        eye: &'static str,
        /// What differs.
        what: &'static str,
    },
    /// The party's signature does not cover the output.
    #[error(
        "{party}'s signature does not cover its output of the {eye} eye's search: refusing it"
    )]
    BadSignature {
        /// The party whose signature failed.
        party: PartyIndex,
        /// The eye.
        eye: &'static str,
    },
    /// The three parties' outputs differ.
    #[error("the parties' outputs of the {eye} eye's search differ ({party}'s is not P0's): refusing them")]
    Disagree {
        /// The first party whose output differs from P0's.
        party: PartyIndex,
        /// The eye.
        eye: &'static str,
    },
}

impl OutputRefused {
    /// The party the refusal names.
    pub fn party(&self) -> PartyIndex {
        match self {
            OutputRefused::Sealed { party, .. }
            | OutputRefused::OtherSearch { party, .. }
            | OutputRefused::BadSignature { party, .. }
            | OutputRefused::Disagree { party, .. } => *party,
        }
    }
}

/// Client side: opens party `party`'s sealed output of the search `expected` with the reply
/// key's secret and the party's pinned public key, checks that it is for that search and, with
/// `signing_key` (`None`: not pinned; the sealing already authenticates the party), its
/// signature.
pub fn open_output(
    expected: &ExpectedSearch,
    party: PartyIndex,
    party_key: &PartyPublicKey,
    signing_key: Option<&PartyVerifyingKey>,
    reply_secret: &PartySecretKey,
    sealed: &[u8],
) -> Result<IrisOutput, OutputRefused> {
    let eye = expected.eye.as_str();
    let plain = open_reply(
        &OUTPUT_FORMAT,
        party,
        party_key,
        reply_secret,
        &expected.session,
        sealed,
    )
    .map_err(|e| OutputRefused::Sealed {
        party,
        eye,
        why: e.why(),
    })?;
    let other = |what: &'static str| OutputRefused::OtherSearch { party, eye, what };
    let malformed = || other("it opened but is malformed");
    let len = plain
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(malformed)? as usize;
    let end = len.checked_add(4).ok_or_else(malformed)?;
    let message = plain.get(4..end).ok_or_else(malformed)?;
    let signature = plain
        .get(end..end.saturating_add(SIGNATURE_LEN))
        .ok_or_else(malformed)?;
    if plain.len() != padded_len(end.saturating_add(SIGNATURE_LEN)) {
        return Err(malformed());
    }
    let output = IrisOutput::decode(message).ok_or_else(malformed)?;
    if output.party != party {
        return Err(other("it is another party's"));
    }
    if output.session != expected.session {
        return Err(other("another session"));
    }
    if output.params != expected.params {
        return Err(other("other search parameters"));
    }
    if output.eye != expected.eye {
        return Err(other("another eye"));
    }
    let mode_matches = matches!(
        (&output.result, expected.params.mode()),
        (
            IrisResult::Identified(_),
            crate::iris::params::SearchMode::Identify
        ) | (
            IrisResult::Unique(_) | IrisResult::MatchesEarlierRequest,
            crate::iris::params::SearchMode::Uniqueness
        )
    );
    if !mode_matches {
        return Err(other("a result of another mode"));
    }
    if let Some(key) = signing_key {
        output
            .verify(key, signature)
            .map_err(|_| OutputRefused::BadSignature { party, eye })?;
    }
    Ok(output)
}

/// What the three parties' outputs of one search agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenedOutputs {
    /// The result.
    pub result: IrisResult,
    /// The digest of the set searched.
    pub set_digest: [u8; 32],
    /// Entries searched.
    pub entries: u64,
}

/// Client side: opens the three parties' sealed outputs of the search `expected`
/// (`sealed[i]` from party i, whose pinned public key is `party_keys[i]` and signing key
/// `signing_keys[i]`, `None` where not pinned) with the reply key's secret, and checks that
/// the three agree. Names the first party refused.
pub fn open_outputs(
    expected: &ExpectedSearch,
    party_keys: &[PartyPublicKey; 3],
    signing_keys: &[Option<PartyVerifyingKey>; 3],
    reply_secret: &PartySecretKey,
    sealed: [&[u8]; 3],
) -> Result<OpenedOutputs, OutputRefused> {
    let mut outputs = Vec::with_capacity(3);
    for party in PartyIndex::ALL {
        let i = party.as_usize();
        outputs.push(open_output(
            expected,
            party,
            &party_keys[i],
            signing_keys[i].as_ref(),
            reply_secret,
            sealed[i],
        )?);
    }
    let first = &outputs[0];
    for output in &outputs[1..] {
        if (output.set_digest, output.entries, &output.result)
            != (first.set_digest, first.entries, &first.result)
        {
            return Err(OutputRefused::Disagree {
                party: output.party,
                eye: expected.eye.as_str(),
            });
        }
    }
    let mut result = first.result.clone();
    if let IrisResult::Identified(subjects) = &mut result {
        subjects.sort();
    }
    Ok(OpenedOutputs {
        result,
        set_digest: first.set_digest,
        entries: first.entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::params::SearchMode;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    struct World {
        rng: ChaCha20Rng,
        secrets: Vec<PartySecretKey>,
        publics: [PartyPublicKey; 3],
        signers: Vec<PartySigningKey>,
        verifying: [Option<PartyVerifyingKey>; 3],
        client: PartySecretKey,
    }

    fn world(seed: u64) -> World {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let secrets: Vec<PartySecretKey> =
            (0..3).map(|_| PartySecretKey::generate(&mut rng)).collect();
        let publics = std::array::from_fn(|i| secrets[i].public_key());
        let signers: Vec<PartySigningKey> = secrets.iter().map(PartySigningKey::derive).collect();
        let verifying = std::array::from_fn(|i| Some(signers[i].verifying_key()));
        let client = PartySecretKey::generate(&mut rng);
        World {
            rng,
            secrets,
            publics,
            signers,
            verifying,
            client,
        }
    }

    fn output(party: usize, expected: &ExpectedSearch, result: &IrisResult) -> IrisOutput {
        IrisOutput {
            party: PartyIndex::ALL[party],
            session: expected.session,
            params: expected.params,
            eye: expected.eye,
            set_digest: [9; 32],
            entries: 40,
            result: result.clone(),
        }
    }

    fn sealed_by_all(
        w: &mut World,
        expected: &ExpectedSearch,
        result: &IrisResult,
    ) -> Vec<Vec<u8>> {
        let reply = w.client.public_key();
        (0..3)
            .map(|i| {
                let sealer =
                    output_sealer(PartyIndex::ALL[i], &w.secrets[i], &reply, &expected.session);
                seal_output(
                    &sealer,
                    &output(i, expected, result),
                    &w.signers[i],
                    &mut w.rng,
                )
            })
            .collect()
    }

    fn identify() -> ExpectedSearch {
        ExpectedSearch {
            session: [7; 16],
            params: SearchParams::new(SearchMode::Identify, 15, 0.345).expect("params"),
            eye: Eye::Left,
        }
    }

    #[test]
    fn outputs_round_trip_and_pad_their_length() {
        let expected = identify();
        for result in [
            IrisResult::Identified(vec![]),
            IrisResult::Identified(vec!["bob".into(), "alice".into()]),
            IrisResult::Unique(true),
            IrisResult::Unique(false),
            IrisResult::MatchesEarlierRequest,
        ] {
            let o = output(1, &expected, &result);
            let back = IrisOutput::decode(&o.encode()).expect("decodes");
            assert_eq!(back.encode(), o.encode());
        }
        assert!(IrisOutput::decode(&[0u8; 10]).is_none());
        let mut trailing = output(0, &expected, &IrisResult::Unique(true)).encode();
        trailing.push(0);
        assert!(IrisOutput::decode(&trailing).is_none());
        // An empty list and a list of 20 subjects seal to the same length.
        let mut w = world(1);
        let none = sealed_by_all(&mut w, &expected, &IrisResult::Identified(vec![]));
        let many: Vec<String> = (0..20).map(|i| format!("subject-{i:07}")).collect();
        let some = sealed_by_all(&mut w, &expected, &IrisResult::Identified(many));
        assert_eq!(none[0].len(), some[0].len());
        assert_eq!(none[0].len(), OUTPUT_FORMAT.sealed_len(MIN_PADDED));
        assert_eq!(padded_len(1025), 2048);
    }

    #[test]
    fn the_client_opens_verified_outputs_and_refuses_changed_ones_naming_the_party() {
        let mut w = world(3);
        let expected = identify();
        let result = IrisResult::Identified(vec!["bob".into(), "alice".into()]);
        let sealed = sealed_by_all(&mut w, &expected, &result);
        // The subjects are not in the clear.
        for s in &sealed {
            assert!(!s.windows(5).any(|x| x == b"alice"));
        }
        let open = |w: &World, expected: &ExpectedSearch, s: [&[u8]; 3]| {
            open_outputs(expected, &w.publics, &w.verifying, &w.client, s)
        };
        let opened = open(&w, &expected, [&sealed[0], &sealed[1], &sealed[2]]).expect("opens");
        assert_eq!(
            opened.result,
            IrisResult::Identified(vec!["alice".into(), "bob".into()])
        );
        assert_eq!((opened.set_digest, opened.entries), ([9; 32], 40));
        // Altered anywhere: refused, naming the party.
        for at in [0, 5, 9, 40, sealed[2].len() - 1] {
            let mut bad = sealed[2].clone();
            bad[at] ^= 1;
            let err = open(&w, &expected, [&sealed[0], &sealed[1], &bad]).unwrap_err();
            assert_eq!(err.party(), PartyIndex::ALL[2], "{at}: {err}");
            assert!(err.to_string().contains("P2"), "{err}");
        }
        // Swapped between two parties: refused, naming the first.
        let err = open(&w, &expected, [&sealed[1], &sealed[0], &sealed[2]]).unwrap_err();
        assert!(matches!(err, OutputRefused::Sealed { party, .. } if party == PartyIndex::ALL[0]));
        // Another session, eye or parameters than the client asked for: refused.
        for other in [
            ExpectedSearch {
                session: [8; 16],
                ..expected
            },
            ExpectedSearch {
                eye: Eye::Right,
                ..expected
            },
            ExpectedSearch {
                params: SearchParams::new(SearchMode::Identify, 14, 0.345).expect("params"),
                ..expected
            },
        ] {
            assert!(open(&w, &other, [&sealed[0], &sealed[1], &sealed[2]]).is_err());
        }
        // Another client's reply key: does not open.
        let stranger = PartySecretKey::generate(&mut w.rng);
        assert!(open_outputs(
            &expected,
            &w.publics,
            &w.verifying,
            &stranger,
            [&sealed[0], &sealed[1], &sealed[2]]
        )
        .is_err());
        // A party that computed another result: the parties disagree, P1 named.
        let other = sealed_by_all(
            &mut w,
            &expected,
            &IrisResult::Identified(vec!["bob".into()]),
        );
        let err = open(&w, &expected, [&sealed[0], &other[1], &sealed[2]]).unwrap_err();
        assert_eq!(
            err,
            OutputRefused::Disagree {
                party: PartyIndex::ALL[1],
                eye: "left"
            }
        );
        // A signing key that is not the party's: refused by the signature, naming it.
        let mut wrong = w.verifying;
        wrong[2] = w.verifying[0];
        let err = open_outputs(
            &expected,
            &w.publics,
            &wrong,
            &w.client,
            [&sealed[0], &sealed[1], &sealed[2]],
        )
        .unwrap_err();
        assert_eq!(
            err,
            OutputRefused::BadSignature {
                party: PartyIndex::ALL[2],
                eye: "left"
            }
        );
    }

    #[test]
    fn a_coordinator_without_the_party_secret_cannot_forge_an_output() {
        let mut w = world(4);
        let expected = ExpectedSearch {
            session: [2; 16],
            params: SearchParams::new(SearchMode::Uniqueness, 15, 0.345).expect("params"),
            eye: Eye::Right,
        };
        let sealed = sealed_by_all(&mut w, &expected, &IrisResult::Unique(false));
        // The coordinator seals "unique" as P1 with a key of its own (it knows every public
        // key and the reply key, not P1's secret).
        let coordinator = PartySecretKey::generate(&mut w.rng);
        let signer = PartySigningKey::derive(&coordinator);
        let forged = seal_output(
            &output_sealer(
                PartyIndex::ALL[1],
                &coordinator,
                &w.client.public_key(),
                &expected.session,
            ),
            &output(1, &expected, &IrisResult::Unique(true)),
            &signer,
            &mut w.rng,
        );
        let unpinned = [None, None, None];
        let err = open_outputs(
            &expected,
            &w.publics,
            &unpinned,
            &w.client,
            [&sealed[0], &forged, &sealed[2]],
        )
        .unwrap_err();
        assert!(matches!(err, OutputRefused::Sealed { party, .. } if party == PartyIndex::ALL[1]));
        // The front door: the reply key is the called party's own static key (P2 here).
        let reply = w.publics[2];
        let at_p2: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                seal_output(
                    &output_sealer(PartyIndex::ALL[i], &w.secrets[i], &reply, &expected.session),
                    &output(i, &expected, &IrisResult::Unique(false)),
                    &w.signers[i],
                    &mut w.rng,
                )
            })
            .collect();
        let opened = open_outputs(
            &expected,
            &w.publics,
            &unpinned,
            &w.secrets[2],
            [&at_p2[0], &at_p2[1], &at_p2[2]],
        )
        .expect("P2 opens");
        assert_eq!(opened.result, IrisResult::Unique(false));
    }
}
