//! Cluster membership on etcd (feature `etcd`): memory servers register themselves under a
//! key prefix with a lease they keep alive, clients follow the prefix and connect to servers
//! that join and drop those that leave. Only addresses travel through etcd: a server's pool
//! descriptor still comes from the connection to it.
//!
//! - [`EtcdRegistration`] (server side) grants a lease, puts `<prefix>/<node>` = `ip:port`
//!   under it, and renews it from a thread (every third of the TTL). Dropping it revokes the
//!   lease, so the key goes at once; a server that dies without dropping it (a crash, or
//!   [`EtcdRegistration::abandon`]) loses the key when the lease runs out, one TTL later.
//! - [`EtcdMembership`] (client side) is a [`Membership`] listing the servers registered
//!   now, and [`EtcdMembership::follow`] starts an [`EtcdFollower`]: a thread that watches
//!   the prefix and calls [`PoolClient::add_server`] / [`PoolClient::remove_server`] as keys
//!   appear and disappear.
//!
//! etcd is reached through its v3 JSON gateway (`/v3/kv/*`, `/v3/lease/*`, `/v3/watch`:
//! HTTP/1.1, base64 keys and values), which every etcd 3.4+ serves on its client port, over
//! plain HTTP (no TLS). The watch is a streamed response read line by line; it is reopened
//! from the last revision seen whenever it has been quiet for a while (so the thread can
//! notice it should stop, and retry servers it could not reach), and after a failure the
//! follower lists the prefix again and reconciles.
//!
//! ```no_run
//! use rdmapool::fabric::*;
//! use rdmapool::remote::*;
//! use std::sync::Arc;
//! # fn main() -> rdmapool::Result<()> {
//! let etcd = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()], "/rdmapool/pool-a");
//! // A server: serve, then say so in etcd.
//! let ctx = Context::open_soft()?;
//! let server = MemoryServer::start(&ctx, ServerConfig::default())?;
//! let reg = EtcdRegistration::register(&etcd, server.descriptor().node, server.addr())?;
//! // A client: connect to whoever is registered, then follow the prefix.
//! let members = EtcdMembership::new(&etcd)?;
//! let pd = ctx.alloc_pd()?;
//! let client = Arc::new(PoolClient::connect(&ctx, &pd, &members, ClientConfig::new(7))?);
//! let follower = members.follow(client.clone())?;
//! # drop((reg, follower)); Ok(()) }
//! ```

use super::client::PoolClient;
use super::membership::Membership;
use crate::{Error, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where etcd is and which part of its key space a pool uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members (`http://host:port`), tried in turn.
    pub endpoints: Vec<String>,
    /// The key prefix the pool's servers register under (a server's key is
    /// `<prefix>/<node>`); a trailing `/` is ignored.
    pub prefix: String,
    /// The registration lease's time to live, in whole seconds (rounded down; at least
    /// 1 s): a server that stops renewing leaves the membership this long after its last
    /// renewal (etcd may round a very short TTL up to its own minimum).
    pub ttl: Duration,
    /// How long one request to etcd may take (connect, send, receive).
    pub request_timeout: Duration,
    /// How long a quiet watch is kept open before it is reopened from the last revision
    /// (bounds how long dropping an [`EtcdFollower`] takes, and how often it retries servers
    /// it could not connect to; each reopen is one request to etcd per follower).
    pub watch_idle: Duration,
}

impl EtcdConfig {
    /// These endpoints and prefix, a 3 s lease, 2 s requests, watches reopened after 1 s of
    /// quiet.
    pub fn new(endpoints: Vec<String>, prefix: &str) -> Self {
        Self {
            endpoints,
            prefix: prefix.to_string(),
            ttl: Duration::from_secs(3),
            request_timeout: Duration::from_secs(2),
            watch_idle: Duration::from_secs(1),
        }
    }

    fn check(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::InvalidArgument("no etcd endpoints given".into()));
        }
        for e in &self.endpoints {
            if !e.starts_with("http://") {
                return Err(Error::InvalidArgument(format!(
                    "etcd endpoint {e:?}: want http://host:port (the JSON gateway over plain HTTP)"
                )));
            }
        }
        if self.prefix.trim_end_matches('/').is_empty() {
            return Err(Error::InvalidArgument("empty etcd key prefix".into()));
        }
        if self.ttl < Duration::from_secs(1) {
            return Err(Error::InvalidArgument(format!(
                "etcd lease TTL of {:?}: at least 1 s",
                self.ttl
            )));
        }
        if self.request_timeout.is_zero() || self.watch_idle.is_zero() {
            return Err(Error::InvalidArgument(
                "etcd request timeout and watch idle time must be non-zero".into(),
            ));
        }
        Ok(())
    }

    /// `<prefix>/`: every server key starts with it.
    fn dir(&self) -> String {
        format!("{}/", self.prefix.trim_end_matches('/'))
    }

    fn key(&self, node: u32) -> String {
        format!("{}{node}", self.dir())
    }
}

/// The JSON gateway of one etcd cluster.
struct Gateway {
    endpoints: Vec<String>,
    /// The endpoint that answered last (tried first).
    current: AtomicUsize,
    /// Unary calls.
    agent: ureq::Agent,
    /// Watches: no total budget, a per-read one of `watch_idle`.
    watcher: ureq::Agent,
}

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

fn malformed(reason: impl Into<String>) -> Error {
    Error::Malformed {
        what: "etcd response",
        reason: reason.into(),
    }
}

/// An int64 of the gateway's JSON (a string, or a number; absent is 0).
fn int(v: &Value, field: &str) -> Result<i64> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|e| malformed(format!("{field} = {s:?}: {e}"))),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| malformed(format!("{field} = {n}"))),
        Some(other) => Err(malformed(format!("{field} = {other}"))),
    }
}

fn text(v: &Value, field: &str) -> Result<String> {
    let s = v.get(field).and_then(Value::as_str).unwrap_or("");
    let bytes = B64
        .decode(s)
        .map_err(|e| malformed(format!("{field}: {e}")))?;
    String::from_utf8(bytes).map_err(|e| malformed(format!("{field}: {e}")))
}

impl Gateway {
    fn new(cfg: &EtcdConfig) -> Result<Self> {
        cfg.check()?;
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(cfg.request_timeout))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let watcher = ureq::Agent::config_builder()
            .timeout_connect(Some(cfg.request_timeout))
            .timeout_send_request(Some(cfg.request_timeout))
            .timeout_recv_response(Some(cfg.request_timeout))
            .timeout_per_read(Some(cfg.watch_idle))
            .http_status_as_error(false)
            .build()
            .new_agent();
        Ok(Self {
            endpoints: cfg
                .endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_string())
                .collect(),
            current: AtomicUsize::new(0),
            agent,
            watcher,
        })
    }

    /// POSTs `body` to `path` on the endpoints in turn (from the last one that answered),
    /// returning the first answer's response; HTTP errors from etcd are not retried.
    fn send(
        &self,
        agent: &ureq::Agent,
        path: &str,
        body: &Value,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let start = self.current.load(Ordering::Relaxed);
        let mut errors = Vec::new();
        for k in 0..self.endpoints.len() {
            let i = (start + k) % self.endpoints.len();
            let url = format!("{}{path}", self.endpoints[i]);
            match agent.post(&url).send_json(body) {
                Ok(mut resp) => {
                    self.current.store(i, Ordering::Relaxed);
                    let status = resp.status();
                    if !status.is_success() {
                        let msg = resp
                            .body_mut()
                            .read_json::<Value>()
                            .ok()
                            .and_then(|v| {
                                v.get("message").and_then(Value::as_str).map(String::from)
                            })
                            .unwrap_or_default();
                        return Err(Error::Connection {
                            peer: url,
                            reason: format!("etcd answered {status}: {msg}"),
                        });
                    }
                    return Ok(resp);
                }
                Err(e) => errors.push(format!("{url}: {e}")),
            }
        }
        Err(Error::Connection {
            peer: self.endpoints.join(","),
            reason: format!("no etcd endpoint answered: {}", errors.join("; ")),
        })
    }

    /// A unary call: its JSON answer.
    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let mut resp = self.send(&self.agent, path, body)?;
        resp.body_mut()
            .read_json::<Value>()
            .map_err(|e| malformed(format!("{path}: {e}")))
    }

    fn grant(&self, ttl: Duration) -> Result<i64> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl.as_secs() }))?;
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            return Err(malformed(format!("lease grant: {e}")));
        }
        match int(&v, "ID")? {
            0 => Err(malformed("lease grant without an ID")),
            id => Ok(id),
        }
    }

    /// Renews `lease` once; false when etcd no longer has it.
    fn keep_alive(&self, lease: i64) -> Result<bool> {
        let v = self.call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))?;
        let result = v
            .get("result")
            .ok_or_else(|| malformed(format!("lease keepalive: {v}")))?;
        Ok(int(result, "TTL")? > 0)
    }

    fn revoke(&self, lease: i64) -> Result<()> {
        match self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() })) {
            // Already gone (expired): what revoking wanted.
            Err(Error::Connection { reason, .. }) if reason.contains("not found") => Ok(()),
            r => r.map(|_| ()),
        }
    }

    fn put(&self, key: &str, value: &str, lease: i64) -> Result<()> {
        self.call(
            "/v3/kv/put",
            &json!({ "key": b64(key), "value": b64(value), "lease": lease.to_string() }),
        )
        .map(|_| ())
    }

    /// The keys under `dir` with their values and leases, and the store's revision.
    fn list(&self, dir: &str) -> Result<(Listing, i64)> {
        let v = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(dir), "range_end": b64(&prefix_end(dir)) }),
        )?;
        let revision = v
            .get("header")
            .map(|h| int(h, "revision"))
            .ok_or_else(|| malformed(format!("range without a header: {v}")))??;
        let mut out = BTreeMap::new();
        if let Some(kvs) = v.get("kvs").and_then(Value::as_array) {
            for kv in kvs {
                out.insert(text(kv, "key")?, (text(kv, "value")?, int(kv, "lease")?));
            }
        }
        Ok((out, revision))
    }
}

/// Keys with their values and leases.
type Listing = BTreeMap<String, (String, i64)>;

/// The smallest key above every key starting with `dir` (its last byte plus one; server
/// prefixes end in `/`, so no carry).
fn prefix_end(dir: &str) -> String {
    let mut b = dir.as_bytes().to_vec();
    while let Some(last) = b.pop() {
        if last < 0x7f {
            b.push(last + 1);
            return String::from_utf8(b).unwrap_or_default();
        }
    }
    String::from("\0")
}

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
            return Err(Error::InvalidArgument(format!(
                "registering {addr}: clients need a routable ip and a port"
            )));
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
            .map_err(|e| Error::Sys {
                call: "spawn",
                source: e,
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

    fn stop_thread(&mut self) {
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

fn keep_alive_loop(
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

/// One server as etcd lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdMember {
    /// The node id its key names.
    pub node: u32,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// The servers registered under a prefix (see the module docs).
pub struct EtcdMembership {
    cfg: EtcdConfig,
    gateway: Arc<Gateway>,
}

impl EtcdMembership {
    /// Membership under `cfg.prefix` (nothing is contacted yet).
    pub fn new(cfg: &EtcdConfig) -> Result<Self> {
        Ok(Self {
            gateway: Arc::new(Gateway::new(cfg)?),
            cfg: cfg.clone(),
        })
    }

    /// The servers registered now, by node (keys or values that do not parse are skipped).
    pub fn members(&self) -> Result<Vec<EtcdMember>> {
        let (kvs, _) = self.gateway.list(&self.cfg.dir())?;
        Ok(parse_members(&self.cfg.dir(), &kvs)
            .into_values()
            .map(|e| e.member)
            .collect())
    }

    /// Starts a thread that keeps `client` connected to exactly the servers registered under
    /// the prefix: it connects to servers that join (and, if a connection fails, retries
    /// while the key stays) and removes those whose key goes. Servers `client` already uses
    /// are recognised by node id; ones etcd does not list are removed. Connections are made
    /// on the follower's thread one at a time (each bounded by the client's
    /// `connect_timeout`). Returns once the first listing is applied.
    pub fn follow(&self, client: Arc<PoolClient>) -> Result<EtcdFollower> {
        let state = Arc::new(Mutex::new(FollowState::default()));
        let (kvs, revision) = self.gateway.list(&self.cfg.dir())?;
        let dir = self.cfg.dir();
        let mut f = Follow {
            gateway: self.gateway.clone(),
            dir: dir.clone(),
            client,
            state: state.clone(),
            wanted: parse_members(&dir, &kvs),
            revision,
        };
        {
            let mut st = state.lock();
            for n in f.client.nodes() {
                st.connected.insert(
                    n.node,
                    Joined {
                        addr: None,
                        node: n.node,
                        lease: f.wanted.get(&n.node).map_or(0, |e| e.lease),
                    },
                );
            }
        }
        f.reconcile();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rdmapool-etcd-follow".into())
            .spawn(move || f.run(&s))
            .map_err(|e| Error::Sys {
                call: "spawn",
                source: e,
            })?;
        Ok(EtcdFollower {
            state,
            stop,
            thread: Some(thread),
        })
    }
}

impl Membership for EtcdMembership {
    fn servers(&self) -> Result<Vec<SocketAddr>> {
        Ok(self.members()?.into_iter().map(|m| m.addr).collect())
    }
}

/// A server's entry: the member and the lease it is registered under (a new lease is a new
/// registration: after a restart, or after etcd lost the old lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    member: EtcdMember,
    lease: i64,
}

fn parse_members(dir: &str, kvs: &Listing) -> BTreeMap<u32, Entry> {
    let mut out = BTreeMap::new();
    for (k, (v, lease)) in kvs {
        match parse_member(dir, k, v) {
            Some(member) => {
                out.insert(
                    member.node,
                    Entry {
                        member,
                        lease: *lease,
                    },
                );
            }
            None => tracing::warn!(key = k, value = v, "not a memory server entry: skipped"),
        }
    }
    out
}

fn parse_member(dir: &str, key: &str, value: &str) -> Option<EtcdMember> {
    let node = key.strip_prefix(dir)?.parse().ok()?;
    let addr = value.trim().parse().ok()?;
    Some(EtcdMember { node, addr })
}

/// What a follower has done (see [`EtcdFollower::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FollowerStats {
    /// Servers connected to after their key appeared.
    pub joined: u64,
    /// Servers removed after their key went.
    pub left: u64,
    /// Servers reconnected because they registered again (a new address, or a new lease
    /// after the client found them down: a restart).
    pub replaced: u64,
    /// Connection attempts that failed (retried while the key stays).
    pub connect_failures: u64,
    /// Watches (re)opened.
    pub watches: u64,
    /// Times the prefix was listed again after a failed or compacted watch.
    pub resyncs: u64,
}

#[derive(Debug, Clone, Copy)]
struct Joined {
    /// The address connected to (`None`: the client had it before following).
    addr: Option<SocketAddr>,
    /// The node id the server's descriptor gave.
    node: u32,
    /// The lease its key had then.
    lease: i64,
}

#[derive(Default)]
struct FollowState {
    /// Key node id -> the connection made for it.
    connected: HashMap<u32, Joined>,
    stats: FollowerStats,
}

struct Follow {
    gateway: Arc<Gateway>,
    dir: String,
    client: Arc<PoolClient>,
    state: Arc<Mutex<FollowState>>,
    wanted: BTreeMap<u32, Entry>,
    /// The revision `wanted` reflects.
    revision: i64,
}

/// Why a watch ended.
enum WatchEnd {
    /// Quiet for `watch_idle` (or closed by etcd): reopen from the revision reached.
    Idle,
    /// The revision was compacted away or the stream failed: list again.
    Resync(String),
}

impl Follow {
    fn run(&mut self, stop: &AtomicBool) {
        let mut backoff = Duration::from_millis(50);
        while !stop.load(Ordering::Acquire) {
            let end = self.watch(stop);
            self.reconcile();
            match end {
                WatchEnd::Idle => backoff = Duration::from_millis(50),
                WatchEnd::Resync(why) => {
                    tracing::warn!(dir = self.dir, "etcd watch: {why}; listing again");
                    self.state.lock().stats.resyncs += 1;
                    match self.gateway.list(&self.dir) {
                        Ok((kvs, revision)) => {
                            self.wanted = parse_members(&self.dir, &kvs);
                            self.revision = revision;
                            self.reconcile();
                            backoff = Duration::from_millis(50);
                        }
                        Err(e) => {
                            tracing::warn!(dir = self.dir, "listing etcd: {e}");
                            let until = Instant::now() + backoff;
                            while Instant::now() < until && !stop.load(Ordering::Acquire) {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            backoff = (backoff * 2).min(Duration::from_secs(2));
                        }
                    }
                }
            }
        }
    }

    /// Watches from the revision after `self.revision`, applying events (and connecting to
    /// servers that join) as they come, until the stream is quiet, fails, or `stop`.
    fn watch(&mut self, stop: &AtomicBool) -> WatchEnd {
        let body = json!({ "create_request": {
            "key": b64(&self.dir),
            "range_end": b64(&prefix_end(&self.dir)),
            "start_revision": (self.revision + 1).to_string(),
        }});
        let resp = match self.gateway.send(&self.gateway.watcher, "/v3/watch", &body) {
            Ok(r) => r,
            Err(e) => return WatchEnd::Resync(e.to_string()),
        };
        self.state.lock().stats.watches += 1;
        let reader = BufReader::new(resp.into_body().into_reader());
        for msg in serde_json::Deserializer::from_reader(reader).into_iter::<Value>() {
            if stop.load(Ordering::Acquire) {
                return WatchEnd::Idle;
            }
            let msg = match msg {
                Ok(m) => m,
                // A read timeout (quiet) or a closed stream: reopen from where we are.
                Err(e) if e.is_io() || e.is_eof() => return WatchEnd::Idle,
                Err(e) => return WatchEnd::Resync(format!("undecodable watch message: {e}")),
            };
            match apply_watch(&self.dir, &mut self.wanted, &mut self.revision, &msg) {
                Ok(true) => self.reconcile(),
                Ok(false) => {}
                Err(why) => return WatchEnd::Resync(why),
            }
        }
        WatchEnd::Idle
    }

    /// Makes the client's servers match `wanted`: removes the nodes whose key went (or now
    /// names another address), and the ones the client found down that registered again
    /// (a restart: same address, new lease); connects to the ones not connected yet. A
    /// down server whose key stays is left alone until the key goes.
    fn reconcile(&mut self) {
        let live: Vec<u32> = self.client.nodes().iter().map(|n| n.node).collect();
        let gone: Vec<(u32, Joined, bool)> = {
            let st = self.state.lock();
            st.connected
                .iter()
                .filter_map(|(n, j)| match self.wanted.get(n) {
                    None => Some((*n, *j, true)),
                    Some(e) if j.addr.is_some_and(|a| a != e.member.addr) => Some((*n, *j, false)),
                    Some(e) if e.lease != j.lease && !live.contains(&j.node) => {
                        Some((*n, *j, false))
                    }
                    Some(_) => None,
                })
                .collect()
        };
        for (n, j, left) in gone {
            self.client.remove_server(j.node);
            let mut st = self.state.lock();
            st.connected.remove(&n);
            if left {
                st.stats.left += 1;
                tracing::info!(node = j.node, "memory server left the etcd membership");
            } else {
                st.stats.replaced += 1;
                tracing::info!(
                    node = j.node,
                    "memory server registered again: reconnecting"
                );
            }
        }
        let todo: Vec<Entry> = {
            let st = self.state.lock();
            self.wanted
                .values()
                .filter(|e| !st.connected.contains_key(&e.member.node))
                .copied()
                .collect()
        };
        for Entry { member: m, lease } in todo {
            match self.client.add_server(m.addr) {
                Ok(node) => {
                    if node != m.node {
                        tracing::warn!(key_node = m.node, node, addr = %m.addr,
                            "server registered under another node id than it gives");
                    }
                    let mut st = self.state.lock();
                    st.connected.insert(
                        m.node,
                        Joined {
                            addr: Some(m.addr),
                            node,
                            lease,
                        },
                    );
                    st.stats.joined += 1;
                    tracing::info!(node, addr = %m.addr, "memory server joined from etcd");
                }
                Err(e) => {
                    self.state.lock().stats.connect_failures += 1;
                    tracing::warn!(node = m.node, addr = %m.addr,
                        "connecting to a server etcd lists: {e} (retrying while it is listed)");
                }
            }
        }
    }
}

/// Applies one watch message to `wanted` (keys under `dir`), advancing `revision` to the
/// last event's; true when it changed something. An error means: list again.
fn apply_watch(
    dir: &str,
    wanted: &mut BTreeMap<u32, Entry>,
    revision: &mut i64,
    msg: &Value,
) -> std::result::Result<bool, String> {
    if let Some(e) = msg.get("error") {
        return Err(format!("watch error: {e}"));
    }
    let Some(r) = msg.get("result") else {
        return Err(format!("watch message without a result: {msg}"));
    };
    let compacted = int(r, "compact_revision").map_err(|e| e.to_string())?;
    if compacted != 0 {
        return Err(format!("revision {} compacted away", *revision + 1));
    }
    if r.get("canceled").and_then(Value::as_bool).unwrap_or(false) {
        return Err(format!("watch canceled: {r}"));
    }
    let mut changed = false;
    for ev in r
        .get("events")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kv = ev.get("kv").cloned().unwrap_or(Value::Null);
        let key = text(&kv, "key").map_err(|e| e.to_string())?;
        let rev = int(&kv, "mod_revision").map_err(|e| e.to_string())?;
        *revision = (*revision).max(rev);
        let Some(node) = key.strip_prefix(dir).and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // PUT is the default (0) and so absent from the JSON.
        let deleted = ev.get("type").and_then(Value::as_str) == Some("DELETE");
        if deleted {
            changed |= wanted.remove(&node).is_some();
        } else {
            let value = text(&kv, "value").map_err(|e| e.to_string())?;
            let lease = int(&kv, "lease").map_err(|e| e.to_string())?;
            match parse_member(dir, &key, &value) {
                Some(member) => {
                    let e = Entry { member, lease };
                    changed |= wanted.insert(node, e) != Some(e);
                }
                None => {
                    tracing::warn!(key, value, "not a memory server entry: dropped");
                    changed |= wanted.remove(&node).is_some();
                }
            }
        }
    }
    Ok(changed)
}

/// Keeps a [`PoolClient`] connected to the servers etcd lists (from
/// [`EtcdMembership::follow`]); dropping it stops following (within `watch_idle`) and
/// leaves the client's servers as they are.
pub struct EtcdFollower {
    state: Arc<Mutex<FollowState>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EtcdFollower {
    /// The node ids of the servers the follower has the client connected to, ascending.
    pub fn nodes(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .state
            .lock()
            .connected
            .values()
            .map(|j| j.node)
            .collect();
        v.sort_unstable();
        v
    }

    /// Counters.
    pub fn stats(&self) -> FollowerStats {
        self.state.lock().stats
    }
}

impl Drop for EtcdFollower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ranges_and_members_parse() {
        let cfg = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()], "/pool/a/");
        assert_eq!(cfg.dir(), "/pool/a/");
        assert_eq!(cfg.key(7), "/pool/a/7");
        assert_eq!(prefix_end("/pool/a/"), "/pool/a0");
        let m = parse_member("/pool/a/", "/pool/a/7", "127.0.0.1:9000").unwrap();
        assert_eq!(m.node, 7);
        assert!(parse_member("/pool/a/", "/pool/a/x", "127.0.0.1:9000").is_none());
        assert!(parse_member("/pool/a/", "/pool/a/7", "nowhere").is_none());
    }

    #[test]
    fn bad_configs_are_typed_errors() {
        let mut cfg = EtcdConfig::new(vec![], "/p");
        assert!(matches!(cfg.check(), Err(Error::InvalidArgument(_))));
        cfg.endpoints = vec!["https://x:1".into()];
        assert!(matches!(cfg.check(), Err(Error::InvalidArgument(_))));
        cfg.endpoints = vec!["http://x:1".into()];
        cfg.ttl = Duration::from_millis(10);
        assert!(matches!(cfg.check(), Err(Error::InvalidArgument(_))));
        cfg.ttl = Duration::from_secs(2);
        cfg.prefix = "/".into();
        assert!(matches!(cfg.check(), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn watch_messages_as_etcd_3_4_sends_them_apply() {
        // Captured from etcd 3.4's gateway: keys /p/1, values 127.0.0.1:5; PUT has no type.
        let dir = "/p/";
        let (mut wanted, mut rev) = (BTreeMap::new(), 1);
        let created: Value =
            serde_json::from_str(r#"{"result":{"header":{"revision":"9"},"created":true}}"#)
                .unwrap();
        assert_eq!(apply_watch(dir, &mut wanted, &mut rev, &created), Ok(false));
        assert_eq!(
            rev, 1,
            "a header does not say every event up to it was seen"
        );
        let put: Value = serde_json::from_str(
            r#"{"result":{"header":{"revision":"2"},"events":[{"kv":{"key":"L3AvMQ==",
            "create_revision":"2","mod_revision":"2","version":"1","value":"MTI3LjAuMC4xOjU=",
            "lease":"2324035739767540487"}}]}}"#,
        )
        .unwrap();
        assert_eq!(apply_watch(dir, &mut wanted, &mut rev, &put), Ok(true));
        assert_eq!(rev, 2);
        assert_eq!(wanted[&1].member.addr, "127.0.0.1:5".parse().unwrap());
        assert_eq!(wanted[&1].lease, 2324035739767540487);
        assert_eq!(apply_watch(dir, &mut wanted, &mut rev, &put), Ok(false));
        let del: Value = serde_json::from_str(
            r#"{"result":{"header":{"revision":"3"},"events":[{"type":"DELETE",
            "kv":{"key":"L3AvMQ==","mod_revision":"3"}}]}}"#,
        )
        .unwrap();
        assert_eq!(apply_watch(dir, &mut wanted, &mut rev, &del), Ok(true));
        assert!(wanted.is_empty());
        assert_eq!(rev, 3);
        let compacted: Value = serde_json::from_str(
            r#"{"result":{"header":{"revision":"9"},"compact_revision":"5","canceled":true}}"#,
        )
        .unwrap();
        assert!(apply_watch(dir, &mut wanted, &mut rev, &compacted).is_err());
        let error: Value =
            serde_json::from_str(r#"{"error":{"grpc_code":14,"message":"unavailable"}}"#).unwrap();
        assert!(apply_watch(dir, &mut wanted, &mut rev, &error).is_err());
    }

    #[test]
    fn int64s_come_as_strings_or_numbers() {
        let v = json!({ "a": "12", "b": 13, "c": "x" });
        assert_eq!(int(&v, "a").unwrap(), 12);
        assert_eq!(int(&v, "b").unwrap(), 13);
        assert_eq!(int(&v, "missing").unwrap(), 0);
        assert!(matches!(int(&v, "c"), Err(Error::Malformed { .. })));
    }

    #[test]
    fn an_unreachable_etcd_is_a_connection_error() {
        // Port 9 on loopback: nothing listens (discard is not run in test environments).
        let mut cfg = EtcdConfig::new(vec!["http://127.0.0.1:9".into()], "/p");
        cfg.request_timeout = Duration::from_millis(500);
        let m = EtcdMembership::new(&cfg).unwrap();
        assert!(matches!(m.servers(), Err(Error::Connection { .. })));
    }
}
