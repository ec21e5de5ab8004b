//! Sealed inputs of the SQL front door: one enrolment or one probe, shared and sealed to the
//! parties' pinned keys on the client (`privmatch iris seal`, `privmatch face seal`), carried
//! as one line of text through an application and its database, and handed by a party's
//! front-door function (`privmatch.iris_identify(sealed)`, …) to the coordinator unchanged.
//!
//! Text form: `privmatch-sealed-v1:<kind>:<base64>` where `<kind>` names the SQL function that
//! takes it ([`SealedKind`]) and the base64 (standard alphabet, padded) is the body of the
//! coordinator endpoint that runs it ([`SealedKind::api_path`]): framed envelopes for an iris
//! enrolment, a JSON body for the others. The text has no tab, newline or backslash, so it
//! travels through `COPY` text format and CSV unquoted.
//!
//! Nothing in it is secret to the party that relays it: every share inside is sealed to its
//! own party's key and bound to a session id (probes also to their parameters and sealing
//! time), so a party, the application or the coordinator can read only what the coordinator
//! API shows anyway (subject ids, eyes, parameters).

use std::fmt;

use base64::Engine;

/// The first field of the text form: names the format and its version.
pub const SEALED_INPUT_TAG: &str = "privmatch-sealed-v1";

/// The longest text accepted (a one-eye iris probe sealed for three parties is about 205 kB of
/// text, an iris enrolment about 155 kB).
pub const MAX_SEALED_INPUT_CHARS: usize = 16 << 20;

/// What a sealed input is for: each front-door function takes exactly one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealedKind {
    /// One iris template to enrol (`privmatch.iris_enroll`).
    IrisEnroll,
    /// An iris probe for identification (`privmatch.iris_identify`).
    IrisIdentify,
    /// An iris probe for a uniqueness check (`privmatch.iris_is_unique`).
    IrisUniqueness,
    /// One face template to enrol (`privmatch.face_enroll`).
    FaceEnroll,
    /// A face probe bound to one claimed subject (`privmatch.face_verify`).
    FaceVerify,
    /// A face probe for 1:N identification (`privmatch.face_identify`).
    FaceIdentify,
}

impl SealedKind {
    /// Every kind, in a fixed order.
    pub const ALL: [SealedKind; 6] = [
        SealedKind::IrisEnroll,
        SealedKind::IrisIdentify,
        SealedKind::IrisUniqueness,
        SealedKind::FaceEnroll,
        SealedKind::FaceVerify,
        SealedKind::FaceIdentify,
    ];

    /// The kind's name in the text form.
    pub fn as_str(self) -> &'static str {
        match self {
            SealedKind::IrisEnroll => "iris-enroll",
            SealedKind::IrisIdentify => "iris-identify",
            SealedKind::IrisUniqueness => "iris-uniqueness",
            SealedKind::FaceEnroll => "face-enroll",
            SealedKind::FaceVerify => "face-verify",
            SealedKind::FaceIdentify => "face-identify",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<SealedKind> {
        SealedKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The coordinator endpoint (path and query) the body is posted to.
    pub fn api_path(self) -> &'static str {
        match self {
            // A record enrolled twice (a retried call) is reported, not an error.
            SealedKind::IrisEnroll => "/v1/iris/enroll?on_duplicate=skip",
            SealedKind::IrisIdentify | SealedKind::IrisUniqueness => "/v1/iris/search",
            SealedKind::FaceEnroll => "/v1/face/enroll",
            SealedKind::FaceVerify => "/v1/face/verify",
            SealedKind::FaceIdentify => "/v1/face/identify",
        }
    }

    /// Whether the body is JSON (all but the iris enrolment's framed envelopes).
    pub fn is_json(self) -> bool {
        self != SealedKind::IrisEnroll
    }

    /// The SQL function that takes this kind (in schema `privmatch`).
    pub fn sql_function(self) -> &'static str {
        match self {
            SealedKind::IrisEnroll => "iris_enroll",
            SealedKind::IrisIdentify => "iris_identify",
            SealedKind::IrisUniqueness => "iris_is_unique",
            SealedKind::FaceEnroll => "face_enroll",
            SealedKind::FaceVerify => "face_verify",
            SealedKind::FaceIdentify => "face_identify",
        }
    }

    /// The command that writes inputs of this kind.
    pub fn sealed_by(self) -> &'static str {
        match self {
            SealedKind::IrisEnroll => "privmatch iris seal --for enroll",
            SealedKind::IrisIdentify => "privmatch iris seal --for identify",
            SealedKind::IrisUniqueness => "privmatch iris seal --for uniqueness",
            SealedKind::FaceEnroll => "privmatch face seal --for enroll",
            SealedKind::FaceVerify => "privmatch face seal --for verify",
            SealedKind::FaceIdentify => "privmatch face seal --for identify",
        }
    }
}

impl fmt::Display for SealedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One sealed input: its kind and the coordinator request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedInput {
    /// What it is for.
    pub kind: SealedKind,
    /// The body of the coordinator endpoint [`SealedKind::api_path`].
    pub body: Vec<u8>,
}

/// Why a text is not a sealed input. Messages quote at most the kind field, never the body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealedInputError {
    /// The text does not start with [`SEALED_INPUT_TAG`].
    #[error("not a privmatch sealed input (it must start with \"{SEALED_INPUT_TAG}:\")")]
    NotSealed,
    /// The kind field names no kind.
    #[error("unknown sealed input kind {0:?} (expected one of iris-enroll, iris-identify, iris-uniqueness, face-enroll, face-verify, face-identify)")]
    UnknownKind(String),
    /// The body is not valid base64, or empty.
    #[error("the body of the sealed input is not valid base64")]
    BadBody,
    /// Longer than [`MAX_SEALED_INPUT_CHARS`].
    #[error("the sealed input is {0} characters long; the limit is {MAX_SEALED_INPUT_CHARS}")]
    TooLong(usize),
}

impl SealedInput {
    /// The text form, `privmatch-sealed-v1:<kind>:<base64>`.
    pub fn encode(&self) -> String {
        let body = base64::engine::general_purpose::STANDARD.encode(&self.body);
        format!("{SEALED_INPUT_TAG}:{}:{body}", self.kind)
    }

    /// Parses the text form (surrounding whitespace is ignored).
    pub fn parse(text: &str) -> Result<SealedInput, SealedInputError> {
        if text.len() > MAX_SEALED_INPUT_CHARS {
            return Err(SealedInputError::TooLong(text.len()));
        }
        let rest = text
            .trim()
            .strip_prefix(SEALED_INPUT_TAG)
            .and_then(|r| r.strip_prefix(':'))
            .ok_or(SealedInputError::NotSealed)?;
        let (kind, body) = rest.split_once(':').ok_or(SealedInputError::NotSealed)?;
        let kind = SealedKind::parse(kind).ok_or_else(|| {
            SealedInputError::UnknownKind(kind.chars().take(32).collect::<String>())
        })?;
        let body = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| SealedInputError::BadBody)?;
        if body.is_empty() {
            return Err(SealedInputError::BadBody);
        }
        Ok(SealedInput { kind, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_kind_round_trips_and_names_its_function() {
        for kind in SealedKind::ALL {
            let input = SealedInput {
                kind,
                body: b"{\"session\": \"00\"}".to_vec(),
            };
            let text = input.encode();
            assert!(!text.contains(['\t', '\n', '\\', ' ']), "{text}");
            assert_eq!(SealedInput::parse(&text), Ok(input));
            assert_eq!(SealedKind::parse(kind.as_str()), Some(kind));
            assert!(kind.sealed_by().starts_with("privmatch "));
            assert!(kind.api_path().starts_with("/v1/"));
            assert!(!kind.sql_function().is_empty());
        }
        assert!(!SealedKind::IrisEnroll.is_json());
        assert!(SealedKind::FaceVerify.is_json());
    }

    #[test]
    fn bad_texts_are_refused_with_a_reason() {
        let cases = [
            ("", SealedInputError::NotSealed),
            ("hello", SealedInputError::NotSealed),
            (
                "privmatch-sealed-v2:iris-enroll:AA==",
                SealedInputError::NotSealed,
            ),
            (
                "privmatch-sealed-v1:iris-enroll",
                SealedInputError::NotSealed,
            ),
            (
                "privmatch-sealed-v1:iris-delete:AA==",
                SealedInputError::UnknownKind("iris-delete".into()),
            ),
            (
                "privmatch-sealed-v1:face-verify:***",
                SealedInputError::BadBody,
            ),
            (
                "privmatch-sealed-v1:face-verify:",
                SealedInputError::BadBody,
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(SealedInput::parse(text), Err(expected), "{text:?}");
        }
        let long = format!(
            "{SEALED_INPUT_TAG}:iris-enroll:{}",
            "A".repeat(MAX_SEALED_INPUT_CHARS)
        );
        assert!(matches!(
            SealedInput::parse(&long),
            Err(SealedInputError::TooLong(_))
        ));
    }

    proptest! {
        #[test]
        fn any_body_round_trips(body in proptest::collection::vec(any::<u8>(), 1..512), k in 0usize..6) {
            let input = SealedInput { kind: SealedKind::ALL[k], body };
            prop_assert_eq!(SealedInput::parse(&format!(" {}\n", input.encode())), Ok(input));
        }
    }
}
