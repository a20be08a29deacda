//! The pool client: connects to memory servers, learns each one from its descriptor, and
//! allocates, frees, reads, writes and updates remote memory with one-sided operations only.
//! The public API is here; `session` connects and keeps leases, `chunks` decides
//! allocation, free and recovery as state machines without I/O (as `takeover` does for the
//! lease slot), `alloc` places allocations and performs the machines' operations, `ops`
//! holds the one-sided primitives with their deadline.

mod alloc;
mod batch;
pub(crate) mod chunks;
mod isolated;
mod node;
mod ops;
pub mod regions;
mod session;
#[cfg(test)]
mod sim;
mod stats;
pub(crate) mod takeover;

pub use batch::{BatchOutcome, PoolBatch};
pub use stats::NodeStats;

use node::{Books, Node, Scratch, Word};
use ops::{timed, Timers};

use super::layout::ChunkShape;
use super::membership::Membership;
use super::placement::{NodeLoad, Placement, RoundRobin};
use super::RemotePtr;
use crate::cq::{Engine, EngineConfig, Progress};
use crate::fabric::{AccessFlags, Context, Pd, RegisteredMemory};
use crate::{Error, Result};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How a client runs.
pub struct ClientConfig {
    /// Who this client is (non-zero). A client restarted with the same id finds the
    /// allocations its predecessor made, if its lease has not expired meanwhile.
    pub client_id: u64,
    /// Where new allocations go.
    pub placement: Box<dyn Placement>,
    /// Who polls completions ([`Progress::Caller`]: whoever awaits, through
    /// [`PoolClient::block_on`]; [`Progress::Event`] inside a tokio runtime).
    pub progress: Progress,
    /// How long connecting to a server may take.
    pub connect_timeout: Duration,
    /// The cluster key: with one, a server must prove it holds it when this client connects
    /// ([`Error::Unauthenticated`] otherwise; the server is listed by
    /// [`PoolClient::unreachable`] and never used), so a server that is not the cluster's
    /// (a rogue membership entry, a key rewritten to point elsewhere) gets no allocation.
    /// `None`: servers are not checked. With the cluster key this client also proves its
    /// id to servers (which require it when they have the key): it derives its
    /// [`client_key`](crate::remote::client_key) from it.
    pub cluster_key: Option<crate::fabric::PreSharedKey>,
    /// This client id's own key ([`client_key`](crate::remote::client_key) of the cluster
    /// key and this id), for a client that is not given the cluster key itself (a tenant):
    /// it proves this id, and no other, to servers with the cluster key, and checks their
    /// proofs as `cluster_key` does. Used instead of `cluster_key` when both are set.
    pub client_key: Option<crate::fabric::PreSharedKey>,
}

impl ClientConfig {
    /// Defaults for `client_id`: round-robin placement, caller-driven progress, 5 s connect.
    pub fn new(client_id: u64) -> Self {
        Self {
            client_id,
            placement: Box::new(RoundRobin::default()),
            progress: Progress::Caller,
            connect_timeout: Duration::from_secs(5),
            cluster_key: None,
            client_key: None,
        }
    }
}

struct Shared {
    id: u64,
    pd: Pd,
    engine: Engine,
    nodes: Mutex<FxHashMap<u32, Arc<Node>>>,
    placement: Mutex<Box<dyn Placement>>,
    scratch: Arc<Scratch>,
    stop: AtomicBool,
    connect_timeout: Duration,
    /// This id's key: proves the id in every hello, and checks servers' proofs.
    client_key: Option<crate::fabric::PreSharedKey>,
    timers: Timers,
    /// What `connect` could not join, and why.
    unreachable: Mutex<Vec<(SocketAddr, String)>>,
    /// Nodes that left the membership (`remove_server`) under an incarnation, and since
    /// when: one may come back under the same incarnation with what it held, so the store
    /// clears no tombstone until a complete repair has seen it back, it came back as a new
    /// incarnation, or [`DEPARTED_MEMORY`] passed (docs/STORE.md section 8).
    departed: Mutex<Vec<(u32, u64, std::time::Instant)>>,
    /// Registered staging buffers for the object store's reads and writes, made on first
    /// use (the store's hot path never registers memory below 2 MiB).
    staging_buffers: std::sync::OnceLock<crate::buf::BufferPool>,
    /// Staging regions of the READs of one step on one node that did not fit one pool
    /// buffer, kept for the next such steps (taken while in use; at most
    /// `regions::BULK_KEPT` bytes in all).
    bulk_staging: Mutex<Vec<crate::fabric::Mr<crate::fabric::Shared>>>,
}

/// A client of the remote memory pool (see the module docs).
pub struct PoolClient {
    shared: Arc<Shared>,
    /// The lease and rejoin threads.
    threads: Vec<std::thread::JoinHandle<()>>,
}

const SCRATCH_WORDS: usize = 4096;

/// How long a client keeps in mind a server that left the membership
/// ([`PoolClient::remove_server`]) and has not come back repaired: while it does, the object
/// store clears no tombstone. A server away longer that comes back under the same
/// incarnation (frozen or cut off for over an hour, never restarted) may bring back keys
/// removed meanwhile (docs/STORE.md section 8, the condition of that promise).
pub const DEPARTED_MEMORY: Duration = Duration::from_secs(3600);

impl PoolClient {
    /// Connects to every server `membership` lists, all at once (a server that cannot be
    /// reached is skipped and listed by [`PoolClient::unreachable`]; at
    /// least one must answer, else [`Error::NoServer`], or [`Error::ClientIdInUse`] when a
    /// live client holds this id). Its QPs live on `pd`, so buffers
    /// registered on `pd` are what reads and writes move data through, without copies.
    pub fn connect(
        ctx: &Context,
        pd: &Pd,
        membership: &dyn Membership,
        cfg: ClientConfig,
    ) -> Result<Self> {
        if !(1..=crate::remote::MAX_CLIENT_ID).contains(&cfg.client_id) {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "client id",
                value: cfg.client_id,
                min: 1,
                max: crate::remote::MAX_CLIENT_ID,
            }));
        }
        let pd = pd.clone();
        let cq = ctx.create_cq(8192)?;
        let engine = Engine::new(
            vec![cq],
            EngineConfig {
                progress: cfg.progress,
                ..EngineConfig::default()
            },
        )?;
        let mr = Arc::new(pd.alloc_mr(SCRATCH_WORDS * 8, AccessFlags::LOCAL_WRITE)?);
        let scratch = Arc::new(Scratch {
            mr,
            free: Mutex::new((0..SCRATCH_WORDS).map(|i| i * 8).collect()),
        });
        let shared = Arc::new(Shared {
            id: cfg.client_id,
            pd,
            engine,
            nodes: Mutex::new(FxHashMap::default()),
            placement: Mutex::new(cfg.placement),
            scratch,
            stop: AtomicBool::new(false),
            connect_timeout: cfg.connect_timeout,
            client_key: cfg.client_key.or_else(|| {
                cfg.cluster_key
                    .map(|k| crate::remote::client_key(&k, cfg.client_id))
            }),
            timers: Timers::new(cfg.progress == Progress::Caller),
            unreachable: Mutex::new(Vec::new()),
            departed: Mutex::new(Vec::new()),
            staging_buffers: std::sync::OnceLock::new(),
            bulk_staging: Mutex::new(Vec::new()),
        });
        let members = membership.servers()?;
        // Leases are renewed from the first node joined on (a slow join elsewhere must not
        // let them run out), and down nodes are dialled again (a restarted server rejoins).
        let client = Self::start_threads(shared)?;
        let shared = &client.shared;
        // Every server at once: a restarted client takes its id over on each after half a
        // lease of standing heartbeat, so joining them one after another would take half a
        // lease per server, and the last ones would have reclaimed its chunks meanwhile.
        let results: Vec<(SocketAddr, Result<u32>)> = std::thread::scope(|scope| {
            let joins: Vec<_> = members
                .iter()
                .map(|&addr| (addr, scope.spawn(move || shared.add_node(addr))))
                .collect();
            joins
                .into_iter()
                .map(|(addr, j)| {
                    let r = j.join().unwrap_or_else(|_| {
                        Err(Error::Core(crate::CoreError::Connection {
                            peer: addr.to_string(),
                            reason: "joining panicked".into(),
                        }))
                    });
                    (addr, r)
                })
                .collect()
        });
        let mut unreachable = Vec::new();
        for (addr, r) in results {
            if let Err(e) = r {
                tracing::debug!(%addr, "pool server not joined: {e}");
                unreachable.push((addr, e));
            }
        }
        if shared.nodes.lock().is_empty() {
            // The one typed reason when there is one (an id held by a live client on one
            // server is that on the others too); else every server's reason.
            if let Some(i) = unreachable
                .iter()
                .position(|(_, e)| matches!(e, Error::ClientIdInUse { .. }))
            {
                return Err(unreachable.swap_remove(i).1);
            }
            let reason = if unreachable.is_empty() {
                "the membership lists no server".to_string()
            } else {
                let each: Vec<String> = unreachable
                    .iter()
                    .map(|(addr, e)| format!("{addr}: {e}"))
                    .collect();
                format!("none of {} answered ({})", members.len(), each.join("; "))
            };
            return Err(Error::NoServer { reason });
        }
        *shared.unreachable.lock() = unreachable
            .into_iter()
            .map(|(addr, e)| (addr, e.to_string()))
            .collect();
        Ok(client)
    }

    /// Starts the lease and rejoin threads of a client that has no node yet.
    fn start_threads(shared: Arc<Shared>) -> Result<Self> {
        let mut client = Self {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        let s = shared.clone();
        client.threads.push(crate::util::spawn_named(
            "rdmapool-pool-lease",
            move || s.lease_loop(),
        )?);
        let s = shared;
        client.threads.push(crate::util::spawn_named(
            "rdmapool-pool-rejoin",
            move || s.rejoin_loop(),
        )?);
        Ok(client)
    }

    /// The servers the membership listed that [`PoolClient::connect`] could not join and
    /// that have not answered since, with why. The client dials them again by itself (with
    /// backoff, up to every 5 s); each leaves this list once joined. While any is listed the
    /// object store places no put (its node id, and so its keys, are unknown:
    /// [`Error::MemberUnreached`]).
    pub fn unreachable(&self) -> Vec<(SocketAddr, String)> {
        self.shared.unreachable.lock().clone()
    }

    /// Stops dialling the never-reached members not in `members` (the membership no longer
    /// lists them).
    pub fn forget_unreached(&self, members: &[SocketAddr]) {
        self.shared
            .unreachable
            .lock()
            .retain(|(a, _)| members.contains(a));
    }

    /// The protection domain its QPs live on: register local buffers here.
    pub fn pd(&self) -> &Pd {
        &self.shared.pd
    }

    /// Connects to one more server (membership grew), or to a restarted one; returns its node
    /// id (also when it is already a member under the same incarnation). A server that
    /// answers with a node id this client knows under another incarnation replaces it when
    /// the old one no longer answers (pointers into the old one then fail with
    /// [`Error::StalePointer`]); while the old one still answers, two servers claim the id
    /// and this is refused. A node this client stopped using (down) is also dialled again
    /// by itself, with backoff, and rejoined once it answers as a new incarnation.
    pub fn add_server(&self, addr: SocketAddr) -> Result<u32> {
        self.shared.add_node(addr)
    }

    /// Stops using a server (membership shrank): its pointers fail with `NodeDown`. The
    /// object store keeps it in mind for [`DEPARTED_MEMORY`]: a server that comes back
    /// under the same incarnation may hold removed keys' older versions.
    pub fn remove_server(&self, node: u32) {
        if let Some(n) = self.shared.nodes.lock().remove(&node) {
            n.mark_down("left the membership".into());
            self.shared
                .departed
                .lock()
                .push((node, n.desc.incarnation, std::time::Instant::now()));
        }
    }

    /// The nodes this client uses, with what it knows of them.
    pub fn nodes(&self) -> Vec<NodeLoad> {
        self.shared.loads()
    }

    /// Runs `fut` on this thread, polling the client's completions meanwhile (for
    /// caller-driven progress, and for synchronous callers in any mode).
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        self.shared.engine.run_until(fut)
    }

    /// Allocates `size` bytes somewhere in the pool. `key` steers hash placement.
    ///
    /// # Errors
    /// [`CoreError::OutOfLimits`](crate::CoreError::OutOfLimits) for 0 bytes or more than the
    /// largest object (it says how many bytes that is), [`Error::NoServer`] when no node is up,
    /// [`Error::Draining`] when the nodes that could take it are draining,
    /// [`Error::RemoteExhausted`] when none has room, [`Error::NodeDown`] when the nodes tried
    /// went down during the call.
    pub async fn alloc(&self, size: u64, key: Option<u64>) -> Result<RemotePtr> {
        self.shared.alloc(size, key).await
    }

    /// Frees an allocation (any client may free any allocation).
    ///
    /// # Errors
    /// As [`PoolClient::write`], and [`Error::NotAllocated`] for an allocation that is free
    /// already, or whose chunk the server took back.
    pub async fn free(&self, ptr: RemotePtr) -> Result<()> {
        self.shared.free(ptr).await
    }

    /// Checks, one-sided, that `ptr` is a live allocation now: `Err(NotAllocated)` when it
    /// was freed, when the server took its chunk back because the lease of the client that
    /// allocated it ran out, or when `ptr` names no object. READ, WRITE and the atomics do
    /// not check this (it costs a READ); use it where a pointer comes from outside, such as
    /// a command line. A snapshot only: another client may free the object right after.
    ///
    /// # Errors
    /// As [`PoolClient::free`].
    pub async fn check_live(&self, ptr: RemotePtr) -> Result<()> {
        self.shared.check_live(ptr).await
    }

    /// Writes `len` bytes of `local` (from `local_offset`) at `offset` of `ptr`.
    ///
    /// # Errors
    /// Checked before anything is posted: [`Error::OutOfBounds`] (the access reaches past
    /// `ptr.len`, or `ptr.len` past its object), [`Error::StalePointer`] (`ptr` names
    /// another incarnation of its node, or none), [`Error::NotAllocated`] (`ptr` does not
    /// start an object), [`Error::NodeDown`] (not a member, down, or the lease there not
    /// renewed for three quarters of a lease). Then [`Error::NodeDown`] when the operation
    /// fails on a dead connection or runs past the 5 s deadline, [`Error::Completion`] for
    /// another error completion.
    pub async fn write<B: RegisteredMemory + Send + 'static>(
        &self,
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    ) -> (Result<()>, B) {
        self.transfer(true, ptr, offset, local, local_offset, len)
            .await
    }

    /// Reads `len` bytes at `offset` of `ptr` into `local` (at `local_offset`).
    ///
    /// # Errors
    /// As [`PoolClient::write`].
    pub async fn read<B: RegisteredMemory + Send + 'static>(
        &self,
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    ) -> (Result<()>, B) {
        self.transfer(false, ptr, offset, local, local_offset, len)
            .await
    }

    /// A WRITE (or READ) of `len` bytes between `local` and `offset` of `ptr`, bounds
    /// checked, with the operation deadline; the buffer always comes back.
    async fn transfer<B: RegisteredMemory + Send + 'static>(
        &self,
        write: bool,
        ptr: RemotePtr,
        offset: u64,
        local: B,
        local_offset: usize,
        len: u32,
    ) -> (Result<()>, B) {
        let (node, remote) = match self.shared.target(ptr, offset, len as u64).await {
            Ok(t) => t,
            Err(e) => return (Err(e), local),
        };
        let op = if write {
            node.qp.write(local, local_offset, len, remote)
        } else {
            node.qp.read(local, local_offset, len, remote)
        };
        let (r, b) = timed(&self.shared.timers, &node, op).await;
        (self.shared.seen(&node, r).map(|_| ()), b)
    }

    /// Compare-and-swap on the 8-byte word at `offset` of `ptr`; returns the old value.
    ///
    /// # Errors
    /// As [`PoolClient::write`].
    pub async fn compare_and_swap(
        &self,
        ptr: RemotePtr,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        let (node, remote) = self.shared.target(ptr, offset, 8).await?;
        self.shared.cas(&node, remote, compare, swap).await
    }

    /// Fetch-and-add on the 8-byte word at `offset` of `ptr`; returns the old value.
    ///
    /// # Errors
    /// As [`PoolClient::write`].
    pub async fn fetch_and_add(&self, ptr: RemotePtr, offset: u64, add: u64) -> Result<u64> {
        let (node, remote) = self.shared.target(ptr, offset, 8).await?;
        self.shared.faa(&node, remote, add).await
    }

    /// The counters of this client's progress engine (completions dispatched: a pool batch
    /// adds one per list, a single operation one each).
    pub fn engine_stats(&self) -> crate::cq::EngineStats {
        self.shared.engine.stats()
    }

    /// A batch of small operations to run together: per server, one list with one doorbell
    /// and one completion instead of one of each per operation ([`PoolBatch::run`]).
    /// `B` is the local buffers' type (for a batch of atomics only, any type, such as
    /// [`Mr<Shared>`](crate::fabric::Mr)).
    ///
    /// ```no_run
    /// # use rdmapool_pool::remote::{PoolClient, RemotePtr};
    /// # use rdmapool_pool::fabric::{Mr, Shared};
    /// # async fn f(client: &PoolClient, counter: RemotePtr, obj: RemotePtr, buf: Mr<Shared>) {
    /// let mut batch = client.batch();
    /// batch.fetch_and_add(counter, 0, 1).write(obj, 0, buf, 0, 64);
    /// let outcomes = batch.run().await;
    /// let old = outcomes[0].result.as_ref().ok().copied().flatten();
    /// # let _ = old;
    /// # }
    /// ```
    pub fn batch<B: RegisteredMemory + Send + 'static>(&self) -> PoolBatch<'_, B> {
        PoolBatch::new(self)
    }

    /// The live allocations in this client's chunks, read from the servers (after a restart
    /// with the same id, what the predecessor allocated). Lengths are the objects' sizes.
    pub async fn allocations(&self) -> Result<Vec<RemotePtr>> {
        let mut out = Vec::new();
        for node in self.shared.live_nodes() {
            let views: Vec<(u64, ChunkShape)> = node.book.lock().owned();
            for (index, shape) in views {
                let bits = self.shared.read_bitmap(&node, index, shape).await?;
                let base = node.desc.layout.chunk(index) + shape.first_object;
                for obj in 0..shape.object_count {
                    if bits[(obj / 64) as usize] & (1 << (obj % 64)) != 0 {
                        out.push(RemotePtr {
                            node: node.desc.node,
                            offset: base + obj * shape.object_size,
                            len: shape.object_size,
                            incarnation: node.desc.incarnation,
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Drop for PoolClient {
    fn drop(&mut self) {
        // Stops renewing: chunks stay ours until the lease runs out (a clean close would
        // free them first; a crash looks the same from the server).
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
