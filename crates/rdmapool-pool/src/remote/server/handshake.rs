//! How a memory server takes in clients: each connection request checked (its hello, and
//! with a cluster key its proof) and handed to a handshake thread of its own, within
//! bounds, then listed with what it holds.

use super::super::descriptor::encode_accept;
use super::super::hello::{client_key, unix_now, HelloGate, Refusal};
use super::{isolated, Conn, Inner};
use crate::conn::Listener;
use crate::fabric::{Qp, QpConfig, RecvWr, RegisteredMemory};
use crate::util::inflight::InFlight;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handshakes a server runs at once, at most (each on a thread of its own, ending within
/// its QP timeout).
pub const MAX_HANDSHAKES: usize = 32;
/// Handshakes in progress from one address, at most.
pub const MAX_HANDSHAKES_PER_PEER: usize = 4;
/// The reject a server sends when [`MAX_HANDSHAKES`] (or the per-address share) are in
/// progress; clients ask again after a pause.
pub(crate) const BUSY: &[u8] = b"busy";
/// The reject reason for a hello without a valid proof of its client id, when the server
/// has the cluster key (docs/PROTOCOL.md section 7.1).
pub(crate) const UNAUTHENTICATED: &[u8] = b"unauthenticated";

/// Connections one client id keeps at a server: a new one beyond this replaces the id's
/// oldest (a client holds one per server; the rest is room for reconnects the server has
/// not yet seen replace the old one).
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 4;

impl Inner {
    /// Posts receives on a new connection: a client never sends, and if one did, the
    /// message would be counted as a request the server handled.
    fn post_receives(&self, qp: &Qp) -> Result<()> {
        for i in 0..4u64 {
            let sge = self.recv_buf.sge(i as usize * 64, 64)?;
            qp.post_recv(&[RecvWr {
                wr_id: i,
                sg_list: &[sge],
            }])?;
        }
        Ok(())
    }

    /// Reads connection requests and hands each to a handshake thread of its own, so that
    /// a requester that stalls its handshake delays nobody else. At most
    /// [`MAX_HANDSHAKES`] are in progress, [`MAX_HANDSHAKES_PER_PEER`] from one address;
    /// beyond that a request is rejected with `busy`.
    pub(super) fn accept_loop(self: &Arc<Self>, listener: Listener) {
        let in_flight = InFlight::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PEER);
        let mut gate = HelloGate::new(self.cluster_key.clone());
        let mut handshakes: Vec<std::thread::JoinHandle<()>> = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            handshakes.retain(|h| !h.is_finished());
            let req = match listener.get_request(Duration::from_millis(100)) {
                Ok(r) => r,
                Err(Error::TimedOut(_)) => continue,
                Err(e) => {
                    tracing::debug!(node = self.node, "connection request failed: {e}");
                    continue;
                }
            };
            if self.draining.load(Ordering::Acquire) {
                let _ = req.reject(b"draining");
                continue;
            }
            let hello = req.private_data().to_vec();
            let client = match gate.admit(&hello, unix_now()) {
                Ok(h) => h.client_id,
                Err(Refusal::Malformed(e)) => {
                    tracing::warn!(node = self.node, "refusing a client: {e}");
                    let _ = req.reject(b"bad client hello");
                    continue;
                }
                Err(Refusal::Unauthenticated(why)) => {
                    tracing::warn!(node = self.node, peer = ?req.peer_addr(), "refusing a client: {why}");
                    let _ = req.reject(UNAUTHENTICATED);
                    continue;
                }
                Err(Refusal::Busy) => {
                    let _ = req.reject(BUSY);
                    continue;
                }
            };
            let Some(ticket) = in_flight.try_begin(req.peer_addr().map(|a| a.ip())) else {
                tracing::debug!(node = self.node, peer = ?req.peer_addr(), "busy: too many handshakes");
                let _ = req.reject(BUSY);
                continue;
            };
            let me = self.clone();
            let run = move || {
                me.handshake(req, client, &hello);
                drop(ticket);
            };
            match crate::util::spawn_named("rdmapool-pool-handshake", run) {
                Ok(h) => handshakes.push(h),
                // The request went with the closure: its connection is closed.
                Err(e) => tracing::warn!(node = self.node, "no thread for a handshake: {e}"),
            }
        }
        for h in handshakes {
            let _ = h.join(); // each ends within its QP timeout
        }
    }

    /// Accepts one client: the descriptor (with its proof) in the accept, receives posted,
    /// the connection kept. A client id keeps at most [`MAX_CONNECTIONS_PER_CLIENT`]: a new
    /// one replaces its oldest (a client that restarted, or a CLI run again, reconnects
    /// before the server sees the old connection end).
    fn handshake(&self, req: crate::conn::ConnRequest, client: u64, hello: &[u8]) {
        let key = self.cluster_key.as_ref().map(|k| client_key(k, client));
        let desc = encode_accept(&self.descriptor(), hello, key.as_ref());
        let qp = match req.accept(&self.pd, &self.cq, &self.cq, &QpConfig::default(), &desc) {
            Ok(qp) => qp,
            Err(e) => return tracing::debug!(node = self.node, "accept failed: {e}"),
        };
        let replaced = {
            // Listed before its receives are posted: the control loop finds the connection
            // of every message that arrives (it holds this lock while it looks).
            let mut conns = self.conns.lock();
            let tenant = if self.isolated {
                match isolated::Tenant::new(self, &qp) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        return tracing::warn!(node = self.node, "cannot set up a client: {e}")
                    }
                }
            } else {
                if let Err(e) = self.post_receives(&qp) {
                    tracing::warn!(node = self.node, "cannot post receives: {e}");
                }
                None
            };
            let mut replaced = Vec::new();
            while conns.iter().filter(|c| c.client == client).count() >= MAX_CONNECTIONS_PER_CLIENT
            {
                // `conns` is in accept order: the first of this id is its oldest.
                let oldest = conns
                    .iter()
                    .position(|c| c.client == client)
                    .expect("counted");
                replaced.push(conns.remove(oldest));
            }
            conns.push(Conn {
                client,
                at: Instant::now(),
                tenant,
                qp,
            });
            replaced
        };
        self.connections.fetch_add(1, Ordering::Relaxed);
        if !replaced.is_empty() {
            tracing::debug!(node = self.node, client, "oldest connection replaced");
        }
        drop(replaced); // disconnects them, outside the lock
    }
}
