//! The coordinator's error answers and the one table that classifies every failure: its API
//! code ([`ErrorCode`]), the HTTP status it is answered with, and the SQLSTATE the SQL front
//! door raises for it. The server, the CLI and the front door read this table; the docs'
//! table (docs/front-door.md, "Errors the coordinator reports") is generated from it
//! ([`markdown_table`], `cargo run -p privmatch-api --example error-table`) and a test fails
//! when the two differ.
//!
//! The other direction — a party's SQLSTATE to the code the coordinator answers — is
//! [`party_failure`]: one function, used by every modality for the failures they share.

use serde::{Deserialize, Serialize};

/// Declares [`ErrorCode`] and its table in one place: variant, wire code, HTTP status, the
/// front door's SQLSTATE, whether a retry with a new session may succeed, what it means and
/// what to do (the front door's hint, if any).
macro_rules! error_codes {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $code:literal, $status:literal, $sqlstate:literal, $transient:literal,
        $meaning:literal, $todo:expr;
    )*) => {
        /// What went wrong, for programs: the `code` of an [`ErrorBody`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, in the table's order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it travels in JSON (`"rejected_by_party"`).
            pub const fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            /// The HTTP status the coordinator answers with this code.
            pub const fn http_status(self) -> u16 {
                match self { $(ErrorCode::$variant => $status,)* }
            }

            /// The SQLSTATE the SQL front door raises for this code (for
            /// [`ErrorCode::RejectedByParty`], the party's own when it reported one; this is
            /// the fallback).
            pub const fn sqlstate(self) -> &'static str {
                match self { $(ErrorCode::$variant => $sqlstate,)* }
            }

            /// Whether a new session (freshly sealed inputs) may succeed where this one failed.
            pub const fn is_transient(self) -> bool {
                match self { $(ErrorCode::$variant => $transient,)* }
            }

            /// What the code means, for the docs' table.
            pub const fn meaning(self) -> &'static str {
                match self { $(ErrorCode::$variant => $meaning,)* }
            }

            /// What the caller should do, when there is something to say (the front door's
            /// hint).
            pub const fn what_to_do(self) -> Option<&'static str> {
                match self { $(ErrorCode::$variant => $todo,)* }
            }
        }
    };
}

const CREDENTIAL_HINT: &str = "check privmatch.coordinator_credential_file: the credential needs the scopes enroll and search";

error_codes! {
    /// The request is malformed or out of range.
    BadRequest = "bad_request", 400, "22023", false,
        "the request is malformed or out of range (the coordinator's own checks)",
        Some("correct the request; nothing was done");
    /// No valid API credential.
    Unauthenticated = "unauthenticated", 401, "28000", false,
        "no valid API credential", Some(CREDENTIAL_HINT);
    /// The credential lacks the scope the endpoint needs, or a party refused an operator
    /// command that is not its operator's.
    Forbidden = "forbidden", 403, "28000", false,
        "the credential lacks the endpoint's scope (or is revoked); a party refused an operator command not signed by its operator",
        Some(CREDENTIAL_HINT);
    /// Paillier: a mailbox poll or reply not signed by the device's enrolled key, or a poll
    /// whose time is too far from the coordinator's clock.
    DeviceSignature = "device_signature", 403, "28000", false,
        "Paillier: a poll or reply not signed by the device's enrolled key, or too far from the coordinator's clock",
        None;
    /// The coordinator serves no such path (a route of another version, a typo).
    UnknownEndpoint = "unknown_endpoint", 404, "0A000", false,
        "the coordinator serves no such endpoint (another version's route, a typo)",
        Some("check the coordinator's version and the URL");
    /// Face: the subject has no face template.
    UnknownSubject = "unknown_subject", 404, "P0002", false,
        "face: the subject has no face template", None;
    /// Paillier: the device is not enrolled at the service provider.
    UnknownDevice = "unknown_device", 404, "P0002", false,
        "Paillier: the device is not enrolled at the service provider",
        Some("enrol the device first (`privmatch device enroll`)");
    /// Paillier: no such matching session (never opened, or expired and forgotten).
    UnknownSession = "unknown_session", 404, "42704", false,
        "Paillier: no such matching session (never opened, or expired and forgotten)",
        Some("open a new session");
    /// The session is not at the step the call belongs to (a reply of another round, one
    /// already given, a template deleted during the session).
    WrongStep = "wrong_step", 409, "55000", false,
        "the session is not at the step the call belongs to (another round's reply, one already given, a template deleted during it)",
        Some("start a new session");
    /// The request body is over the limit.
    TooLarge = "too_large", 413, "54000", false,
        "the request body is over the coordinator's limit", Some("send smaller batches");
    /// A party rejected the request's content (its SQLSTATE, class 22 or 23, is passed on).
    RejectedByParty = "rejected_by_party", 422, "22023", false,
        "a party refused the input: the party's own SQLSTATE is passed on — 22023 refused (expired, wrong dimension, another threshold than the policy, sealed to another party's keys), 22P03 does not open (altered), 23505 already consumed",
        Some("seal the input again, for these parties (iris: with the threshold of `privmatch iris policy show`)");
    /// The coordinator is at its concurrency limit.
    TooBusy = "too_busy", 429, "53400", true,
        "the coordinator or a party is at its limit of concurrent requests", Some("retry shortly");
    /// Paillier: a session budget of the service provider's policy is spent.
    BudgetExhausted = "budget_exhausted", 429, "53400", false,
        "a party's query budget for this subject, device or caller is spent (not transient)",
        Some("wait for the budget's window to pass; the operator sets the budget");
    /// The parties broke the protocol or disagree.
    ProtocolError = "protocol_error", 502, "08P01", false,
        "the parties broke the protocol or disagree (an altered round message, a session a party does not know)",
        Some("retry with a new session; if it persists, tell the operators");
    /// A party failed for a reason it did not classify.
    PartyError = "party_error", 502, "58000", false,
        "a party failed (the message and the party's SQLSTATE say how)", None;
    /// A party is unreachable or not ready.
    PartyUnavailable = "party_unavailable", 503, "08006", false,
        "a party is unreachable or not ready (the message names it)", Some("retry later");
    /// The parties hold different template sets (an enrolment or deletion was committing).
    TemplateSetsDiffer = "template_sets_differ", 503, "40001", true,
        "the parties' template sets differed: an enrolment or deletion was committing (the coordinator retried for 10 s); if it persists, the message names the party whose set diverges",
        Some("an enrolment was being committed: seal the input again and retry; if it persists, the set of the party named diverges: its operator runs `privmatch iris audit` (docs/protocols/iris.md §14.2)");
    /// Face: a session id or a stocked dealing was claimed by another session already.
    KeyClaimConflict = "key_claim_conflict", 503, "40001", true,
        "face: the session id or the stocked dealing was claimed by another session",
        Some("seal the input again (a new session) and retry");
    /// Iris enroll-if-unique: a request ahead of this one in its batch was refused at some
    /// parties only, so the comparison with its record is void.
    EnrolmentBatchVoid = "enrolment_batch_void", 503, "40001", true,
        "iris enroll-if-unique: a request ahead of this one in its batch was refused at some parties only, so this request's comparison with it is void; nothing was enrolled for it",
        Some("seal the request again (a new session) and retry: it runs in another batch (`privmatch iris enroll --if-unique` retries by itself)");
    /// A distributed transaction's outcome is left to recovery.
    InDoubt = "in_doubt", 503, "40003", false,
        "a distributed transaction's outcome is left to the coordinator's recovery",
        Some("the coordinator's recovery completes it at every party or at none; calling again with the same sealed input fails with 23505 once it committed");
    /// The dealer, a party or the service provider is not configured.
    NotConfigured = "not_configured", 503, "55000", false,
        "the face dealer, a party or the Paillier service provider is not configured",
        Some("the message names the command that configures it (e.g. `privmatch face configure`)");
    /// A party did not answer in time.
    Timeout = "timeout", 504, "08006", false,
        "a party did not answer in time (the message names it)", Some("retry later");
}

impl ErrorCode {
    /// The code of its wire form, if it is one of ours.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answer: `{"error": message, "code": …, "party": n, "sqlstate": "…"}`.
///
/// `code` stays a string on the wire so that a client reads the message of a code it does not
/// know yet; [`ErrorBody::kind`] is its typed reading.
#[derive(Clone, Debug, Serialize, Deserialize, Default)]
pub struct ErrorBody {
    /// What went wrong, for people.
    #[serde(default)]
    pub error: String,
    /// What went wrong, for programs (an [`ErrorCode`]'s wire form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The party at fault, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub party: Option<u8>,
    /// The party's SQLSTATE, if it reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqlstate: Option<String>,
    /// With `template_sets_differ`: the entries each party reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<[i64; 3]>,
}

impl ErrorBody {
    /// A body with a code and a message.
    pub fn new(code: ErrorCode, message: String) -> ErrorBody {
        ErrorBody {
            error: message,
            code: Some(code.as_str().to_owned()),
            ..ErrorBody::default()
        }
    }

    /// The code, if it is one this build knows.
    pub fn kind(&self) -> Option<ErrorCode> {
        self.code.as_deref().and_then(ErrorCode::parse)
    }

    /// Whether a new session may succeed (a known transient code).
    pub fn is_transient(&self) -> bool {
        self.kind().is_some_and(ErrorCode::is_transient)
    }

    /// The SQLSTATE the front door raises for this answer of HTTP `status`: the code's, or
    /// for a party's rejection the party's own (class 22 or 23); a route the coordinator does
    /// not have (404 without a code) is 0A000, anything unclassified 58000.
    pub fn sqlstate_for(&self, status: u16) -> &str {
        match self.kind() {
            Some(ErrorCode::RejectedByParty) => self
                .sqlstate
                .as_deref()
                .filter(|s| is_sqlstate(s) && (s.starts_with("22") || s.starts_with("23")))
                .unwrap_or(ErrorCode::RejectedByParty.sqlstate()),
            Some(code) => code.sqlstate(),
            None if status == 404 => "0A000",
            None => "58000",
        }
    }
}

/// Whether `text` has the form of a SQLSTATE: five digits or upper-case letters.
pub fn is_sqlstate(text: &str) -> bool {
    text.len() == 5
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
}

/// The code for a party's failure during a session or transaction, by the SQLSTATE it
/// reported (none: it could not be reached): cancelled by a timeout → `timeout`, rejected
/// content (class 22, 23) → `rejected_by_party`, an operator command refused (28) →
/// `forbidden`, a budget spent (53400) → `budget_exhausted`, unavailable (08, 53, 55, 57) →
/// `party_unavailable`, anything else → `party_error`. A modality may classify its own
/// SQLSTATEs first (e.g. faces' P0002 as `unknown_subject`).
pub fn party_failure(sqlstate: Option<&str>) -> ErrorCode {
    let sqlstate = sqlstate.unwrap_or("");
    let class = sqlstate.get(..2).unwrap_or("");
    match (sqlstate, class) {
        ("", _) => ErrorCode::PartyUnavailable,
        ("57014", _) => ErrorCode::Timeout,
        ("53400", _) => ErrorCode::BudgetExhausted,
        (_, "22" | "23") => ErrorCode::RejectedByParty,
        (_, "28") => ErrorCode::Forbidden,
        (_, "08" | "53" | "55" | "57") => ErrorCode::PartyUnavailable,
        _ => ErrorCode::PartyError,
    }
}

/// The docs' table of the codes (Markdown), generated from [`ErrorCode`]: code, HTTP status,
/// the front door's SQLSTATE, transient, meaning, what to do.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| code | HTTP | SQLSTATE | retry | meaning | what to do |\n|---|---|---|---|---|---|\n",
    );
    for code in ErrorCode::ALL {
        let sqlstate = match code {
            ErrorCode::RejectedByParty => "the party's (22023, 22P03, 23505)".to_owned(),
            _ => code.sqlstate().to_owned(),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            code.as_str(),
            code.http_status(),
            sqlstate,
            if code.is_transient() {
                "new session"
            } else {
                "—"
            },
            code.meaning(),
            code.what_to_do().unwrap_or("—"),
        ));
    }
    out
}

/// The markers around the generated table in docs/front-door.md.
pub const TABLE_BEGIN: &str =
    "<!-- generated by `cargo run -p privmatch-api --example error-table`: do not edit -->";
/// See [`TABLE_BEGIN`].
pub const TABLE_END: &str = "<!-- end of the generated table -->";

/// `doc` with the text between [`TABLE_BEGIN`] and [`TABLE_END`] replaced by
/// [`markdown_table`]; `None` when the markers are missing.
pub fn with_generated_table(doc: &str) -> Option<String> {
    let start = doc.find(TABLE_BEGIN)? + TABLE_BEGIN.len();
    let end = start + doc[start..].find(TABLE_END)?;
    Some(format!(
        "{}\n{}{}",
        &doc[..start],
        markdown_table(),
        &doc[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(*code));
            assert!(is_sqlstate(code.sqlstate()), "{code}");
            assert!((400..600).contains(&code.http_status()), "{code}");
        }
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        assert_eq!(ErrorCode::parse("nonsense"), None);
    }

    #[test]
    fn party_failures_classify_by_sqlstate() {
        assert_eq!(party_failure(None), ErrorCode::PartyUnavailable);
        assert_eq!(party_failure(Some("57014")), ErrorCode::Timeout);
        assert_eq!(party_failure(Some("22023")), ErrorCode::RejectedByParty);
        assert_eq!(party_failure(Some("22P03")), ErrorCode::RejectedByParty);
        assert_eq!(party_failure(Some("23505")), ErrorCode::RejectedByParty);
        assert_eq!(party_failure(Some("28000")), ErrorCode::Forbidden);
        assert_eq!(party_failure(Some("53400")), ErrorCode::BudgetExhausted);
        assert_eq!(party_failure(Some("55000")), ErrorCode::PartyUnavailable);
        assert_eq!(party_failure(Some("XX000")), ErrorCode::PartyError);
    }

    #[test]
    fn the_front_door_passes_a_rejection_on_with_the_partys_sqlstate() {
        let body = |code: ErrorCode, sqlstate: Option<&str>| ErrorBody {
            sqlstate: sqlstate.map(str::to_owned),
            ..ErrorBody::new(code, String::new())
        };
        let rejected = body(ErrorCode::RejectedByParty, Some("22P03"));
        assert_eq!(rejected.sqlstate_for(422), "22P03");
        // Only content classes pass through; anything else is the code's own.
        let odd = body(ErrorCode::RejectedByParty, Some("XX000"));
        assert_eq!(odd.sqlstate_for(422), "22023");
        assert_eq!(body(ErrorCode::InDoubt, None).sqlstate_for(503), "40003");
        assert_eq!(ErrorBody::default().sqlstate_for(404), "0A000");
        assert_eq!(ErrorBody::default().sqlstate_for(500), "58000");
        assert!(body(ErrorCode::TemplateSetsDiffer, None).is_transient());
        assert!(!body(ErrorCode::NotConfigured, None).is_transient());
    }

    #[test]
    fn the_docs_table_is_the_generated_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/front-door.md");
        let doc = std::fs::read_to_string(path).expect("docs/front-door.md");
        let generated = with_generated_table(&doc).expect("the table's markers");
        assert!(
            generated == doc,
            "docs/front-door.md's error table differs from privmatch-api's ErrorCode: run \
             `cargo run -p privmatch-api --example error-table`"
        );
    }
}
