//! The memory servers (`remote::MemoryServer`) alive on a context: each registers a probe
//! with the context's recorder when it starts, and a snapshot reads their counters then. A
//! server that was dropped leaves the listing at the next snapshot.

use std::sync::Mutex;

/// What a memory server has seen (`remote::MemoryServer::stats`; defined here, with the
/// listing, so that the metrics build without the pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Chunks in the pool.
    pub chunks: u64,
    /// Chunks a client owns now.
    pub chunks_owned: u64,
    /// Clients holding a lease now.
    pub clients: u64,
    /// Lease slots: how many clients can hold a lease at once.
    pub lease_slots: u64,
    /// Connections accepted so far.
    pub connections: u64,
    /// Connections open now (a client's is closed once it holds no lease and is older
    /// than two leases).
    pub connected: u64,
    /// Chunks taken back from clients whose lease expired.
    pub reclaimed_chunks: u64,
    /// Leases that expired.
    pub expired_clients: u64,
    /// Two-sided messages the server's CPU handled: allocation, free and data access never
    /// send any, so this stays zero (receives are posted so that one would be counted).
    pub requests_handled: u64,
}

/// Reads one server's node id and counters; `None` once the server is gone.
#[doc(hidden)]
pub type Probe = Box<dyn Fn() -> Option<(u32, ServerStats)> + Send + Sync>;

/// The memory servers started on one context.
#[derive(Default)]
#[doc(hidden)]
pub struct Servers(Mutex<Vec<Probe>>);

impl Servers {
    /// Lists a server (called by `MemoryServer::start`).
    #[doc(hidden)]
    pub fn register(&self, probe: Probe) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(probe);
    }
}

/// The live servers of these listings: node ids and counters, by node id; forgets the
/// servers that are gone.
#[doc(hidden)]
pub fn snapshot<'a>(listings: impl Iterator<Item = &'a Servers>) -> Vec<(u32, ServerStats)> {
    let mut out = Vec::new();
    for l in listings {
        let mut probes =
            l.0.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        probes.retain(|p| match p() {
            Some(s) => {
                out.push(s);
                true
            }
            None => false,
        });
    }
    out.sort_by_key(|&(node, _)| node);
    out
}
