//! Valid inputs for every target: the seed corpus in `fuzz/corpus/` (written and checked by
//! `fuzzing::tests`). The decoders' seeds are here, the state machines' in [`programs`].

mod programs;

use crate::conn::encode_private_data;
use crate::fabric::{Endpoint, ProviderKind, RemoteRegion, WcStatus};
use crate::remote::{ClientHello, Layout, PoolDescriptor};
use crate::soft::addr::SoftAddress;
use crate::soft::proto::handshake::{encode_hello_ack, Challenge, Hello, HelloStatus};
use crate::soft::proto::wire::{ReqOp, Request, Response};
use std::time::Duration;

fn with_mode(mode: u8, bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![mode];
    v.extend_from_slice(bytes);
    v
}

fn request(op: ReqOp, len: u32, imm: Option<u32>) -> Request {
    Request {
        op,
        seq: 7,
        remote_addr: 0x7f00_0000_1000,
        rkey: 0x1234,
        len,
        compare_add: 1,
        swap: 2,
        imm,
    }
}

fn soft_wire() -> Vec<(&'static str, Vec<u8>)> {
    let frames: Vec<Vec<u8>> = vec![
        request(ReqOp::Write, 64, Some(9)).encode().to_vec(),
        request(ReqOp::Send, 16, None).encode().to_vec(),
        request(ReqOp::Read, 4096, None).encode().to_vec(),
        request(ReqOp::CompareSwap, 8, None).encode().to_vec(),
        request(ReqOp::FetchAdd, 8, None).encode().to_vec(),
        request(ReqOp::Map, 0, None).encode().to_vec(),
    ];
    let responses = [
        Response::Ack { seq: 1 },
        Response::ReadData { seq: 2, len: 64 },
        Response::Atomic { seq: 3, old: 99 },
        Response::Nak {
            seq: 4,
            status: WcStatus::RemAccessErr,
        },
        Response::Map {
            seq: 5,
            mappable: true,
        },
    ];
    let hello = Hello::answer(&Challenge { nonce: [7; 16] }, 1, 2, &[0; 16], None);
    vec![
        ("requests", with_mode(0, &frames.concat())),
        ("write-small-max", with_mode(2, &frames[0])),
        (
            "responses",
            with_mode(0, &responses.map(|r| r.encode().to_vec()).concat()),
        ),
        ("hello", with_mode(0, &hello.encode())),
        (
            "hello-acks",
            with_mode(
                0,
                &[
                    HelloStatus::Ok,
                    HelloStatus::NoSuchQp,
                    HelloStatus::QpInError,
                    HelloStatus::AuthFailed,
                    HelloStatus::PeerNotAllowed,
                    HelloStatus::AlreadyConnected,
                ]
                .map(|s| encode_hello_ack(s).to_vec())
                .concat(),
            ),
        ),
    ]
}

fn soft_endpoint() -> Endpoint {
    let address = SoftAddress {
        host_id: [7; 16],
        token: [9; 16],
        tcp: "127.0.0.1:4791".parse().unwrap(),
        local: "@rdmapool-1-0011223344556677".into(),
    };
    Endpoint {
        provider: ProviderKind::Soft,
        qpn: 5,
        address: address.encode(),
    }
}

fn region() -> RemoteRegion {
    RemoteRegion {
        addr: 0x7f00_0000_1000,
        len: 4096,
        rkey: 0x1234,
    }
}

fn pool_descriptor() -> PoolDescriptor {
    PoolDescriptor {
        node: 3,
        region: RemoteRegion {
            addr: 0x7f00_0000_0000,
            len: 64 << 20,
            rkey: 0x99,
        },
        layout: Layout::new(64 << 20, 2 << 20, 64).unwrap(),
        lease: Duration::from_secs(2),
        incarnation: 0x5eed_0000_0000_0001,
        isolated: false,
    }
}

fn padded(data: &[u8], to: usize) -> Vec<u8> {
    let mut v = encode_private_data(data).unwrap();
    v.resize(to, 0);
    v
}

fn handshake() -> Vec<(&'static str, Vec<u8>)> {
    let hello = Hello::answer(&Challenge { nonce: [7; 16] }, 1, 2, &[0; 16], None).encode();
    let ack = encode_hello_ack(HelloStatus::Ok);
    vec![
        ("soft-hello", with_mode(1, &[&hello[..], &ack[..]].concat())),
        (
            "private-region",
            with_mode(0, &padded(&region().to_bytes(), 56)),
        ),
        ("private-text", with_mode(0, &padded(b"hello", 148))),
        (
            "private-descriptor",
            with_mode(0, &padded(&pool_descriptor().encode(), 196)),
        ),
        (
            "private-client",
            with_mode(
                0,
                &padded(
                    &ClientHello {
                        client_id: 42,
                        nonce: [9; 16],
                    }
                    .encode(),
                    56,
                ),
            ),
        ),
        ("endpoint", with_mode(0, &soft_endpoint().to_bytes())),
        (
            "endpoint-hex",
            with_mode(0, soft_endpoint().to_hex().as_bytes()),
        ),
        ("region", with_mode(0, &region().to_bytes())),
    ]
}

fn descriptors() -> Vec<(&'static str, Vec<u8>)> {
    let d = pool_descriptor().encode();
    vec![
        ("descriptor", with_mode(1, &d)),
        ("descriptor-fixed-magic", with_mode(0, &d)),
        (
            "client",
            with_mode(
                1,
                &ClientHello {
                    client_id: 42,
                    nonce: [9; 16],
                }
                .encode(),
            ),
        ),
        (
            "client-proven",
            with_mode(
                1,
                &ClientHello {
                    client_id: 42,
                    nonce: [9; 16],
                }
                .encode_proven(
                    &crate::remote::client_key(
                        &crate::fabric::PreSharedKey::new(&[3; 32]).expect("a key"),
                        42,
                    ),
                    1_800_000_000,
                ),
            ),
        ),
        ("pointer", with_mode(2, b"3:0x100000:64")),
        (
            "pointer-incarnation",
            with_mode(2, b"3:1048576:64:0x5eed000000000001"),
        ),
    ]
}

/// Takeover programs: a free slot; a restart whose old heartbeat stands still; a live
/// holder whose heartbeat moves; a full pool.
fn pool_lease() -> Vec<(&'static str, Vec<u8>)> {
    // lease 100 ms (u16 90), 1 + `n` slots, start 0; then per step a choice byte (0 free,
    // 1 the id, 2 another id, 3 the usual value), a heartbeat read first takes a delay.
    // The owner words come first, one choice byte per slot (0 free, 1 the id, 2 another).
    let head = |n: u8| vec![90, 0, n, 0];
    let mut free = head(0);
    free.push(0); // no slot holds the id
    free.extend([0, 3]); // claim finds 0; the renewal finds the usual (0)
    let mut restart = head(0);
    restart.push(1); // the slot holds the id
    restart.push(1); // claim finds the id
    restart.extend([20, 3, 20, 3, 20, 3]); // three reads over 50 ms: it stands still
    restart.push(3); // the renewal finds the watched value
    let mut live = head(0);
    live.push(1); // the slot holds the id
    live.extend([1, 5, 3, 5, 2, 1]); // claim: id; beat; beat moved (78); owner: the id
    let mut full = head(2);
    full.extend([2, 2, 2]); // three slots, all another id's
    full.extend([2, 2, 2]);
    vec![
        ("free-slot", free),
        ("restart", restart),
        ("live-holder", live),
        ("full", full),
    ]
}

/// Chunk programs: a fresh node; a restart that finds its full chunks; headers and tables
/// of a hostile server; a server whose answers lie.
fn pool_chunks() -> Vec<(&'static str, Vec<u8>)> {
    // Chunks (1 + n), slots (1 + n), then per chunk: table entry, magic, owner, class pick,
    // size, count, bitmap words (each a choice byte: 0 zero, 1 the id, 3 the usual value,
    // 5 then eight bytes of any value); then lies (every n-th answer), then operations:
    // 0 size-pick = allocate, 1 1 = free one held, 2 = recover again.
    let ops = [0, 0, 0, 1, 0, 3, 0, 5, 1, 1, 0, 0, 2, 0, 2, 1, 1];
    let mut fresh = vec![6, 3];
    fresh.extend([0u8; 7].repeat(7));
    fresh.push(0);
    fresh.extend(ops);
    let mut restart = vec![1, 3];
    restart.extend([1, 3, 1, 1, 3, 3, 2, 3, 3]); // ours, 64-byte class, two full words
    restart.extend([1, 3, 1, 3, 3, 3, 0]); // ours, 4 KiB class, empty
    restart.push(0);
    restart.extend(ops);
    let mut hostile = vec![3, 0];
    for v in [0xdead_beef_u64, 1 << 40, 96, u64::MAX] {
        hostile.extend([1, 3, 1, 0, 5]);
        hostile.extend(v.to_le_bytes());
        hostile.extend([5]);
        hostile.extend(v.to_le_bytes());
        hostile.push(1);
        hostile.push(5);
        hostile.extend(u64::MAX.to_le_bytes());
    }
    hostile.push(0);
    hostile.extend(ops);
    let mut liar = fresh.clone();
    let at = 2 + 7 * 7;
    liar[at] = 3; // every third answer lies
    vec![
        ("fresh-node", fresh),
        ("restart", restart),
        ("hostile-headers", hostile),
        ("liar", liar),
    ]
}

/// The seeds of target `name`: (file name, bytes).
pub fn seeds(name: &str) -> Vec<(&'static str, Vec<u8>)> {
    match name {
        "soft_wire" => soft_wire(),
        "soft_responder" => programs::soft_responder(),
        "soft_requester" => programs::soft_requester(),
        "handshake" => handshake(),
        "descriptors" => descriptors(),
        "pool_lease" => pool_lease(),
        "pool_chunks" => pool_chunks(),
        _ => Vec::new(),
    }
}
