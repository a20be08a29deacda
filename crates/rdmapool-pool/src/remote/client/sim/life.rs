//! A simulated client's life: joining a node (taking a lease slot), recovering its chunks,
//! and its allocation and free tasks, each a machine driven one step at a time.

use super::*;

impl Cluster {
    /// Goes as far as the takeover can at this time (the real client reads the watched
    /// heartbeat every few milliseconds, whoever else runs).
    pub(super) fn join_step(&mut self, i: usize) {
        for _ in 0..64 {
            if !self.join_once(i) {
                return;
            }
        }
    }

    /// One step of client `i`'s takeover: performs the operation it asked for and
    /// advances it; `false` once it waits for a later time (or is not joining).
    pub(super) fn join_once(&mut self, i: usize) -> bool {
        let now = self.now;
        let at = self.at(now);
        let c = &mut self.clients[i];
        let Life::Joining { t, asked } = &mut c.life else {
            return false;
        };
        let answers: Vec<Answer> = asked
            .take()
            .map(|op| self.region.apply(&op.io))
            .into_iter()
            .collect();
        match t.advance(&mut (), at, &answers) {
            Ok(Step::One(op)) => {
                *asked = Some(op);
                true
            }
            Ok(Step::Do(ops)) => unreachable!("a takeover asks one operation at a time: {ops:?}"),
            Ok(Step::Sleep(_)) => false,
            Ok(Step::Wait) => unreachable!("a takeover waits for no other task"),
            Ok(Step::Done(taken)) => {
                if let Some(sent) = taken.renewed {
                    c.holder.renewed(sent);
                }
                c.slot = taken.slot_at;
                c.beat = taken.beat;
                c.next_renew = now;
                c.life = Life::Recovering {
                    m: Recover::new(),
                    pending: None,
                };
                self.recover_step(i);
                false
            }
            Err(Error::ClientIdInUse { .. }) => {
                // The predecessor is alive for the server: wait and try again.
                let l = self.region.layout;
                let base = hash64(self.randoms.get());
                self.randoms.set(self.randoms.get() + 1);
                c.life = Life::Joining {
                    t: Takeover::new(
                        c.id,
                        self.lease,
                        l.client_count,
                        hash64(c.id) % l.client_count,
                        base,
                    )
                    .on_node(NODE, l, false),
                    asked: None,
                };
                false
            }
            Err(e) => panic!("eight slots, at most four clients: {e}\n{:?}", self.log),
        }
    }

    pub(super) fn recover_step(&mut self, i: usize) {
        let at = self.at(self.now);
        let c = &mut self.clients[i];
        if !c.holder.may_use(at) {
            c.life = Life::Down;
            return;
        }
        let Life::Recovering { m, pending } = &mut c.life else {
            return;
        };
        let answers: Vec<Answer> = pending
            .take()
            .map(|io| self.region.apply(&io))
            .into_iter()
            .collect();
        match m
            .advance(&mut c.book, at, &answers)
            .expect("recovery decides without errors")
        {
            Step::One(op) => *pending = Some(op.io),
            Step::Do(ops) => unreachable!("recovery asks one operation at a time: {ops:?}"),
            Step::Sleep(_) | Step::Wait => unreachable!("recovery waits for nothing"),
            Step::Done(()) => {
                c.life = Life::Up;
                self.joined(i);
            }
        }
    }

    /// Checks what a client that just joined finds: stale pointers refused, and what it
    /// recovered against what its predecessor held.
    pub(super) fn joined(&mut self, i: usize) {
        let c = &mut self.clients[i];
        for ptr in std::mem::take(&mut c.stale) {
            match c.book.check(ptr, false) {
                Err(Error::StalePointer { .. }) => {}
                other => panic!("{ptr} after a server restart: {other:?}\n{:#?}", self.log),
            }
        }
        let mut recovered = Vec::new();
        for (chunk, shape) in c.book.owned() {
            let base = self.region.layout.chunk(chunk) + shape.first_object;
            let bits = self
                .region
                .apply(&Io::Read {
                    at: self.region.layout.chunk(chunk) + layout::chunk::BITMAP,
                    len: shape.object_count.div_ceil(64) * 8,
                })
                .words();
            for obj in 0..shape.object_count {
                if bits[(obj / 64) as usize] & (1 << (obj % 64)) != 0 {
                    recovered.push(base + obj * shape.object_size);
                }
            }
        }
        let expiries_now = self.expiries.get(&c.id).copied().unwrap_or(0);
        c.expiries_at_join = expiries_now;
        let Some(Predecessor {
            held,
            freeing,
            expiries_at_join,
            lost,
        }) = c.predecessor.take()
        else {
            assert!(
                recovered.is_empty(),
                "a first start recovered {recovered:?}"
            );
            return;
        };
        let expired = expiries_now != expiries_at_join;
        if expired {
            assert!(
                recovered.is_empty(),
                "{}: the server expired the id, yet {recovered:?} were recovered\n{:#?}",
                c.id,
                self.log
            );
        } else if !lost {
            // Everything held, and of what was being freed, what the free had not cleared.
            let missing: Vec<u64> = held
                .iter()
                .map(|h| h.ptr.offset)
                .filter(|o| !recovered.contains(o))
                .collect();
            let extra: Vec<u64> = recovered
                .iter()
                .copied()
                .filter(|o| !held.iter().chain(&freeing).any(|h| h.ptr.offset == *o))
                .collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{}: not recovered {missing:?}, recovered but not held {extra:?}\n{:#?}",
                c.id,
                self.log
            );
        }
        for off in recovered {
            let shape = c
                .book
                .owned()
                .into_iter()
                .find(|(ch, _)| self.region.layout.chunk_of(off) == Some(*ch))
                .map(|(_, s)| s)
                .expect("recovered in an owned chunk");
            let ptr = RemotePtr {
                node: 1,
                offset: off,
                len: shape.object_size,
                incarnation: c.incarnation,
            };
            let tag = match held.iter().chain(&freeing).find(|h| h.ptr.offset == off) {
                Some(h) => {
                    let found = self.region.load(off);
                    assert_eq!(
                        found, h.tag,
                        "{}: {ptr} recovered with other bytes\n{:#?}",
                        c.id, self.log
                    );
                    h.tag
                }
                None => {
                    // Its allocation's answer was lost: it is ours now, tag it.
                    c.seq += 1;
                    let tag = c.id << 32 | c.seq;
                    self.region.store(off, tag);
                    tag
                }
            };
            c.held.push(Held { ptr, tag });
        }
    }

    pub(super) fn start_task(&mut self, i: usize, pick: u8) {
        let now = self.now;
        let l = self.region.layout;
        let c = &mut self.clients[i];
        let kind = pick % 3;
        if kind == 0 || (kind == 1 && c.held.is_empty()) {
            let size = SIZES[pick as usize / 3 % SIZES.len()];
            let class = size_class(size, l.chunk_size).expect("fits");
            c.tasks.push((
                Task::Alloc {
                    m: Alloc::new(class),
                    size,
                },
                None,
            ));
        } else if kind == 1 {
            let h = c.held.swap_remove(pick as usize % c.held.len());
            let obj = match c.book.check(h.ptr, true) {
                Ok(Checked::Known(o)) => o,
                other => panic!(
                    "{now} ms: own {} checks as {other:?}\n{:#?}",
                    h.ptr, self.log
                ),
            };
            let found = self.region.load(h.ptr.offset);
            assert_eq!(
                found, h.tag,
                "{}: {} holds other bytes\n{:#?}",
                c.id, h.ptr, self.log
            );
            c.freeing.push(h);
            c.tasks.push((
                Task::Free {
                    m: Free::new(h.ptr, obj),
                    ptr: h.ptr,
                },
                None,
            ));
        } else {
            // Look at every object held: each still holds this client's tag.
            for h in &c.held {
                assert!(matches!(c.book.check(h.ptr, false), Ok(Checked::Known(_))));
                let found = self.region.load(h.ptr.offset);
                assert_eq!(
                    found, h.tag,
                    "{now} ms: {} found other bytes in {}\n{:#?}",
                    c.id, h.ptr, self.log
                );
            }
            return;
        }
        let t = c.tasks.len() - 1;
        self.task_step(i, t);
    }

    /// Task `t` of client `i`: performs its pending operation (if any) and advances it.
    pub(super) fn task_step(&mut self, i: usize, t: usize) {
        let now = self.now;
        let at = self.at(now);
        let c = &mut self.clients[i];
        let pending = c.tasks[t].1.take();
        let answer = match pending {
            Some(io) => {
                let a = self.region.apply(&io);
                if std::mem::take(&mut c.lose_next) {
                    // Landed, but the connection died with the answer: every machine gives
                    // back what it reserved, and the node is down for this client.
                    self.log
                        .push(format!("{now} ms: {} lost the answer to {io:?}", c.id));
                    for (task, _) in &mut c.tasks {
                        match task {
                            Task::Alloc { m, .. } => m.abandon(&mut c.book),
                            Task::Free { m, .. } => m.abandon(&mut c.book),
                        }
                    }
                    c.tasks.clear();
                    c.lost = true;
                    c.life = Life::Down;
                    return;
                }
                vec![a]
            }
            None => Vec::new(),
        };
        let (task, slot) = &mut c.tasks[t];
        let done = match task {
            Task::Alloc { m, size } => match m.advance(&mut c.book, at, &answer).expect("alloc") {
                Step::One(op) => {
                    *slot = Some(op.io);
                    None
                }
                Step::Do(ops) => unreachable!("one operation at a time: {ops:?}"),
                Step::Sleep(_) | Step::Wait => None,
                Step::Done(Some(offset)) => Some(Some((offset, *size))),
                Step::Done(None) => Some(None),
            },
            Task::Free { m, ptr } => match m.advance(&mut c.book, at, &answer) {
                Ok(Step::One(op)) => {
                    *slot = Some(op.io);
                    None
                }
                Ok(Step::Do(ops)) => unreachable!("one operation at a time: {ops:?}"),
                Ok(Step::Sleep(_) | Step::Wait) => None,
                Ok(Step::Done(_)) => {
                    let p = *ptr;
                    c.freeing.retain(|h| h.ptr.offset != p.offset);
                    Some(None)
                }
                Err(e) => panic!(
                    "{now} ms: {} freeing its own {ptr}: {e}\n{:#?}",
                    c.id, self.log
                ),
            },
        };
        let Some(result) = done else {
            return;
        };
        c.tasks.swap_remove(t);
        let Some((offset, size)) = result else {
            return;
        };
        let id = c.id;
        // No other client that may still use this object holds it.
        for o in &self.clients {
            let may = o.id == id || (matches!(o.life, Life::Up) && o.holder.may_use(at));
            if may
                && o.held
                    .iter()
                    .chain(&o.freeing)
                    .any(|h| h.ptr.offset == offset)
            {
                panic!(
                    "{now} ms: {offset} handed to {id} while {} holds it\n{:#?}",
                    o.id, self.log
                );
            }
        }
        let c = &mut self.clients[i];
        c.seq += 1;
        let tag = id << 32 | c.seq;
        self.region.store(offset, tag);
        let class = size_class(size, self.region.layout.chunk_size).expect("fits");
        debug_assert!(ChunkShape::new(self.region.layout.chunk_size, class).object_size >= size);
        c.held.push(Held {
            ptr: RemotePtr {
                node: 1,
                offset,
                len: size,
                incarnation: c.incarnation,
            },
            tag,
        });
    }
}
