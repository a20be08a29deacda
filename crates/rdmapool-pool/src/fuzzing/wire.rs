//! `soft_wire`: the soft provider's frame decoders on any bytes. A frame that decodes must
//! encode back to the same bytes (docs/PROTOCOL.md: every reserved byte is checked; the one
//! ignored field, a request's `imm` without `has_imm`, is compared as zero).

use super::input::Input;
use crate::soft::proto::handshake::{
    decode_hello_ack, encode_hello_ack, Challenge, Hello, CHALLENGE_LEN, HELLO_ACK_LEN, HELLO_LEN,
    TOKEN_LEN,
};
use crate::soft::proto::wire::{ReqOp, Request, Response, REQ_LEN, RESP_LEN};
use crate::soft::MAX_MSG;

/// Runs every decoder over the input, cut in frames of each one's length.
pub(super) fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let max_msg = match input.u8() % 4 {
        0 => MAX_MSG,
        1 => 0,
        2 => 4096,
        _ => input.u32(),
    };
    let rest = input.bytes(usize::MAX);
    for b in rest.chunks_exact(REQ_LEN) {
        request(b.try_into().unwrap(), max_msg);
    }
    for b in rest.chunks_exact(RESP_LEN) {
        response(b.try_into().unwrap(), max_msg);
    }
    for b in rest.chunks_exact(CHALLENGE_LEN) {
        challenge(b.try_into().unwrap());
    }
    for b in rest.chunks_exact(HELLO_LEN) {
        hello(b.try_into().unwrap());
    }
    for b in rest.chunks_exact(HELLO_ACK_LEN) {
        hello_ack(b.try_into().unwrap());
    }
}

/// A request header: decoded, its length within `max_msg`, re-encoded to the same bytes.
pub(super) fn request(b: &[u8; REQ_LEN], max_msg: u32) -> Option<Request> {
    let r = Request::decode(b, max_msg).ok()?;
    assert!(r.len <= max_msg, "{r:?} passed a {max_msg}-byte maximum");
    assert!(r.payload_len() <= r.len);
    if matches!(r.op, ReqOp::CompareSwap | ReqOp::FetchAdd) {
        assert_eq!(r.len, 8, "atomic of another length: {r:?}");
    }
    let mut expect = *b;
    if r.imm.is_none() {
        expect[48..52].fill(0); // ignored without has_imm
    }
    assert_eq!(r.encode(), expect, "{r:?} re-encodes differently");
    assert_eq!(Request::decode(&r.encode(), max_msg).ok(), Some(r));
    Some(r)
}

/// A response header: decoded and re-encoded to exactly the same bytes.
pub(super) fn response(b: &[u8; RESP_LEN], max_msg: u32) -> Option<Response> {
    let r = Response::decode(b, max_msg).ok()?;
    if let Response::ReadData { len, .. } = r {
        assert!(len <= max_msg, "{r:?} passed a {max_msg}-byte maximum");
    }
    assert_eq!(&r.encode(), b, "{r:?} re-encodes differently");
    Some(r)
}

/// The responder's challenge (the first frame of a data connection).
pub(super) fn challenge(b: &[u8; CHALLENGE_LEN]) {
    if let Ok(c) = Challenge::decode(b) {
        assert_eq!(&c.encode(), b, "{c:?} re-encodes differently");
    }
}

/// The soft hello (the requester's answer to the challenge), and its MAC check: a decoded
/// hello verifies only against the token and nonce it was made with.
pub(super) fn hello(b: &[u8; HELLO_LEN]) {
    if let Ok(h) = Hello::decode(b) {
        assert_eq!(&h.encode(), b, "{h:?} re-encodes differently");
        let ch = Challenge { nonce: [0; 16] };
        let token = [0u8; TOKEN_LEN];
        let genuine = Hello::answer(&ch, h.src_qpn, h.dst_qpn, &token, None);
        assert_eq!(h.verify(&ch, &token, None), h == genuine, "{h:?}");
    }
}

/// The responder's answer to a hello.
pub(super) fn hello_ack(b: &[u8; HELLO_ACK_LEN]) {
    if let Ok(s) = decode_hello_ack(b) {
        assert_eq!(&encode_hello_ack(s), b, "{s:?} re-encodes differently");
    }
}
