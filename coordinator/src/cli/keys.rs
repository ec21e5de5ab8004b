//! What the client shares and seals with: the parties' keys pinned in the configuration
//! (never keys the coordinator reports) and a CSPRNG seeded from the operating system.

use anyhow::{Context, Result};
use privmatch_core::crypto::seal::PartyPublicKey;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::config::Config;

/// A ChaCha20 CSPRNG seeded from the operating system: drawing every share coefficient from
/// the OS directly would cost a system call per draw.
pub fn sharing_rng() -> Result<ChaCha20Rng> {
    ChaCha20Rng::from_rng(rand::rngs::OsRng)
        .context("the operating system's random source is unavailable")
}

/// The pinned keys and the CSPRNG of one client.
pub struct Sealer {
    /// The three parties' pinned public keys, in index order.
    pub keys: [PartyPublicKey; 3],
    /// The CSPRNG shares are drawn from.
    pub rng: ChaCha20Rng,
}

impl Sealer {
    /// The pinned keys of `config` and a fresh CSPRNG.
    pub fn new(config: &Config) -> Result<Self> {
        Ok(Sealer {
            keys: config.pinned_keys()?,
            rng: sharing_rng()?,
        })
    }
}

/// The time a probe is sealed at (seconds since the Unix epoch): parties refuse probes older
/// than `privmatch_core::iris::probe::PROBE_LIFETIME_SECS`.
pub fn sealing_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
