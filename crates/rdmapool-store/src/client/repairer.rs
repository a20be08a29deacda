//! The repair that runs by itself (docs/STORE.md section 7, issue #40): a thread that runs
//! [`Store::repair`] when the membership changes and every period, on one client of the
//! cluster at a time, chosen one-sided by the **repairer word** of the lowest-numbered
//! member that is up (region offset 32, PROTOCOL.md 7.3).
//!
//! The rule: the word holds the id of the client that repairs (0: none). A client that
//! finds it 0, or naming an id that holds no lease slot on that server (a client that is
//! gone), takes it with a compare-and-swap from what it read; one that finds its own id
//! repairs; one that finds a live client's id does not. A repairer gives the word back
//! when it stops. Two clients that disagree about which member is the lowest up (one sees
//! it down) may both repair for a while; repairs are safe beside each other, as beside
//! puts, since every change they make is a compare-and-swap against what they scanned.
//! The tombstones this client's repairs find clean are cleared by it past the hold (its
//! memory of them lives as long as the [`Repairer`]'s store).
//!
//! Where the cluster uses etcd, [`Repairer::start_elected`] elects the repairer through an
//! etcd lease instead ([`EtcdElection`](rdmapool_etcd::EtcdElection), role
//! `store-repairer`): one client at a time holds it, the next takes over one TTL after the
//! holder stops renewing, and no client needs to agree with another about which member is
//! the lowest up. The elected repairer also changes the store's view as etcd's
//! membership changes ([`Repairer::start_elected`]).

use super::Store;
use crate::view::View;
use crate::RepairReport;
use parking_lot::Mutex;
use rdmapool_pool::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The region word that names the cluster's repairer (PROTOCOL.md 7.3).
pub(crate) const REPAIRER_WORD: u64 = 32;

/// How often the repairer looks at the membership between periodic runs.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// What a [`Repairer`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairerStats {
    /// Repairs it ran (this client held the role: the repairer word, or the etcd lease).
    pub runs: u64,
    /// Times it was due and another live client held the role.
    pub deferred_to_another: u64,
    /// Repairs or claims that failed (a server went down meanwhile): tried again at the
    /// next look.
    pub errors: u64,
    /// Replicas its repairs copied, in all.
    pub copied: u64,
    /// Index slots of removed keys its repairs cleared, in all.
    pub tombstones_cleared: u64,
    /// Views it changed (where etcd elects it: the store's view follows the membership).
    pub views_changed: u64,
    /// Views it settled after a repair that left nothing behind (keys moved in full).
    pub views_settled: u64,
    /// The last repair's report.
    pub last: Option<RepairReport>,
}

/// How the repairer of the cluster is chosen (see the module's text).
enum Election {
    /// The repairer word of the lowest-numbered member that is up.
    Word,
    /// An etcd lease.
    #[cfg(feature = "etcd")]
    Etcd(rdmapool_etcd::EtcdElection),
}

impl Election {
    /// Whether this client is the cluster's repairer now (taking the role if it is free).
    fn claim(&self, store: &Store) -> Result<bool> {
        match self {
            Election::Word => store.block_on(store.claim_repairer()),
            #[cfg(feature = "etcd")]
            Election::Etcd(e) => e.lead(),
        }
    }

    /// Where the view comes from etcd, and this client holds the role: changes the store's
    /// view to the members etcd lists when they differ from the view in force (see
    /// [`Repairer::start_elected`]). Returns the view written and its change's repair, or
    /// `None` when there was nothing to change (or the role was lost meanwhile).
    fn keep_view(&self, store: &Store) -> Result<Option<(View, RepairReport)>> {
        match self {
            Election::Word => {
                let _ = store; // an operator changes a static list's view
                Ok(None)
            }
            #[cfg(feature = "etcd")]
            Election::Etcd(e) => view_from_etcd(store, e),
        }
    }

    /// Gives the role back (best effort).
    fn release(&self, store: &Store) {
        match self {
            Election::Word => {
                let _ = store.block_on(store.release_repairer());
            }
            #[cfg(feature = "etcd")]
            Election::Etcd(e) => e.resign(),
        }
    }
}

/// The etcd key (under the prefix) that records each view the elected repairer writes; its
/// modification revision is the view's number.
#[cfg(feature = "etcd")]
pub const VIEW_KEY: &str = "store/view";

/// Changes the store's view to the members etcd lists (those this client has joined), when
/// they differ from the view in force or there is none: the change is recorded in etcd at
/// [`VIEW_KEY`] by a write fenced by the election (made only while `election` holds the
/// role), and etcd's revision of that write numbers the view.
#[cfg(feature = "etcd")]
fn view_from_etcd(
    store: &Store,
    election: &rdmapool_etcd::EtcdElection,
) -> Result<Option<(View, RepairReport)>> {
    let known = store.pool.regions().members();
    if known.nodes.is_empty() || known.nodes.iter().any(|n| n.isolated) {
        // No member yet, or a tenant's own store (no shared view on isolated servers).
        return Ok(None);
    }
    let members: Vec<u32> = known.nodes.iter().map(|n| n.node).collect();
    let current = store.block_on(store.reload_view())?;
    if current.number != 0 && current.members == members {
        return Ok(None);
    }
    let mut change = store.block_on(store.plan_view_change(&members))?;
    let record = serde_json::json!({
        "members": change.next.members,
        "previous": change.next.previous,
        "from": change.from,
    })
    .to_string();
    let Some(revision) = election.put_if_leading(VIEW_KEY, &record)? else {
        return Ok(None);
    };
    let number = u64::try_from(revision).unwrap_or(0);
    if number <= change.from {
        return Err(rdmapool_pool::Error::Contended {
            what: "store view change (etcd's revision is not above the view the servers \
                   hold: a view set without etcd; set one above it by hand)",
            rounds: 1,
        });
    }
    change.next.number = number;
    store.block_on(store.apply_view_change(change)).map(Some)
}

/// A background repairer of a [`Store`] (see the module's text). Dropping it stops the
/// thread and gives the role back (the repairer word, or the etcd lease).
pub struct Repairer {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<RepairerStats>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Repairer {
    /// Starts repairing `store` every `every`, and at once whenever the members this client
    /// knows, or their state (up, down, restarted), change.
    ///
    /// # Errors
    /// [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) for a zero period (it
    /// would repair back to back); [`Error::Sys`](rdmapool_pool::Error) when the thread cannot be
    /// started.
    pub fn start(store: Arc<Store>, every: Duration) -> Result<Self> {
        Self::spawn(store, every, Election::Word)
    }

    /// Like [`Repairer::start`], with the repairer elected through etcd (`cfg`, role
    /// `store-repairer`, candidate this client's id) instead of the repairer word: for a
    /// store whose servers come from an [`EtcdMembership`](rdmapool_etcd::EtcdMembership).
    ///
    /// The elected repairer is also the store's **view changer** (docs/STORE.md section 4):
    /// whenever the members etcd lists (the servers whose leases live, that this client has
    /// joined) differ from the view in force, it records the new view in etcd at
    /// [`VIEW_KEY`] with a write fenced by the election, numbers the view by etcd's revision
    /// of that write, writes it on the servers (body, then fence word), repairs, and settles
    /// it. A server whose lease runs out leaves the view; one that registers joins it.
    ///
    /// # Errors
    /// As [`Repairer::start`], and a bad etcd config
    /// ([`CoreError::BadSetting`](rdmapool_pool::CoreError::BadSetting)).
    #[cfg(feature = "etcd")]
    pub fn start_elected(
        store: Arc<Store>,
        every: Duration,
        cfg: &rdmapool_etcd::EtcdConfig,
    ) -> Result<Self> {
        let election =
            rdmapool_etcd::EtcdElection::new(cfg, "store-repairer", store.pool.client_id())?;
        Self::spawn(store, every, Election::Etcd(election))
    }

    fn spawn(store: Arc<Store>, every: Duration, election: Election) -> Result<Self> {
        if every.is_zero() {
            return Err(rdmapool_pool::Error::Core(
                rdmapool_pool::CoreError::OutOfLimits {
                    what: "repair period (ms)",
                    value: 0,
                    min: 1,
                    max: u64::MAX,
                },
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(RepairerStats::default()));
        let (s, st) = (stop.clone(), stats.clone());
        let thread = rdmapool_core::util::spawn_named("rdmapool-store-repair", move || {
            run(&store, &election, every, &s, &st);
            // Give the role back for the next client.
            election.release(&store);
        })?;
        Ok(Self {
            stop,
            stats,
            thread: Some(thread),
        })
    }

    /// What it did so far.
    pub fn stats(&self) -> RepairerStats {
        *self.stats.lock()
    }
}

impl Drop for Repairer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// The repairer's loop: due at the start, every `every`, and when the view changes.
fn run(
    store: &Store,
    election: &Election,
    every: Duration,
    stop: &AtomicBool,
    stats: &Mutex<RepairerStats>,
) {
    let mut seen = None;
    let mut due = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let view: Vec<(u32, u64, bool)> = store
            .pool
            .regions()
            .members()
            .nodes
            .iter()
            .map(|n| (n.node, n.incarnation, n.up))
            .collect();
        if seen.as_ref() != Some(&view) {
            seen = Some(view);
            due = Instant::now();
        }
        if Instant::now() >= due {
            due = Instant::now() + every;
            match election.claim(store) {
                Ok(true) => match repair_once(store, election, stats) {
                    Ok(()) => {}
                    Err(e) => {
                        tracing::debug!("background repair: {e}");
                        stats.lock().errors += 1;
                        due = Instant::now() + LOOK_EVERY.max(every / 8);
                    }
                },
                Ok(false) => stats.lock().deferred_to_another += 1,
                Err(e) => {
                    tracing::debug!("claiming the repairer word: {e}");
                    stats.lock().errors += 1;
                }
            }
        }
        std::thread::park_timeout(LOOK_EVERY.min(due.saturating_duration_since(Instant::now())));
    }
}

/// One turn of the role's holder: the view changed where it follows etcd (its change
/// repairs), or else a repair, and the view settled when keys were moving and the repair
/// left nothing behind.
fn repair_once(store: &Store, election: &Election, stats: &Mutex<RepairerStats>) -> Result<()> {
    let report = match election.keep_view(store)? {
        Some((view, report)) => {
            let mut s = stats.lock();
            s.views_changed += 1;
            s.views_settled += u64::from(!view.moving());
            tracing::info!(view = view.number, members = ?view.members, "store view changed");
            report
        }
        None => {
            let report = store.block_on(store.repair())?;
            if store.block_on(store.settle_after(&report))?.is_some() {
                stats.lock().views_settled += 1;
            }
            report
        }
    };
    let mut s = stats.lock();
    s.runs += 1;
    s.copied += report.copied as u64;
    s.tombstones_cleared += report.tombstones_cleared as u64;
    s.last = Some(report);
    Ok(())
}

impl Store {
    /// Whether this client is the cluster's repairer now: it holds the repairer word of the
    /// lowest-numbered member that is up, or takes it (free, or held by an id with no lease
    /// there). See the module's text.
    async fn claim_repairer(&self) -> Result<bool> {
        let view = self.pool.regions().members();
        let Some(n) = view.nodes.iter().find(|n| n.up) else {
            return Ok(false);
        };
        if n.isolated {
            // A tenant's store: its one client repairs its own namespace.
            return Ok(true);
        }
        let me = self.pool.client_id();
        let word = self
            .pool
            .regions()
            .read(n.node, n.incarnation, REPAIRER_WORD, 8)
            .await?;
        let holder = u64::from_le_bytes(word[..8].try_into().unwrap_or([0; 8]));
        if holder == me {
            return Ok(true);
        }
        if holder != 0 && self.lease_holders(n).await?.contains(&holder) {
            return Ok(false);
        }
        let old = self
            .pool
            .regions()
            .cas(n.node, n.incarnation, REPAIRER_WORD, holder, me)
            .await?;
        Ok(old == holder)
    }

    /// Gives the repairer word back where this client holds it (best effort).
    async fn release_repairer(&self) -> Result<()> {
        let me = self.pool.client_id();
        for n in self
            .pool
            .regions()
            .up_nodes()
            .into_iter()
            .filter(|n| !n.isolated)
        {
            // A node that does not answer keeps the word; its next claimer finds no lease.
            let _ = self
                .pool
                .regions()
                .cas(n.node, n.incarnation, REPAIRER_WORD, me, 0)
                .await;
        }
        Ok(())
    }
}
