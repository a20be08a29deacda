//! The exact-LRU reference of the hit-rate runs (`hit.rs`): the same stream of gets run
//! offline through a least-recently-used cache of a given number of records, every get that
//! misses filling it (a look-aside cache's miss fill), the least recently read record going
//! first. Every record of a run is the same size, so a capacity in records is the cache size
//! in bytes over the record size.
//!
//! An intrusive doubly linked list over the record numbers (the records are at most
//! `--records`, so two arrays of `u32` hold it): each get is O(1), with no allocation.

/// No record: the ends of the list.
const NIL: u32 = u32::MAX;

/// An LRU cache of up to `cap` records out of `0..records`.
pub(super) struct Lru {
    cap: usize,
    len: usize,
    /// Towards the most recently read.
    prev: Vec<u32>,
    /// Towards the least recently read.
    next: Vec<u32>,
    present: Vec<bool>,
    /// The most recently read.
    head: u32,
    /// The least recently read: the next to go.
    tail: u32,
}

impl Lru {
    /// An empty cache of `cap` records (at least 1) over records `0..records`.
    pub(super) fn new(records: usize, cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            len: 0,
            prev: vec![NIL; records],
            next: vec![NIL; records],
            present: vec![false; records],
            head: NIL,
            tail: NIL,
        }
    }

    /// Records held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn unlink(&mut self, r: u32) {
        let (p, n) = (self.prev[r as usize], self.next[r as usize]);
        match p {
            NIL => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.prev[n as usize] = p,
        }
    }

    fn push_front(&mut self, r: u32) {
        self.prev[r as usize] = NIL;
        self.next[r as usize] = self.head;
        match self.head {
            NIL => self.tail = r,
            h => self.prev[h as usize] = r,
        }
        self.head = r;
    }

    /// A get of record `r` (below `records`): whether it hit. A hit makes it the most
    /// recently read; a miss fills it in, the least recently read record going when the
    /// cache is full.
    pub(super) fn get(&mut self, r: u32) -> bool {
        if self.present[r as usize] {
            if self.head != r {
                self.unlink(r);
                self.push_front(r);
            }
            return true;
        }
        if self.len == self.cap {
            let old = self.tail;
            self.unlink(old);
            self.present[old as usize] = false;
            self.len -= 1;
        }
        self.push_front(r);
        self.present[r as usize] = true;
        self.len += 1;
        false
    }
}

/// Runs `stream` (record numbers below `records`) through an LRU of `cap` records: the
/// first `warm` gets fill it unmeasured, then the hits among the rest. Returns (hits, gets
/// measured).
pub(super) fn hits(stream: &[u32], warm: usize, records: usize, cap: usize) -> (u64, u64) {
    let mut lru = Lru::new(records, cap);
    let warm = warm.min(stream.len());
    for &r in &stream[..warm] {
        lru.get(r);
    }
    let measured = &stream[warm..];
    let hits = measured.iter().filter(|&&r| lru.get(r)).count();
    (hits as u64, measured.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A plain LRU to check against: the front the most recent.
    fn naive(stream: &[u32], cap: usize) -> Vec<bool> {
        let mut q: VecDeque<u32> = VecDeque::new();
        stream
            .iter()
            .map(|&r| {
                let hit = match q.iter().position(|&x| x == r) {
                    Some(i) => {
                        q.remove(i);
                        true
                    }
                    None => {
                        if q.len() == cap {
                            q.pop_back();
                        }
                        false
                    }
                };
                q.push_front(r);
                hit
            })
            .collect()
    }

    fn stream(seed: u64, n: usize, records: u32) -> Vec<u32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = super::super::workload::fnv1a64(x);
                // Skewed: small records more often.
                let a = (x % u64::from(records)) as u32;
                let b = ((x >> 32) % u64::from(records)) as u32;
                a.min(b)
            })
            .collect()
    }

    #[test]
    fn every_get_hits_exactly_as_a_plain_lru_does() {
        for (seed, records, cap) in [(1, 50, 1), (2, 50, 7), (3, 200, 40), (4, 10, 10)] {
            let s = stream(seed, 5000, records);
            let mut lru = Lru::new(records as usize, cap);
            let got: Vec<bool> = s.iter().map(|&r| lru.get(r)).collect();
            assert_eq!(got, naive(&s, cap), "records {records}, cap {cap}");
            assert!(lru.len() <= cap);
        }
    }

    #[test]
    fn a_larger_lru_never_hits_less_and_warm_up_is_not_counted() {
        // LRU is a stack algorithm: what a cache of c records holds, one of c + 1 holds too.
        let s = stream(9, 20_000, 500);
        let mut last = 0;
        for cap in [1, 5, 50, 100, 400, 500] {
            let (hits, gets) = hits(&s, 1000, 500, cap);
            assert_eq!(gets, 19_000);
            assert!(hits >= last, "cap {cap}: {hits} < {last}");
            last = hits;
        }
        // Every record fits: after the warm-up only the records never seen before miss.
        let (h, g) = hits(&s, 0, 500, 500);
        let distinct = s.iter().collect::<std::collections::HashSet<_>>().len() as u64;
        assert_eq!(g - h, distinct);
        assert_eq!(hits(&s, s.len() + 5, 500, 10), (0, 0));
    }
}
