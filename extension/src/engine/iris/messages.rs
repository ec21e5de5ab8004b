//! What a backend and the iris service exchange: a backend's [`IrisCall`] travels as a
//! [`Call`] of [`Modality::Iris`] in the modality-neutral frame (`super::super::ipc`), the
//! service's answer as an [`IrisReply`] in a [`Response::Reply`]. The layouts are defined here.
//!
//! Imports: [`super::super::ipc`] and core's `iris::policy`.

use std::borrow::Cow;
use std::io;

use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::params::SearchParams;
use privmatch_core::iris::policy::IrisPolicy;

/// A refusal's text as read back from a reply.
fn text(bytes: Vec<u8>) -> io::Result<String> {
    String::from_utf8(bytes).map_err(|_| malformed())
}

use crate::engine::ipc::{
    malformed, Call, EngineError, ErrorKind, Modality, Reader, Request, Response, Writer,
};

/// The operations of the iris service.
pub mod op {
    /// `iris_search_start`.
    pub const START: u8 = 1;
    /// `iris_search_round`.
    pub const ROUND: u8 = 2;
    /// `iris_search_abort`.
    pub const ABORT: u8 = 3;
    /// `iris_batch_start`.
    pub const BATCH_START: u8 = 4;
    /// `iris_batch_round`.
    pub const BATCH_ROUND: u8 = 5;
}

/// Most probes a batch frame may carry (the service refuses more than its own limit).
const MAX_FRAME_PROBES: u32 = 1024;

/// What a backend asks the iris service. A round's message is borrowed on the backend side
/// and owned on the engine side, so it is never copied to build a frame.
#[derive(Debug)]
pub enum IrisCall<'a> {
    /// `iris_search_start`.
    Start {
        /// Search session id.
        session: [u8; 16],
        /// The sealed probe for this party.
        probe: Vec<u8>,
        /// This party's iris threshold policy: the threshold sealed in the probe must be it
        /// (the search parameters travel only sealed in the probe). It crosses the socket
        /// as its exact numerator.
        policy: IrisPolicy,
    },
    /// `iris_search_round`.
    Round {
        /// Search session id.
        session: [u8; 16],
        /// Round number.
        round: u32,
        /// Sealed message of party i−1.
        message: Cow<'a, [u8]>,
    },
    /// `iris_search_abort`.
    Abort {
        /// Search session id.
        session: [u8; 16],
    },
    /// `iris_batch_start`.
    BatchStart {
        /// The batch id (drawn by the coordinator).
        batch: [u8; 16],
        /// The declared search parameters (core's `SearchParams::to_bytes`).
        params: SearchParams,
        /// The declared eye.
        eye: Eye,
        /// Each search's session id and this party's sealed probe, in batch order.
        probes: Vec<([u8; 16], Vec<u8>)>,
        /// Empty for a search batch; for an enrolment batch (`iris_batch_enroll_start`), per
        /// probe this party's sealed enrolment envelope (as it opens it) and the record's
        /// envelope hashes h0 ‖ h1 ‖ h2 (checked by the SQL layer).
        enrolments: Vec<(Vec<u8>, Vec<u8>)>,
        /// This party's iris threshold policy (as for `Start`).
        policy: IrisPolicy,
    },
    /// `iris_batch_round`.
    BatchRound {
        /// The batch id.
        batch: [u8; 16],
        /// Round number.
        round: u32,
        /// Sealed message of party i−1.
        message: Cow<'a, [u8]>,
    },
}

impl<'a> IrisCall<'a> {
    /// The engine request carrying this call.
    pub fn into_request(self) -> Request<'a> {
        let (op, head, payload) = match self {
            IrisCall::Start {
                session,
                probe,
                policy,
            } => (
                op::START,
                Writer::default()
                    .fixed(&session)
                    .bytes(&probe)
                    .u32(policy.numerator())
                    .0,
                Cow::Borrowed(&[][..]),
            ),
            IrisCall::Round {
                session,
                round,
                message,
            } => (
                op::ROUND,
                Writer::default().fixed(&session).u32(round).0,
                message,
            ),
            IrisCall::Abort { session } => (
                op::ABORT,
                Writer::default().fixed(&session).0,
                Cow::Borrowed(&[][..]),
            ),
            IrisCall::BatchStart {
                batch,
                params,
                eye,
                probes,
                enrolments,
                policy,
            } => {
                let mut w = Writer::default()
                    .fixed(&batch)
                    .fixed(&params.to_bytes())
                    .u8(eye.to_byte())
                    .u32(policy.numerator())
                    .u32(probes.len() as u32);
                for (id, probe) in &probes {
                    w = w.fixed(id).bytes(probe);
                }
                w = w.u32(enrolments.len() as u32);
                for (envelope, hashes) in &enrolments {
                    w = w.bytes(envelope).bytes(hashes);
                }
                (op::BATCH_START, w.0, Cow::Borrowed(&[][..]))
            }
            IrisCall::BatchRound {
                batch,
                round,
                message,
            } => (
                op::BATCH_ROUND,
                Writer::default().fixed(&batch).u32(round).0,
                message,
            ),
        };
        Request::Call(Call {
            modality: Modality::Iris,
            op,
            head,
            payload,
        })
    }

    /// Reads an iris call (the engine side); a threshold policy outside (0, 0.5] or fields
    /// that do not follow the layout make a malformed frame.
    pub fn from_call(call: Call<'static>) -> io::Result<IrisCall<'static>> {
        let mut r = Reader(&call.head);
        let parsed = match call.op {
            op::START => {
                let session = r.array()?;
                let probe = r.bytes()?;
                let policy = IrisPolicy::from_numerator(r.u32()?).map_err(|_| malformed())?;
                IrisCall::Start {
                    session,
                    probe,
                    policy,
                }
            }
            op::ROUND => {
                let session = r.array()?;
                let round = r.u32()?;
                r.end()?;
                return Ok(IrisCall::Round {
                    session,
                    round,
                    message: call.payload,
                });
            }
            op::ABORT => IrisCall::Abort {
                session: r.array()?,
            },
            op::BATCH_START => {
                let batch = r.array()?;
                let params = SearchParams::from_bytes(r.array()?).map_err(|_| malformed())?;
                let eye = Eye::from_byte(r.u8()?).map_err(|_| malformed())?;
                let policy = IrisPolicy::from_numerator(r.u32()?).map_err(|_| malformed())?;
                let count = r.u32()?;
                if count > MAX_FRAME_PROBES {
                    return Err(malformed());
                }
                let mut probes = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    probes.push((r.array()?, r.bytes()?));
                }
                let count = r.u32()?;
                if count > MAX_FRAME_PROBES {
                    return Err(malformed());
                }
                let mut enrolments = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    enrolments.push((r.bytes()?, r.bytes()?));
                }
                IrisCall::BatchStart {
                    batch,
                    params,
                    eye,
                    probes,
                    enrolments,
                    policy,
                }
            }
            op::BATCH_ROUND => {
                let batch = r.array()?;
                let round = r.u32()?;
                r.end()?;
                return Ok(IrisCall::BatchRound {
                    batch,
                    round,
                    message: call.payload,
                });
            }
            _ => return Err(malformed()),
        };
        r.end()?;
        if !call.payload.is_empty() {
            return Err(malformed());
        }
        Ok(parsed)
    }
}

/// What the iris service answers.
#[derive(Debug)]
pub enum IrisReply {
    /// Reply to [`IrisCall::Start`].
    Started {
        /// Entries searched.
        entries: u64,
        /// Set digest.
        digest: [u8; 32],
        /// First message.
        message: Vec<u8>,
    },
    /// The next message.
    Continue(Vec<u8>),
    /// A search's output: signed and sealed to the client's reply key (core's
    /// `iris::output`), and the uniqueness bit when the client's probe disclosed it.
    Finished {
        /// The sealed output.
        sealed: Vec<u8>,
        /// The disclosed uniqueness bit (enroll-if-unique only).
        disclosed_unique: Option<bool>,
    },
    /// Reply to [`IrisCall::Abort`]: whether the session was running.
    Aborted(bool),
    /// Reply to [`IrisCall::BatchStart`]: as `Started`, with each probe's refusal.
    BatchStarted {
        /// Entries searched.
        entries: u64,
        /// Set digest.
        digest: [u8; 32],
        /// First message.
        message: Vec<u8>,
        /// Per probe in batch order: why this party refused it, if it did.
        refused: Vec<Option<EngineError>>,
    },
    /// A batch's outputs, per probe in batch order: its sealed output and disclosed bit, or
    /// its refusal at start.
    BatchFinished(Vec<ProbeAnswer>),
}

/// One probe's answer at the end of a batch: its sealed output and disclosed uniqueness bit,
/// or its refusal at start.
pub type ProbeAnswer = Result<(Vec<u8>, Option<bool>), String>;

fn disclosed_byte(disclosed: Option<bool>) -> u8 {
    match disclosed {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    }
}

fn disclosed_from(byte: u8) -> io::Result<Option<bool>> {
    match byte {
        0 => Ok(None),
        1 => Ok(Some(false)),
        2 => Ok(Some(true)),
        _ => Err(malformed()),
    }
}

impl IrisReply {
    /// The engine response carrying this reply.
    pub fn into_response(self) -> Response {
        let (head, payload) = match self {
            IrisReply::Started {
                entries,
                digest,
                message,
            } => (
                Writer::default().u8(1).u64(entries).fixed(&digest).0,
                message,
            ),
            IrisReply::Continue(m) => (Writer::default().u8(2).0, m),
            IrisReply::Finished {
                sealed,
                disclosed_unique,
            } => (
                Writer::default()
                    .u8(3)
                    .u8(disclosed_byte(disclosed_unique))
                    .bytes(&sealed)
                    .0,
                Vec::new(),
            ),
            IrisReply::Aborted(a) => (Writer::default().u8(4).u8(u8::from(a)).0, Vec::new()),
            IrisReply::BatchStarted {
                entries,
                digest,
                message,
                refused,
            } => {
                let mut w = Writer::default()
                    .u8(5)
                    .u64(entries)
                    .fixed(&digest)
                    .u32(refused.len() as u32);
                for r in &refused {
                    w = match r {
                        None => w.u8(0),
                        Some(why) => w.u8(1).u8(why.kind as u8).bytes(why.message.as_bytes()),
                    };
                }
                (w.0, message)
            }
            IrisReply::BatchFinished(outputs) => {
                let mut w = Writer::default().u8(6).u32(outputs.len() as u32);
                for o in &outputs {
                    w = match o {
                        Ok((sealed, disclosed)) => {
                            w.u8(0).u8(disclosed_byte(*disclosed)).bytes(sealed)
                        }
                        Err(why) => w.u8(1).bytes(why.as_bytes()),
                    };
                }
                (w.0, Vec::new())
            }
        };
        Response::Reply { head, payload }
    }

    /// Reads the iris service's reply (the backend side).
    pub fn from_reply(head: &[u8], payload: Vec<u8>) -> io::Result<IrisReply> {
        let mut r = Reader(head);
        let reply = match r.u8()? {
            1 => {
                let entries = r.u64()?;
                let digest = r.array()?;
                r.end()?;
                return Ok(IrisReply::Started {
                    entries,
                    digest,
                    message: payload,
                });
            }
            2 => {
                r.end()?;
                return Ok(IrisReply::Continue(payload));
            }
            3 => {
                let disclosed_unique = disclosed_from(r.u8()?)?;
                IrisReply::Finished {
                    sealed: r.bytes()?,
                    disclosed_unique,
                }
            }
            4 => IrisReply::Aborted(r.u8()? != 0),
            5 => {
                let entries = r.u64()?;
                let digest = r.array()?;
                let count = r.u32()?.min(MAX_FRAME_PROBES);
                let mut refused = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    refused.push(match r.u8()? {
                        0 => None,
                        1 => {
                            let kind = ErrorKind::from_byte(r.u8()?).ok_or_else(malformed)?;
                            Some(EngineError::new(kind, text(r.bytes()?)?))
                        }
                        _ => return Err(malformed()),
                    });
                }
                r.end()?;
                return Ok(IrisReply::BatchStarted {
                    entries,
                    digest,
                    message: payload,
                    refused,
                });
            }
            6 => {
                let count = r.u32()?.min(MAX_FRAME_PROBES);
                let mut outputs = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    outputs.push(match r.u8()? {
                        0 => {
                            let disclosed = disclosed_from(r.u8()?)?;
                            Ok((r.bytes()?, disclosed))
                        }
                        1 => Err(text(r.bytes()?)?),
                        _ => return Err(malformed()),
                    });
                }
                IrisReply::BatchFinished(outputs)
            }
            _ => return Err(malformed()),
        };
        r.end()?;
        if !payload.is_empty() {
            return Err(malformed());
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ipc::{read_frame, write_frame};

    /// `request` written to a socket and read back by the engine.
    fn through_the_socket(request: Request<'_>) -> IrisCall<'static> {
        let (head, payload) = request.encode_parts();
        let mut framed = Vec::new();
        write_frame(&mut framed, &head, payload).expect("write");
        match Request::decode(read_frame(&mut framed.as_slice()).expect("read")).expect("decode") {
            Request::Call(call) => {
                assert_eq!(call.modality, Modality::Iris);
                IrisCall::from_call(call).expect("an iris call")
            }
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn calls_and_replies_round_trip() {
        let calls = [
            IrisCall::Start {
                session: [3; 16],
                probe: vec![1, 2, 3],
                policy: IrisPolicy::default_policy(),
            },
            IrisCall::Round {
                session: [4; 16],
                round: 7,
                message: Cow::Borrowed(&[9u8, 8, 7][..]),
            },
            IrisCall::Abort { session: [5; 16] },
            IrisCall::BatchStart {
                batch: [6; 16],
                params: SearchParams::new(
                    privmatch_core::iris::params::SearchMode::Uniqueness,
                    15,
                    0.345,
                )
                .expect("params"),
                eye: Eye::Right,
                probes: vec![([7; 16], vec![1, 2]), ([8; 16], Vec::new())],
                enrolments: vec![(vec![3, 4], vec![5; 96]), (Vec::new(), vec![6; 96])],
                policy: IrisPolicy::default_policy(),
            },
            IrisCall::BatchRound {
                batch: [6; 16],
                round: 3,
                message: Cow::Borrowed(&[1u8][..]),
            },
        ];
        for call in calls {
            let expected = format!("{call:?}");
            assert_eq!(
                format!("{:?}", through_the_socket(call.into_request())),
                expected
            );
        }
        let replies = [
            IrisReply::Started {
                entries: 12,
                digest: [1; 32],
                message: vec![5; 100],
            },
            IrisReply::Continue(vec![1, 2]),
            IrisReply::Continue(Vec::new()),
            IrisReply::Finished {
                sealed: vec![3; 1100],
                disclosed_unique: None,
            },
            IrisReply::Finished {
                sealed: vec![4; 1100],
                disclosed_unique: Some(true),
            },
            IrisReply::Aborted(true),
            IrisReply::BatchStarted {
                entries: 3,
                digest: [2; 32],
                message: vec![1; 10],
                refused: vec![None, Some(EngineError::new(ErrorKind::Probe, "stale"))],
            },
            IrisReply::BatchFinished(vec![
                Ok((vec![1; 30], None)),
                Err("refused".into()),
                Ok((vec![2; 30], Some(false))),
            ]),
        ];
        for reply in replies {
            let expected = format!("{reply:?}");
            let Response::Reply { head, payload } = reply.into_response() else {
                panic!("not a reply")
            };
            let back = IrisReply::from_reply(&head, payload).expect("decode");
            assert_eq!(format!("{back:?}"), expected);
        }
        // A payload on a reply that has none is malformed.
        assert!(IrisReply::from_reply(&[4, 1], vec![1]).is_err());
        assert!(IrisReply::from_reply(&[9], Vec::new()).is_err());
    }

    #[test]
    fn the_threshold_policy_crosses_the_socket_exactly() {
        for numerator in 1..=5_000u32 {
            let policy = IrisPolicy::from_numerator(numerator).expect("in range");
            let call = IrisCall::Start {
                session: [0; 16],
                probe: Vec::new(),
                policy,
            };
            match through_the_socket(call.into_request()) {
                IrisCall::Start { policy: back, .. } => assert_eq!(back, policy),
                other => panic!("decoded {other:?}"),
            }
        }
        // A threshold outside (0, 0.5] makes a malformed frame.
        let start = |numerator: u32| {
            let mut head = vec![0u8; 16];
            head.extend_from_slice(&0u32.to_le_bytes());
            head.extend_from_slice(&numerator.to_le_bytes());
            IrisCall::from_call(Call {
                modality: Modality::Iris,
                op: op::START,
                head,
                payload: Cow::Owned(Vec::new()),
            })
        };
        assert!(start(3_450).is_ok());
        assert!(start(0).is_err());
        assert!(start(5_001).is_err());
    }
}
