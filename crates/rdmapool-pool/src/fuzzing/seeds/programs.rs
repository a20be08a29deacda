//! Seed programs for the state machines: each a short, valid run of one behaviour (a WRITE
//! and a READ, one-byte pieces, RNR and not-ready waits, a payload received in place, a
//! region deregistered under a payload, bad keys, timeouts, NAKs).

use crate::fuzzing::input::Program;
use crate::fuzzing::{requester_steps as rq, responder_steps as rs};

fn responder_program(steps: &[rs::Step]) -> Vec<u8> {
    let mut p = Program::default();
    steps.iter().for_each(|s| s.emit(&mut p));
    p.0
}

pub(super) fn soft_responder() -> Vec<(&'static str, Vec<u8>)> {
    use rs::{Key, Step::*};
    let f = |op, key, off, len| Frame(rs::Frame::new(op, key, off, len));
    let atomic = |op, off| {
        let mut fr = rs::Frame::new(op, Key::ReadWrite, off, 8);
        fr.atomic = (0, 5);
        Frame(fr)
    };
    let imm = |mut fr: rs::Frame| {
        fr.imm = Some(77);
        Frame(fr)
    };
    let no_payload = |mut fr: rs::Frame| {
        fr.payload = false;
        Frame(fr)
    };
    let recv = PostRecv {
        off: 0,
        len: 512,
        sges: 2,
        bad: false,
    };
    let p = responder_program;
    vec![
        (
            "write-read",
            p(&[
                f(2, Key::ReadWrite, 0, 64),
                f(3, Key::ReadWrite, 0, 64),
                Feed(0),
                Answer,
            ]),
        ),
        (
            "write-one-byte-pieces",
            p(&[f(2, Key::Window, 8, 32), Feed(1)]),
        ),
        (
            "read-only",
            p(&[
                f(3, Key::ReadOnly, 16, 100),
                f(2, Key::ReadOnly, 0, 8),
                Feed(0),
            ]),
        ),
        (
            "atomics",
            p(&[atomic(4, 0), atomic(5, 8), atomic(5, 3), Feed(0)]),
        ),
        (
            "send",
            p(&[recv.clone(), f(1, Key::ReadWrite, 0, 300), Feed(7)]),
        ),
        (
            "send-too-long",
            p(&[recv.clone(), f(1, Key::ReadWrite, 0, 600), Feed(0)]),
        ),
        (
            "rnr-wait",
            p(&[
                f(1, Key::ReadWrite, 0, 16),
                Feed(0),
                Advance(500),
                recv.clone(),
                Feed(0),
            ]),
        ),
        (
            "write-imm",
            p(&[
                recv.clone(),
                imm(rs::Frame::new(2, Key::ReadWrite, 0, 16)),
                Feed(0),
            ]),
        ),
        (
            "not-ready",
            p(&[
                State(1),
                f(2, Key::ReadWrite, 0, 8),
                Feed(0),
                Advance(100),
                State(3),
                Feed(0),
            ]),
        ),
        (
            "in-place",
            p(&[
                no_payload(rs::Frame::new(2, Key::ReadWrite, 0, 200)),
                Feed(0),
                Raw(vec![9; 200]),
                Receive {
                    n: 150,
                    fail: false,
                },
                Feed(0),
            ]),
        ),
        (
            "deregistered-mid-payload",
            p(&[
                no_payload(rs::Frame::new(2, Key::ReadWrite, 0, 100)),
                Feed(0),
                Deregister(0),
                Raw(vec![1; 100]),
                Feed(0),
            ]),
        ),
        (
            "bad-keys",
            p(&[
                f(2, Key::Gone, 0, 8),
                Feed(0),
                State(3),
                f(2, Key::OtherPd, 0, 8),
                Feed(0),
                State(3),
                f(3, Key::OtherQpWindow, 0, 8),
                Feed(0),
            ]),
        ),
        (
            "map",
            p(&[
                f(6, Key::ReadWrite, 0, 0),
                f(3, Key::ReadWrite, 0, 0),
                Feed(0),
            ]),
        ),
        (
            "garbage",
            p(&[Raw(b"RDRQ\x01\x09garbage".to_vec()), Feed(0)]),
        ),
    ]
}

fn requester_program(steps: &[rq::Step]) -> Vec<u8> {
    let mut p = Program::default();
    steps.iter().for_each(|s| s.emit(&mut p));
    p.0
}

pub(super) fn soft_requester() -> Vec<(&'static str, Vec<u8>)> {
    use rq::Step::*;
    let post = |op, len| Post {
        op,
        region: 0,
        off: 64,
        len,
        how: 0,
    };
    let right = |payload| {
        Respond(rq::Resp {
            which: 0,
            kind: 0,
            value: 5,
            payload,
            corrupt: None,
        })
    };
    let p = requester_program;
    vec![
        (
            "write-read-atomics",
            p(&[
                post(1, 64),
                post(2, 64),
                post(3, 8),
                post(4, 8),
                right(true),
                right(true),
                right(true),
                right(true),
                Feed(0),
                Poll,
            ]),
        ),
        (
            "read-one-byte-pieces",
            p(&[post(2, 100), right(true), Feed(1), Poll]),
        ),
        (
            "read-in-place",
            p(&[
                post(2, 200),
                right(false),
                Feed(0),
                Raw(vec![3; 200]),
                Receive {
                    n: 150,
                    fail: false,
                },
                Feed(0),
                Poll,
            ]),
        ),
        (
            "timeout",
            p(&[post(0, 16), post(1, 16), Advance(4000), Poll]),
        ),
        (
            "nak",
            p(&[
                post(1, 16),
                Respond(rq::Resp {
                    which: 0,
                    kind: 4,
                    value: 10,
                    payload: true,
                    corrupt: None,
                }),
                Feed(0),
                post(1, 8),
                Poll,
            ]),
        ),
        (
            "wrong-seq",
            p(&[
                post(2, 16),
                Respond(rq::Resp {
                    which: 1,
                    kind: 1,
                    value: 0,
                    payload: true,
                    corrupt: None,
                }),
                Feed(0),
                Poll,
            ]),
        ),
        (
            "deregistered-read",
            p(&[
                Post {
                    op: 2,
                    region: 1,
                    off: 0,
                    len: 64,
                    how: 0,
                },
                right(false),
                Feed(0),
                Deregister,
                Raw(vec![0; 64]),
                Feed(0),
                Poll,
            ]),
        ),
        (
            "local-ops",
            p(&[
                Post {
                    op: 1,
                    region: 0,
                    off: 0,
                    len: 8,
                    how: 2,
                },
                Post {
                    op: 1,
                    region: 0,
                    off: 0,
                    len: 8,
                    how: 3,
                },
                post(1, 8),
                Lose(12),
                Poll,
            ]),
        ),
    ]
}
