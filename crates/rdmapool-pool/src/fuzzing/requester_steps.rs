//! The program a `soft_requester` run executes: work requests posted (and sent, flushed or
//! finished locally), responses from the peer (aimed at requests on the wire, or anything),
//! and what the driver and the application do meanwhile.

use super::input::{Input, Program};

/// One step of a run.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// A work request: `op` (SEND, WRITE, READ, CAS, FAA) over `len` bytes at `off` of local
    /// region `region` (0 or 1); `how`: 0 and 1 sent, 2 flushed, 3 finished locally.
    Post {
        op: u8,
        region: u8,
        off: u16,
        len: u16,
        how: u8,
    },
    /// A response onto the link.
    Respond(Resp),
    /// Bytes onto the link.
    Raw(Vec<u8>),
    /// The driver feeds the link to the requester in pieces of this size (0: all).
    Feed(u8),
    /// The driver receives up to `n` READ payload bytes in place, or the receive fails.
    Receive { n: u16, fail: bool },
    /// Time passes (milliseconds); the driver checks the retry timeout.
    Advance(u16),
    /// The connection dies; the oldest request gets `WcStatus::ALL[status % 22]`.
    Lose(u8),
    /// Local region 1 is deregistered.
    Deregister,
    /// The application polls completions.
    Poll,
}

/// A response: to the request on the wire at `which` (modulo their number; any seq when
/// none is), of `kind` 0 the right one for it, 1 ACK, 2 READ data of `value` bytes, 3
/// atomic result, 4 NAK with status byte `value`, 5 a map answer.
#[derive(Debug, Clone)]
pub(super) struct Resp {
    pub(super) which: u8,
    pub(super) kind: u8,
    pub(super) value: u16,
    /// READ data follows on the link now.
    pub(super) payload: bool,
    /// One byte of the encoded header overwritten: (index, value).
    pub(super) corrupt: Option<(u8, u8)>,
}

impl Step {
    pub(super) fn parse(input: &mut Input<'_>) -> Step {
        match input.u8() % 9 {
            0 => Step::Post {
                op: input.u8(),
                region: input.u8(),
                off: input.u16(),
                len: input.u16(),
                how: input.u8(),
            },
            1 => {
                let (which, kind, value) = (input.u8(), input.u8(), input.u16());
                let flags = input.u8();
                let corrupt = (flags & 2 != 0).then(|| (input.u8(), input.u8()));
                Step::Respond(Resp {
                    which,
                    kind,
                    value,
                    payload: flags & 1 == 0,
                    corrupt,
                })
            }
            2 => {
                let n = input.u8() as usize;
                Step::Raw(input.bytes(n).to_vec())
            }
            3 => Step::Feed(input.u8()),
            4 => Step::Receive {
                n: input.u16(),
                fail: input.bool(),
            },
            5 => Step::Advance(input.u16()),
            6 => Step::Lose(input.u8()),
            7 => Step::Deregister,
            _ => Step::Poll,
        }
    }

    pub(super) fn emit(&self, p: &mut Program) {
        match self {
            Step::Post {
                op,
                region,
                off,
                len,
                how,
            } => p.u8(0).u8(*op).u8(*region).u16(*off).u16(*len).u8(*how),
            Step::Respond(r) => {
                let flags = (!r.payload) as u8 | r.corrupt.map_or(0, |_| 2);
                p.u8(1).u8(r.which).u8(r.kind).u16(r.value).u8(flags);
                if let Some((i, v)) = r.corrupt {
                    p.u8(i).u8(v);
                }
                p
            }
            Step::Raw(b) => p.u8(2).u8(b.len() as u8).bytes(&b[..b.len().min(255)]),
            Step::Feed(piece) => p.u8(3).u8(*piece),
            Step::Receive { n, fail } => p.u8(4).u16(*n).bool(*fail),
            Step::Advance(ms) => p.u8(5).u16(*ms),
            Step::Lose(s) => p.u8(6).u8(*s),
            Step::Deregister => p.u8(7),
            Step::Poll => p.u8(8),
        };
    }
}
