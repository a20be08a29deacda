//! `handshake`: what two sides exchange before any data moves. The soft hello and its
//! acknowledgement, RDMA CM private data (the 0xA7 frame, and what applications put in it:
//! a region descriptor, a pool descriptor or client hello), and endpoints with the soft
//! address inside. Whatever decodes must encode back to the bytes it came from.

use super::input::Input;
use super::wire;
use crate::conn::{decode_private_data, encode_private_data, MAX_ACCEPT_PRIVATE_DATA};
use crate::fabric::{Endpoint, ProviderKind, RemoteRegion};
use crate::soft::addr::SoftAddress;
use crate::soft::proto::handshake::{HELLO_ACK_LEN, HELLO_LEN};

/// Every handshake decoder on the input.
pub(super) fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let mode = input.u8();
    let rest = input.bytes(usize::MAX);
    if mode & 1 == 1 {
        // The soft data connection's first frames: hello, then its acknowledgement.
        let mut padded = rest.to_vec();
        padded.resize(HELLO_LEN + HELLO_ACK_LEN, 0);
        wire::hello(padded[..HELLO_LEN].try_into().unwrap());
        wire::hello_ack(padded[HELLO_LEN..].try_into().unwrap());
    }
    private_data(rest);
    endpoint(rest);
    soft_address(rest);
    region(rest);
    if let Ok(s) = std::str::from_utf8(rest) {
        if let Ok(e) = Endpoint::from_hex(s) {
            assert_eq!(Endpoint::from_hex(&e.to_hex()).unwrap(), e);
        }
        if let Ok(r) = RemoteRegion::from_hex(s) {
            assert_eq!(RemoteRegion::from_hex(&r.to_hex()).unwrap(), r);
        }
    }
}

/// The private-data frame (docs/PROTOCOL.md section 3): all zeros is none; otherwise 0xA7,
/// `n`, `n` bytes, then only zero padding. The data inside goes to the descriptor decoders.
fn private_data(raw: &[u8]) {
    let Ok(data) = decode_private_data(raw) else {
        return;
    };
    if raw.iter().all(|&b| b == 0) {
        assert!(data.is_empty(), "all-zero private data decoded as {data:?}");
        return;
    }
    assert_eq!(raw[0], 0xA7, "unframed private data accepted");
    let n = raw[1] as usize;
    assert_eq!(data, &raw[2..2 + n]);
    assert!(raw[2 + n..].iter().all(|&b| b == 0), "non-zero padding");
    if data.len() <= MAX_ACCEPT_PRIVATE_DATA {
        let mut again = encode_private_data(data).unwrap();
        again.resize(raw.len(), 0);
        assert_eq!(again, raw);
    }
    region(data);
    super::descriptors::pool_descriptor(data);
    super::descriptors::client_hello(data);
}

/// An endpoint, and the soft address inside a soft one.
fn endpoint(b: &[u8]) {
    let Ok(e) = Endpoint::from_bytes(b) else {
        return;
    };
    assert!(b.len() <= Endpoint::MAX_LEN);
    assert_eq!(e.to_bytes(), b, "{e:?} re-encodes differently");
    if e.provider == ProviderKind::Soft {
        soft_address(&e.address);
    }
}

/// How a soft context is reached: host id, TCP address, local socket path.
fn soft_address(b: &[u8]) {
    if let Ok(a) = SoftAddress::decode(b) {
        assert_eq!(a.encode(), b, "{a:?} re-encodes differently");
    }
}

/// A region descriptor (docs/PROTOCOL.md section 2).
fn region(b: &[u8]) {
    if let Ok(r) = RemoteRegion::from_bytes(b) {
        assert!(r.addr.checked_add(r.len).is_some(), "{r:?} wraps");
        assert_eq!(r.to_bytes(), b, "{r:?} re-encodes differently");
    }
}
