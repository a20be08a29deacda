//! The memory server: exports one registered huge-page region laid out as a pool, hands each
//! client the pool's descriptor when it connects, and reclaims the chunks of clients whose
//! lease expired. It takes no part in allocation, free, or data access: those are one-sided.

mod handshake;
mod isolated;
mod stats;

pub(crate) use handshake::{BUSY, UNAUTHENTICATED};
pub use handshake::{MAX_CONNECTIONS_PER_CLIENT, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PEER};

use super::descriptor::PoolDescriptor;
use super::isolation::Isolation;
use super::layout::{self, Layout};
use super::lease::Reaper;
use super::sweep;
use crate::conn::Listener;
use crate::fabric::{
    AccessFlags, Completion, Context, Cq, Mr, Pd, PreSharedKey, ProviderKind, Qp, RegisteredMemory,
    Shared, WcOpcode,
};
use crate::mr::{HugeOptions, HugeRegion};
use crate::{Error, Result};
use parking_lot::Mutex;
pub use stats::ServerStats;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to run a memory server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// This node's id (unique in the cluster; it names the node in remote pointers).
    pub node: u32,
    /// Bytes of the exported region (a multiple of 2 MiB; the first chunk holds metadata).
    pub size: usize,
    /// Bytes per chunk (a power of two, at least 64 KiB).
    pub chunk_size: u64,
    /// How many clients can hold a lease at once.
    pub clients: u64,
    /// How long a client's lease lasts without renewal (clients renew 4 times per lease).
    pub lease: Duration,
    /// Where to listen for clients.
    pub listen: SocketAddr,
    /// The cluster key: with one, the server proves it holds it in every accept (clients
    /// that have the key refuse servers that cannot: docs/PROTOCOL.md §7.2), and admits only
    /// clients that prove their id with its [`client_key`](crate::remote::client_key) (§7.1;
    /// others are rejected with `unauthenticated`). `None`: no proof either way (clients with
    /// a key refuse this server).
    pub cluster_key: Option<PreSharedKey>,
    /// Whether the server may listen beyond loopback without a cluster key (it refuses to
    /// start otherwise: [`CoreError::Unprotected`](crate::CoreError::Unprotected)). Also set by
    /// [`crate::fabric::ENV_ALLOW_UNAUTHENTICATED`]` = 1`.
    pub allow_unauthenticated: bool,
    /// Whether clients may use the whole region ([`Isolation::Trusted`], the default) or
    /// only their own lease slot and chunks ([`Isolation::Isolated`], enforced by the NIC).
    pub isolation: Isolation,
    /// Isolated mode: the most chunks one client id may own at once (0: no limit). A claim
    /// beyond it is refused, and the client's allocation reports the node full.
    pub max_chunks_per_client: u64,
    /// Isolated mode: the most bytes of chunks one client id (a tenant) may own at once,
    /// its lease's and its store's together (0: no limit). A claim beyond it is refused as
    /// one beyond `max_chunks_per_client` is.
    pub max_bytes_per_client: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            node: 1,
            size: 64 << 20,
            chunk_size: 2 << 20,
            clients: 256,
            lease: Duration::from_secs(2),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            cluster_key: None,
            allow_unauthenticated: false,
            isolation: Isolation::Trusted,
            max_chunks_per_client: 0,
            max_bytes_per_client: 0,
        }
    }
}

struct Inner {
    node: u32,
    /// Proven in every accept, when set.
    cluster_key: Option<PreSharedKey>,
    /// This start's incarnation (random, non-zero).
    incarnation: u64,
    layout: Layout,
    lease: Duration,
    /// The exported memory (see [`export_memory`]).
    region: Mr<Shared>,
    pd: Pd,
    cq: Cq,
    /// Receive buffers for the two-sided messages nobody sends (see `requests_handled`).
    recv_buf: crate::fabric::Mr,
    /// Whether clients are confined to their own slot and chunks.
    isolated: bool,
    /// Isolated mode: chunks one id may own (0: no limit).
    max_chunks_per_client: u64,
    /// Isolated mode: bytes of chunks one id may own (0: no limit).
    max_bytes_per_client: u64,
    /// Isolated mode: the server's own record of slot holders and used chunks.
    ledger: Option<isolated::Ledger>,
    /// Connected clients. Dropped once the id holds no lease slot (expired, or never taken)
    /// and the connection is older than two leases; in isolated mode, also as soon as the
    /// id's lease expires.
    conns: Mutex<Vec<Conn>>,
    stop: AtomicBool,
    draining: AtomicBool,
    connections: AtomicU64,
    reclaimed: AtomicU64,
    expired: AtomicU64,
    requests: AtomicU64,
}

/// One client connection.
pub(super) struct Conn {
    client: u64,
    /// When it was accepted.
    at: Instant,
    /// Isolated mode: its windows and control buffers (declared before `qp`, so dropped
    /// first: a bound window holds a reference to its QP).
    tenant: Option<isolated::Tenant>,
    qp: Qp,
}

/// A memory server (see the module docs). Dropping it stops it at once (as a crash would,
/// for its clients); [`MemoryServer::shutdown`] drains first.
pub struct MemoryServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl sweep::Words for Inner {
    fn load(&self, at: u64) -> u64 {
        self.word(at).load(Ordering::Acquire)
    }

    fn store(&self, at: u64, value: u64) {
        self.word(at).store(value, Ordering::Release)
    }

    fn compare_exchange(&self, at: u64, current: u64, new: u64) -> bool {
        self.word(at)
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn slot_owner(&self, l: &Layout, slot: u64) -> u64 {
        match &self.ledger {
            Some(ledger) => ledger.owner(slot),
            None => self.load(l.client_slot(slot) + layout::slot::OWNER),
        }
    }

    fn free_slot(&self, l: &Layout, slot: u64, owner: u64) {
        let at = l.client_slot(slot) + layout::slot::OWNER;
        match &self.ledger {
            Some(ledger) => {
                if ledger.free(slot, owner) {
                    self.store(at, 0);
                }
            }
            None => {
                self.compare_exchange(at, owner, 0);
            }
        }
    }
}

impl Inner {
    fn word(&self, offset: u64) -> &AtomicU64 {
        self.region
            .atomic_u64(offset as usize)
            .expect("layout offsets are aligned and inside the region")
    }

    fn descriptor(&self) -> PoolDescriptor {
        PoolDescriptor {
            node: self.node,
            region: self.region.remote_region(),
            layout: self.layout,
            lease: self.lease,
            incarnation: self.incarnation,
            isolated: self.isolated,
        }
    }

    fn chunks_owned(&self) -> u64 {
        self.chunks_where(|entry| entry != 0)
    }

    /// Chunks held under a client's lease (not the object store's, which no lease holds).
    fn leased_chunks(&self) -> u64 {
        self.chunks_where(|entry| entry != 0 && entry & crate::remote::layout::DURABLE_TAG == 0)
    }

    fn chunks_where(&self, f: impl Fn(u64) -> bool) -> u64 {
        (0..self.layout.chunk_count)
            .filter(|&i| {
                f(self
                    .word(self.layout.table_entry(i))
                    .load(Ordering::Acquire))
            })
            .count() as u64
    }

    /// The counters ([`MemoryServer::stats`], and its context's metrics).
    fn stats(&self) -> ServerStats {
        ServerStats {
            chunks: self.layout.chunk_count,
            chunks_owned: self.chunks_owned(),
            lease_slots: self.layout.client_count,
            clients: (0..self.layout.client_count)
                .filter(|&s| {
                    self.word(self.layout.client_slot(s))
                        .load(Ordering::Acquire)
                        != 0
                })
                .count() as u64,
            connections: self.connections.load(Ordering::Relaxed),
            connected: self.conns.lock().len() as u64,
            reclaimed_chunks: self.reclaimed.load(Ordering::Relaxed),
            expired_clients: self.expired.load(Ordering::Relaxed),
            requests_handled: self.requests.load(Ordering::Relaxed),
        }
    }

    /// Every quarter lease: counts two-sided messages, and expires clients whose heartbeat
    /// did not move for a whole lease.
    fn reaper_loop(self: &Arc<Self>) {
        let mut reaper = Reaper::new(self.lease);
        let tick = reaper.tick();
        let mut buf = [Completion::EMPTY; 16];
        while !self.stop.load(Ordering::Acquire) {
            let until = Instant::now() + tick;
            while !self.stop.load(Ordering::Acquire) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::park_timeout(left); // the server's drop unparks it
            }
            // In isolated mode the control loop polls the CQ (and counts requests).
            if !self.isolated {
                if let Ok(n) = self.cq.poll(&mut buf) {
                    let handled = buf[..n]
                        .iter()
                        .filter(|c| c.is_ok() && c.opcode == WcOpcode::Recv)
                        .count();
                    self.requests.fetch_add(handled as u64, Ordering::Relaxed);
                }
            }
            let now = Instant::now();
            let swept = if self.isolated {
                self.sweep_isolated(&mut reaper, now)
            } else {
                sweep::sweep(&mut reaper, &self.layout, &**self, now, sweep::Reclaim::Now)
            };
            self.reclaimed.fetch_add(swept.reclaimed, Ordering::Relaxed);
            self.expired
                .fetch_add(swept.expired.len() as u64, Ordering::Relaxed);
            for owner in &swept.expired {
                tracing::info!(node = self.node, owner, "lease expired: chunks taken back");
            }
            let owners = swept.holders;
            self.drop_stale(&owners, now);
        }
    }

    /// The sweep of an isolated server, in the order that keeps an expired tenant's windows
    /// from outliving its lease: expire under the connection lock (no slot or chunk is
    /// assigned meanwhile), close the expired ids' connections (revoking their windows; off
    /// the lock, as rxe can take tens of seconds), then, under the lock again, close any
    /// connection such an id opened meanwhile and only then take back its chunks and free
    /// its slot. Returns what the sweep did, with `reclaimed` counted.
    fn sweep_isolated(self: &Arc<Self>, reaper: &mut Reaper, now: Instant) -> sweep::Swept {
        let expired_of = |conns: &mut Vec<Conn>, ids: &[u64]| -> Vec<Conn> {
            let (gone, keep) = conns.drain(..).partition(|c| ids.contains(&c.client));
            *conns = keep;
            gone
        };
        let (mut swept, gone) = {
            let mut conns = self.conns.lock();
            let swept = sweep::sweep(reaper, &self.layout, &**self, now, sweep::Reclaim::Later);
            let gone = expired_of(&mut conns, &swept.expired);
            (swept, gone)
        };
        drop(gone); // revokes their windows and disconnects them
        if swept.pending.is_empty() {
            return swept;
        }
        let mut conns = self.conns.lock();
        drop(expired_of(&mut conns, &swept.expired));
        for &(slot, owner) in &swept.pending {
            swept.reclaimed += sweep::release(&self.layout, &**self, slot, owner);
        }
        swept
    }

    /// Disconnects clients that hold no lease (expired, or never took one) and connected
    /// more than two leases ago: their QPs, sockets and responder threads go (they were
    /// kept for the life of the server before).
    fn drop_stale(&self, owners: &std::collections::HashSet<u64>, now: Instant) {
        let gone: Vec<Conn> = {
            let mut conns = self.conns.lock();
            let (keep, gone) = conns.drain(..).partition(|c| {
                owners.contains(&c.client) || now.saturating_duration_since(c.at) < 2 * self.lease
            });
            *conns = keep;
            gone
        };
        for c in &gone {
            tracing::debug!(
                node = self.node,
                client = c.client,
                "client gone: disconnected"
            );
        }
    }
}

impl MemoryServer {
    /// Allocates and registers the region on `ctx`, lays out the pool, and starts serving.
    pub fn start(ctx: &Context, cfg: ServerConfig) -> Result<Self> {
        crate::fabric::check_exposure(
            "pool server",
            cfg.listen,
            cfg.cluster_key.is_some(),
            cfg.allow_unauthenticated,
            "Give the servers and their clients the same cluster key: `head -c 32 \
             /dev/urandom > /etc/rdmapool-pool.key; chmod 600 /etc/rdmapool-pool.key`, then \
             ServerConfig::cluster_key and ClientConfig::cluster_key \
             (PreSharedKey::from_file), or RDMAPOOL_POOL_KEY_FILE for rdma-tool.",
        )?;
        let layout = Layout::new(cfg.size as u64, cfg.chunk_size, cfg.clients)?;
        if cfg.lease < Duration::from_millis(10) || cfg.lease > layout::MAX_LEASE {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "lease (ms)",
                value: cfg.lease.as_millis() as u64,
                min: 10,
                max: layout::MAX_LEASE.as_millis() as u64,
            }));
        }
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(4096)?;
        let isolated = cfg.isolation == Isolation::Isolated;
        // Isolated: no remote rights on the region itself; windows grant them per client.
        let access = if isolated {
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND
        } else {
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_ATOMIC
        };
        let region = export_memory(&pd, cfg.size, access, isolated)?;
        let recv_buf = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
        let listener = Listener::bind(&pd, cfg.listen)?;
        let addr = listener.local_addr();
        let inner = Arc::new(Inner {
            node: cfg.node,
            incarnation: crate::util::random_nonzero()?,
            layout,
            lease: cfg.lease,
            cluster_key: cfg.cluster_key.clone(),
            region,
            pd,
            cq,
            recv_buf,
            isolated,
            max_chunks_per_client: cfg.max_chunks_per_client,
            max_bytes_per_client: cfg.max_bytes_per_client,
            ledger: isolated.then(|| isolated::Ledger::new(&layout)),
            conns: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        });
        // The mapping is zeroed: every client slot and chunk is free. The header says what
        // the memory is and that the server runs.
        inner
            .word(layout::header::STATE)
            .store(layout::STATE_RUNNING, Ordering::Release);
        inner
            .word(layout::header::INCARNATION)
            .store(inner.incarnation, Ordering::Release);
        inner
            .word(layout::header::MAGIC)
            .store(layout::POOL_MAGIC, Ordering::Release);
        let a = inner.clone();
        let accept =
            crate::util::spawn_named("rdmapool-pool-accept", move || a.accept_loop(listener))?;
        let r = inner.clone();
        let reaper = crate::util::spawn_named("rdmapool-pool-reaper", move || r.reaper_loop())?;
        let mut threads = vec![accept, reaper];
        if isolated {
            let c = inner.clone();
            threads.push(crate::util::spawn_named(
                "rdmapool-pool-control",
                move || c.control_loop(),
            )?);
        }
        // Listed in its context's metrics while it lives.
        let weak = Arc::downgrade(&inner);
        ctx.metrics().0.sources.register(Box::new(move || {
            weak.upgrade().map(|i| i.stats().section(i.node))
        }));
        Ok(Self {
            inner,
            addr,
            threads,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This start's incarnation (see [`PoolDescriptor::incarnation`]).
    pub fn incarnation(&self) -> u64 {
        self.inner.incarnation
    }

    /// The descriptor clients receive.
    pub fn descriptor(&self) -> PoolDescriptor {
        self.inner.descriptor()
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        self.inner.stats()
    }

    /// Graceful shutdown: new connections are refused, connected clients see the pool
    /// draining (at their next lease renewal) and place no new chunks here; waits up to
    /// `drain` for every chunk held under a lease to be released, then stops. Returns the
    /// chunks still held under a lease. (The object store's chunks are not waited for: no
    /// client gives them back; their objects' other replicas outlive this server.)
    pub fn shutdown(self, drain: Duration) -> u64 {
        self.inner.draining.store(true, Ordering::Release);
        self.inner
            .word(layout::header::STATE)
            .store(layout::STATE_DRAINING, Ordering::Release);
        let until = Instant::now() + drain;
        let mut left = self.inner.leased_chunks();
        while left > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
            left = self.inner.leased_chunks();
        }
        left
    }
}

/// Allocates and registers the exported memory, zeroed. A trusted server on the soft
/// provider takes memory the soft NIC owns (a memfd), which clients on this host map and
/// reach at memory speed without this process's CPU, as they would a region on a NIC
/// (trusted clients may write the whole region anyway). An isolated server, and every server
/// on hardware, registers huge-page memory, which no other process can map.
fn export_memory(pd: &Pd, size: usize, access: AccessFlags, isolated: bool) -> Result<Mr<Shared>> {
    if pd.provider() == ProviderKind::Soft && !isolated {
        return Ok(pd.alloc_mr(size, access)?.into_shared());
    }
    let memory = HugeRegion::alloc(size, HugeOptions::default())?;
    Ok(pd
        .register(memory, access)
        .map_err(Error::from)?
        .into_shared())
}

impl Drop for MemoryServer {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            t.thread().unpark();
            let _ = t.join();
        }
        // Disconnect everyone before the region goes.
        self.inner.conns.lock().clear();
    }
}
