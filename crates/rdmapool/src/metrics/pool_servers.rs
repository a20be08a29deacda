//! The memory servers (`remote::MemoryServer`) alive in the process: each registers a probe
//! when it starts, and a snapshot reads their counters then. A server that was dropped
//! leaves the listing at the next snapshot.

use crate::remote::ServerStats;
use std::sync::Mutex;

/// Reads one server's node id and counters; `None` once the server is gone.
pub(crate) type Probe = Box<dyn Fn() -> Option<(u32, ServerStats)> + Send + Sync>;

static SERVERS: Mutex<Vec<Probe>> = Mutex::new(Vec::new());

/// Lists a server (called by `MemoryServer::start`).
pub(crate) fn register(probe: Probe) {
    SERVERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(probe);
}

/// The live servers' node ids and counters, by node id; forgets the servers that are gone.
pub(crate) fn snapshot() -> Vec<(u32, ServerStats)> {
    let mut probes = SERVERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut out = Vec::new();
    probes.retain(|p| match p() {
        Some(s) => {
            out.push(s);
            true
        }
        None => false,
    });
    out.sort_by_key(|&(node, _)| node);
    out
}
