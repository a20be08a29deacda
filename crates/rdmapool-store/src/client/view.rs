//! The numbered, fenced view on a [`Store`] (docs/STORE.md section 4, `rdmapool-store/src/view.rs` for
//! the record): reading it from the servers, checking the fence words after a put and
//! beside a get, and changing it.

use super::Store;
use crate::lookup::Replica;
use crate::view::{View, MAX_IDS, VIEW_AT, VIEW_LEN};
use crate::RepairReport;
use futures_util::future::join_all;
use rdmapool_pool::remote::regions::RegionNode;
use rdmapool_pool::{CoreError, Error, Result};

/// A view change checked against the view in force and not yet written: see
/// [`Store::plan_view_change`].
pub(crate) struct ViewChange {
    /// The number of the view in force when the change was planned.
    pub(crate) from: u64,
    /// The view to write (renumber it, upward only, before applying).
    pub(crate) next: View,
    /// The store servers that were up, where it is written.
    up: Vec<RegionNode>,
}

/// Reads of a record that did not hold together (a change in progress) before giving up.
const TORN_READS: usize = 8;

/// The error of a view record that stayed torn: a change that did not finish.
pub(super) fn torn_record() -> Error {
    Error::Contended {
        what: "store view record (a view change that did not finish)",
        rounds: TORN_READS as u32,
    }
}

impl Store {
    /// The view this client places keys by: the one it last read from the servers (read
    /// on first use).
    pub(super) async fn placing_view(&self) -> Result<View> {
        if let Some(v) = self.view.lock().clone() {
            return Ok(v);
        }
        self.reload_view().await
    }

    /// Reads the view record of every store node that is up, keeps the highest-numbered
    /// one that holds together (no record anywhere: view 0, placement over the
    /// membership), and places keys by it from now on.
    ///
    /// # Errors
    /// [`Error::Contended`] when a record stayed torn (a change that did not finish).
    pub(super) async fn reload_view(&self) -> Result<View> {
        let nodes = self.pool.regions().up_nodes();
        let mut best = View::default();
        for n in &nodes {
            if let Some(v) = self.read_view(n).await? {
                if v.number > best.number {
                    best = v;
                }
            }
        }
        let mut cached = self.view.lock();
        // Never go back to an older view than one already seen.
        match cached.as_ref() {
            Some(c) if c.number > best.number => Ok(c.clone()),
            _ => {
                *cached = Some(best.clone());
                Ok(best)
            }
        }
    }

    /// `n`'s view record (`None`: none; a node that does not answer has none to say).
    async fn read_view(&self, n: &RegionNode) -> Result<Option<View>> {
        for _ in 0..TORN_READS {
            let Ok(bytes) = self
                .pool
                .regions()
                .read(n.node, n.incarnation, VIEW_AT, VIEW_LEN)
                .await
            else {
                return Ok(None);
            };
            match View::decode(&bytes) {
                Ok(v) => return Ok(v),
                Err(_) => std::thread::yield_now(),
            }
        }
        Err(torn_record())
    }

    /// The fence words of `replicas`: the view number each holds now (`None` for one that
    /// did not answer). Read after a put's last swap on each, on the same connection, so
    /// after it.
    pub(super) async fn fences(&self, replicas: &[Replica]) -> Vec<Option<u64>> {
        join_all(
            replicas
                .iter()
                .map(|r| async move { self.fence_of(r.node, r.incarnation).await.ok() }),
        )
        .await
    }

    /// The fence words of `replicas` after a put on them: those the put read right after
    /// its swaps (`read`, by node), and the others read now (a replica the put did not
    /// swap, as it held a newer version already), in the order of `replicas`.
    pub(super) async fn fences_after(
        &self,
        replicas: &[Replica],
        read: &[(u32, Option<u64>)],
    ) -> Vec<Option<u64>> {
        let missing: Vec<Replica> = replicas
            .iter()
            .filter(|r| !read.iter().any(|&(n, _)| n == r.node))
            .copied()
            .collect();
        let mut rest = if missing.is_empty() {
            Vec::new()
        } else {
            self.counters
                .put_round_trips
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.fences(&missing).await
        }
        .into_iter();
        replicas
            .iter()
            .map(|r| match read.iter().find(|&&(n, _)| n == r.node) {
                Some(&(_, word)) => word,
                None => rest.next().flatten(),
            })
            .collect()
    }

    /// The fence word of `node`: the number of the view it holds.
    async fn fence_of(&self, node: u32, incarnation: u64) -> Result<u64> {
        let b = self
            .pool
            .regions()
            .read(node, incarnation, VIEW_AT, 8)
            .await?;
        let word: Option<[u8; 8]> = b.get(..8).and_then(|w| w.try_into().ok());
        Ok(word.map_or(0, u64::from_le_bytes))
    }

    /// Whether a view newer than `number` is in force on any of `fences`.
    pub(super) fn fenced_out(fences: &[Option<u64>], number: u64) -> bool {
        fences.iter().flatten().any(|&f| f > number)
    }

    /// The view the servers hold now, read afresh (and placed by from now on).
    ///
    /// # Errors
    /// [`Error::Contended`] when a record stayed torn (a change that did not finish).
    pub async fn view(&self) -> Result<View> {
        self.reload_view().await
    }

    /// Changes the store's view to `members` (node ids of servers this client has joined
    /// and reaches), for static memberships an operator changes (`rdma-tool store view
    /// --set`): writes view `v + 1`, with the members it replaces as the previous ones, on
    /// every store server that is up (its body, then its fence word from what it held),
    /// so every put made under view `v` from then on is refused and retried under `v + 1`;
    /// then repairs (keys move from the old placement to the new one while gets read
    /// both), and, when the repair left nothing behind, settles the view (no previous
    /// members). Returns the view in force and the repair's report.
    ///
    /// # Errors
    /// [`CoreError::OutOfLimits`] for no member or more than [`MAX_IDS`];
    /// [`Error::NodeDown`] for a new member this client has not joined or does not reach;
    /// [`Error::NotEnoughReplicas`] when more than `replicas − 1` members of the view in
    /// force do not answer (a put acknowledged on them could be missed); [`Error::Contended`]
    /// when another change raced this one; the repair's errors.
    pub async fn set_view(&self, members: &[u32]) -> Result<(View, RepairReport)> {
        let change = self.plan_view_change(members).await?;
        self.apply_view_change(change).await
    }

    /// The checks of [`Store::set_view`], and the next view (numbered `v + 1`), not yet
    /// written anywhere: a changer that numbers views otherwise (by etcd's revision, where
    /// the cluster uses etcd) renumbers it before [`Store::apply_view_change`].
    pub(crate) async fn plan_view_change(&self, members: &[u32]) -> Result<ViewChange> {
        if members.is_empty() || members.len() > MAX_IDS {
            return Err(Error::Core(CoreError::OutOfLimits {
                what: "store view members",
                value: members.len() as u64,
                min: 1,
                max: MAX_IDS as u64,
            }));
        }
        let current = self.reload_view().await?;
        let known = self.pool.regions().members();
        let up: Vec<RegionNode> = known.nodes.iter().filter(|n| n.up).copied().collect();
        let old: Vec<u32> = if current.number == 0 {
            known.nodes.iter().map(|n| n.node).collect()
        } else {
            current.members.clone()
        };
        // A member kept from the view in force may be away (it counts below); one it adds
        // must answer, to be written the fence and take its keys.
        for id in members.iter().filter(|id| !old.contains(id)) {
            if !up.iter().any(|n| n.node == *id) {
                return Err(Error::NodeDown {
                    node: *id,
                    reason: "a member a store view adds must be joined and answering".into(),
                });
            }
        }
        let away = old
            .iter()
            .filter(|id| !up.iter().any(|n| n.node == **id))
            .count();
        if away > self.cfg.replicas.saturating_sub(1) {
            return Err(Error::NotEnoughReplicas {
                live: old.len() - away,
                wanted: old.len() + 1 - self.cfg.replicas,
            });
        }
        let next = current.next(members, &old);
        Ok(ViewChange {
            from: current.number,
            next,
            up,
        })
    }

    /// Writes the planned view on every store server that was up (body, then fence word),
    /// repairs, and settles the view when the repair left nothing behind.
    ///
    /// # Errors
    /// [`Error::Contended`] when another change raced this one (a fence word above the
    /// planned change's start, or a next number not above it); the repair's errors.
    pub(crate) async fn apply_view_change(
        &self,
        change: ViewChange,
    ) -> Result<(View, RepairReport)> {
        let ViewChange { from, next, up } = change;
        if next.number <= from {
            return Err(Error::Contended {
                what: "store view change (its number is not above the view in force)",
                rounds: 1,
            });
        }
        self.install(&up, &next, from).await?;
        *self.view.lock() = Some(next.clone());
        let report = self.repair().await?;
        if !report.clean() {
            return Ok((next, report));
        }
        let settled = next.settled();
        self.write_body(&up, &settled).await?;
        *self.view.lock() = Some(settled.clone());
        Ok((settled, report))
    }

    /// Settles the view in force once `report`, a repair made under it, left nothing
    /// behind: the record is written again without the previous members on every store
    /// server that is up and still holds this view's number, and gets read one placement
    /// from then on. Returns the view settled, or `None` when there was nothing to settle
    /// (no view, or one already settled) or the repair left something behind.
    ///
    /// # Errors
    /// [`Error::Contended`] when a record stayed torn; a write that failed.
    pub(crate) async fn settle_after(&self, report: &RepairReport) -> Result<Option<View>> {
        let current = self.reload_view().await?;
        let current = &current;
        if !current.moving() || !report.clean() {
            return Ok(None);
        }
        // Only where the record still holds this view: a newer change's body is not
        // overwritten.
        let held = join_all(
            self.pool
                .regions()
                .up_nodes()
                .into_iter()
                .map(|n| async move {
                    let fence = self.fence_of(n.node, n.incarnation).await.ok()?;
                    (fence == current.number).then_some(n)
                }),
        )
        .await;
        let nodes: Vec<RegionNode> = held.into_iter().flatten().collect();
        let settled = current.settled();
        self.write_body(&nodes, &settled).await?;
        *self.view.lock() = Some(settled.clone());
        Ok(Some(settled))
    }

    /// Settles the view in force if its keys have all moved: repairs, and when the repair
    /// left nothing failed, deferred or unreadable, writes the view again without its
    /// previous members, so gets read one placement from then on. (A [`Store::set_view`]
    /// whose repair left something behind returns a view still moving; the background
    /// [`Repairer`](crate::Repairer) settles it by itself.) Returns the view settled,
    /// or `None` when there was nothing to settle or the repair left something behind,
    /// with the repair's report.
    ///
    /// # Errors
    /// The repair's; [`Error::Contended`] when a record stayed torn.
    pub async fn settle_view(&self) -> Result<(Option<View>, RepairReport)> {
        let report = self.repair().await?;
        Ok((self.settle_after(&report).await?, report))
    }

    /// Writes `next` on every one of `nodes`: its body, then its fence word, swapped from
    /// what the node held (at most `from`, the number the change started from).
    async fn install(&self, nodes: &[RegionNode], next: &View, from: u64) -> Result<()> {
        self.write_body(nodes, next).await?;
        let swapped = join_all(nodes.iter().map(|n| async move {
            let held = self.fence_of(n.node, n.incarnation).await?;
            if held > from {
                return Ok(false);
            }
            let old = self
                .pool
                .regions()
                .cas(n.node, n.incarnation, VIEW_AT, held, next.number)
                .await?;
            Ok::<bool, Error>(old == held)
        }))
        .await;
        for r in swapped {
            if !r? {
                return Err(Error::Contended {
                    what: "store view change (another change raced it)",
                    rounds: 1,
                });
            }
        }
        Ok(())
    }

    /// Writes the record of `view` but its fence word (bytes 8 on) on every one of `nodes`.
    async fn write_body(&self, nodes: &[RegionNode], view: &View) -> Result<()> {
        let bytes = view.encode()?;
        let body: [&[u8]; 1] = [&bytes[8..]];
        let body = &body;
        let written = join_all(nodes.iter().map(|n| {
            self.pool
                .regions()
                .write(n.node, n.incarnation, VIEW_AT + 8, body)
        }))
        .await;
        written.into_iter().collect::<Result<Vec<_>>>().map(drop)
    }
}
