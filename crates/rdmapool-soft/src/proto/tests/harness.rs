//! The harness: a target QP with real keys, and a [`Pair`] of requester and responder with
//! the link between them in the test's hands.

use crate::control;
use crate::fabric::{AccessFlags, RemoteAddr, WcStatus, WrOp};
use crate::keys::{KeyTable, LocalList, MrInner, NewRegion, Resolved};
use crate::os::mapping::Mapping;
use crate::proto::requester::{Finished, Requester};
use crate::proto::responder::{self, Output, Responder};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) use crate::proto::mem_target::{MemTarget as Target, PD, RNR, TIMEOUT};
pub(super) const LEN: usize = 4096;

pub(super) fn region(keys: &KeyTable, access: AccessFlags) -> Arc<MrInner> {
    let mapping = Mapping::new(control::len_with_control(LEN)).unwrap();
    keys.insert(NewRegion {
        addr: mapping.ptr() as u64,
        len: LEN as u64,
        access,
        pd_id: PD,
        pin: None,
        mapping: Some(mapping),
    })
    .unwrap()
}

pub(super) fn fill(mr: &MrInner, off: usize, bytes: &[u8]) {
    assert!(off + bytes.len() <= LEN);
    // SAFETY: inside a live test region (checked above) that nothing else touches now.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (mr.addr as *mut u8).add(off), bytes.len())
    };
}

pub(super) fn read(mr: &MrInner, off: usize, len: usize) -> Vec<u8> {
    assert!(off + len <= LEN);
    let mut v = vec![0u8; len];
    // SAFETY: inside a live test region (checked above) that nothing else touches now.
    unsafe { std::ptr::copy_nonoverlapping((mr.addr as *const u8).add(off), v.as_mut_ptr(), len) };
    v
}

pub(super) fn list(mr: &Arc<MrInner>, off: usize, len: usize) -> LocalList {
    let mut l = LocalList::new();
    l.push(Resolved {
        mr: mr.clone(),
        addr: mr.addr + off as u64,
        len: len as u32,
    });
    l
}

/// A requester and a responder with the link between them in the test's hands.
pub(super) struct Pair {
    pub(super) req: Requester,
    pub(super) resp: Responder,
    pub(super) target: Target,
    pub(super) init_keys: KeyTable,
    pub(super) local: Arc<MrInner>,
    pub(super) remote: Arc<MrInner>,
    pub(super) now: Instant,
    /// Frames on their way to the responder, and back.
    pub(super) to_target: VecDeque<Vec<u8>>,
    pub(super) to_initiator: VecDeque<Vec<u8>>,
    /// Bytes the responder has not taken yet.
    pub(super) inbox: Vec<u8>,
}

impl Pair {
    pub(super) fn new() -> Self {
        let init_keys = KeyTable::default();
        let local = region(&init_keys, AccessFlags::LOCAL_WRITE);
        let target = Target::new();
        let remote = region(&target.keys, AccessFlags::all_remote());
        Self {
            req: Requester::new(16, TIMEOUT, 1 << 20),
            resp: Responder::new(1 << 20),
            target,
            init_keys,
            local,
            remote,
            now: Instant::now(),
            to_target: VecDeque::new(),
            to_initiator: VecDeque::new(),
            inbox: Vec::new(),
        }
    }

    pub(super) fn remote_at(&self, off: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.remote.addr + off,
            rkey: self.remote.rkey,
        }
    }

    /// Posts `op` with the local range `[off, off+len)`: its frame (and payload) goes on the
    /// link at the current time.
    pub(super) fn post(&mut self, wr_id: u64, op: WrOp, off: usize, len: usize) {
        let mut e = self
            .req
            .entry(wr_id, op.completion_opcode(), true)
            .expect("room");
        e.local = list(&self.local, off, len);
        e.byte_len = len as u32;
        let frame = self.req.frame(&e, &op);
        let mut bytes = frame.encode().to_vec();
        if frame.payload_len() > 0 {
            bytes.extend(read(&self.local, off, len));
        }
        self.to_target.push_back(bytes);
        self.req.sent(e, self.now);
    }

    /// Feeds the responder `bytes` (after what it left over before) in pieces of at most
    /// `piece` bytes, retrying a stalled request at the current time; what it answers goes
    /// on the link.
    pub(super) fn serve(&mut self, bytes: &[u8], piece: usize) {
        self.inbox.extend_from_slice(bytes);
        loop {
            let take = self.inbox.len().min(piece.max(1));
            let n = self
                .resp
                .handle_input(&self.target, &self.inbox[..take], self.now);
            self.inbox.drain(..n);
            let answered = self.answer();
            if n == 0 && !answered {
                return; // out of input, stalled, or failed
            }
        }
    }

    /// Moves the responder's answers onto the link (READ data copied as the driver would
    /// send it).
    pub(super) fn answer(&mut self) -> bool {
        let mut any = false;
        while let Some(out) = self.resp.poll_output() {
            any = true;
            let bytes = match out {
                Output::Reply(r) => r.encode().to_vec(),
                Output::Read(r) => responder::read_frame(&self.target, &r, |hdr, data| {
                    let mut v = hdr.to_vec();
                    if let Some((addr, len)) = data {
                        let mut d = vec![0u8; len];
                        // SAFETY: the range passed the access check of a region that
                        // `read_frame` keeps registered during this call.
                        unsafe {
                            std::ptr::copy_nonoverlapping(addr as *const u8, d.as_mut_ptr(), len)
                        };
                        v.extend(d);
                    }
                    v
                }),
                Output::Map { .. } => panic!("no map requests here"),
            };
            self.to_initiator.push_back(bytes);
        }
        any
    }

    /// Delivers every frame on the way to the target, whole.
    pub(super) fn deliver_requests(&mut self) {
        while let Some(f) = self.to_target.pop_front() {
            self.serve(&f, f.len());
        }
    }

    /// Delivers every frame on the way back, in pieces of `piece` bytes.
    pub(super) fn deliver_responses(&mut self, piece: usize) {
        while let Some(f) = self.to_initiator.pop_front() {
            for chunk in f.chunks(piece.max(1)) {
                let n = self.req.handle_input(chunk);
                assert_eq!(n, chunk.len(), "the requester takes what it is given");
            }
        }
    }

    pub(super) fn round_trip(&mut self) {
        self.deliver_requests();
        self.deliver_responses(usize::MAX);
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.now += d;
        self.req.handle_timeout(self.now);
    }

    pub(super) fn done(&mut self) -> Vec<(u64, WcStatus)> {
        std::iter::from_fn(|| self.req.poll_done())
            .map(|f: Finished| (f.wr_id, f.status))
            .collect()
    }
}
