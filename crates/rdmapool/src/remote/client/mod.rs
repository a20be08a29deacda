//! The pool client: connects to memory servers, learns each one from its descriptor, and
//! allocates, frees, reads, writes and updates remote memory with one-sided operations only.
//! The public API is here; `session` connects and keeps leases, `alloc` claims, allocates
//! and frees, `ops` holds the one-sided primitives with their deadline.

mod alloc;
mod ops;
mod session;
mod stats;

pub use stats::NodeStats;

use ops::{timed, Timers};

use super::descriptor::PoolDescriptor;
use super::layout::ChunkShape;
use super::membership::Membership;
use super::placement::{NodeLoad, Placement, RoundRobin};
use super::RemotePtr;
use crate::cq::{AsyncQp, Engine, EngineConfig, Progress};
use crate::fabric::{AccessFlags, Context, Mr, Pd, RegisteredMemory, RemoteAddr};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
}

impl ClientConfig {
    /// Defaults for `client_id`: round-robin placement, caller-driven progress, 5 s connect.
    pub fn new(client_id: u64) -> Self {
        Self {
            client_id,
            placement: Box::new(RoundRobin::default()),
            progress: Progress::Caller,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// A chunk this client owns: its shape and what it knows of its bitmap (the client is the
/// only one that sets bits; others only clear them, so a set bit here may be stale, a clear
/// one never is).
struct ChunkView {
    index: u64,
    shape: ChunkShape,
    bits: Vec<u64>,
    /// Objects reserved locally and not yet committed remotely.
    pending: u64,
}

impl ChunkView {
    fn free_bit(&self) -> Option<u64> {
        for (w, &word) in self.bits.iter().enumerate() {
            if word != u64::MAX {
                let bit = (!word).trailing_zeros() as u64;
                let obj = w as u64 * 64 + bit;
                if obj < self.shape.object_count {
                    return Some(obj);
                }
            }
        }
        None
    }

    fn is_empty(&self) -> bool {
        self.pending == 0 && self.bits.iter().all(|&w| w == 0)
    }
}

/// One memory server as this client uses it.
struct Node {
    desc: PoolDescriptor,
    qp: AsyncQp,
    /// Offset of this client's lease slot (set once it is taken).
    slot: AtomicU64,
    chunks: Mutex<Vec<ChunkView>>,
    /// Chunk claims of this client on this node, one at a time.
    claiming: tokio::sync::Mutex<()>,
    down: Mutex<Option<String>>,
    draining: AtomicBool,
    last_renewal: Mutex<Instant>,
    /// The lease heartbeat as this client last left it (only this client adds to it; the
    /// server zeroes it when the lease expires, which the next renewal notices).
    beat: AtomicU64,
    used: AtomicU64,
}

impl Node {
    fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.desc.region.addr + offset,
            rkey: self.desc.region.rkey,
        }
    }

    fn check_up(&self) -> Result<()> {
        match &*self.down.lock() {
            Some(reason) => Err(Error::NodeDown {
                node: self.desc.node,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn mark_down(&self, reason: String) {
        tracing::warn!(node = self.desc.node, "pool node down: {reason}");
        self.down.lock().get_or_insert(reason);
    }
}

/// Registered scratch words for atomics results and staged chunk headers.
struct Scratch {
    mr: Arc<Mr>,
    free: Mutex<Vec<usize>>,
}

/// One scratch word, given back on drop.
struct Word {
    scratch: Arc<Scratch>,
    offset: usize,
}

impl Drop for Word {
    fn drop(&mut self) {
        self.scratch.free.lock().push(self.offset);
    }
}

struct Shared {
    id: u64,
    pd: Pd,
    engine: Engine,
    nodes: Mutex<HashMap<u32, Arc<Node>>>,
    placement: Mutex<Box<dyn Placement>>,
    scratch: Arc<Scratch>,
    stop: AtomicBool,
    connect_timeout: Duration,
    timers: Timers,
}

/// A client of the remote memory pool (see the module docs).
pub struct PoolClient {
    shared: Arc<Shared>,
    lease_thread: Option<std::thread::JoinHandle<()>>,
    /// Servers of the membership that did not answer `connect`, with why.
    unreachable: Vec<(SocketAddr, String)>,
}

const SCRATCH_WORDS: usize = 4096;

impl PoolClient {
    /// Connects to every server `membership` lists (a server that cannot be reached is
    /// skipped and listed by [`PoolClient::unreachable`]; at least one must answer). Its QPs live on `pd`, so buffers
    /// registered on `pd` are what reads and writes move data through, without copies.
    pub fn connect(
        ctx: &Context,
        pd: &Pd,
        membership: &dyn Membership,
        cfg: ClientConfig,
    ) -> Result<Self> {
        if cfg.client_id == 0 {
            return Err(Error::InvalidArgument("client id 0".into()));
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
            nodes: Mutex::new(HashMap::new()),
            placement: Mutex::new(cfg.placement),
            scratch,
            stop: AtomicBool::new(false),
            connect_timeout: cfg.connect_timeout,
            timers: Timers::new(cfg.progress == Progress::Caller),
        });
        let mut errors = Vec::new();
        let members = membership.servers()?;
        for addr in &members {
            if let Err(e) = shared.add_node(*addr) {
                tracing::debug!(%addr, "memory server unreachable: {e}");
                errors.push((*addr, e.to_string()));
            }
        }
        if shared.nodes.lock().is_empty() {
            let said: Vec<String> = errors.iter().map(|(a, e)| format!("{a}: {e}")).collect();
            return Err(Error::Connection {
                peer: format!("{members:?}"),
                reason: format!("no memory server answered: {}", said.join("; ")),
            });
        }
        let s = shared.clone();
        let lease_thread = std::thread::Builder::new()
            .name("rdmapool-pool-lease".into())
            .spawn(move || s.lease_loop())
            .map_err(|e| Error::Sys {
                call: "spawn",
                source: e,
            })?;
        Ok(Self {
            shared,
            lease_thread: Some(lease_thread),
            unreachable: errors,
        })
    }

    /// The servers of the membership that could not be reached when this client connected,
    /// each with the error (empty when all answered).
    pub fn unreachable(&self) -> &[(SocketAddr, String)] {
        &self.unreachable
    }

    /// The protection domain its QPs live on: register local buffers here.
    pub fn pd(&self) -> &Pd {
        &self.shared.pd
    }

    /// Connects to one more server (membership grew).
    pub fn add_server(&self, addr: SocketAddr) -> Result<u32> {
        self.shared.add_node(addr)
    }

    /// Stops using a server (membership shrank): its pointers fail with `NodeDown`.
    pub fn remove_server(&self, node: u32) {
        if let Some(n) = self.shared.nodes.lock().remove(&node) {
            n.mark_down("left the membership".into());
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
    pub async fn alloc(&self, size: u64, key: Option<u64>) -> Result<RemotePtr> {
        self.shared.alloc(size, key).await
    }

    /// Frees an allocation (any client may free any allocation).
    pub async fn free(&self, ptr: RemotePtr) -> Result<()> {
        self.shared.free(ptr).await
    }

    /// Checks, one-sided, that `ptr` is a live allocation now: `Err(NotAllocated)` when it
    /// was freed, when the server took its chunk back because the lease of the client that
    /// allocated it ran out, or when `ptr` names no object. READ, WRITE and the atomics do
    /// not check this (it costs a READ); use it where a pointer comes from outside, such as
    /// a command line. A snapshot only: another client may free the object right after.
    pub async fn check_live(&self, ptr: RemotePtr) -> Result<()> {
        self.shared.check_live(ptr).await
    }

    /// Writes `len` bytes of `local` (from `local_offset`) at `offset` of `ptr`.
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
        let (node, remote) = match self.shared.target(ptr, offset, len as u64) {
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
    pub async fn compare_and_swap(
        &self,
        ptr: RemotePtr,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        let (node, remote) = self.shared.target(ptr, offset, 8)?;
        self.shared.cas(&node, remote, compare, swap).await
    }

    /// Fetch-and-add on the 8-byte word at `offset` of `ptr`; returns the old value.
    pub async fn fetch_and_add(&self, ptr: RemotePtr, offset: u64, add: u64) -> Result<u64> {
        let (node, remote) = self.shared.target(ptr, offset, 8)?;
        self.shared.faa(&node, remote, add).await
    }

    /// The live allocations in this client's chunks, read from the servers (after a restart
    /// with the same id, what the predecessor allocated). Lengths are the objects' sizes.
    pub async fn allocations(&self) -> Result<Vec<RemotePtr>> {
        let mut out = Vec::new();
        for node in self.shared.live_nodes() {
            let views: Vec<(u64, ChunkShape)> = node
                .chunks
                .lock()
                .iter()
                .map(|c| (c.index, c.shape))
                .collect();
            for (index, shape) in views {
                let bits = self.shared.read_bitmap(&node, index, shape).await?;
                let base = node.desc.layout.chunk(index) + shape.first_object;
                for obj in 0..shape.object_count {
                    if bits[(obj / 64) as usize] & (1 << (obj % 64)) != 0 {
                        out.push(RemotePtr {
                            node: node.desc.node,
                            offset: base + obj * shape.object_size,
                            len: shape.object_size,
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
        if let Some(t) = self.lease_thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
