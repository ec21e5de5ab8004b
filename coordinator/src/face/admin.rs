//! The coordinator's face administration: the dealer's configuration and public state (P2).
//! The dealer's threshold reaches P2 sealed and signed by P2's operator; the coordinator only
//! relays it and reads back the metric, dimension and generation.

use privmatch_core::party::PartyIndex;
use tokio_postgres::Row;

use crate::parties::{column, Parties, PartyError};
use privmatch_api::face::{DealerStatus, FaceDealerResponse};

/// The dealer's public state from a row (metric, dim, generation).
fn dealer_of(party: PartyIndex, row: &Row) -> Result<DealerStatus, PartyError> {
    Ok(DealerStatus {
        metric: column(party, row, 0)?.unwrap_or_default(),
        dim: column(party, row, 1)?.unwrap_or(0),
        generation: column(party, row, 2)?.unwrap_or(0),
    })
}

/// Sends the sealed dealer configuration to P2; returns its new public state.
pub async fn configure_dealer(
    parties: &Parties,
    sealed: &[u8],
) -> Result<DealerStatus, PartyError> {
    let p2 = &parties.all()[2];
    let row = p2
        .query_one(
            "SELECT metric, dim, generation FROM privmatch.face_dealer_configure($1)",
            &[&sealed],
        )
        .await?;
    dealer_of(p2.index, &row)
}

/// P2's public state; None when the dealer is not configured (no row, or SQLSTATE 55000).
pub async fn dealer_status(parties: &Parties) -> Result<Option<DealerStatus>, PartyError> {
    let p2 = &parties.all()[2];
    let rows = match p2
        .query(
            "SELECT metric, dim, generation FROM privmatch.face_dealer_status()",
            &[],
        )
        .await
    {
        Ok(rows) => rows,
        Err(err) if err.sqlstate.as_deref() == Some("55000") => return Ok(None),
        Err(err) => return Err(err),
    };
    rows.first().map(|row| dealer_of(p2.index, row)).transpose()
}

/// The dealer's state for `GET /v1/face/dealer` (an error is reported inside the answer).
pub async fn dealer_state(parties: &Parties) -> FaceDealerResponse {
    match dealer_status(parties).await {
        Ok(dealer) => FaceDealerResponse {
            dealer,
            dealer_error: None,
        },
        Err(e) => FaceDealerResponse {
            dealer: None,
            dealer_error: Some(e.to_string()),
        },
    }
}
