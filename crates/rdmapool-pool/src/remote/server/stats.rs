//! A memory server's counters ([`MemoryServer::stats`](super::MemoryServer::stats)), and the
//! section its context's metrics show for it (`pool_servers` in JSON, `rdmapool_pool_server_*`
//! in Prometheus, labelled by `node`; docs/METRICS.md).

use crate::fabric::recorder::{Section, Series, SeriesKind};

/// What a memory server has seen (`remote::MemoryServer::stats`).
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

impl ServerStats {
    /// The section of server `node` in its context's metrics.
    pub(crate) fn section(&self, node: u32) -> Section {
        use SeriesKind::{Counter, Gauge};
        let series = |key, metric, kind, help, value| Series {
            key,
            metric,
            kind,
            help,
            value,
        };
        Section {
            family: "pool_servers",
            label: ("node", u64::from(node)),
            series: vec![
                series("leases", "pool_server_leases", Gauge, "Clients holding a lease slot of the memory server.", self.clients),
                series("lease_slots", "pool_server_lease_slots", Gauge, "Lease slots of the memory server.", self.lease_slots),
                series("chunks", "pool_server_chunks", Gauge, "Chunks in the memory server's pool.", self.chunks),
                series("chunks_owned", "pool_server_chunks_owned", Gauge, "Chunks a client owns (the rest are free).", self.chunks_owned),
                series("connected", "pool_server_connected", Gauge, "Client connections open now.", self.connected),
                series("connections", "pool_server_connections_total", Counter, "Client connections accepted.", self.connections),
                series("requests_handled", "pool_server_requests_total", Counter, "Two-sided messages the server's CPU handled (allocation and data access are one-sided).", self.requests_handled),
                series("expired_leases", "pool_server_expired_leases_total", Counter, "Leases that ran out.", self.expired_clients),
                series("reclaimed_chunks", "pool_server_reclaimed_chunks_total", Counter, "Chunks taken back from expired leases.", self.reclaimed_chunks),
            ],
        }
    }
}
