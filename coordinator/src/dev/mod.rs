//! Developer tooling, apart from the service: a local cluster of three parties and a
//! coordinator on one machine ([`cluster`], `privmatch cluster up|down|status`; [`delay`], the
//! relay that delays its links with `up --link-delay-ms`) and the
//! benchmarks ([`mod@bench`], `privmatch bench enroll|iris|face`). It exercises every modality,
//! so it may name them all.
//!
//! Both hold every role of a deployment at once ([`LocalConfigs`]): the client's configuration,
//! the coordinator's, and the three operators'. That is what a local cluster is; the service
//! and the client commands never read another role's file.

pub mod bench;
pub mod cluster;
pub mod delay;

use std::path::Path;

use anyhow::Result;

use crate::config::{Config, CoordinatorConfig, OperatorConfig, COORDINATOR_CONFIG_FILE};
use crate::parties::Parties;

/// Every configuration of a local cluster's home directory.
pub struct LocalConfigs {
    /// The client's (`privmatch.toml`, or `--config`).
    pub client: Config,
    /// The coordinator's (`coordinator.toml`).
    pub coordinator: CoordinatorConfig,
    /// The three operators' (`operators/p<i>.toml`).
    pub operators: [OperatorConfig; 3],
}

impl LocalConfigs {
    /// Loads them from `home`, the client's from `client_path`.
    pub fn load(home: &Path, client_path: &Path) -> Result<Self> {
        Ok(LocalConfigs {
            client: Config::load(client_path)?,
            coordinator: CoordinatorConfig::load(&home.join(COORDINATOR_CONFIG_FILE))?,
            operators: OperatorConfig::load_all(home)?,
        })
    }

    /// The parties as the coordinator's role reaches them (the protocol functions only).
    pub fn coordinator_parties(&self) -> Parties {
        Parties::new(&self.coordinator)
    }

    /// The parties as their operators reach them (what benchmarks measure with: tables, WAL).
    pub fn operator_parties(&self) -> Parties {
        Parties::from_configs([
            self.operators[0].party.clone(),
            self.operators[1].party.clone(),
            self.operators[2].party.clone(),
        ])
    }
}
