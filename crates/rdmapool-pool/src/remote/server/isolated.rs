//! The server's side of isolated mode (see `remote::isolation`): each connection's windows
//! and control buffers, and the control loop that answers setup, claim, release and access
//! requests. The only server CPU work a client can cause; it is counted in
//! `requests_handled`.

use super::super::isolation::{Control, CONTROL_LEN, NO_SLOT, QUOTA_REACHED, REFUSED};
use super::super::layout::{self, Layout};
use super::Inner;
use crate::fabric::{
    AccessFlags, Completion, Mr, Mw, Qp, RecvWr, RegisteredMemory, SendWr, WcOpcode, WrOp,
};
use crate::remote::layout::DURABLE_TAG;
use crate::Result;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Receives posted per connection (a client has at most this many requests outstanding:
/// its requests are one at a time per node, so this is room to spare).
const RECV_DEPTH: usize = 4;
/// Answers in flight per connection.
const SEND_DEPTH: usize = 4;
/// Work request ids: receives are `RECV_TAG | i`, sends `SEND_TAG | i`.
const RECV_TAG: u64 = 1 << 32;
const SEND_TAG: u64 = 2 << 32;

/// What an isolated server records itself, in memory no window covers (issue #41): who
/// holds each lease slot, and which chunks have been handed out before. A tenant's slot
/// window reaches only its heartbeat word, but rxe 6.1 checks a window's range against its
/// region (docs/PROTOCOL.md section 7.6), so the server never acts on the owner words a
/// tenant might have written: expiry, reclaim and slot assignment follow this record.
/// Changed only under the connection lock.
pub(super) struct Ledger {
    /// Slot `i`'s holder: the proven id the server gave it to (0: free).
    owners: Mutex<Vec<u64>>,
    /// Whether chunk `j` has been claimed since the server started: its memory may hold a
    /// tenant's bytes, and is wiped before it is handed out again.
    used: Vec<AtomicBool>,
}

impl Ledger {
    pub(super) fn new(l: &Layout) -> Self {
        Self {
            owners: Mutex::new(vec![0; l.client_count as usize]),
            used: (0..l.chunk_count).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// The holder of `slot` (0: free).
    pub(super) fn owner(&self, slot: u64) -> u64 {
        self.owners.lock().get(slot as usize).copied().unwrap_or(0)
    }

    /// Frees `slot` if `owner` holds it; whether it did.
    pub(super) fn free(&self, slot: u64, owner: u64) -> bool {
        match self.owners.lock().get_mut(slot as usize) {
            Some(o) if *o == owner => {
                *o = 0;
                true
            }
            _ => false,
        }
    }
}

/// What an isolated connection holds besides its QP: dropped before the QP (a bound window
/// holds a reference to it), and dropping a window revokes its key.
pub(super) struct Tenant {
    /// The lease slot this connection was given, once set up.
    slot: Option<u64>,
    /// Windows: the read-only one over the header, slots and table; the slot's.
    meta: Option<Mw>,
    slot_window: Option<Mw>,
    /// One window per chunk this connection was given access to.
    chunks: HashMap<u64, Mw>,
    /// `RECV_DEPTH` receive buffers, then `SEND_DEPTH` send buffers, 32 bytes each.
    bufs: Mr,
    send_busy: [bool; SEND_DEPTH],
    /// Answers waiting for a free send buffer.
    backlog: VecDeque<[u8; CONTROL_LEN]>,
}

impl Tenant {
    /// The state of a new connection, with its receives posted.
    pub(super) fn new(inner: &Inner, qp: &Qp) -> Result<Self> {
        let bufs = inner.pd.alloc_mr(
            (RECV_DEPTH + SEND_DEPTH) * CONTROL_LEN,
            AccessFlags::LOCAL_WRITE,
        )?;
        let t = Self {
            slot: None,
            meta: None,
            slot_window: None,
            chunks: HashMap::new(),
            bufs,
            send_busy: [false; SEND_DEPTH],
            backlog: VecDeque::new(),
        };
        for i in 0..RECV_DEPTH {
            t.post_recv(qp, i)?;
        }
        Ok(t)
    }

    fn post_recv(&self, qp: &Qp, i: usize) -> Result<()> {
        let sge = self.bufs.sge(i * CONTROL_LEN, CONTROL_LEN as u32)?;
        Ok(qp.post_recv(&[RecvWr {
            wr_id: RECV_TAG | i as u64,
            sg_list: &[sge],
        }])?)
    }

    /// Sends `msg` now if a send buffer is free, else after one frees.
    fn answer(&mut self, qp: &Qp, msg: Control) -> Result<()> {
        self.backlog.push_back(msg.encode());
        self.flush(qp)
    }

    fn flush(&mut self, qp: &Qp) -> Result<()> {
        while let Some(i) = self.send_busy.iter().position(|b| !b) {
            let Some(bytes) = self.backlog.pop_front() else {
                break;
            };
            let at = (RECV_DEPTH + i) * CONTROL_LEN;
            self.bufs.write_at(at, &bytes)?;
            let sge = self.bufs.sge(at, CONTROL_LEN as u32)?;
            qp.post_send(&[SendWr {
                wr_id: SEND_TAG | i as u64,
                op: WrOp::Send { imm: None },
                sg_list: &[sge],
                signaled: true,
            }])?;
            self.send_busy[i] = true;
        }
        Ok(())
    }

    /// Revokes this connection's window over `chunk`, if it has one.
    pub(super) fn revoke(&mut self, chunk: u64) {
        self.chunks.remove(&chunk);
    }
}

impl Inner {
    /// Answers control messages until the server stops: waits on the CQ's event channel
    /// (no spinning while idle), then handles every completion.
    pub(super) fn control_loop(&self) {
        let mut buf = [Completion::EMPTY; 16];
        // Whether the CQ was armed since the last sleep: an empty poll arms it and polls once
        // more before sleeping, since what came before the arm raises no event (rxe).
        let mut armed = false;
        while !self.stop.load(Ordering::Acquire) {
            let n = match self.cq.poll(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(node = self.node, "polling the control CQ: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            for c in &buf[..n] {
                self.on_completion(c);
            }
            if n == 0 && !armed {
                if self.cq.req_notify().is_err() {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                armed = true;
            } else if n == 0 {
                self.wait_for_completions(Duration::from_millis(100));
                armed = false;
            }
        }
    }

    /// Sleeps until the armed CQ signals a completion or `timeout` passes.
    fn wait_for_completions(&self, timeout: Duration) {
        let mut fds = [libc::pollfd {
            fd: self.cq.event_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: `fds` is a valid array of one pollfd for the duration of the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout.as_millis() as i32) };
        if ready > 0 {
            let _ = self.cq.ack_events();
        }
    }

    fn on_completion(&self, c: &Completion) {
        if let Some(gone) = self.complete(c) {
            // Closed off this thread: destroying a QP can block (rxe 6.1 waits up to
            // about 50 s for its windows' references), and the control loop answers
            // everyone else.
            let spawned = crate::util::spawn_named("rdmapool-pool-disconnect", move || drop(gone));
            if let Err(e) = spawned {
                tracing::warn!(node = self.node, "no thread to disconnect a client: {e}");
            }
        }
    }

    /// Handles one completion; returns the connection to close, if it must go.
    fn complete(&self, c: &Completion) -> Option<super::Conn> {
        let mut conns = self.conns.lock();
        let Some(pos) = conns.iter().position(|k| k.qp.qpn() == c.qp_num) else {
            return None; // a connection already dropped
        };
        let conn = &mut conns[pos];
        let (id, qp) = (conn.client, &conn.qp);
        let t = conn.tenant.as_mut()?;
        let slot = (c.wr_id & 0xffff_ffff) as usize;
        if !c.is_ok() {
            // A failed receive or send: the connection is broken (flushed, or the peer
            // misbehaved); drop it.
            tracing::debug!(node = self.node, client = id, status = %c.status, "control completion failed: disconnecting");
            return Some(conns.remove(pos));
        }
        match c.opcode {
            WcOpcode::Send => {
                if let Some(b) = t.send_busy.get_mut(slot) {
                    *b = false;
                }
                if let Err(e) = t.flush(qp) {
                    tracing::debug!(node = self.node, client = id, "answering: {e}");
                }
            }
            WcOpcode::Recv => {
                self.requests.fetch_add(1, Ordering::Relaxed);
                let mut msg = [0u8; CONTROL_LEN];
                let read = t.bufs.read_at(slot * CONTROL_LEN, &mut msg);
                let request = read.ok().and_then(|()| {
                    (c.byte_len as usize == CONTROL_LEN)
                        .then(|| Control::decode(&msg).ok())
                        .flatten()
                });
                let Some(request) = request else {
                    tracing::warn!(
                        node = self.node,
                        client = id,
                        "malformed control message: disconnecting"
                    );
                    return Some(conns.remove(pos));
                };
                let answer = self.handle(id, qp, t, request);
                let posted = t.post_recv(qp, slot).and_then(|()| match answer {
                    Some(a) => t.answer(qp, a),
                    None => Ok(()),
                });
                let mut gone = None;
                if let Err(e) = posted {
                    tracing::debug!(node = self.node, client = id, "control: {e}: disconnecting");
                    gone = Some(conns.remove(pos));
                }
                // A release revokes the chunk's windows on the id's other connections too.
                if let Control::Release { chunk, .. } = request {
                    for k in conns.iter_mut().filter(|k| k.client == id) {
                        if let Some(t) = k.tenant.as_mut() {
                            t.revoke(chunk);
                        }
                    }
                }
                return gone;
            }
            _ => {}
        }
        None
    }

    /// One request of client `id` on `qp`: its answer (`None` for messages a client may not
    /// send, which are ignored).
    fn handle(&self, id: u64, qp: &Qp, t: &mut Tenant, request: Control) -> Option<Control> {
        let l = self.layout;
        let in_range = |chunk: u64| chunk < l.chunk_count && t.slot.is_some();
        Some(match request {
            Control::Setup { req } => {
                let (slot, beat) = match t.slot {
                    Some(s) => (s, 0),
                    None => self.assign_slot(id),
                };
                let granted = |meta_rkey, slot_rkey| Control::Granted {
                    req,
                    slot,
                    meta_rkey,
                    slot_rkey,
                    beat,
                };
                if slot == NO_SLOT {
                    return Some(granted(0, 0));
                }
                t.slot = Some(slot);
                let meta = self.bind(qp, 0, l.data_offset, AccessFlags::REMOTE_READ);
                // The heartbeat word only: the owner word is the server's (issue #41).
                let beat_at = l.client_slot(slot) + layout::slot::HEARTBEAT;
                let own = self.bind(qp, beat_at, 8, full_rights());
                match (meta, own) {
                    (Ok(m), Ok(s)) => {
                        let g = granted(m.rkey(), s.rkey());
                        t.meta = Some(m);
                        t.slot_window = Some(s);
                        g
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::warn!(node = self.node, client = id, "binding windows: {e}");
                        granted(0, 0)
                    }
                }
            }
            Control::Claim { req, chunk } if in_range(chunk) => {
                self.claim(qp, t, id, req, chunk, id)
            }
            Control::ClaimStore { req, chunk } if in_range(chunk) => {
                self.claim(qp, t, id, req, chunk, DURABLE_TAG | id)
            }
            Control::Release { req, chunk } if in_range(chunk) => {
                // Revoke first (here; the caller does the id's other connections before
                // anyone can claim the chunk: the table entry clears under the same lock).
                t.revoke(chunk);
                let entry = l.table_entry(chunk);
                let old = match self.compare_exchange_entry(entry, id, 0) {
                    Ok(()) => id,
                    // A store chunk of the id's.
                    Err(old) if old == DURABLE_TAG | id => {
                        match self.compare_exchange_entry(entry, old, 0) {
                            Ok(()) => old,
                            Err(now) => now,
                        }
                    }
                    Err(old) => old,
                };
                Control::Answer { req, old, rkey: 0 }
            }
            Control::Access { req, chunk } if in_range(chunk) => {
                let old = self.word(l.table_entry(chunk)).load(Ordering::Acquire);
                if old != id && old != DURABLE_TAG | id {
                    return Some(Control::Answer { req, old, rkey: 0 });
                }
                match self.chunk_window(qp, t, chunk) {
                    Ok(rkey) => Control::Answer { req, old, rkey },
                    Err(_) => Control::Answer {
                        req,
                        old: REFUSED,
                        rkey: 0,
                    },
                }
            }
            Control::Claim { req, .. }
            | Control::ClaimStore { req, .. }
            | Control::Release { req, .. }
            | Control::Access { req, .. } => Control::Answer {
                req,
                old: REFUSED,
                rkey: 0,
            },
            Control::Granted { .. } | Control::Answer { .. } => return None,
        })
    }

    /// The slot of `id`, from the server's record: the one that holds it already
    /// (heartbeat 0 in the answer: the client takes it over), else a free one claimed for it
    /// with a fresh random heartbeat. The owner word is written from the record each time,
    /// so whatever a tenant wrote there, the metadata window shows the truth.
    fn assign_slot(&self, id: u64) -> (u64, u64) {
        let l = self.layout;
        let Some(ledger) = &self.ledger else {
            return (NO_SLOT, 0);
        };
        let mut owners = ledger.owners.lock();
        let owner_word = |s: u64| self.word(l.client_slot(s) + layout::slot::OWNER);
        if let Some(s) = owners.iter().position(|&o| o == id) {
            owner_word(s as u64).store(id, Ordering::Release);
            return (s as u64, 0);
        }
        let start = layout::hash64(id) % l.client_count.max(1);
        for k in 0..l.client_count {
            let s = (start + k) % l.client_count;
            if owners[s as usize] == 0 {
                owners[s as usize] = id;
                let beat = crate::util::random_nonzero().unwrap_or(1);
                self.word(l.client_slot(s) + layout::slot::HEARTBEAT)
                    .store(beat, Ordering::Release);
                owner_word(s).store(id, Ordering::Release);
                return (s, beat);
            }
        }
        (NO_SLOT, 0)
    }

    /// Zeroes `chunk` if it was handed out before (a claim just took it, so no window
    /// covers it: its last holder's were revoked before its table entry was freed).
    fn wipe_if_used(&self, chunk: u64) -> Result<()> {
        let used = self
            .ledger
            .as_ref()
            .and_then(|g| g.used.get(chunk as usize));
        if used.is_some_and(|u| u.swap(true, Ordering::AcqRel)) {
            let l = self.layout;
            self.region
                .zero_at(l.chunk(chunk) as usize, l.chunk_size as usize)?;
        }
        Ok(())
    }

    /// A claim of `chunk` by client `id` (on `qp`), for the entry value `swap`: the id
    /// (a chunk of its lease) or `2^63 | id` (of its store namespace). Within the id's
    /// quotas, the entry is swapped from 0, the chunk wiped if it was handed out before, and
    /// a window bound over it.
    fn claim(&self, qp: &Qp, t: &mut Tenant, id: u64, req: u32, chunk: u64, swap: u64) -> Control {
        let l = self.layout;
        let owned = self.chunks_of(id);
        let over_chunks = self.max_chunks_per_client > 0 && owned >= self.max_chunks_per_client;
        let over_bytes = self.max_bytes_per_client > 0
            && (owned + 1).saturating_mul(l.chunk_size) > self.max_bytes_per_client;
        if over_chunks || over_bytes {
            return Control::Answer {
                req,
                old: QUOTA_REACHED,
                rkey: 0,
            };
        }
        let entry = l.table_entry(chunk);
        if let Err(old) = self.compare_exchange_entry(entry, 0, swap) {
            return Control::Answer { req, old, rkey: 0 };
        }
        let refused = Control::Answer {
            req,
            old: REFUSED,
            rkey: 0,
        };
        if let Err(e) = self.wipe_if_used(chunk) {
            tracing::error!(node = self.node, chunk, "wiping a chunk: {e}");
            let _ = self.compare_exchange_entry(entry, swap, 0);
            return refused;
        }
        match self.chunk_window(qp, t, chunk) {
            Ok(rkey) => Control::Answer { req, old: 0, rkey },
            Err(e) => {
                tracing::warn!(node = self.node, client = id, "binding a chunk window: {e}");
                let _ = self.compare_exchange_entry(entry, swap, 0);
                refused
            }
        }
    }

    /// How many chunks the table says `id` owns, its store's among them (claims are rare:
    /// a scan is cheap enough).
    fn chunks_of(&self, id: u64) -> u64 {
        (0..self.layout.chunk_count)
            .filter(|&j| {
                let e = self
                    .word(self.layout.table_entry(j))
                    .load(Ordering::Acquire);
                e == id || e == DURABLE_TAG | id
            })
            .count() as u64
    }

    fn compare_exchange_entry(
        &self,
        at: u64,
        current: u64,
        new: u64,
    ) -> std::result::Result<(), u64> {
        self.word(at)
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
    }

    /// A window over `chunk` for this connection (bound now, or the one it has).
    fn chunk_window(&self, qp: &Qp, t: &mut Tenant, chunk: u64) -> Result<u32> {
        if let Some(w) = t.chunks.get(&chunk) {
            return Ok(w.rkey());
        }
        let l = self.layout;
        let w = self.bind(qp, l.chunk(chunk), l.chunk_size, full_rights())?;
        let rkey = w.rkey();
        t.chunks.insert(chunk, w);
        Ok(rkey)
    }

    /// Binds a new window over `len` bytes at `offset` of the region through `qp`. Not
    /// signaled: an answer sent after it on the same QP executes after it, so the key works
    /// by the time the client has it.
    fn bind(&self, qp: &Qp, offset: u64, len: u64, access: AccessFlags) -> Result<Mw> {
        let mw = self.pd.alloc_mw()?;
        qp.post_bind_mw(
            0,
            &mw,
            &self.region,
            offset as usize,
            len as usize,
            access,
            false,
        )?;
        Ok(mw)
    }
}

fn full_rights() -> AccessFlags {
    AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC
}
