//! The coordinator's calls to the service provider's SQL functions (packed Paillier,
//! Game-Set-MATCH [ABMR20]; the functions are documented in `docs/protocols/paillier.md` §10).
//! One party is the service provider (SP), `privmatch.paillier_sp_party` in the parties'
//! configuration: the coordinator finds it by asking every party for
//! `paillier_service_info()` (only the SP has a row, naming its own index) and keeps the
//! answer until the SP answers 55000 (for instance after the setting changed). Every call runs
//! as the coordinator's login role, under the serve options' call timeout; nothing the SP
//! returns is kept here beyond the call (the relay keeps the Round 2 message until the device
//! takes it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use privmatch_core::paillier::cipher::PublicKey;
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::SessionId;
use tokio::sync::Mutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::parties::{column, Parties, Party, PartyError};
use privmatch_api::paillier::{DeviceEntry, ParamSet, ServiceInfo};
use privmatch_api::wire::to_base64;

/// Why a call to the service provider failed.
#[derive(Debug, thiserror::Error)]
pub enum SpError {
    /// No party is the service provider yet (none answers `paillier_service_info()`).
    #[error("no party is a Paillier service provider: its operator runs SELECT privmatch.paillier_init_service() and privmatch.paillier_set_params()")]
    NoServiceProvider,
    /// The service provider answered an error.
    #[error("service provider {0}")]
    Party(PartyError),
    /// The service provider did not answer in time.
    #[error("service provider P{0} did not answer within {1:?}")]
    Timeout(u8, Duration),
    /// The answer has an unexpected shape.
    #[error("service provider P{0}: unexpected answer: {1}")]
    Malformed(u8, String),
    /// The SP refused the device's answer to its norm challenge (malformed, or the proof
    /// failed; the SP's WARNING says which). The challenge is single use, so the pending
    /// enrolment is void: the device begins again.
    #[error("service provider P{0} refused the device's answer to the norm challenge; the enrolment is void (its challenge is single use) and nothing was stored: begin again")]
    Refused(u8),
}

impl SpError {
    /// The SQLSTATE the service provider answered, if it did.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            SpError::Party(e) => e.sqlstate.as_deref(),
            SpError::Refused(_) => Some("08P01"),
            _ => None,
        }
    }
}

/// The service provider's SQL functions, found once and called with a timeout.
pub struct ServiceProvider {
    parties: Arc<Parties>,
    timeout: Duration,
    found: Mutex<Option<PartyIndex>>,
}

impl ServiceProvider {
    /// The SP among `parties`, calls bounded by `timeout`.
    pub fn new(parties: Arc<Parties>, timeout: Duration) -> Self {
        ServiceProvider {
            parties,
            timeout,
            found: Mutex::new(None),
        }
    }

    /// The SP's party: the cached one, or the party whose `paillier_service_info()` has a row
    /// naming itself.
    async fn party(&self) -> Result<Arc<Party>, SpError> {
        let mut found = self.found.lock().await;
        if let Some(index) = *found {
            return Ok(self.parties.all()[index.as_u8() as usize].clone());
        }
        let asked = join_all(self.parties.all().iter().map(|party| async move {
            let rows = party
                .query(
                    "SELECT party_index FROM privmatch.paillier_service_info()",
                    &[],
                )
                .await
                .ok()?;
            let named = rows.first().and_then(|r| r.try_get::<_, i32>(0).ok())?;
            (named == i32::from(party.index.as_u8())).then(|| party.clone())
        }))
        .await;
        let party = asked
            .into_iter()
            .flatten()
            .next()
            .ok_or(SpError::NoServiceProvider)?;
        *found = Some(party.index);
        Ok(party)
    }

    /// Runs one statement at the SP under the timeout; forgets the SP on 55000.
    async fn rows(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, SpError> {
        let party = self.party().await?;
        let index = party.index.as_u8();
        let result = tokio::time::timeout(self.timeout, party.query(sql, args))
            .await
            .map_err(|_| SpError::Timeout(index, self.timeout))?;
        result.map_err(|e| {
            if e.sqlstate.as_deref() == Some("55000") {
                if let Ok(mut found) = self.found.try_lock() {
                    *found = None;
                }
            }
            SpError::Party(e)
        })
    }

    /// One row of a statement that answers exactly one.
    async fn row(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<(u8, Row), SpError> {
        let party = self.party().await?.index.as_u8();
        let mut rows = self.rows(sql, args).await?;
        match (rows.pop(), rows.is_empty()) {
            (Some(row), true) => Ok((party, row)),
            _ => Err(SpError::Malformed(party, "not exactly one row".into())),
        }
    }

    /// Column `i` of an SP row, NULL as None.
    fn get<'r, T: tokio_postgres::types::FromSql<'r>>(
        party: u8,
        row: &'r Row,
        i: usize,
    ) -> Result<Option<T>, SpError> {
        column(PartyIndex::ALL[usize::from(party)], row, i).map_err(SpError::Party)
    }

    /// Column `i`, which must not be NULL.
    fn required<'r, T: tokio_postgres::types::FromSql<'r>>(
        party: u8,
        row: &'r Row,
        i: usize,
        what: &str,
    ) -> Result<T, SpError> {
        Self::get(party, row, i)?
            .ok_or_else(|| SpError::Malformed(party, format!("{what} is NULL")))
    }

    /// `paillier_service_info()` and `paillier_parameters()`: what a device enrols with.
    pub async fn info(&self) -> Result<ServiceInfo, SpError> {
        let (party, row) = self
            .row(
                "SELECT signing_key, ring_pedersen FROM privmatch.paillier_service_info()",
                &[],
            )
            .await?;
        let signing: Vec<u8> = Self::required(party, &row, 0, "signing_key")?;
        let ring: Vec<u8> = Self::required(party, &row, 1, "ring_pedersen")?;
        let sets = self
            .rows(
                "SELECT protocol, params, valid_days FROM privmatch.paillier_parameters()",
                &[],
            )
            .await?;
        let parameters = sets
            .iter()
            .map(|r| {
                Ok(ParamSet {
                    protocol: Self::required(party, r, 0, "protocol")?,
                    params: to_base64(&Self::required::<Vec<u8>>(party, r, 1, "params")?),
                    valid_days: Self::required(party, r, 2, "valid_days")?,
                })
            })
            .collect::<Result<_, SpError>>()?;
        Ok(ServiceInfo {
            party,
            signing_key: hex::encode(signing),
            ring_pedersen: to_base64(&ring),
            parameters,
        })
    }

    /// `paillier_enroll_begin`: the norm challenge (Π2/Π3) or None (Π1).
    pub async fn enroll_begin(
        &self,
        device: &str,
        request: &[u8],
        session: &SessionId,
    ) -> Result<Option<Vec<u8>>, SpError> {
        let session = session.as_slice();
        let (party, row) = self
            .row(
                "SELECT privmatch.paillier_enroll_begin($1, $2, $3)",
                &[&device, &request, &session],
            )
            .await?;
        Self::get(party, &row, 0)
    }

    /// `paillier_enroll_finish`: the signed record; [`SpError::Refused`] when the SP refused
    /// the device's norm answer (NULL: the refusal consumed the pending enrolment).
    pub async fn enroll_finish(
        &self,
        device: &str,
        response: Option<&[u8]>,
    ) -> Result<Vec<u8>, SpError> {
        let (party, row) = self
            .row(
                "SELECT privmatch.paillier_enroll_finish($1, $2)",
                &[&device, &response],
            )
            .await?;
        Self::get(party, &row, 0)?.ok_or(SpError::Refused(party))
    }

    /// `paillier_device`: the stored signed record.
    pub async fn record(&self, device: &str) -> Result<Vec<u8>, SpError> {
        let (party, row) = self
            .row("SELECT privmatch.paillier_device($1)", &[&device])
            .await?;
        Self::required(party, &row, 0, "record")
    }

    /// The Paillier key in `device`'s stored record (`paillier_device`): the key its
    /// signatures verify under.
    pub async fn device_key(&self, device: &str) -> Result<PublicKey, SpError> {
        let bytes = self.record(device).await?;
        let party = self.party().await?.index.as_u8();
        let signed = SignedTemplate::from_bytes(&bytes)
            .map_err(|e| SpError::Malformed(party, format!("the record of {device:?}: {e}")))?;
        Ok(signed.record.public_key)
    }

    /// `paillier_devices()`.
    pub async fn devices(&self) -> Result<Vec<DeviceEntry>, SpError> {
        let party = self.party().await?.index.as_u8();
        let rows = self
            .rows(
                "SELECT device_id, protocol, to_json(expires_at) #>> '{}', \
                 to_json(enrolled_at) #>> '{}' FROM privmatch.paillier_devices() \
                 ORDER BY device_id",
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DeviceEntry {
                    device: Self::required(party, r, 0, "device_id")?,
                    protocol: Self::required(party, r, 1, "protocol")?,
                    expires_at: Self::get(party, r, 2)?.unwrap_or_default(),
                    enrolled_at: Self::get(party, r, 3)?.unwrap_or_default(),
                })
            })
            .collect()
    }

    /// `paillier_delete` with the device's `signature` of the deletion: whether a record was
    /// removed.
    pub async fn delete(&self, device: &str, signature: &[u8]) -> Result<bool, SpError> {
        let (party, row) = self
            .row(
                "SELECT privmatch.paillier_delete($1, $2)",
                &[&device, &signature],
            )
            .await?;
        Self::required(party, &row, 0, "deleted")
    }

    /// `paillier_delete_signed` with the SP operator's signed `command` (a lost device):
    /// whether a record was removed.
    pub async fn delete_signed(&self, command: &[u8]) -> Result<bool, SpError> {
        let (party, row) = self
            .row("SELECT privmatch.paillier_delete_signed($1)", &[&command])
            .await?;
        Self::required(party, &row, 0, "deleted")
    }

    /// The threshold of the SP's policy for `protocol` (`paillier_policies()`), if one is set.
    pub async fn policy_threshold(&self, protocol: Protocol) -> Result<Option<i64>, SpError> {
        let name = protocol.name();
        let rows = self
            .rows(
                "SELECT threshold FROM privmatch.paillier_policies() WHERE protocol = $1",
                &[&name],
            )
            .await?;
        let party = self.party().await?.index.as_u8();
        match rows.first() {
            Some(row) => Self::get(party, row, 0),
            None => Ok(None),
        }
    }

    /// Round 2 of `protocol` at the SP from the terminal's sealed input: first
    /// `paillier_session_open` (policy threshold, budgets of the device and of `terminal`, the
    /// API credential that asked; its own transaction, so the charge commits), then
    /// `paillier_pi1_round2`, `paillier_pi2_round2` or `paillier_pi3_round2`: the SP's signed
    /// Round 2 (core's `SignedRound2`).
    pub async fn round2(
        &self,
        protocol: Protocol,
        device: &str,
        terminal_input: &[u8],
        terminal: &str,
    ) -> Result<Vec<u8>, SpError> {
        self.row(
            "SELECT privmatch.paillier_session_open($1, $2, $3)",
            &[&device, &terminal_input, &terminal],
        )
        .await?;
        let sql = format!(
            "SELECT privmatch.paillier_{}_round2($1, $2)",
            protocol.name()
        );
        let (party, row) = self.row(&sql, &[&device, &terminal_input]).await?;
        Self::required(party, &row, 0, "round 2")
    }

    /// Π2 Round 4 at the SP (`paillier_pi2_round4`): the device's X checked, with the
    /// device's `signature` of its Round 3 for this session. Returns (Round 4 for the device,
    /// sealed to it in the SP's signed envelope; the verdict sealed to the terminal).
    pub async fn pi2_round4(
        &self,
        session: &SessionId,
        round3: &[u8],
        signature: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), SpError> {
        let session = session.as_slice();
        let (party, row) = self
            .row(
                "SELECT message, verdict FROM privmatch.paillier_pi2_round4($1, $2, $3)",
                &[&session, &round3, &signature],
            )
            .await?;
        Ok((
            Self::required(party, &row, 0, "message")?,
            Self::required(party, &row, 1, "verdict")?,
        ))
    }

    /// Π3 Round 4 at the SP (`paillier_pi3_round4`): the garbled circuit for the device,
    /// sealed to it in the SP's signed envelope; `signature` the device's of its Round 3.
    pub async fn pi3_round4(
        &self,
        session: &SessionId,
        round3: &[u8],
        signature: &[u8],
    ) -> Result<Vec<u8>, SpError> {
        let session = session.as_slice();
        let (party, row) = self
            .row(
                "SELECT privmatch.paillier_pi3_round4($1, $2, $3)",
                &[&session, &round3, &signature],
            )
            .await?;
        Self::required(party, &row, 0, "round 4")
    }

    /// Π3's output at the SP (`paillier_pi3_finish`): the device's output labels checked
    /// (`signature` the device's of its Round 5); the verdict sealed to the terminal.
    pub async fn pi3_finish(
        &self,
        session: &SessionId,
        round5: &[u8],
        signature: &[u8],
    ) -> Result<Vec<u8>, SpError> {
        let session = session.as_slice();
        let (party, row) = self
            .row(
                "SELECT privmatch.paillier_pi3_finish($1, $2, $3)",
                &[&session, &round5, &signature],
            )
            .await?;
        Self::required(party, &row, 0, "verdict")
    }
}

/// The most device keys [`DeviceKeys`] holds; past it the cache starts again empty.
const MAX_CACHED_KEYS: usize = 100_000;

/// The devices' enrolled Paillier keys as the SP's records give them, which the relay checks
/// the devices' signatures with (core's `paillier::device_signature`). Public keys only. An
/// entry is read from the SP on the device's first signed call and again whenever a signature
/// fails under it (the device may have been deleted and enrolled again under a new key).
#[derive(Default)]
pub struct DeviceKeys {
    keys: std::sync::Mutex<HashMap<String, PublicKey>>,
}

impl DeviceKeys {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, PublicKey>> {
        // A panic while holding the lock leaves a map of public keys, still consistent.
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The cached key of `device`.
    pub fn get(&self, device: &str) -> Option<PublicKey> {
        self.table().get(device).cloned()
    }

    /// Keeps `key` as `device`'s.
    pub fn put(&self, device: &str, key: PublicKey) {
        let mut table = self.table();
        if table.len() >= MAX_CACHED_KEYS && !table.contains_key(device) {
            table.clear();
        }
        table.insert(device.to_owned(), key);
    }
}
