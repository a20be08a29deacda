//! One holder at a time of a named role, through an etcd lease: the store's background
//! repairer is elected this way where the cluster uses etcd (docs/STORE.md section 7).
//!
//! The role's key is `<prefix>/elections/<role>`. A candidate grants itself a lease of the
//! config's TTL, kept alive from a thread (every third of the TTL), and takes the role with
//! one transaction: put the key (its value names the candidate and a random nonce) under its
//! lease if the key does not exist. It holds the role while the key holds its value; the key
//! goes when the holder resigns (its lease is revoked) or stops renewing (the lease runs out,
//! one TTL after a crash or a partition from etcd), and the next candidate to ask takes it.
//! A holder cut off from etcd learns it lost the role at its next renewal: until then two
//! candidates may each believe they hold it, for up to a TTL (the store's repairs are safe
//! side by side, so the store needs no more).

use super::gateway::{b64, int, malformed, text, Gateway};
use super::EtcdConfig;
use parking_lot::Mutex;
use rdmapool_pool::Result;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A candidate for one role (see the module docs). Dropping it resigns.
pub struct EtcdElection {
    gateway: Arc<Gateway>,
    /// `<prefix>/`: where [`EtcdElection::put_if_leading`] writes.
    dir: String,
    key: String,
    /// `<candidate>:<nonce>`: this candidate's value in the role's key.
    value: String,
    ttl: Duration,
    /// The lease this candidate campaigns under (0: none yet, or lost).
    lease: Arc<Mutex<i64>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EtcdElection {
    /// A candidate for `role` under `cfg`'s prefix, named `candidate` (a client id).
    /// Nothing is asked of etcd until [`EtcdElection::lead`].
    ///
    /// # Errors
    /// A bad config ([`CoreError::BadSetting`](rdmapool_pool::CoreError::BadSetting)), or a role name
    /// that is empty or holds `/`; [`Error::Sys`](rdmapool_pool::Error) when the renewal thread
    /// cannot start.
    pub fn new(cfg: &EtcdConfig, role: &str, candidate: u64) -> Result<Self> {
        if role.is_empty() || role.contains('/') {
            return Err(rdmapool_pool::Error::Core(
                rdmapool_pool::CoreError::BadSetting {
                    name: "etcd election role".into(),
                    value: role.into(),
                    reason: "a non-empty name without '/'".into(),
                },
            ));
        }
        let gateway = Arc::new(Gateway::new(cfg)?);
        let lease = Arc::new(Mutex::new(0i64));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, l, s, ttl) = (gateway.clone(), lease.clone(), stop.clone(), cfg.ttl);
        let thread = rdmapool_core::util::spawn_named("rdmapool-etcd-elect", move || {
            renew_loop(&g, &l, &s, ttl)
        })?;
        Ok(Self {
            gateway,
            dir: cfg.dir(),
            key: format!("{}elections/{role}", cfg.dir()),
            value: format!(
                "{candidate}:{:016x}",
                rdmapool_core::util::random_nonzero()?
            ),
            ttl: cfg.ttl,
            lease,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether this candidate holds the role now, taking it if nobody does.
    ///
    /// # Errors
    /// etcd could not be reached or answered something else than etcd answers.
    pub fn lead(&self) -> Result<bool> {
        let lease = {
            let mut lease = self.lease.lock();
            if *lease == 0 {
                *lease = self.gateway.grant(self.ttl)?;
            }
            *lease
        };
        let v = self.gateway.call(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": b64(&self.key), "target": "CREATE", "create_revision": "0" }],
                "success": [{ "request_put": {
                    "key": b64(&self.key), "value": b64(&self.value), "lease": lease.to_string(),
                }}],
                "failure": [{ "request_range": { "key": b64(&self.key) } }],
            }),
        );
        let v = match v {
            // The lease expired since the renewal thread last saw it: campaign afresh.
            Err(rdmapool_pool::Error::Core(rdmapool_pool::CoreError::Connection {
                reason,
                ..
            })) if reason.contains("lease not found") => {
                *self.lease.lock() = 0;
                return Ok(false);
            }
            r => r?,
        };
        if v.get("succeeded").and_then(Value::as_bool) == Some(true) {
            return Ok(true);
        }
        Ok(holder_value(&v)?.as_deref() == Some(self.value.as_str()))
    }

    /// Writes `value` at `<prefix>/<key>` only if this candidate holds the role at that
    /// moment, in one transaction that compares the role's key with this candidate's value:
    /// a leader's fenced write, which a former holder that has not yet learned it lost the
    /// role cannot make. Returns etcd's revision of the write (it names the write in etcd's
    /// one order of changes), or `None` when this candidate does not hold the role.
    ///
    /// # Errors
    /// As [`EtcdElection::lead`]; a `key` that is empty.
    pub fn put_if_leading(&self, key: &str, value: &str) -> Result<Option<i64>> {
        if key.is_empty() {
            return Err(rdmapool_pool::Error::Core(
                rdmapool_pool::CoreError::BadSetting {
                    name: "etcd key under the prefix".into(),
                    value: String::new(),
                    reason: "a non-empty key".into(),
                },
            ));
        }
        let target = format!("{}{key}", self.dir);
        let v = self.gateway.call(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": b64(&self.key), "target": "VALUE", "value": b64(&self.value) }],
                "success": [{ "request_put": { "key": b64(&target), "value": b64(value) }}],
            }),
        )?;
        if v.get("succeeded").and_then(Value::as_bool) != Some(true) {
            return Ok(None);
        }
        let header = v
            .get("header")
            .ok_or_else(|| malformed(format!("txn without a header: {v}")))?;
        Ok(Some(int(header, "revision")?))
    }

    /// The candidate (a client id) that holds the role now, if any.
    ///
    /// # Errors
    /// As [`EtcdElection::lead`].
    pub fn holder(&self) -> Result<Option<u64>> {
        let v = self
            .gateway
            .call("/v3/kv/range", &json!({ "key": b64(&self.key) }))?;
        let kvs = v.get("kvs").and_then(Value::as_array);
        let Some(kv) = kvs.and_then(|k| k.first()) else {
            return Ok(None);
        };
        let value = text(kv, "value")?;
        Ok(value.split_once(':').and_then(|(c, _)| c.parse().ok()))
    }

    /// Gives the role up (revokes this candidate's lease, so its key goes at once). A later
    /// [`EtcdElection::lead`] campaigns again.
    pub fn resign(&self) {
        let lease = std::mem::take(&mut *self.lease.lock());
        if lease != 0 {
            if let Err(e) = self.gateway.revoke(lease) {
                tracing::warn!(
                    key = self.key,
                    "resigning: {e} (the lease runs out instead)"
                );
            }
        }
    }
}

/// The value of the role's key in a failed transaction's range answer.
fn holder_value(v: &Value) -> Result<Option<String>> {
    let responses = v
        .get("responses")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed(format!("txn without responses: {v}")))?;
    let kv = responses
        .first()
        .and_then(|r| r.get("response_range"))
        .and_then(|r| r.get("kvs"))
        .and_then(Value::as_array)
        .and_then(|k| k.first());
    match kv {
        // The key went between the compare and the range (its lease ran out).
        None => Ok(None),
        Some(kv) => Ok(Some(text(kv, "value")?)),
    }
}

/// Keeps the candidate's lease alive (every third of the TTL); a lease etcd no longer has
/// is forgotten, so the next `lead` campaigns afresh.
fn renew_loop(g: &Gateway, lease: &Mutex<i64>, stop: &AtomicBool, ttl: Duration) {
    let period = ttl / 3;
    let mut next = Instant::now() + period;
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < next {
            std::thread::park_timeout(next - now);
            continue;
        }
        next = now + period;
        let id = *lease.lock();
        if id == 0 {
            continue;
        }
        match g.keep_alive(id) {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!("etcd lost the election lease: the role is given up");
                let mut l = lease.lock();
                if *l == id {
                    *l = 0;
                }
            }
            Err(e) => {
                tracing::warn!("renewing the election lease: {e}");
                next = Instant::now() + Duration::from_millis(200).min(period);
            }
        }
    }
}

impl Drop for EtcdElection {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        self.resign();
    }
}
