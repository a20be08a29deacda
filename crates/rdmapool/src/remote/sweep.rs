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
}

/// Reads every client slot at `now`, and expires (in the order of the module docs) the
/// clients whose lease ran out.
pub(crate) fn sweep(reaper: &mut Reaper, l: &Layout, words: &impl Words, now: Instant) -> Swept {
    let mut out = Swept::default();
    for slot in 0..l.client_count {
        let at = l.client_slot(slot);
        let owner = words.load(at);
        let beat = words.load(at + 8);
        if !reaper.observe(slot, owner, beat, now) {
            if owner != 0 {
                out.holders.insert(owner);
            }
            continue;
        }
        if !words.compare_exchange(at + 8, beat, 0) {
            // Renewed just now: alive. The reaper watches the new value from the next sweep.
            out.holders.insert(owner);
            continue;
        }
        out.reclaimed += reclaim(l, words, owner);
        words.compare_exchange(at, owner, 0);
        out.expired.push(owner);
    }
    out
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
        assert!(sweep(&mut reaper, &l, &w, t0).expired.is_empty());
        let s = sweep(&mut reaper, &l, &w, t0 + Duration::from_millis(101));
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
        sweep(&mut reaper, &l, &w, t0);
        w.after_load.set(Some(|w: &MapWords, at| {
            let beat = Layout::new(16 << 20, 1 << 20, 4).unwrap().client_slot(1) + 8;
            if at == beat {
                let v = w.words.borrow().get(&at).copied().unwrap_or(0);
                w.words.borrow_mut().insert(at, v + 1);
                w.after_load.set(None);
            }
        }));
        let s = sweep(&mut reaper, &l, &w, t0 + Duration::from_millis(101));
        assert!(s.expired.is_empty(), "{s:?}");
        assert_eq!(s.reclaimed, 0);
        assert_eq!(w.load(l.table_entry(2)), 9, "a live client's chunk taken");
        assert_eq!(w.load(l.client_slot(1) + 8), 6, "the renewal is kept");
    }
}
