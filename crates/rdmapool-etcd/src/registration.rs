//! The server side: a key under a lease kept alive from a thread.

use super::gateway::*;
use super::*;
use rdmapool_pool::{Error, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A memory server's entry in etcd, kept alive while this lives (see the module docs).
/// Dropping it revokes the lease (one request, bounded by `request_timeout` per endpoint;
/// if etcd cannot be reached the lease expires instead).
pub struct EtcdRegistration {
    key: String,
    lease: Arc<AtomicU64>,
    gateway: Arc<Gateway>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    renewals: Arc<AtomicU64>,
}

impl EtcdRegistration {
    /// Grants a lease of `cfg.ttl`, puts `<prefix>/<node>` = `addr` under it, and keeps the
    /// lease alive from a thread (if etcd forgets the lease, say after a long partition, a
    /// new one is granted and the key put again). `addr` is what clients connect to: a
    /// routable address, not `0.0.0.0`.
    pub fn register(cfg: &EtcdConfig, node: u32, addr: SocketAddr) -> Result<Self> {
        if addr.ip().is_unspecified() || addr.port() == 0 {
            return Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                name: "address registered in etcd".into(),
                value: addr.to_string(),
                reason: "clients need a routable ip and a port".into(),
            }));
        }
        let gateway = Arc::new(Gateway::new(cfg)?);
        let key = cfg.key(node);
        let value = addr.to_string();
        let lease = gateway.grant(cfg.ttl)?;
        if let Err(e) = gateway.put(&key, &value, lease) {
            let _ = gateway.revoke(lease);
            return Err(e);
        }
        let lease = Arc::new(AtomicU64::new(lease as u64));
        let stop = Arc::new(AtomicBool::new(false));
        let renewals = Arc::new(AtomicU64::new(0));
        let (g, l, s, r, k, ttl) = (
            gateway.clone(),
            lease.clone(),
            stop.clone(),
            renewals.clone(),
            key.clone(),
            cfg.ttl,
        );
        let thread = std::thread::Builder::new()
            .name("rdmapool-etcd-lease".into())
            .spawn(move || keep_alive_loop(&g, &l, &s, &r, &k, &value, ttl))
            .map_err(|e| {
                Error::Core(rdmapool_pool::CoreError::Sys {
                    call: "spawn",
                    source: e,
                })
            })?;
        tracing::info!(key, %addr, lease = lease.load(Ordering::Relaxed), "registered in etcd");
        Ok(Self {
            key,
            lease,
            gateway,
            stop,
            thread: Some(thread),
            renewals,
        })
    }

    /// The key this server is registered under.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Successful lease renewals so far.
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// Stops renewing without revoking: the key stays until the lease runs out, as after a
    /// crash (for tests, and for a server that wants clients to keep it a little longer).
    pub fn abandon(mut self) {
        self.stop_thread();
    }

    pub(super) fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for EtcdRegistration {
    fn drop(&mut self) {
        if self.thread.is_none() {
            return; // abandoned
        }
        self.stop_thread();
        let lease = self.lease.load(Ordering::Relaxed) as i64;
        if let Err(e) = self.gateway.revoke(lease) {
            tracing::warn!(
                key = self.key,
                "revoking the etcd lease: {e} (it expires instead)"
            );
        }
    }
}

pub(super) fn keep_alive_loop(
    g: &Gateway,
    lease: &AtomicU64,
    stop: &AtomicBool,
    renewals: &AtomicU64,
    key: &str,
    value: &str,
    ttl: Duration,
) {
    let period = ttl / 3;
    let mut next = Instant::now() + period;
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < next {
            std::thread::park_timeout(next - now);
            continue;
        }
        let id = lease.load(Ordering::Relaxed) as i64;
        let r = g.keep_alive(id).and_then(|alive| {
            if alive {
                return Ok(());
            }
            tracing::warn!(key, "etcd lost the lease: registering again");
            let fresh = g.grant(ttl)?;
            g.put(key, value, fresh)?;
            lease.store(fresh as u64, Ordering::Relaxed);
            Ok(())
        });
        match r {
            Ok(()) => {
                renewals.fetch_add(1, Ordering::Relaxed);
                next = Instant::now() + period;
            }
            Err(e) => {
                tracing::warn!(key, "renewing the etcd lease: {e}");
                next = Instant::now() + Duration::from_millis(200).min(period);
            }
        }
    }
}
