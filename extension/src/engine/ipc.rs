//! The local protocol between a backend (a SQL call) and the party engine worker, over the
//! Unix socket [`SOCKET_NAME`] in the data directory. Both ends are the same party's
//! processes (and the same library build); the bytes never leave the machine. One request
//! and one response per connection. Pure Rust: no Postgres call, unit-tested.
//!
//! Frame: the u32 little-endian lengths of the head and of the payload, then the head, then the
//! payload. Head: a tag byte, then the fields in order; byte strings and text are
//! u32-length-prefixed, integers little-endian. The payload is the large part of a message (a
//! round message, key chunks), empty for the others; the head repeats its length. Head and
//! payload are read into buffers of their own, so a payload of tens of MB is handed on
//! without being moved.
//!
//! Modality-neutral: a request is the engine's status or a [`Call`] — a [`Modality`], an
//! operation of that modality and its head and payload, whose layouts the modality's own file
//! defines (`super::iris`, `super::face`); an answer is a [`Response::Reply`] in the same
//! shape, the status, or an error. A new modality is a new [`Modality`] value and its own file.
//!
//! Imports: nothing of the crate, no modality.

use std::borrow::Cow;
use std::io::{self, Read, Write};

/// The engine's socket, relative to the data directory (every server process runs there).
pub const SOCKET_NAME: &str = "privmatch_engine.sock";

/// Largest frame accepted (a round message for millions of comparisons stays far below).
pub const MAX_FRAME: usize = 1 << 30;

/// The modality a [`Call`] is for: which service of the engine runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Modality {
    /// The iris search service (`super::iris`).
    Iris = 1,
    /// The face session service (`super::face`).
    Face = 2,
}

impl Modality {
    pub(crate) fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Modality::Iris),
            2 => Some(Modality::Face),
            _ => None,
        }
    }
}

/// One operation of one modality: the modality's file encodes and decodes `head` and
/// `payload`. Payloads are borrowed on the backend side and owned on the engine side, so the
/// large part is never copied to build a frame.
#[derive(Debug)]
pub struct Call<'a> {
    /// The service.
    pub modality: Modality,
    /// The operation, in the modality's own numbering.
    pub op: u8,
    /// Small fields.
    pub head: Vec<u8>,
    /// The large part (a round message, key chunks), sent without a copy.
    pub payload: Cow<'a, [u8]>,
}

/// What a backend asks the engine.
#[derive(Debug)]
pub enum Request<'a> {
    /// `engine_status`.
    Status,
    /// A modality's operation.
    Call(Call<'a>),
}

/// Error classes, mapped to SQLSTATEs by the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// 22023 invalid_parameter_value.
    BadParameter = 1,
    /// 42704 undefined_object: the session is not running.
    UnknownSession = 2,
    /// 08P01 protocol_violation: a refused round message.
    Protocol = 3,
    /// 55000 object_not_in_prerequisite_state.
    NotReady = 4,
    /// XX000 internal_error.
    Internal = 5,
    /// 22P03 invalid_binary_representation: the probe could not be opened.
    Probe = 6,
    /// 53400 configuration_limit_exceeded: as many searches as allowed are running.
    Busy = 7,
    /// 40001 serialization_failure: the two evaluators differ for a moment; retry.
    Retry = 8,
    /// 22023 invalid_parameter_value: the probe was sealed for another party or to keys that
    /// are not this party's (not altered: that is [`ErrorKind::Probe`]).
    OtherParty = 9,
}

/// A refused request: its class and a message without secrets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineError {
    /// The class, which the backend maps to a SQLSTATE.
    pub kind: ErrorKind,
    /// The message the backend raises.
    pub message: String,
}

impl EngineError {
    /// An error of class `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        EngineError {
            kind,
            message: message.into(),
        }
    }

    /// An internal error (XX000).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

impl ErrorKind {
    pub(crate) fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => ErrorKind::BadParameter,
            2 => ErrorKind::UnknownSession,
            3 => ErrorKind::Protocol,
            4 => ErrorKind::NotReady,
            5 => ErrorKind::Internal,
            6 => ErrorKind::Probe,
            7 => ErrorKind::Busy,
            8 => ErrorKind::Retry,
            9 => ErrorKind::OtherParty,
            _ => return None,
        })
    }
}

/// The engine's figures for `engine_status()`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStatus {
    /// `ready`, or why not.
    pub state: String,
    /// Templates held.
    pub templates: u64,
    /// Bytes of shares held.
    pub share_bytes: u64,
    /// Resident memory of the engine process.
    pub resident_bytes: u64,
    /// Of `resident_bytes`, the pages of PostgreSQL's shared memory (its shared buffers,
    /// touched when the engine reads the tables) mapped into the process: the server's, not
    /// the engine's own allocation.
    pub resident_shared_bytes: u64,
    /// Running searches.
    pub sessions: u32,
    /// The scan backend: a GPU description or the CPU kernel, followed by why the CPU scans
    /// when a GPU was allowed, required or failed (one text, so the SQL signature stays).
    pub kernel: String,
    /// Scan threads, or GPUs.
    pub threads: u32,
}

/// What the engine answers.
#[derive(Debug)]
pub enum Response {
    /// A modality's answer to a [`Call`]: the modality's file gives `head` and `payload`
    /// their meaning.
    Reply {
        /// Small fields.
        head: Vec<u8>,
        /// The large part (a round message), sent without a copy.
        payload: Vec<u8>,
    },
    /// Reply to [`Request::Status`].
    Status(EngineStatus),
    /// The request was refused.
    Error(EngineError),
}

/// Builds a head: fields in order, integers little-endian, byte strings length-prefixed.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// Appends a byte.
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    /// Appends a u32.
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u64.
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends bytes of a fixed length (no prefix).
    pub fn fixed(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    /// Appends a u32-length-prefixed byte string.
    pub fn bytes(self, v: &[u8]) -> Self {
        self.u32(v.len() as u32).fixed(v)
    }
}

/// Reads a head written by [`Writer`]; every short read is a malformed frame.
pub struct Reader<'a>(pub &'a [u8]);

/// The error of a frame that does not follow its layout.
pub fn malformed() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed engine frame")
}

impl<'a> Reader<'a> {
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(malformed());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// A byte.
    pub fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    /// A u32.
    pub fn u32(&mut self) -> io::Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A u64.
    pub fn u64(&mut self) -> io::Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    /// `N` bytes.
    pub fn array<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    /// A length-prefixed byte string.
    pub fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    /// A length-prefixed UTF-8 text.
    pub fn text(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| malformed())
    }
    /// The payload's length as the head repeats it, which must be `payload`'s.
    pub fn trailing(&mut self, payload: &[u8]) -> io::Result<()> {
        if self.u32()? as usize != payload.len() {
            return Err(malformed());
        }
        Ok(())
    }

    /// Checks that nothing is left.
    pub fn end(&self) -> io::Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(malformed())
        }
    }
}

impl Request<'_> {
    /// The frame body: a small head and the large trailing payload (if any), kept apart so
    /// that [`write_frame`] sends the payload without copying it.
    pub fn encode_parts(&self) -> (Vec<u8>, &[u8]) {
        match self {
            Request::Status => (Writer::default().u8(1).0, &[]),
            Request::Call(call) => (
                Writer::default()
                    .u8(2)
                    .u8(call.modality as u8)
                    .u8(call.op)
                    .bytes(&call.head)
                    .u32(call.payload.len() as u32)
                    .0,
                &call.payload,
            ),
        }
    }

    /// Parses a frame, taking ownership so a call's payload is handed on, not copied.
    pub fn decode(frame: Frame) -> io::Result<Request<'static>> {
        let Frame { head, payload } = frame;
        let mut r = Reader(&head);
        match r.u8()? {
            1 => {
                r.end()?;
                no_payload(&payload)?;
                Ok(Request::Status)
            }
            2 => {
                let modality = Modality::from_byte(r.u8()?).ok_or_else(malformed)?;
                let op = r.u8()?;
                let head = r.bytes()?;
                r.trailing(&payload)?;
                r.end()?;
                Ok(Request::Call(Call {
                    modality,
                    op,
                    head,
                    payload: Cow::Owned(payload),
                }))
            }
            _ => Err(malformed()),
        }
    }
}

impl Response {
    /// The frame body as a small head and the large trailing payload (if any), see
    /// [`Request::encode_parts`].
    pub fn encode_parts(&self) -> (Vec<u8>, &[u8]) {
        match self {
            Response::Reply { head, payload } => (
                Writer::default()
                    .u8(1)
                    .bytes(head)
                    .u32(payload.len() as u32)
                    .0,
                payload,
            ),
            Response::Status(s) => (
                Writer::default()
                    .u8(2)
                    .bytes(s.state.as_bytes())
                    .u64(s.templates)
                    .u64(s.share_bytes)
                    .u64(s.resident_bytes)
                    .u64(s.resident_shared_bytes)
                    .u32(s.sessions)
                    .bytes(s.kernel.as_bytes())
                    .u32(s.threads)
                    .0,
                &[],
            ),
            Response::Error(err) => (
                Writer::default()
                    .u8(3)
                    .u8(err.kind as u8)
                    .bytes(err.message.as_bytes())
                    .0,
                &[],
            ),
        }
    }

    /// Parses a frame, taking ownership so a reply's payload is handed on, not copied.
    pub fn decode(frame: Frame) -> io::Result<Self> {
        let Frame { head, payload } = frame;
        let mut r = Reader(&head);
        let resp = match r.u8()? {
            1 => {
                let head = r.bytes()?;
                r.trailing(&payload)?;
                r.end()?;
                return Ok(Response::Reply { head, payload });
            }
            2 => Response::Status(EngineStatus {
                state: r.text()?,
                templates: r.u64()?,
                share_bytes: r.u64()?,
                resident_bytes: r.u64()?,
                resident_shared_bytes: r.u64()?,
                sessions: r.u32()?,
                kernel: r.text()?,
                threads: r.u32()?,
            }),
            3 => {
                let kind = ErrorKind::from_byte(r.u8()?).ok_or_else(malformed)?;
                Response::Error(EngineError::new(kind, r.text()?))
            }
            _ => return Err(malformed()),
        };
        r.end()?;
        no_payload(&payload)?;
        Ok(resp)
    }
}

/// A frame as read: its head and its payload, each in a buffer of its own.
#[derive(Debug)]
pub struct Frame {
    /// Tag and small fields.
    pub head: Vec<u8>,
    /// The large trailing part (empty for most messages).
    pub payload: Vec<u8>,
}

/// Refuses a payload on a message that has none.
fn no_payload(payload: &[u8]) -> io::Result<()> {
    if payload.is_empty() {
        Ok(())
    } else {
        Err(malformed())
    }
}

/// Writes one frame: the two lengths, `head`, then `payload` (no copy of the payload).
pub fn write_frame(w: &mut impl Write, head: &[u8], payload: &[u8]) -> io::Result<()> {
    if head.len() + payload.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "engine frame too large",
        ));
    }
    w.write_all(&(head.len() as u32).to_le_bytes())?;
    w.write_all(&(payload.len() as u32).to_le_bytes())?;
    w.write_all(head)?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one frame. The payload is read into uninitialised capacity (no pass to zero tens of
/// MB that the read overwrites at once).
pub fn read_frame(r: &mut impl Read) -> io::Result<Frame> {
    let mut lengths = [0u8; 8];
    r.read_exact(&mut lengths)?;
    let head_len = u32::from_le_bytes([lengths[0], lengths[1], lengths[2], lengths[3]]) as usize;
    let payload_len = u32::from_le_bytes([lengths[4], lengths[5], lengths[6], lengths[7]]) as usize;
    if head_len + payload_len > MAX_FRAME {
        return Err(malformed());
    }
    let mut head = vec![0u8; head_len];
    r.read_exact(&mut head)?;
    let mut payload = Vec::with_capacity(payload_len);
    r.take(payload_len as u64).read_to_end(&mut payload)?;
    if payload.len() != payload_len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "engine frame cut short",
        ));
    }
    Ok(Frame { head, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_body(head: Vec<u8>, payload: &[u8]) -> Frame {
        let mut framed = Vec::new();
        write_frame(&mut framed, &head, payload).unwrap();
        read_frame(&mut framed.as_slice()).unwrap()
    }

    #[test]
    fn requests_and_responses_round_trip() {
        let requests = [
            Request::Status,
            Request::Call(Call {
                modality: Modality::Iris,
                op: 2,
                head: vec![4; 20],
                payload: Cow::Borrowed(&[9u8, 8, 7][..]),
            }),
            Request::Call(Call {
                modality: Modality::Face,
                op: 1,
                head: Vec::new(),
                payload: Cow::Borrowed(&[][..]),
            }),
        ];
        for req in &requests {
            let (head, payload) = req.encode_parts();
            let back = Request::decode(frame_body(head, payload)).unwrap();
            assert_eq!(format!("{back:?}"), format!("{req:?}"));
        }
        let responses = [
            Response::Reply {
                head: vec![1; 40],
                payload: vec![5; 100],
            },
            Response::Reply {
                head: Vec::new(),
                payload: Vec::new(),
            },
            Response::Status(EngineStatus {
                state: "ready".into(),
                templates: 3,
                kernel: "avx2".into(),
                ..EngineStatus::default()
            }),
            Response::Error(EngineError::new(ErrorKind::Protocol, "no")),
            Response::Error(EngineError::new(ErrorKind::OtherParty, "keys")),
        ];
        for resp in &responses {
            let (head, payload) = resp.encode_parts();
            let back = Response::decode(frame_body(head, payload)).unwrap();
            assert_eq!(format!("{back:?}"), format!("{resp:?}"));
        }
        let frame = |head: Vec<u8>, payload: Vec<u8>| Frame { head, payload };
        assert!(Request::decode(frame(vec![9], vec![])).is_err());
        // An unknown modality is malformed.
        assert!(Request::decode(frame(vec![2, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0], vec![])).is_err());
        assert!(Request::decode(frame(vec![2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0], vec![])).is_ok());
        // A payload whose length is not the one the head gives is refused, and so is a
        // payload on a message that has none.
        assert!(Response::decode(frame(vec![1, 0, 0, 0, 0, 5, 0, 0, 0], vec![1])).is_err());
        assert!(Response::decode(frame(vec![1, 0, 0, 0, 0, 1, 0, 0, 0], vec![1])).is_ok());
        assert!(Request::decode(frame(vec![1], vec![1])).is_err());
        // A frame cut short is an error, not a short payload.
        let mut framed = Vec::new();
        write_frame(&mut framed, &[1, 0, 0, 0, 0, 3, 0, 0, 0], &[7, 7, 7]).unwrap();
        framed.pop();
        assert!(read_frame(&mut framed.as_slice()).is_err());
    }
}
