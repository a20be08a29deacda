//! Joining a node (connect, descriptor, lease slot, recovery after a restart) and keeping
//! the leases alive.

use super::chunks::{Book, Recover};
use super::takeover::{next_beat, Takeover};
use super::{Node, Shared};
use crate::conn::{self, Manager};
use crate::fabric::QpConfig;
use crate::remote::descriptor::decode_accept;
use crate::remote::hello::{unix_now, ClientHello};
use crate::remote::layout::hash64;
use crate::remote::layout::{self, STATE_DRAINING};
use crate::remote::lease::Holder;
use crate::remote::step::{Machine, Step};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

impl Shared {
    /// Connects, takes a lease slot, and (after a restart) recovers this id's chunks. A
    /// server answering with the id of a node this client knows under another incarnation
    /// replaces that node if it no longer answers (it restarted).
    pub(super) fn add_node(&self, addr: SocketAddr) -> Result<u32> {
        let cq = self.engine.cqs()[0].clone();
        // A server busy with other handshakes (a burst of clients from one host) says so:
        // ask again, a little later each time, until the connect timeout.
        let deadline = Instant::now() + self.connect_timeout;
        let mut pause = Duration::from_millis(1);
        let (c, hello) = loop {
            // A fresh hello each time: a server accepts a proven hello's nonce once.
            let h = ClientHello::new(self.id)?;
            let hello = match &self.client_key {
                Some(key) => h.encode_proven(key, unix_now()).to_vec(),
                None => h.encode().to_vec(),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let dial = conn::connect(
                Manager::from(&self.pd),
                addr,
                &conn::ConnectSpec::new(&self.pd, &cq, &QpConfig::default())
                    .private_data(&hello)
                    .timeout(left.max(Duration::from_millis(1))),
            );
            match dial {
                Err(Error::Core(crate::CoreError::Rejected { private_data, .. }))
                    if private_data == crate::remote::server::BUSY
                        && Instant::now() + pause < deadline =>
                {
                    let jitter = Duration::from_micros(crate::util::random_nonzero()? % 1000);
                    std::thread::sleep(pause + jitter);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(Error::Core(crate::CoreError::Rejected { private_data, .. }))
                    if private_data == crate::remote::server::UNAUTHENTICATED =>
                {
                    return Err(Error::Unauthenticated {
                        peer: format!("this client (id {}) at the pool server {addr}", self.id),
                        reason: format!(
                            "the server refused its proof of id {}: {}",
                            self.id,
                            if self.client_key.is_some() {
                                format!(
                                    "a key of another cluster or another id, or clocks more \
                                     than {} s apart",
                                    crate::remote::MAX_CLOCK_SKEW.as_secs()
                                )
                            } else {
                                "it requires one (give the client the cluster key or its \
                                 client key)"
                                    .to_string()
                            }
                        ),
                    })
                }
                other => break (other?, hello),
            }
        };
        let desc = decode_accept(
            &c.private_data,
            &hello,
            self.client_key.as_ref(),
            &addr.to_string(),
        )?;
        let known = self.nodes.lock().get(&desc.node).cloned();
        // A node down under the same incarnation (frozen, or cut off, and answering again)
        // is rejoined under a new session: a new connection, slot and lease, and its chunks
        // recovered as after a restart of this client; pointers into those the server took
        // back meanwhile (our lease there lapsed) are refused (`Book::follow`).
        let mut same_incarnation = None;
        if let Some(old) = &known {
            if old.desc.incarnation == desc.incarnation {
                if old.down.lock().is_none() {
                    // Already a member: nothing to do (the new connection is dropped).
                    return Ok(desc.node);
                }
                same_incarnation = Some(old.clone());
            } else if old.down.lock().is_none() && self.engine.run_until(self.answers(old)) {
                return Err(Error::NodeIdConflict {
                    node: desc.node,
                    first: old.desc.incarnation,
                    first_addr: old.addr.to_string(),
                    second: desc.incarnation,
                    second_addr: addr.to_string(),
                });
            }
        }
        let node = Arc::new(Node {
            desc,
            addr,
            qp: self.engine.wrap(c.qp),
            slot: AtomicU64::new(0),
            book: Mutex::new(Book::new(self.id, desc.node, desc.incarnation, desc.layout)),
            claimed: tokio::sync::Notify::new(),
            durable_book: Mutex::new(Book::new(
                crate::remote::layout::DURABLE_TAG | self.id,
                desc.node,
                desc.incarnation,
                desc.layout,
            )),
            durable_claimed: tokio::sync::Notify::new(),
            down: Mutex::new(None),
            is_down: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            lease: Mutex::new(Holder::new(desc.lease, Instant::now())),
            beat: AtomicU64::new(0),
            windows: if desc.isolated {
                Some(super::isolated::Windows::new(&self.pd)?)
            } else {
                None
            },
        });
        let slot = if desc.isolated {
            // The server picks the slot and binds the windows. A slot it claimed for us now
            // comes with a fresh heartbeat; one the id held already is taken over as usual.
            let asked = Instant::now();
            let grant = self.engine.run_until(self.setup(&node))?;
            if grant.beat != 0 {
                node.lease.lock().renewed(asked);
                node.beat.store(grant.beat, Ordering::Release);
                grant.slot
            } else {
                self.engine.run_until(self.take_slot(&node))?
            }
        } else {
            self.engine.run_until(self.take_slot(&node))?
        };
        node.slot.store(slot, Ordering::Release);
        self.engine.run_until(self.recover(&node))?;
        if let Some(old) = &same_incarnation {
            node.book.lock().follow(&old.book.lock());
            // The store's chunks are not the lease's: they stay this client's.
            std::mem::swap(
                &mut *node.durable_book.lock(),
                &mut *old.durable_book.lock(),
            );
        }
        let replaced = self.nodes.lock().insert(desc.node, node);
        self.unreachable.lock().retain(|(a, _)| *a != addr);
        // Back as a new incarnation: its memory is fresh, nothing old can come back with it.
        self.departed
            .lock()
            .retain(|&(n, inc, _)| n != desc.node || inc == desc.incarnation);
        if same_incarnation.is_some() {
            tracing::info!(
                node = desc.node,
                "pool node answering again: rejoined under a new lease"
            );
        } else if let Some(old) = replaced {
            old.mark_down(format!(
                "restarted: incarnation {:#x} replaced by {:#x}",
                old.desc.incarnation, desc.incarnation
            ));
            tracing::info!(
                node = desc.node,
                old = old.desc.incarnation,
                new = desc.incarnation,
                "pool node rejoined as a new incarnation"
            );
        }
        Ok(desc.node)
    }

    /// Whether `node` still answers a one-sided READ of its incarnation word with the
    /// incarnation this client knows (else it is marked down).
    async fn answers(&self, node: &Node) -> bool {
        match self.read_u64(node, layout::header::INCARNATION).await {
            Ok(i) if i == node.desc.incarnation => true,
            Ok(i) => {
                node.mark_down(format!("its memory now says incarnation {i:#x}"));
                false
            }
            Err(_) => false,
        }
    }

    /// Why no node is usable, for [`Error::NoServer`].
    pub(super) fn why_no_server(&self) -> String {
        let nodes = self.nodes.lock();
        if nodes.is_empty() {
            return "this client has joined no server".into();
        }
        let mut each: Vec<String> = nodes
            .values()
            .map(|n| {
                let why = n.down.lock().clone().unwrap_or_else(|| "up".into());
                format!("node {} at {}: {why}", n.desc.node, n.addr)
            })
            .collect();
        each.sort();
        format!("every node is down ({})", each.join("; "))
    }

    /// Dials the nodes that are down again, and the members never reached since connect,
    /// each with its own backoff (100 ms doubling up to 5 s), and joins the ones that
    /// answer: a restarted server as its new incarnation, one that answers again under the
    /// same incarnation (it was frozen, or cut off) under a new lease. Runs until the
    /// client is dropped; a node removed with `remove_server` is left alone.
    pub(super) fn rejoin_loop(&self) {
        const FIRST: Duration = Duration::from_millis(100);
        const MOST: Duration = Duration::from_secs(5);
        let mut backoff: HashMap<u32, (Instant, Duration)> = HashMap::new();
        let mut unreached_backoff: HashMap<SocketAddr, (Instant, Duration)> = HashMap::new();
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let unreached: Vec<SocketAddr> =
                self.unreachable.lock().iter().map(|(a, _)| *a).collect();
            unreached_backoff.retain(|a, _| unreached.contains(a));
            for addr in unreached {
                let (at, wait) = *unreached_backoff
                    .entry(addr)
                    .or_insert((now + FIRST, FIRST));
                if at > now || self.stop.load(Ordering::Acquire) {
                    continue;
                }
                match self.add_node(addr) {
                    Ok(id) => {
                        tracing::info!(node = id, %addr, "pool member reached at last");
                        unreached_backoff.remove(&addr);
                    }
                    Err(e) => {
                        tracing::debug!(%addr, "member not reached yet: {e}");
                        if let Some(u) =
                            self.unreachable.lock().iter_mut().find(|(a, _)| *a == addr)
                        {
                            u.1 = e.to_string();
                        }
                        let next = (wait * 2).min(MOST);
                        unreached_backoff.insert(addr, (Instant::now() + next, next));
                    }
                }
            }
            let down: Vec<(u32, SocketAddr)> = self
                .nodes
                .lock()
                .values()
                .filter(|n| n.down.lock().is_some())
                .map(|n| (n.desc.node, n.addr))
                .collect();
            backoff.retain(|id, _| down.iter().any(|(d, _)| d == id));
            for (id, addr) in down {
                let (at, wait) = *backoff.entry(id).or_insert((now + FIRST, FIRST));
                if at > now || self.stop.load(Ordering::Acquire) {
                    continue;
                }
                match self.add_node(addr) {
                    Ok(_) => {
                        backoff.remove(&id);
                    }
                    Err(e) => {
                        tracing::debug!(node = id, %addr, "not rejoined yet: {e}");
                        let next = (wait * 2).min(MOST);
                        backoff.insert(id, (Instant::now() + next, next));
                    }
                }
            }
            let until = Instant::now() + FIRST;
            while !self.stop.load(Ordering::Acquire) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::park_timeout(left);
            }
        }
    }

    /// Claims this id's lease slot (probing from its hash), or takes it over after a
    /// restart: the decisions are `takeover::Takeover`'s, this performs its steps.
    pub(super) async fn take_slot(&self, node: &Node) -> Result<u64> {
        let l = node.desc.layout;
        let mut t = Takeover::new(
            self.id,
            node.desc.lease,
            l.client_count,
            hash64(self.id) % l.client_count,
            crate::util::random_nonzero()?,
        )
        .on_node(node.desc.node, l, node.windows.is_some());
        // A takeover watches for half a lease, and may wait out an expiry in progress: two
        // leases and the connect timeout are plenty. A slot that never settles is the
        // server's fault (or its lie), not a reason to hang.
        let settle = 2 * node.desc.lease + self.connect_timeout;
        let deadline = Instant::now() + settle;
        let mut answers = Vec::new();
        loop {
            if Instant::now() > deadline {
                return Err(Error::NodeDown {
                    node: node.desc.node,
                    reason: format!(
                        "its lease slot did not settle within {settle:?} (two leases and the \
                         connect timeout)"
                    ),
                });
            }
            let step = t.advance(&mut (), Instant::now(), &answers)?.listed();
            answers.clear();
            match step {
                Step::Do(ops) => {
                    for op in ops {
                        answers.push(self.perform(node, op.io).await?);
                    }
                }
                // Connecting runs this under `engine.run_until` on the caller's thread,
                // before the lease thread (which wakes the client's timers) runs for the
                // node: the wait is the thread's, a heartbeat's period at most.
                Step::Sleep(until) => {
                    let wait = until
                        .min(deadline)
                        .saturating_duration_since(Instant::now());
                    if !wait.is_zero() {
                        std::thread::sleep(wait);
                    }
                }
                Step::One(_) | Step::Wait => {}
                Step::Done(taken) => {
                    if let Some(asked) = taken.renewed {
                        node.lease.lock().renewed(asked);
                    }
                    node.beat.store(taken.beat, Ordering::Release);
                    return Ok(taken.slot_at);
                }
            }
        }
    }

    /// Finds the chunks the table says this id owns and rebuilds their views (the
    /// decisions are [`Recover`]'s).
    pub(super) async fn recover(&self, node: &Node) -> Result<()> {
        self.drive(node, Recover::new()).await?;
        // The object store's chunks this id claimed before a restart: its objects stay
        // whatever happens to the id, and the chunks' free room is used again.
        self.drive_in(node, super::node::Books::Durable, Recover::new())
            .await
    }

    /// One lease renewal on `node`: swaps our heartbeat from the value we left to the next
    /// (noticing a lease the server expired, and a slot that is no longer ours, without
    /// touching it) and reads the server's state; resolves to that state. One at a time per
    /// node (the lease loop's).
    async fn renew(&self, node: &Node) -> Result<u64> {
        let at = node.slot.load(Ordering::Acquire) + 8;
        let expected = node.beat.load(Ordering::Acquire);
        let next = next_beat(expected);
        let remote = self.at(node, at, 8, true).await?;
        let old = self.cas(node, remote, expected, next).await?;
        if old == expected {
            node.beat.store(next, Ordering::Release);
        } else {
            // Zeroed, or another client's count since: the server expired our lease and may
            // have handed our chunks to others.
            node.mark_down(format!(
                "lease lost: heartbeat {old}, expected {expected} (expired by the server)"
            ));
        }
        self.read_u64(node, layout::header::STATE).await
    }

    /// What a finished renewal, sent at `sent`, means for `node`.
    fn renewed(&self, node: &Node, sent: Instant, result: Result<u64>) {
        match result {
            Ok(state) => {
                // Counted from the sending: the server counts from when it first reads the
                // new heartbeat, which is later (remote/lease.rs).
                node.lease.lock().renewed(sent);
                node.draining
                    .store(state == STATE_DRAINING, Ordering::Relaxed);
            }
            Err(e) => {
                // Past three quarters of a lease without renewal the server may hand our
                // chunks to others: stop using them.
                if !node.lease.lock().may_use(Instant::now()) {
                    node.mark_down(format!("lease renewal failed: {e}"));
                }
            }
        }
    }

    /// Renews the lease on every node four times per lease, and notices draining servers
    /// and lost leases.
    ///
    /// Each node's renewal runs on its own schedule: a renewal waiting on a dead or slow
    /// node (up to the operation deadline) does not hold back the others, whose leases
    /// would otherwise run out meanwhile.
    pub(super) fn lease_loop(&self) {
        type Renewal<'a> = Pin<Box<dyn Future<Output = Result<u64>> + Send + 'a>>;
        let mut in_flight: Vec<(Arc<Node>, Instant, Renewal<'_>)> = Vec::new();
        let mut due: HashMap<u32, Instant> = HashMap::new();
        let mut cx = TaskContext::from_waker(Waker::noop());
        loop {
            // Stopping, renewals in flight are finished first (each within the operation
            // deadline): dropping one mid-flight would leave its work request, QP and
            // buffers to the engine, which keeps them for good once nobody polls.
            let stopping = self.stop.load(Ordering::Acquire);
            if stopping && in_flight.is_empty() {
                break;
            }
            let now = Instant::now();
            let mut next = now + Duration::from_millis(250);
            let nodes: Vec<(u32, Arc<Node>)> = if stopping {
                Vec::new()
            } else {
                self.nodes
                    .lock()
                    .iter()
                    .map(|(&id, n)| (id, n.clone()))
                    .collect()
            };
            for (id, node) in nodes {
                if node.down.lock().is_some()
                    || in_flight.iter().any(|(n, _, _)| Arc::ptr_eq(n, &node))
                {
                    continue;
                }
                let at = *due.entry(id).or_insert(now);
                if at > now {
                    next = next.min(at);
                    continue;
                }
                let every = node.lease.lock().renew_every();
                due.insert(id, now + every);
                next = next.min(now + every);
                let n = node.clone();
                in_flight.push((node, now, Box::pin(async move { self.renew(&n).await })));
            }
            if !in_flight.is_empty() {
                self.engine.progress();
                in_flight.retain_mut(|(node, sent, fut)| match fut.as_mut().poll(&mut cx) {
                    Poll::Ready(r) => {
                        self.renewed(node, *sent, r);
                        false
                    }
                    Poll::Pending => true,
                });
            }
            // Wake the tasks whose operations are past their deadline (they then give up).
            let now = Instant::now();
            self.timers.pending.lock().retain(|_, (at, waker)| {
                let due = *at <= now;
                if due {
                    waker.wake_by_ref();
                }
                !due
            });
            // With renewals in flight, come back soon to make progress on them (the soft NIC
            // and the verbs device complete work without us; we only poll the CQ).
            let until = if in_flight.is_empty() {
                next.max(Instant::now() + Duration::from_millis(2))
            } else {
                Instant::now() + Duration::from_micros(200)
            };
            // Parked, not polled: dropping the client unparks it (and, stopping, only the
            // renewals in flight are left: no parking, progress until they are done).
            while !self.stop.load(Ordering::Acquire) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}
