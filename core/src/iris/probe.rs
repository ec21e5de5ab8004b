//! Sealed search probes: what a client sends each party to search with one iris template.
//!
//! The client shares the probe with [`share_query_template`] (probes need the constant-term
//! layout applied before sharing) and seals party i's share to party i's pinned key
//! ([`seal_to_party`], purpose [`IRIS_PROBE_PURPOSE`]). The plaintext names the search
//! session it belongs to, so a coordinator cannot replay a probe into another session, and
//! the party it belongs to, so a misrouted probe is refused.
//!
//! Plaintext layout (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `PMPR` |
//! | 4 | 1 | layout version (1) |
//! | 5 | 1 | party index the share belongs to |
//! | 6 | 16 | search session id |
//! | 22 | 1 | eye: 0 left, 1 right |
//! | 23 | 2·12,800 | code share coefficients (u16) |
//! | … | 2·6,400 | mask share coefficients (u16) |

use rand_core::{CryptoRng, RngCore};

use crate::crypto::seal::{open_sealed_box, seal_to_party, PartyPublicKey, PartySecretKey};
use crate::iris::encoding::{IrisShare, CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use crate::iris::enroll::{BundleError, Eye};
use crate::iris::query::share_query_template;
use crate::iris::template::IrisTemplate;
use crate::party::PartyIndex;
use crate::wire::storage::{coefs_from_le_bytes, push_coefs_le};

/// The sealing purpose label of iris search probes.
pub const IRIS_PROBE_PURPOSE: &str = "iris-probe";

use crate::wire::session::SESSION_ID_LEN;

const MAGIC: &[u8; 4] = b"PMPR";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 4 + 1 + 1 + SESSION_ID_LEN + 1;
const PLAINTEXT_LEN: usize = HEADER_LEN + 2 * (CODE_SHARE_COEFS + MASK_SHARE_COEFS);

/// One party's opened probe.
#[derive(Clone, PartialEq, Eq)]
pub struct IrisProbe {
    /// The search session the probe was sealed for.
    pub session: [u8; SESSION_ID_LEN],
    /// Which eye the probe is; it is compared with enrolled templates of the same eye.
    pub eye: Eye,
    /// The party's share of the probe (query layout, see [`share_query_template`]).
    pub share: IrisShare,
}

impl std::fmt::Debug for IrisProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IrisProbe {{ session: {}, eye: {}, party: {}, share: <redacted> }}",
            hex::encode(self.session),
            self.eye.as_str(),
            self.share.party
        )
    }
}

impl IrisProbe {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PLAINTEXT_LEN);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.share.party.as_u8());
        out.extend_from_slice(&self.session);
        out.push(self.eye.to_byte());
        push_coefs_le(&mut out, &self.share.code);
        push_coefs_le(&mut out, &self.share.mask);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, BundleError> {
        if bytes.len() != PLAINTEXT_LEN || &bytes[..4] != MAGIC {
            return Err(BundleError::Malformed(
                "probe: bad magic or length does not match the layout",
            ));
        }
        if bytes[4] != VERSION {
            return Err(BundleError::Malformed("probe: unsupported layout version"));
        }
        let party = PartyIndex::new(i64::from(bytes[5]))
            .map_err(|_| BundleError::Malformed("probe: party index out of range"))?;
        let mut session = [0u8; SESSION_ID_LEN];
        session.copy_from_slice(&bytes[6..22]);
        let eye = Eye::from_byte(bytes[22])?;
        let code_end = HEADER_LEN + 2 * CODE_SHARE_COEFS;
        Ok(IrisProbe {
            session,
            eye,
            share: IrisShare {
                party,
                code: coefs_from_le_bytes(&bytes[HEADER_LEN..code_end]),
                mask: coefs_from_le_bytes(&bytes[code_end..]),
            },
        })
    }
}

/// Client side: shares `template` as a probe and seals party i's share to `party_keys[i]`
/// for search session `session`. Returns the three sealed probes, indexed by party. Fails if
/// the template cannot be encoded (e.g. a mask that is not doubled).
pub fn seal_iris_probe<R: RngCore + CryptoRng>(
    template: &IrisTemplate,
    eye: Eye,
    session: [u8; SESSION_ID_LEN],
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<[Vec<u8>; 3], BundleError> {
    let shares = share_query_template(template, rng)?;
    let mut sealed: [Vec<u8>; 3] = Default::default();
    for share in shares {
        let p = share.party;
        let probe = IrisProbe {
            session,
            eye,
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

/// Party side: opens a sealed probe as party `me` for search session `session`. Refuses a
/// probe sealed to another party or key, tampered, of another session, or carrying another
/// party's share.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::synth::random_template;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn keys(rng: &mut ChaCha20Rng) -> ([PartySecretKey; 3], [PartyPublicKey; 3]) {
        let secrets: [PartySecretKey; 3] = std::array::from_fn(|_| PartySecretKey::generate(rng));
        let publics = std::array::from_fn(|i| secrets[i].public_key());
        (secrets, publics)
    }

    #[test]
    fn probe_round_trips_at_each_party() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let (secrets, publics) = keys(&mut rng);
        let t = random_template(&mut rng);
        let session = [9u8; 16];
        let sealed = seal_iris_probe(&t, Eye::Right, session, &publics, &mut rng).unwrap();
        for p in PartyIndex::ALL {
            let probe = open_iris_probe(p, &secrets[p.as_usize()], &session, &sealed[p.as_usize()])
                .unwrap();
            assert_eq!(probe.eye, Eye::Right);
            assert_eq!(probe.share.party, p);
            assert_eq!(probe.share.code.len(), CODE_SHARE_COEFS);
            assert_eq!(probe.share.mask.len(), MASK_SHARE_COEFS);
        }
    }

    #[test]
    fn probe_for_another_session_party_or_tampered_is_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let (secrets, publics) = keys(&mut rng);
        let t = random_template(&mut rng);
        let session = [1u8; 16];
        let sealed = seal_iris_probe(&t, Eye::Left, session, &publics, &mut rng).unwrap();
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
