//! What a memory server does to its region every quarter lease: expire the clients whose
//! heartbeat stood still for a lease ([`Reaper`]) and take their chunks back. Written over
//! [`Words`], so the server runs it on its registered region and the client's simulated
//! cluster (`client/sim/`) on words in memory, interleaved with clients' operations.
//!
//! The order is what makes it safe against a renewal that lands in the middle:
//! 1. the heartbeat is swapped from the value the reaper saw to 0 with one compare-and-swap.
//!    If a renewal landed since, the swap fails and the client is not expired; once it is
//!    done, every later renewal finds 0 and its client knows the lease is lost;
//! 2. each chunk the client owns gets its magic zeroed (frees and pointer checks of its
//!    objects fail from then on), then its table entry released;
//! 3. last, the slot's owner word is released. Until then a restart of the same id finds
//!    the slot still taken (owner the id, heartbeat 0) and waits (`client/takeover/`), so it
//!    never recovers chunks that are being taken back.
//!
//! An isolated server (issue #41) splits the sweep in two ([`Reclaim::Later`]): step 1 under
//! its connection lock, then it closes the expired clients' connections (revoking their
//! windows), and only then steps 2 and 3 ([`release`]), so nothing of an expired client
//! changes hands while a window of its still works. It also answers who holds a slot from
//! its own record, not from the owner word ([`Words::slot_owner`]).

use super::layout::{self, Layout};
use super::lease::Reaper;
use std::collections::HashSet;
use std::time::Instant;

/// The region's 8-byte words, as the server (or a simulation) changes them: each call is
/// one atomic access at a byte offset.
pub(crate) trait Words {
    /// The word at `at`.
    fn load(&self, at: u64) -> u64;
    /// Sets the word at `at`.
    fn store(&self, at: u64, value: u64);
    /// Swaps the word at `at` from `current` to `new`; whether it held `current`.
    fn compare_exchange(&self, at: u64, current: u64, new: u64) -> bool;

    /// The id that holds lease slot `slot`: its owner word. An isolated server answers from
    /// its own record instead: a tenant's window must never decide whom the sweep expires.
    fn slot_owner(&self, l: &Layout, slot: u64) -> u64 {
        self.load(l.client_slot(slot) + layout::slot::OWNER)
    }

    /// Frees lease slot `slot`, held by `owner` (the sweep's last step).
    fn free_slot(&self, l: &Layout, slot: u64, owner: u64) {
        self.compare_exchange(l.client_slot(slot) + layout::slot::OWNER, owner, 0);
    }
}

/// When the sweep takes an expired client's chunks and slot back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reclaim {
    /// At once (a trusted server: no window to revoke first).
    Now,
    /// Not in the sweep: it lists them in [`Swept::pending`] for [`release`], called once
    /// the client's windows are gone (an isolated server).
    Later,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Clients whose lease expired.
    pub(crate) expired: Vec<u64>,
    /// Chunks taken back from them.
    pub(crate) reclaimed: u64,
    /// The ids that hold a lease after the sweep.
    pub(crate) holders: HashSet<u64>,
    /// [`Reclaim::Later`]: the expired `(slot, owner)` pairs whose chunks and slot are still
    /// to be [`release`]d.
    pub(crate) pending: Vec<(u64, u64)>,
}

/// Reads every client slot at `now`, and expires (in the order of the module docs) the
/// clients whose lease ran out; `reclaim` says whether their chunks and slots are taken
/// back now or left to [`release`].
pub(crate) fn sweep(
    reaper: &mut Reaper,
    l: &Layout,
    words: &impl Words,
    now: Instant,
    reclaim: Reclaim,
) -> Swept {
    let mut out = Swept::default();
    for slot in 0..l.client_count {
        let at = l.client_slot(slot);
        let owner = words.slot_owner(l, slot);
        let beat = words.load(at + layout::slot::HEARTBEAT);
        if !reaper.observe(slot, owner, beat, now) {
            if owner != 0 {
                out.holders.insert(owner);
            }
            continue;
        }
        if !words.compare_exchange(at + layout::slot::HEARTBEAT, beat, 0) {
            // Renewed just now: alive. The reaper watches the new value from the next sweep.
            out.holders.insert(owner);
            continue;
        }
        match reclaim {
            Reclaim::Now => out.reclaimed += release(l, words, slot, owner),
            Reclaim::Later => out.pending.push((slot, owner)),
        }
        out.expired.push(owner);
    }
    out
}

/// Steps 2 and 3 of an expiry (module docs): takes back every chunk of `owner`, then frees
/// its slot. Returns how many chunks.
pub(crate) fn release(l: &Layout, words: &impl Words, slot: u64, owner: u64) -> u64 {
    let n = reclaim(l, words, owner);
    words.free_slot(l, slot, owner);
    n
}

/// Takes back every chunk `owner` holds: its magic is zeroed first, then the table entry
/// released. Returns how many.
pub(crate) fn reclaim(l: &Layout, words: &impl Words, owner: u64) -> u64 {
    let mut n = 0;
    for i in 0..l.chunk_count {
        let entry = l.table_entry(i);
        if words.load(entry) == owner {
            words.store(l.chunk(i) + layout::chunk::MAGIC, 0);
            if words.compare_exchange(entry, owner, 0) {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;
    use std::time::Duration;

    /// Runs after a load of the word at the offset it is given.
    type Hook = fn(&MapWords, u64);

    /// Words in a map, with a hook run after every load (to land a client's operation in
    /// the middle of a sweep).
    #[derive(Default)]
    struct MapWords {
        words: RefCell<HashMap<u64, u64>>,
        after_load: Cell<Option<Hook>>,
    }

    impl Words for MapWords {
        fn load(&self, at: u64) -> u64 {
            let v = self.words.borrow().get(&at).copied().unwrap_or(0);
            if let Some(hook) = self.after_load.get() {
                hook(self, at);
            }
            v
        }
        fn store(&self, at: u64, value: u64) {
            self.words.borrow_mut().insert(at, value);
        }
        fn compare_exchange(&self, at: u64, current: u64, new: u64) -> bool {
            let mut w = self.words.borrow_mut();
            let v = w.entry(at).or_insert(0);
            if *v == current {
                *v = new;
                true
            } else {
                false
            }
        }
    }

    fn setup() -> (Layout, MapWords, Reaper, Instant) {
        let l = Layout::new(16 << 20, 1 << 20, 4).unwrap();
        let w = MapWords::default();
        // Client 9 in slot 1 with heartbeat 5, owning chunks 2 and 7 (initialised).
        w.store(l.client_slot(1), 9);
        w.store(l.client_slot(1) + 8, 5);
        for c in [2, 7] {
            w.store(l.table_entry(c), 9);
            w.store(l.chunk(c), layout::CHUNK_MAGIC);
        }
        let lease = Duration::from_millis(100);
        (l, w, Reaper::new(lease), Instant::now())
    }

    #[test]
    fn an_expired_client_loses_its_slot_and_chunks_in_order() {
        let (l, w, mut reaper, t0) = setup();
        assert!(sweep(&mut reaper, &l, &w, t0, Reclaim::Now)
            .expired
            .is_empty());
        let s = sweep(
            &mut reaper,
            &l,
            &w,
            t0 + Duration::from_millis(101),
            Reclaim::Now,
        );
        assert_eq!((s.expired, s.reclaimed), (vec![9], 2));
        for c in [2, 7] {
            assert_eq!(w.load(l.table_entry(c)), 0);
            assert_eq!(w.load(l.chunk(c)), 0);
        }
        assert_eq!(w.load(l.client_slot(1)), 0);
        assert_eq!(w.load(l.client_slot(1) + 8), 0);
    }

    #[test]
    fn a_renewal_landing_during_the_sweep_keeps_the_lease() {
        // The client's fetch-and-add executes right after the reaper read the heartbeat.
        // Zeroing after reclaiming (the old order) let that renewal come back intact, so the
        // client went on using chunks already taken back.
        let (l, w, mut reaper, t0) = setup();
        sweep(&mut reaper, &l, &w, t0, Reclaim::Now);
        w.after_load.set(Some(|w: &MapWords, at| {
            let beat = Layout::new(16 << 20, 1 << 20, 4).unwrap().client_slot(1) + 8;
            if at == beat {
                let v = w.words.borrow().get(&at).copied().unwrap_or(0);
                w.words.borrow_mut().insert(at, v + 1);
                w.after_load.set(None);
            }
        }));
        let s = sweep(
            &mut reaper,
            &l,
            &w,
            t0 + Duration::from_millis(101),
            Reclaim::Now,
        );
        assert!(s.expired.is_empty(), "{s:?}");
        assert_eq!(s.reclaimed, 0);
        assert_eq!(w.load(l.table_entry(2)), 9, "a live client's chunk taken");
        assert_eq!(w.load(l.client_slot(1) + 8), 6, "the renewal is kept");
    }

    /// Words whose slot holders come from a record kept apart, as an isolated server keeps
    /// them (issue #41).
    struct Recorded {
        words: MapWords,
        owners: HashMap<u64, u64>,
    }

    impl Words for Recorded {
        fn load(&self, at: u64) -> u64 {
            self.words.load(at)
        }
        fn store(&self, at: u64, value: u64) {
            self.words.store(at, value)
        }
        fn compare_exchange(&self, at: u64, current: u64, new: u64) -> bool {
            self.words.compare_exchange(at, current, new)
        }
        fn slot_owner(&self, _: &Layout, slot: u64) -> u64 {
            self.owners.get(&slot).copied().unwrap_or(0)
        }
    }

    #[test]
    fn a_rewritten_owner_word_expires_its_writer_not_the_id_it_names() {
        // Issue #41, finding 1: client 666 wrote 9 (another client's id) into its own
        // slot's owner word and stopped renewing; the sweep expired 9 and took its chunks.
        let (l, words, mut reaper, t0) = setup();
        words.store(l.client_slot(2), 9); // the rewrite; the record says 666
        words.store(l.client_slot(2) + 8, 3);
        words.store(l.table_entry(4), 666);
        let w = Recorded {
            words,
            owners: HashMap::from([(1, 9), (2, 666)]),
        };
        sweep(&mut reaper, &l, &w, t0, Reclaim::Later);
        // Client 9 renews; 666 does not.
        w.store(l.client_slot(1) + 8, 6);
        let s = sweep(
            &mut reaper,
            &l,
            &w,
            t0 + Duration::from_millis(101),
            Reclaim::Later,
        );
        assert_eq!((s.expired, &s.pending[..]), (vec![666], &[(2, 666)][..]));
        assert!(s.holders.contains(&9));
        assert_eq!(w.load(l.table_entry(4)), 666, "later: nothing taken yet");
        assert_eq!(release(&l, &w, 2, 666), 1);
        assert_eq!(w.load(l.table_entry(4)), 0);
        for c in [2, 7] {
            assert_eq!(w.load(l.table_entry(c)), 9, "client 9's chunk {c} taken");
            assert_eq!(w.load(l.chunk(c)), layout::CHUNK_MAGIC);
        }
    }
}
