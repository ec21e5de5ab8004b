//! What a backend and the face service exchange: each face step travels as a [`Call`] of
//! [`Modality::Face`] in the modality-neutral frame (`super::super::ipc`), its answer as a
//! [`Response::Reply`] payload. The layouts are the `encode_*`/`decode_*` pairs below; the
//! requests' contents are core's ([`OpenRequest`], [`Opened`]).
//!
//! Imports: [`super::super::ipc`] and core's `face`.

use std::borrow::Cow;
use std::io;

use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::face::encoding::EmbeddingShare;
use privmatch_core::face::funshade::{bytes_to_words, words_to_bytes};
use privmatch_core::face::service::{BundleId, OpenRequest, Opened};

use crate::engine::ipc::{
    malformed, Call, EngineError, Modality, Reader, Request, Response, Writer,
};

/// The operations of the face service ([`Modality::Face`]).
pub mod op {
    /// Open a session: fix the probe share and the compared list.
    pub const OPEN: u8 = 1;
    /// The dealer's key chunks; answers the sealed masked probe vector.
    pub const KEYS: u8 = 2;
    /// Round 2 (peer's masked probe vector) or 3 (peer's distance shares).
    pub const ROUND: u8 = 3;
    /// A dealing made ahead of time: P2's key chunks under a stock id, kept for a later open.
    pub const STOCK: u8 = 4;
    /// A verification's keys and round 2 in one request (its masked vectors went out with the
    /// opens, so nothing needs to leave between the two).
    pub const KEYED_ROUND: u8 = 5;
    /// End a session: its keys and probe are dropped (answered on the worker's main thread).
    pub const ABORT: u8 = 6;
}

/// The engine's error for a face request that does not follow its layout.
pub fn malformed_request(_: io::Error) -> EngineError {
    EngineError::internal("malformed face request")
}

/// The engine request of face operation `op`.
fn face_request<'a>(op: u8, head: Vec<u8>, payload: Cow<'a, [u8]>) -> Request<'a> {
    Request::Call(Call {
        modality: Modality::Face,
        op,
        head,
        payload,
    })
}

/// The engine response carrying a face step's answer (the face replies have no head).
pub fn face_reply(payload: Vec<u8>) -> Response {
    Response::Reply {
        head: Vec::new(),
        payload,
    }
}

/// The request that aborts face session `session` at this party's engine.
pub fn encode_abort(session: &[u8; 16]) -> Request<'static> {
    face_request(op::ABORT, session.to_vec(), Cow::Borrowed(&[][..]))
}

/// The answer to an abort: whether the session was running (one byte).
pub fn aborted_reply(aborted: bool) -> Response {
    face_reply(vec![u8::from(aborted)])
}

/// Reads an abort's session id (the engine side).
pub fn decode_abort(head: &[u8]) -> io::Result<[u8; 16]> {
    let mut r = Reader(head);
    let session = r.array()?;
    r.end()?;
    Ok(session)
}

/// Appends a u32-counted list of bundle ids.
fn put_ids(w: Writer, ids: &[BundleId]) -> Writer {
    ids.iter()
        .fold(w.u32(ids.len() as u32), |w, id| w.fixed(id))
}

/// Reads a list written by [`put_ids`].
fn read_ids(r: &mut Reader<'_>) -> io::Result<Vec<BundleId>> {
    let n = r.u32()? as usize;
    (0..n).map(|_| r.array()).collect()
}

/// Appends an optional fixed-size field: a presence byte, then the bytes.
fn put_optional(w: Writer, v: Option<&[u8]>) -> Writer {
    match v {
        Some(bytes) => w.u8(1).fixed(bytes),
        None => w.u8(0),
    }
}

/// Reads a field written by [`put_optional`].
fn read_optional<const N: usize>(r: &mut Reader<'_>) -> io::Result<Option<[u8; N]>> {
    match r.u8()? {
        0 => Ok(None),
        _ => r.array().map(Some),
    }
}

/// The request of an open.
pub fn encode_open(req: &OpenRequest) -> Request<'static> {
    let head = Writer(Vec::with_capacity(52 + 4 * req.probe.elements.len()))
        .fixed(&req.session)
        .fixed(req.reply_key.as_bytes())
        .u32(req.probe.norm)
        .fixed(&words_to_bytes(&req.probe.elements));
    let list = match &req.wanted {
        Some(ids) => put_ids(Writer::default().u8(1), ids),
        None => Writer::default().u8(0),
    };
    let list = put_optional(list, req.stock.as_ref().map(|s| &s[..]));
    let list = put_optional(list, req.known.as_ref().map(|k| &k[..]));
    let list = put_optional(list, req.known_subjects.as_ref().map(|k| &k[..]));
    let list = list.u8(u8::from(req.verification));
    face_request(op::OPEN, head.0, list.0.into())
}

/// Reads an open (the engine side).
pub fn decode_open(head: &[u8], payload: &[u8]) -> io::Result<OpenRequest> {
    let mut h = Reader(head);
    let session = h.array()?;
    let reply_key = PartyPublicKey::from_bytes(h.array()?);
    let norm = h.u32()?;
    let elements = bytes_to_words(h.0).map_err(|_| malformed())?;
    let mut p = Reader(payload);
    let wanted = match p.u8()? {
        0 => None,
        _ => Some(read_ids(&mut p)?),
    };
    let stock = read_optional(&mut p)?;
    let known = read_optional(&mut p)?;
    let known_subjects = read_optional(&mut p)?;
    let verification = p.u8()? != 0;
    p.end()?;
    Ok(OpenRequest {
        session,
        probe: EmbeddingShare { elements, norm },
        reply_key,
        wanted,
        stock,
        known,
        verification,
        known_subjects,
    })
}

/// The answer of an open.
pub fn encode_opened(opened: &Opened) -> Vec<u8> {
    let w = Writer(Vec::with_capacity(
        45 + opened.ids.len() * 16 + opened.masked_probe.len(),
    ))
    .fixed(&opened.digest)
    .u8(u8::from(opened.claimed))
    .u32(opened.comparisons);
    put_ids(w, &opened.ids).bytes(&opened.masked_probe).0
}

/// Parses the answer of an open.
pub fn decode_opened(body: &[u8]) -> io::Result<Opened> {
    let mut r = Reader(body);
    let digest = r.array()?;
    let claimed = r.u8()? != 0;
    let comparisons = r.u32()?;
    let ids = read_ids(&mut r)?;
    if !ids.is_empty() && ids.len() != comparisons as usize {
        return Err(malformed());
    }
    let masked_probe = r.bytes()?;
    r.end()?;
    Ok(Opened {
        comparisons,
        ids,
        digest,
        claimed,
        masked_probe,
    })
}

/// The request carrying P2's sealed key chunks of session `session` (none: the session uses
/// the stocked dealing its open claimed).
pub fn encode_keys<'a>(session: &[u8; 16], chunks: &[&[u8]]) -> Request<'a> {
    encode_chunks(op::KEYS, session, chunks)
}

/// The request stocking P2's sealed key chunks dealt under stock id `stock`.
pub fn encode_stock<'a>(stock: &[u8; 16], chunks: &[&[u8]]) -> Request<'a> {
    encode_chunks(op::STOCK, stock, chunks)
}

fn encode_chunks<'a>(op: u8, session: &[u8; 16], chunks: &[&[u8]]) -> Request<'a> {
    let (head, payload) = chunk_parts(session, chunks, 0);
    face_request(op, head, payload.into())
}

/// Head (session id, chunk count, chunk lengths) and payload (the chunks, with room for
/// `extra` bytes more) of a request carrying key chunks.
fn chunk_parts(session: &[u8; 16], chunks: &[&[u8]], extra: usize) -> (Vec<u8>, Vec<u8>) {
    let head = chunks.iter().fold(
        Writer::default().fixed(session).u32(chunks.len() as u32),
        |w, chunk| w.u64(chunk.len() as u64),
    );
    let mut payload = Vec::with_capacity(chunks.iter().map(|c| c.len()).sum::<usize>() + extra);
    for chunk in chunks {
        payload.extend_from_slice(chunk);
    }
    (head.0, payload)
}

/// The session (or stock) id and chunks of a keys or stock request.
pub fn decode_keys<'a>(head: &[u8], payload: &'a [u8]) -> io::Result<([u8; 16], Vec<&'a [u8]>)> {
    let (session, chunks, rest) = decode_chunks(head, payload)?;
    Reader(rest).end()?;
    Ok((session, chunks))
}

/// A decoded request with key chunks: the session (or stock) id, the chunks, and what the
/// payload holds after them.
pub type Chunked<'a> = ([u8; 16], Vec<&'a [u8]>, &'a [u8]);

/// The session id and chunks of [`encode_chunks`], and what the payload holds after them.
pub fn decode_chunks<'a>(head: &[u8], payload: &'a [u8]) -> io::Result<Chunked<'a>> {
    let mut h = Reader(head);
    let session = h.array()?;
    let n = h.u32()? as usize;
    let mut p = Reader(payload);
    let mut chunks = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let len = usize::try_from(h.u64()?).map_err(|_| malformed())?;
        chunks.push(p.take(len)?);
    }
    h.end()?;
    Ok((session, chunks, p.0))
}

/// The request of a verification's keys step and round 2 at once: P2's key chunks, then the
/// other evaluator's message of the open (`message`).
pub fn encode_keyed_round<'a>(session: &[u8; 16], chunks: &[&[u8]], message: &[u8]) -> Request<'a> {
    let (head, mut payload) = chunk_parts(session, chunks, message.len());
    payload.extend_from_slice(message);
    face_request(op::KEYED_ROUND, head, payload.into())
}

/// The request of round 2 or 3 of session `session` with the other evaluator's message.
pub fn encode_round<'a>(session: &[u8; 16], round: u8, message: &'a [u8]) -> Request<'a> {
    let head = Writer::default().fixed(session).u8(round);
    face_request(op::ROUND, head.0, message.into())
}

/// The session id and round of a round request.
pub fn decode_round(head: &[u8]) -> io::Result<([u8; 16], u8)> {
    let mut h = Reader(head);
    let session = h.array()?;
    let round = h.u8()?;
    h.end()?;
    Ok((session, round))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(request: Request<'_>) -> (u8, Vec<u8>, Vec<u8>) {
        let Request::Call(Call {
            modality,
            op,
            head,
            payload,
        }) = request
        else {
            panic!("not a call");
        };
        assert_eq!(modality, Modality::Face);
        (op, head, payload.into_owned())
    }

    #[test]
    fn opens_round_trip_with_and_without_their_options() {
        let req = OpenRequest {
            session: [7; 16],
            probe: EmbeddingShare {
                elements: vec![1, 2, 3, u32::MAX],
                norm: 9,
            },
            reply_key: PartyPublicKey::from_bytes([5; 32]),
            wanted: Some(vec![[1; 16], [2; 16]]),
            stock: Some([8; 16]),
            known: Some([9; 32]),
            verification: true,
            known_subjects: Some([6; 32]),
        };
        let (op, head, payload) = parts(encode_open(&req));
        assert_eq!(op, op::OPEN);
        let back = decode_open(&head, &payload).unwrap();
        assert_eq!(back.session, req.session);
        assert_eq!(back.probe.elements, req.probe.elements);
        assert_eq!(back.probe.norm, 9);
        assert_eq!(back.reply_key, req.reply_key);
        assert_eq!(back.wanted, req.wanted);
        assert_eq!(back.stock, req.stock);
        assert_eq!(back.known, req.known);
        assert_eq!(back.known_subjects, req.known_subjects);
        assert!(back.verification);
        assert!(decode_open(&head, &payload[..payload.len() - 1]).is_err());
        let plain = OpenRequest {
            wanted: None,
            stock: None,
            known: None,
            verification: false,
            known_subjects: None,
            ..req
        };
        let (_, head, payload) = parts(encode_open(&plain));
        let back = decode_open(&head, &payload).unwrap();
        assert_eq!((back.wanted, back.stock, back.known), (None, None, None));
        assert_eq!(back.known_subjects, None);
        assert!(!back.verification);
    }

    #[test]
    fn open_answers_round_trip_and_a_wrong_count_is_malformed() {
        let opened = Opened {
            comparisons: 1,
            ids: vec![[3; 16]],
            digest: [4; 32],
            claimed: true,
            masked_probe: vec![9; 70],
        };
        let mut cut = encode_opened(&opened);
        let back = decode_opened(&cut).unwrap();
        assert_eq!(
            (back.comparisons, back.ids, back.digest, back.claimed),
            (1, opened.ids, opened.digest, true)
        );
        assert_eq!(back.masked_probe, opened.masked_probe);
        cut.pop();
        assert!(decode_opened(&cut).is_err());
        // A known list: the count without the ids.
        let unlisted = Opened {
            comparisons: 5,
            ids: Vec::new(),
            digest: [4; 32],
            claimed: false,
            masked_probe: Vec::new(),
        };
        let back = decode_opened(&encode_opened(&unlisted)).unwrap();
        assert_eq!((back.comparisons, back.ids.len()), (5, 0));
        let wrong = Opened {
            comparisons: 2,
            ..unlisted
        };
        let wrong = Opened {
            ids: vec![[3; 16]],
            ..wrong
        };
        assert!(decode_opened(&encode_opened(&wrong)).is_err());
    }

    #[test]
    fn keys_stock_rounds_and_aborts_round_trip() {
        let chunks: [&[u8]; 2] = [b"abc", b"de"];
        let (op, head, payload) = parts(encode_keys(&[5; 16], &chunks));
        assert_eq!(op, op::KEYS);
        let (session, got) = decode_keys(&head, &payload).unwrap();
        assert_eq!(session, [5; 16]);
        assert_eq!(got, chunks.to_vec());
        assert!(decode_keys(&head, &payload[..4]).is_err());
        let (op, head, payload) = parts(encode_stock(&[6; 16], &[]));
        assert_eq!(op, op::STOCK);
        let (stock, got) = decode_keys(&head, &payload).unwrap();
        assert_eq!((stock, got.len()), ([6; 16], 0));
        let (op, head, payload) = parts(encode_keyed_round(&[4; 16], &chunks, b"msg"));
        assert_eq!(op, op::KEYED_ROUND);
        let (session, got, rest) = decode_chunks(&head, &payload).unwrap();
        assert_eq!(
            (session, got, rest),
            ([4; 16], chunks.to_vec(), &b"msg"[..])
        );
        let (op, head, payload) = parts(encode_round(&[3; 16], 2, b"x"));
        assert_eq!((op, payload), (op::ROUND, b"x".to_vec()));
        assert_eq!(decode_round(&head).unwrap(), ([3; 16], 2));
        let (op, head, _) = parts(encode_abort(&[7; 16]));
        assert_eq!(op, op::ABORT);
        assert_eq!(decode_abort(&head).unwrap(), [7; 16]);
        assert!(decode_abort(&head[1..]).is_err());
    }
}
