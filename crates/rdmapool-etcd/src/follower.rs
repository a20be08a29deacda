//! The client side: who is registered now, and a thread that follows the prefix.

use super::gateway::*;
use super::*;
use parking_lot::Mutex;
use rdmapool_pool::remote::Membership;
use rdmapool_pool::remote::PoolClient;
use rdmapool_pool::{Error, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::BufReader;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// are recognised by node id; ones etcd does not list are removed. A rewritten key
    /// (another address or lease) replaces a node only once the client finds it down. Each
    /// server is dialled on a thread of its own (at most 64 at once, each bounded by the
    /// client's `connect_timeout`), so an entry that never answers delays no other join,
    /// and one that failed is dialled again with backoff (250 ms doubling to 10 s) while it
    /// is listed. Returns once the first listing is applied.
    pub fn follow(&self, client: Arc<PoolClient>) -> Result<EtcdFollower> {
        let state = Arc::new(Mutex::new(FollowState::default()));
        let (kvs, revision) = self.gateway.list(&self.cfg.dir())?;
        let dir = self.cfg.dir();
        let mut f = Follow {
            dials: Vec::new(),
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
        f.wait_for_dials(); // the first listing is applied before `follow` returns
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rdmapool-etcd-follow".into())
            .spawn(move || f.run(&s))
            .map_err(|e| {
                Error::Core(rdmapool_pool::CoreError::Sys {
                    call: "spawn",
                    source: e,
                })
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
pub(super) struct Entry {
    pub(super) member: EtcdMember,
    pub(super) lease: i64,
}

pub(super) fn parse_members(dir: &str, kvs: &Listing) -> BTreeMap<u32, Entry> {
    let mut out = BTreeMap::new();
    for (k, (v, lease)) in kvs {
        if k.strip_prefix(dir).is_some_and(|rest| rest.contains('/')) {
            continue; // a subdirectory (elections/): not a server entry
        }
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

pub(super) fn parse_member(dir: &str, key: &str, value: &str) -> Option<EtcdMember> {
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
pub(super) struct Joined {
    /// The address connected to (`None`: the client had it before following).
    addr: Option<SocketAddr>,
    /// The node id the server's descriptor gave.
    node: u32,
    /// The lease its key had then.
    lease: i64,
}

#[derive(Default)]
pub(super) struct FollowState {
    /// Key node id -> the connection made for it.
    connected: HashMap<u32, Joined>,
    /// Key node ids being dialled now (each on a thread of its own).
    dialling: HashSet<u32>,
    /// Key node id -> when its entry may be dialled again after a failure, and the wait
    /// that led there (doubling from [`RETRY_FIRST`] to [`RETRY_MOST`]).
    retry: HashMap<u32, (Instant, Duration)>,
    stats: FollowerStats,
}

/// The first wait before an entry that failed to connect is dialled again.
const RETRY_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two dials of an entry that keeps failing.
const RETRY_MOST: Duration = Duration::from_secs(10);
/// Dials in flight at most (each a thread, bounded by the client's connect timeout).
const DIALS_AT_ONCE: usize = 64;

pub(super) struct Follow {
    /// The dials in flight (joined when following stops, so no server is added after).
    dials: Vec<JoinHandle<()>>,
    gateway: Arc<Gateway>,
    dir: String,
    client: Arc<PoolClient>,
    state: Arc<Mutex<FollowState>>,
    wanted: BTreeMap<u32, Entry>,
    /// The revision `wanted` reflects.
    revision: i64,
}

/// Why a watch ended.
pub(super) enum WatchEnd {
    /// Quiet for `watch_idle` (or closed by etcd): reopen from the revision reached.
    Idle,
    /// The revision was compacted away or the stream failed: list again.
    Resync(String),
}

impl Follow {
    pub(super) fn run(&mut self, stop: &AtomicBool) {
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
        self.wait_for_dials();
    }

    /// Waits for the dials in flight to end (each within the client's connect timeout).
    fn wait_for_dials(&mut self) {
        for d in self.dials.drain(..) {
            let _ = d.join();
        }
    }

    /// Watches from the revision after `self.revision`, applying events (and connecting to
    /// servers that join) as they come, until the stream is quiet, fails, or `stop`.
    pub(super) fn watch(&mut self, stop: &AtomicBool) -> WatchEnd {
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
    pub(super) fn reconcile(&mut self) {
        let listed: Vec<std::net::SocketAddr> =
            self.wanted.values().map(|e| e.member.addr).collect();
        self.client.forget_unreached(&listed);
        let live: Vec<u32> = self.client.nodes().iter().map(|n| n.node).collect();
        let gone: Vec<(u32, Joined, bool)> = {
            let st = self.state.lock();
            st.connected
                .iter()
                .filter_map(|(n, j)| match self.wanted.get(n) {
                    None => Some((*n, *j, true)),
                    // A key rewritten (another address or lease) replaces only a node this
                    // client found down: a live, proven node is never dropped for what an
                    // etcd writer says of it (issue #41, finding 5).
                    Some(e)
                        if (j.addr.is_some_and(|a| a != e.member.addr) || e.lease != j.lease)
                            && !live.contains(&j.node) =>
                    {
                        Some((*n, *j, false))
                    }
                    Some(e) if j.addr.is_some_and(|a| a != e.member.addr) => {
                        tracing::warn!(node = j.node, addr = %e.member.addr,
                            "etcd names another address for a live server: kept until it is down");
                        None
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
        // Each listed server not connected is dialled on a thread of its own, and the
        // follower goes on at once: one that never answers (a black hole, or a rogue entry)
        // costs its own connect timeout, never another's join nor the next watch event's
        // (issue #41, finding 5: each event waited for every hole, 5 s a hole). One that
        // failed is dialled again after its own backoff.
        let now = Instant::now();
        let todo: Vec<Entry> = {
            let mut st = self.state.lock();
            st.retry.retain(|n, _| self.wanted.contains_key(n));
            let room = DIALS_AT_ONCE.saturating_sub(st.dialling.len());
            let todo: Vec<Entry> = self
                .wanted
                .values()
                .filter(|e| {
                    let n = e.member.node;
                    !st.connected.contains_key(&n)
                        && !st.dialling.contains(&n)
                        && st.retry.get(&n).is_none_or(|&(at, _)| at <= now)
                })
                .take(room)
                .copied()
                .collect();
            st.dialling.extend(todo.iter().map(|e| e.member.node));
            todo
        };
        self.dials.retain(|d| !d.is_finished());
        for e in todo {
            let (client, state) = (self.client.clone(), self.state.clone());
            let dial = rdmapool_core::util::spawn_named("rdmapool-etcd-dial", move || {
                let r = client.add_server(e.member.addr);
                joined(&state, e, r);
            });
            match dial {
                Ok(d) => self.dials.push(d),
                Err(err) => {
                    tracing::warn!(node = e.member.node, "no thread to dial a server: {err}");
                    self.state.lock().dialling.remove(&e.member.node);
                }
            }
        }
    }
}

/// Records the outcome of dialling entry `e`.
fn joined(state: &Mutex<FollowState>, Entry { member: m, lease }: Entry, result: Result<u32>) {
    let mut st = state.lock();
    st.dialling.remove(&m.node);
    match result {
        Ok(node) => {
            if node != m.node {
                tracing::warn!(key_node = m.node, node, addr = %m.addr,
                    "server registered under another node id than it gives");
            }
            st.connected.insert(
                m.node,
                Joined {
                    addr: Some(m.addr),
                    node,
                    lease,
                },
            );
            st.retry.remove(&m.node);
            st.stats.joined += 1;
            tracing::info!(node, addr = %m.addr, "memory server joined from etcd");
        }
        Err(e) => {
            st.stats.connect_failures += 1;
            let wait = st
                .retry
                .get(&m.node)
                .map_or(RETRY_FIRST, |&(_, w)| (w * 2).min(RETRY_MOST));
            st.retry.insert(m.node, (Instant::now() + wait, wait));
            tracing::warn!(node = m.node, addr = %m.addr,
                "connecting to a server etcd lists: {e} (dialled again in {wait:?} while it is listed)");
        }
    }
}

/// Applies one watch message to `wanted` (keys under `dir`), advancing `revision` to the
/// last event's; true when it changed something. An error means: list again.
pub(super) fn apply_watch(
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
