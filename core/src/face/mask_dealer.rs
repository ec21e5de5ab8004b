//! What the dealer P2 sends P0 and P1 for dealer-masked templates ([`super::masked`]), as
//! messages of the pairwise channel P2 → P_b (encrypted, and authenticated as P2's: a
//! coordinator that forged them would know the masks).
//!
//! **Template mask seeds** (once per template, when an evaluator loads templates it has no
//! seed for): `PMFS`, version 1, party, count (u32), then per template its bundle id (16) and
//! the evaluator's seed_b (16). Channel session id: SHA-256("privmatch face template seeds
//! v1" ‖ [`super::masked::template_digest`] of the ids)[0..16], so the seeds answer exactly the
//! list the evaluator asked for.
//!
//! **Identification keys** (once per face session, [`super::masked::IdentificationKeys`]
//! layout): channel session id SHA-256("privmatch face identification keys v1" ‖ face session
//! id)[0..16], so a half opens only for the session it was dealt for; the session id is
//! single use at each evaluator, hence so are the keys. A dealing made ahead of time
//! ([`KeysFor::Stock`]) travels under SHA-256("privmatch face stocked identification keys v1"
//! ‖ stock id)[0..16]: it opens only as that stock id, which each evaluator lets one session
//! claim, once. A verification's keys ([`KeysFor::Verification`]) travel under
//! SHA-256("privmatch face verification keys v1" ‖ face session id)[0..16], so keys dealt for
//! an identification never open in a verification session.
//!
//! **Verifications** (1:1, docs/protocols/face.md §7): P2 deals a verification's keys from
//! its session id alone ([`super::masked::deal_verification`]), at the same time as the
//! evaluators' opens; no template list travels to P2 (since extension 0.14.0).

use rand_core::{CryptoRng, RngCore};
use sha2::{Digest, Sha256};

use super::encoding::{evaluator, Reader, VERSION};
use super::masked::{
    template_digest, IdentificationKeys, KeysFor, TemplateMaskMaster, BUNDLE_ID_LEN,
};
use super::FaceError;
use crate::crypto::seal::PairwiseSecrets;
use crate::party::PartyIndex;
use crate::wire::session::SESSION_ID_LEN;

const SEEDS_MAGIC: &[u8; 4] = b"PMFS";

fn channel_id(label: &[u8], bound: &[u8]) -> [u8; SESSION_ID_LEN] {
    let digest = Sha256::new()
        .chain_update(label)
        .chain_update(bound)
        .finalize();
    let mut out = [0u8; SESSION_ID_LEN];
    out.copy_from_slice(&digest[..SESSION_ID_LEN]);
    out
}

fn seeds_channel(ids: &[[u8; BUNDLE_ID_LEN]]) -> [u8; SESSION_ID_LEN] {
    channel_id(b"privmatch face template seeds v1", &template_digest(ids))
}

fn keys_channel(keys_for: KeysFor) -> [u8; SESSION_ID_LEN] {
    match keys_for {
        KeysFor::Session(id) => channel_id(b"privmatch face identification keys v1", &id),
        KeysFor::Stock(id) => channel_id(b"privmatch face stocked identification keys v1", &id),
        KeysFor::Verification(id) => channel_id(b"privmatch face verification keys v1", &id),
    }
}

/// Dealer side: seals evaluator `party`'s mask seeds of the templates `ids` (in order), with
/// `to_evaluator` the pairwise secrets of P2 with P_party.
pub fn seal_template_seeds<R: RngCore + CryptoRng>(
    party: usize,
    master: &TemplateMaskMaster,
    ids: &[[u8; BUNDLE_ID_LEN]],
    to_evaluator: &PairwiseSecrets,
    rng: &mut R,
) -> Result<Vec<u8>, FaceError> {
    if party > 1 {
        return Err(FaceError::NotAnEvaluator(party as u8));
    }
    let count = u32::try_from(ids.len())
        .map_err(|_| FaceError::Malformed("template seeds: too many templates"))?;
    let mut plain = Vec::with_capacity(10 + ids.len() * 32);
    plain.extend_from_slice(SEEDS_MAGIC);
    plain.push(VERSION);
    plain.push(party as u8);
    plain.extend_from_slice(&count.to_le_bytes());
    let seeder = master.seeder();
    for id in ids {
        let mut seeds = seeder.seeds(id);
        plain.extend_from_slice(id);
        plain.extend_from_slice(&seeds[party]);
        zeroize::Zeroize::zeroize(&mut seeds);
    }
    let sealed = to_evaluator
        .channel(seeds_channel(ids))
        .seal(0, &plain, rng);
    zeroize::Zeroize::zeroize(&mut plain);
    Ok(sealed)
}

/// Evaluator side: opens the seeds of the templates `ids` it asked for, as `me`, with
/// `from_dealer` its pairwise secrets with P2. Refuses a message for another list, another
/// party, or not sealed by P2. Returns one seed per id, in order.
pub fn open_template_seeds(
    me: PartyIndex,
    from_dealer: &PairwiseSecrets,
    ids: &[[u8; BUNDLE_ID_LEN]],
    sealed: &[u8],
) -> Result<Vec<[u8; 16]>, FaceError> {
    let mine = evaluator(me)? as u8;
    let mut plain = from_dealer.channel(seeds_channel(ids)).open(0, sealed)?;
    let result = parse_seeds(mine, ids, &plain);
    zeroize::Zeroize::zeroize(&mut plain);
    result
}

fn parse_seeds(
    mine: u8,
    ids: &[[u8; BUNDLE_ID_LEN]],
    plain: &[u8],
) -> Result<Vec<[u8; 16]>, FaceError> {
    let mut r = Reader::new(plain);
    r.magic(SEEDS_MAGIC)?;
    let party = r.u8()?;
    if party != mine {
        return Err(FaceError::PartyMismatch {
            inside: party,
            me: mine,
        });
    }
    if r.u32()? as usize != ids.len() {
        return Err(FaceError::Malformed("template seeds: wrong count"));
    }
    let mut seeds = Vec::with_capacity(ids.len());
    for id in ids {
        if &r.array::<BUNDLE_ID_LEN>()? != id {
            return Err(FaceError::Malformed("template seeds: another template"));
        }
        seeds.push(r.array::<16>()?);
    }
    r.finish()?;
    Ok(seeds)
}

/// Largest plaintext of one sealed chunk of an identification key half: 256 MiB, half the
/// 512 MiB message limit of the sessions, so one chunk always fits a message (and a `bytea`)
/// whatever N is; a half above it (N ≥ 393,000 or so at 683 bytes per comparison) travels as
/// several chunks.
pub const KEY_CHUNK_BYTES: usize = 256 << 20;

/// Dealer side: seals one evaluator's half of an identification's keys
/// ([`super::masked::deal_identification`]) for `keys_for`, as one message.
pub fn seal_identification_keys<R: RngCore + CryptoRng>(
    half: &[u8],
    keys_for: KeysFor,
    to_evaluator: &PairwiseSecrets,
    rng: &mut R,
) -> Vec<u8> {
    to_evaluator
        .channel(keys_channel(keys_for))
        .seal(0, half, rng)
}

/// Dealer side: seals one evaluator's half for `keys_for` as consecutive
/// messages of one channel, each holding at most `chunk_bytes` of the half (at least one
/// message). The channel numbers its messages, so the evaluator opens them only in order and
/// all of them ([`open_identification_key_chunks`]); one chunk is exactly the message of
/// [`seal_identification_keys`].
pub fn seal_identification_key_chunks<R: RngCore + CryptoRng>(
    half: &[u8],
    keys_for: KeysFor,
    to_evaluator: &PairwiseSecrets,
    chunk_bytes: usize,
    rng: &mut R,
) -> Vec<Vec<u8>> {
    let mut channel = to_evaluator.channel(keys_channel(keys_for));
    if half.is_empty() {
        return vec![channel.seal(0, half, rng)];
    }
    half.chunks(chunk_bytes.max(1))
        .map(|chunk| channel.seal(0, chunk, rng))
        .collect()
}

/// Evaluator side: opens and decodes its half of the keys dealt for `keys_for`.
pub fn open_identification_keys(
    me: PartyIndex,
    from_dealer: &PairwiseSecrets,
    keys_for: KeysFor,
    sealed: &[u8],
) -> Result<IdentificationKeys, FaceError> {
    open_identification_key_chunks(me, from_dealer, keys_for, &[sealed])
}

/// Evaluator side: opens the chunks of its half of the keys dealt for `keys_for`, in order,
/// and decodes the whole. A missing, repeated or reordered chunk is refused (by the
/// channel's sequence numbers, or by the half's exact length).
pub fn open_identification_key_chunks(
    me: PartyIndex,
    from_dealer: &PairwiseSecrets,
    keys_for: KeysFor,
    chunks: &[&[u8]],
) -> Result<IdentificationKeys, FaceError> {
    let party = evaluator(me)?;
    let mut channel = from_dealer.channel(keys_channel(keys_for));
    let mut plain = Vec::new();
    for chunk in chunks {
        let mut part = channel.open(0, chunk)?;
        if plain.is_empty() {
            // The first (often the only) chunk is taken as it is: no copy of tens of MB.
            plain = part;
        } else {
            plain.extend_from_slice(&part);
            zeroize::Zeroize::zeroize(&mut part);
        }
    }
    let keys = IdentificationKeys::decode(party, &plain);
    zeroize::Zeroize::zeroize(&mut plain);
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::face::encoding::test_support::{pairwise, seeded_keys};
    use crate::face::funshade::DealerParams;
    use crate::face::masked::deal_identification;
    use crate::face::Metric;

    #[test]
    fn seeds_and_keys_open_only_for_their_party_list_and_session() {
        let (mut rng, secrets, publics) = seeded_keys(31);
        let pair = |a: usize, b: usize| pairwise(&secrets, &publics, a, b);
        let master = TemplateMaskMaster::generate(&mut rng);
        let ids = [[1u8; 16], [2u8; 16], [3u8; 16]];
        let sealed = seal_template_seeds(1, &master, &ids, &pair(2, 1), &mut rng).unwrap();
        let seeds = open_template_seeds(PartyIndex::ALL[1], &pair(1, 2), &ids, &sealed).unwrap();
        let want: Vec<[u8; 16]> = ids.iter().map(|id| master.template_seeds(id)[1]).collect();
        assert_eq!(seeds, want);
        // Another list, another party, a forger (P0 → P1), a flipped bit: refused.
        let other = [[1u8; 16], [3u8; 16], [2u8; 16]];
        assert!(open_template_seeds(PartyIndex::ALL[1], &pair(1, 2), &other, &sealed).is_err());
        assert!(open_template_seeds(PartyIndex::ALL[0], &pair(0, 2), &ids, &sealed).is_err());
        let forged = seal_template_seeds(1, &master, &ids, &pair(0, 1), &mut rng).unwrap();
        assert!(open_template_seeds(PartyIndex::ALL[1], &pair(1, 2), &ids, &forged).is_err());
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(open_template_seeds(PartyIndex::ALL[1], &pair(1, 2), &ids, &flipped).is_err());
        assert!(seal_template_seeds(2, &master, &ids, &pair(2, 1), &mut rng).is_err());

        let params = DealerParams::for_tests(Metric::Cosine, 128, 5);
        let halves = deal_identification(&params, &master, &ids, &mut rng).unwrap();
        let session = KeysFor::Session([7u8; SESSION_ID_LEN]);
        let sealed = seal_identification_keys(&halves[0], session, &pair(2, 0), &mut rng);
        let keys =
            open_identification_keys(PartyIndex::ALL[0], &pair(0, 2), session, &sealed).unwrap();
        assert_eq!(keys.len(), 3);
        assert_eq!(keys.digest(), &template_digest(&ids));
        let other_session = KeysFor::Session([8u8; SESSION_ID_LEN]);
        assert!(
            open_identification_keys(PartyIndex::ALL[0], &pair(0, 2), other_session, &sealed)
                .is_err()
        );
        // P1's channel with P2 cannot open P0's half, and P0 refuses P1's half.
        assert!(
            open_identification_keys(PartyIndex::ALL[1], &pair(1, 2), session, &sealed).is_err()
        );
        let p1_half_to_p0 = seal_identification_keys(&halves[1], session, &pair(2, 0), &mut rng);
        assert!(matches!(
            open_identification_keys(PartyIndex::ALL[0], &pair(0, 2), session, &p1_half_to_p0),
            Err(FaceError::PartyMismatch { .. })
        ));
        // Stocked under the same 16 bytes: opens only as stock, and the session's half does
        // not open as stock.
        let stock = KeysFor::Stock([7u8; SESSION_ID_LEN]);
        let stocked = seal_identification_keys(&halves[0], stock, &pair(2, 0), &mut rng);
        assert!(open_identification_keys(PartyIndex::ALL[0], &pair(0, 2), stock, &stocked).is_ok());
        assert!(
            open_identification_keys(PartyIndex::ALL[0], &pair(0, 2), session, &stocked).is_err()
        );
        assert!(open_identification_keys(PartyIndex::ALL[0], &pair(0, 2), stock, &sealed).is_err());
    }

    #[test]
    fn chunked_key_halves_open_only_whole_and_in_order() {
        let (mut rng, secrets, publics) = seeded_keys(32);
        let pair = |a: usize, b: usize| pairwise(&secrets, &publics, a, b);
        let master = TemplateMaskMaster::generate(&mut rng);
        let ids: Vec<[u8; 16]> = (0..5u8).map(|i| [i; 16]).collect();
        let params = DealerParams::for_tests(Metric::Euclidean, 128, 5);
        let halves = deal_identification(&params, &master, &ids, &mut rng).unwrap();
        let session = KeysFor::Session([9u8; SESSION_ID_LEN]);
        let chunks =
            seal_identification_key_chunks(&halves[1], session, &pair(2, 1), 1000, &mut rng);
        assert_eq!(chunks.len(), halves[1].len().div_ceil(1000));
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let me = PartyIndex::ALL[1];
        let keys = open_identification_key_chunks(me, &pair(1, 2), session, &refs).unwrap();
        assert_eq!(keys.len(), 5);
        assert_eq!(keys.digest(), &template_digest(&ids));
        // Reordered, missing the last or the first, repeated: refused.
        let mut swapped = refs.clone();
        swapped.swap(0, 1);
        let last = refs.len() - 1;
        let repeated = [refs[0], refs[0]];
        for bad in [&swapped[..], &refs[..last], &refs[1..], &repeated[..]] {
            assert!(open_identification_key_chunks(me, &pair(1, 2), session, bad).is_err());
        }
        // One chunk is the single message.
        let single =
            seal_identification_key_chunks(&halves[1], session, &pair(2, 1), usize::MAX, &mut rng);
        assert_eq!(single.len(), 1);
        assert!(open_identification_keys(me, &pair(1, 2), session, &single[0]).is_ok());
    }
}
