//! The program a `soft_responder` run executes: what arrives on the connection (request
//! frames aimed at the target's real keys, or raw bytes), and what the driver and the
//! application do meanwhile (post receives, change the QP state, let time pass, receive a
//! payload in place, deregister).

use super::input::{Input, Program};

/// Which key a frame names (the rkey is looked up in the run's key table).
#[derive(Debug, Clone, Copy)]
pub(super) enum Key {
    /// Read, write and atomics, PD of the QP.
    ReadWrite,
    /// Remote read only.
    ReadOnly,
    /// All rights, another PD.
    OtherPd,
    /// The receive buffers' region: local write only.
    Receives,
    /// Deregistered before the run.
    Gone,
    /// A window on `ReadWrite` bound through this QP (read and write).
    Window,
    /// A window bound through another QP.
    OtherQpWindow,
    /// Any rkey.
    Raw(u32),
}

/// A request frame.
#[derive(Debug, Clone)]
pub(super) struct Frame {
    /// 1..=6 are the opcodes; anything else goes on the wire as is.
    pub(super) op: u8,
    pub(super) key: Key,
    /// Absolute address, or offset from the key's region.
    pub(super) addr: Addr,
    pub(super) len: u16,
    pub(super) imm: Option<u32>,
    /// Compare (or add) and swap, for atomics.
    pub(super) atomic: (u64, u64),
    /// Whether the payload follows on the link now (else the driver receives it in place).
    pub(super) payload: bool,
    /// One byte of the encoded header overwritten: (index, value).
    pub(super) corrupt: Option<(u8, u8)>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Addr {
    Offset(i16),
    Absolute(u64),
}

/// One step of a run.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// Bytes onto the link.
    Raw(Vec<u8>),
    /// A request frame onto the link.
    Frame(Frame),
    /// The application posts a receive over `len` bytes of the receive region at `off`, in
    /// `sges` pieces; `bad`: its local check failed.
    PostRecv {
        off: u16,
        len: u16,
        sges: u8,
        bad: bool,
    },
    /// The QP moves to this state (as `QpState::from_u8`).
    State(u8),
    /// Time passes (milliseconds).
    Advance(u16),
    /// The driver feeds the responder what is on the link, in pieces of this size (0: all).
    Feed(u8),
    /// The driver sends what the responder queued.
    Answer,
    /// The driver receives up to `n` payload bytes in place, or the receive fails.
    Receive { n: u16, fail: bool },
    /// Deregistration: 0 the read-write region, 1 the receive region, 2 the window.
    Deregister(u8),
}

const FLAG_IMM: u8 = 1;
const FLAG_NO_PAYLOAD: u8 = 2;
const FLAG_CORRUPT: u8 = 4;
const KEY_ABSOLUTE: u8 = 0x80;

impl Step {
    pub(super) fn parse(input: &mut Input<'_>) -> Step {
        match input.u8() % 9 {
            0 => {
                let n = input.u8() as usize;
                Step::Raw(input.bytes(n).to_vec())
            }
            1 => Step::Frame(Frame::parse(input)),
            2 => Step::PostRecv {
                off: input.u16(),
                len: input.u16(),
                sges: input.u8(),
                bad: input.bool(),
            },
            3 => Step::State(input.u8()),
            4 => Step::Advance(input.u16()),
            5 => Step::Feed(input.u8()),
            6 => Step::Answer,
            7 => Step::Receive {
                n: input.u16(),
                fail: input.bool(),
            },
            _ => Step::Deregister(input.u8()),
        }
    }

    pub(super) fn emit(&self, p: &mut Program) {
        match self {
            Step::Raw(b) => p.u8(0).u8(b.len() as u8).bytes(&b[..b.len().min(255)]),
            Step::Frame(f) => {
                f.emit(p.u8(1));
                p
            }
            Step::PostRecv {
                off,
                len,
                sges,
                bad,
            } => p.u8(2).u16(*off).u16(*len).u8(*sges).bool(*bad),
            Step::State(s) => p.u8(3).u8(*s),
            Step::Advance(ms) => p.u8(4).u16(*ms),
            Step::Feed(piece) => p.u8(5).u8(*piece),
            Step::Answer => p.u8(6),
            Step::Receive { n, fail } => p.u8(7).u16(*n).bool(*fail),
            Step::Deregister(what) => p.u8(8).u8(*what),
        };
    }
}

fn is_atomic(op: u8) -> bool {
    op == 4 || op == 5
}

impl Frame {
    /// A well-formed frame: `op` on `key` at `off`, `len` bytes, payload on the link.
    pub(super) fn new(op: u8, key: Key, off: i16, len: u16) -> Frame {
        Frame {
            op,
            key,
            addr: Addr::Offset(off),
            len,
            imm: None,
            atomic: (0, 0),
            payload: true,
            corrupt: None,
        }
    }

    fn parse(input: &mut Input<'_>) -> Frame {
        let op = input.u8();
        let k = input.u8();
        let key = match k & 7 {
            0 => Key::ReadWrite,
            1 => Key::ReadOnly,
            2 => Key::OtherPd,
            3 => Key::Receives,
            4 => Key::Gone,
            5 => Key::Window,
            6 => Key::OtherQpWindow,
            _ => Key::Raw(input.u32()),
        };
        let addr = if k & KEY_ABSOLUTE != 0 {
            Addr::Absolute(input.u64())
        } else {
            Addr::Offset(input.u16() as i16)
        };
        let len = input.u16();
        let flags = input.u8();
        let imm = (flags & FLAG_IMM != 0).then(|| input.u32());
        let atomic = if is_atomic(op) {
            (input.u64(), input.u64())
        } else {
            (0, 0)
        };
        let corrupt = (flags & FLAG_CORRUPT != 0).then(|| (input.u8(), input.u8()));
        Frame {
            op,
            key,
            addr,
            len,
            imm,
            atomic,
            payload: flags & FLAG_NO_PAYLOAD == 0,
            corrupt,
        }
    }

    fn emit(&self, p: &mut Program) {
        let (k, raw) = match self.key {
            Key::ReadWrite => (0, None),
            Key::ReadOnly => (1, None),
            Key::OtherPd => (2, None),
            Key::Receives => (3, None),
            Key::Gone => (4, None),
            Key::Window => (5, None),
            Key::OtherQpWindow => (6, None),
            Key::Raw(r) => (7, Some(r)),
        };
        let absolute = matches!(self.addr, Addr::Absolute(_));
        p.u8(self.op)
            .u8(k | if absolute { KEY_ABSOLUTE } else { 0 });
        if let Some(r) = raw {
            p.u32(r);
        }
        match self.addr {
            Addr::Offset(o) => p.u16(o as u16),
            Addr::Absolute(a) => p.u64(a),
        };
        let flags = self.imm.map_or(0, |_| FLAG_IMM)
            | if self.payload { 0 } else { FLAG_NO_PAYLOAD }
            | self.corrupt.map_or(0, |_| FLAG_CORRUPT);
        p.u16(self.len).u8(flags);
        if let Some(imm) = self.imm {
            p.u32(imm);
        }
        if is_atomic(self.op) {
            p.u64(self.atomic.0).u64(self.atomic.1);
        }
        if let Some((i, v)) = self.corrupt {
            p.u8(i).u8(v);
        }
    }
}
