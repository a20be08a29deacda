//! Where a key lives: its replicas under the view this client places keys by (both
//! placements for a read while keys move), each with its index (found, or made, on first
//! use), and the READs of a step on all of them at once.

use super::Store;
use crate::format::KeyHash;
use crate::lookup::{Read, Replica};
use crate::placement;
use crate::root::{FindRoot, Index};
use futures_util::future::join_all;
use rdmapool_pool::remote::regions::Payload;
use rdmapool_pool::remote::regions::RegionNode;
use rdmapool_pool::remote::step::{Answer, Op};
use rdmapool_pool::{Error, Result};

/// While keys move: a key's placement under the view in force, and under the previous one.
pub(super) type Moving = (Vec<u32>, Vec<u32>);

/// `count` replicas of the key hashed `h`, best first, under view `placing` (no view set:
/// over the membership `members` this client knows). While keys move, a read also names
/// the previous view's placement (after the current one's), and the two placements come
/// back apart too.
pub(super) fn placed(
    placing: &crate::view::View,
    members: &rdmapool_pool::remote::regions::Members,
    h: KeyHash,
    count: usize,
    purpose: Purpose,
) -> (Vec<u32>, Option<Moving>) {
    if placing.number == 0 {
        let ids: Vec<u32> = members.nodes.iter().map(|n| n.node).collect();
        return (placement::replicas(h, &ids, count), None);
    }
    let mut chosen = placement::replicas(h, &placing.members, count);
    if purpose != Purpose::Read || !placing.moving() {
        return (chosen, None);
    }
    let previous = placement::replicas(h, &placing.previous, count);
    let moving = Some((chosen.clone(), previous.clone()));
    for id in previous {
        if !chosen.contains(&id) {
            chosen.push(id);
        }
    }
    (chosen, moving)
}

impl Store {
    /// The key's replicas, best first, with their indexes (found or made on first use),
    /// placed over every member this client knows, up or down (docs/STORE.md section 4):
    /// for [`Purpose::Read`] those of them that are up, and how many are not; for
    /// [`Purpose::Write`] all of them, or an error naming the one that is down (a put must
    /// reach every replica a later get may read).
    pub(super) async fn replicas(
        &self,
        key: &[u8],
        count: usize,
        purpose: Purpose,
    ) -> Result<(Vec<Replica>, usize)> {
        let placing = self.placing_view().await?;
        let view = self.pool.regions().members();
        let (chosen, moving) = placed(&placing, &view, KeyHash::of(key), count, purpose);
        let member = |id: u32| view.nodes.iter().find(|n| n.node == id);
        match purpose {
            Purpose::Read if chosen.is_empty() => {
                return Err(Error::NotEnoughReplicas { live: 0, wanted: 1 })
            }
            Purpose::Read => {}
            Purpose::Write => {
                if let Some((addr, why)) = view.unreached.first().filter(|_| placing.number == 0) {
                    return Err(Error::MemberUnreached {
                        addr: addr.to_string(),
                        reason: why.clone(),
                    });
                }
                if chosen.len() < count {
                    return Err(Error::NotEnoughReplicas {
                        live: chosen.len(),
                        wanted: count,
                    });
                }
                if let Some(id) = chosen.iter().find(|&&id| member(id).is_none()) {
                    return Err(Error::MemberUnreached {
                        addr: format!("node {id}"),
                        reason: format!(
                            "a member of store view {} that this client has not joined",
                            placing.number
                        ),
                    });
                }
                if let Some(down) = chosen.iter().find(|&&id| member(id).is_some_and(|n| !n.up)) {
                    return Err(Error::NodeDown {
                        node: *down,
                        reason: "a replica of this key is down: a put waits until it answers \
                                 again or leaves the membership"
                            .into(),
                    });
                }
            }
        }
        let mut out = Vec::with_capacity(chosen.len());
        let mut missing = 0;
        for id in &chosen {
            match member(*id) {
                Some(n) if n.up => match self.replica(n).await {
                    Ok(r) => out.push(r),
                    Err(e) if purpose == Purpose::Write => return Err(e),
                    Err(_) => missing += 1,
                },
                _ => missing += 1,
            }
        }
        if out.is_empty() {
            return Err(Error::NodeDown {
                node: chosen[0],
                reason: "no replica of this key answers".into(),
            });
        }
        if let Some((current, previous)) = &moving {
            // Every put acknowledged under the previous view is on all of its placement's
            // replicas, and every one since on all of the new: a get reads around a down
            // replica only while it reads one of each (else the newest may be on those
            // that do not answer, not yet moved).
            for ids in [current, previous] {
                if !ids.iter().any(|id| out.iter().any(|r| r.node == *id)) {
                    return Err(Error::NodeDown {
                        node: ids.first().copied().unwrap_or(0),
                        reason: "while keys move to a new view, no replica of this key under \
                                 one of the two placements answers"
                            .into(),
                    });
                }
            }
        }
        Ok((out, missing))
    }

    /// `n` as a replica, with its index (found or made on first use).
    pub(super) async fn replica(&self, n: &RegionNode) -> Result<Replica> {
        Ok(Replica {
            node: n.node,
            incarnation: n.incarnation,
            layout: n.layout,
            index: self.index(n).await?,
        })
    }

    pub(super) async fn index(&self, n: &RegionNode) -> Result<Index> {
        let known = || {
            self.indexes
                .lock()
                .get(&n.node)
                .filter(|&&(inc, _)| inc == n.incarnation)
                .map(|&(_, ix)| ix)
        };
        if let Some(ix) = known() {
            return Ok(ix);
        }
        // One lookup at a time makes an index: every key of a `put_many` looks up its
        // replicas at once, and on a fresh server each found no root and claimed a chunk
        // to make one (a dozen over a wire claimed every chunk of a server, and the batch
        // failed `RemoteExhausted`). The others find the index made meanwhile.
        let _making = self.making_index.lock().await;
        if let Some(ix) = known() {
            return Ok(ix); // made meanwhile
        }
        let mut m = match n.isolated {
            true => FindRoot::tenant(n.node, n.layout, self.pool.client_id()),
            false => FindRoot::new(n.node, n.layout, self.pool.client_id()),
        };
        let ix = self
            .pool
            .regions()
            .drive(&mut m, |_| n.incarnation, Payload::None)
            .await?;
        self.indexes.lock().insert(n.node, (n.incarnation, ix));
        Ok(ix)
    }

    /// Performs a machine's step on `replicas` (the incarnations its operations name).
    pub(super) async fn perform(&self, replicas: &[Replica], ops: &[Op]) -> Result<Vec<Answer>> {
        self.pool
            .regions()
            .perform(ops, |node| incarnation(replicas, node), Payload::None)
            .await
    }

    /// The bytes of `reads` (of a lookup outside a machine), `None` for one that failed.
    pub(super) async fn reads(&self, replicas: &[Replica], reads: &[Read]) -> Vec<Option<Vec<u8>>> {
        join_all(reads.iter().map(|r| async move {
            let inc = incarnation(replicas, r.node);
            self.pool
                .regions()
                .read(r.node, inc, r.at, r.len)
                .await
                .ok()
        }))
        .await
    }
}

/// What a key's replicas are looked up for ([`Store::replicas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// A get, a lookup: read around replicas that are down.
    Read,
    /// A put, a remove, a copy: every replica must be up.
    Write,
}

pub(super) fn incarnation(replicas: &[Replica], node: u32) -> u64 {
    replicas
        .iter()
        .find(|r| r.node == node)
        .map_or(0, |r| r.incarnation)
}
