//! What a cache evicts, chosen without I/O (docs/STORE.md section 12): from the blocks a
//! client sampled on a server, Redis-style approximate LRU or LFU, leaving pinned values
//! alone; and how a key is evicted, by clearing its slots (`clear`, a state machine).

use crate::format::{Expiry, Kind, Peek, Pin};
use std::time::{Duration, Instant};

pub(crate) mod clear;

/// How a cache ranks what it may evict, as Redis's `maxmemory-policy` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Eviction {
    /// The value read longest ago goes first (`allkeys-lru`).
    #[default]
    Lru,
    /// The value read least often goes first, its count halved for every minute since it
    /// was last read, so a value once hot fades (`allkeys-lfu`); ties go by age.
    Lfu,
}

/// One sampled block a cache may evict: its key and version (as its header says) and its
/// rank (lower goes first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The key.
    pub(crate) key: Vec<u8>,
    /// The version the sampled block holds.
    pub(crate) version: crate::format::Version,
    /// What it holds (a value or a striped value's manifest).
    pub(crate) kind: Kind,
    /// The block's bytes, as its slot's length bound gives them.
    pub(crate) bytes: u64,
    /// When it was last read, as sampled (microseconds since the Unix epoch).
    pub(crate) accessed_us: u64,
    /// Its reads counted, as sampled.
    pub(crate) accesses: u64,
    /// Lower is evicted first.
    rank: (u8, u64, u64),
}

/// What the eviction of one server may take, and how it ranks it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// The policy.
    pub(crate) policy: Eviction,
    /// Now, in microseconds since the Unix epoch (with the clock skew added: what a
    /// reader would take as expired).
    pub(crate) now_us: u64,
    /// A soft-pinned value read (or put) within this many microseconds is kept while any
    /// other candidate is left.
    pub(crate) soft_pin_us: u64,
}

impl Rules {
    /// `peek` as a candidate of `bytes` bytes, or `None` when it may never be evicted: a
    /// tombstone, a striped value's part (it goes with its manifest), a hard-pinned value.
    pub(crate) fn candidate(&self, peek: Peek, bytes: u64) -> Option<Candidate> {
        if !matches!(peek.kind, Kind::Value | Kind::Manifest) || peek.pin == Pin::Hard {
            return None;
        }
        let expired = peek.expiry != Expiry::NEVER && peek.expiry.is_past(self.now_us / 1000);
        let age = self.now_us.saturating_sub(peek.accessed_us);
        let soft_held = peek.pin == Pin::Soft && age < self.soft_pin_us;
        // Expired values first, soft-pinned ones held last; then the policy's order.
        let tier = match (expired, soft_held) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        };
        let rank = match self.policy {
            Eviction::Lru => (tier, peek.accessed_us, 0),
            Eviction::Lfu => {
                let minutes = age / 60_000_000;
                let count = peek.accesses.checked_shr(minutes as u32).unwrap_or(0);
                (tier, count, peek.accessed_us)
            }
        };
        Some(Candidate {
            accessed_us: peek.accessed_us,
            accesses: peek.accesses,
            key: peek.key,
            version: peek.version,
            kind: peek.kind,
            bytes,
            rank,
        })
    }
}

/// A client's best candidates on one server, kept between evictions as Redis keeps its
/// eviction pool: each eviction adds what it sampled and takes the lowest ranked, so a few
/// samples per key evicted choose about as well as many (docs/STORE.md section 12).
#[derive(Debug, Clone, Default)]
pub(crate) struct EvictionPool {
    /// Lowest ranked first, each key once, with when it was sampled.
    held: Vec<(Candidate, Instant)>,
}

impl EvictionPool {
    /// Candidates kept between evictions.
    pub(crate) const SIZE: usize = 16;

    /// Adds `sampled` (sampled at `now`), drops what was sampled `fresh_for` before `now`
    /// or more (its rank may be stale: read since, or evicted by another client), and
    /// takes out up to `want` victims, lowest ranked first, each key once. Soft-pinned
    /// values read lately are taken only when nothing else is held; the rest stays, the
    /// best [`Self::SIZE`].
    pub(crate) fn take(
        &mut self,
        sampled: Vec<Candidate>,
        now: Instant,
        fresh_for: Duration,
        want: usize,
    ) -> Vec<Candidate> {
        self.held
            .retain(|(_, at)| now.saturating_duration_since(*at) < fresh_for);
        for c in sampled {
            // A newer sample of a key replaces the older.
            self.held.retain(|(h, _)| h.key != c.key);
            self.held.push((c, now));
        }
        self.held.sort_by_key(|(c, _)| c.rank);
        let plain = self.held.iter().filter(|(c, _)| !c.soft_held()).count();
        let mut out = Vec::new();
        let mut kept = Vec::with_capacity(self.held.len());
        for (c, at) in self.held.drain(..) {
            if out.len() < want && (plain == 0 || !c.soft_held()) {
                out.push(c);
            } else {
                kept.push((c, at));
            }
        }
        kept.truncate(Self::SIZE);
        self.held = kept;
        out
    }
}

impl Candidate {
    /// A soft-pinned value read (or put) within the soft-pin time.
    fn soft_held(&self) -> bool {
        self.rank.0 == 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Version;

    /// A peek of a block read `accessed_ms` milliseconds after the epoch.
    fn peek(key: &str, accessed_ms: u64, accesses: u64, pin: Pin, kind: Kind) -> Peek {
        Peek {
            key: key.as_bytes().to_vec(),
            version: Version { seq: 1, writer: 7 },
            tombstone: kind == Kind::Tombstone,
            kind,
            expiry: Expiry::NEVER,
            pin,
            accessed_us: accessed_ms * 1000,
            accesses,
        }
    }

    fn rules(policy: Eviction) -> Rules {
        Rules {
            policy,
            now_us: 10_000_000 * 1000,
            soft_pin_us: 60_000 * 1000,
        }
    }

    fn pick(r: Rules, peeks: Vec<Peek>) -> Option<String> {
        let group = peeks
            .into_iter()
            .filter_map(|p| r.candidate(p, 128))
            .collect();
        EvictionPool::default()
            .take(group, Instant::now(), Duration::from_secs(1), 1)
            .pop()
            .map(|c| String::from_utf8(c.key).unwrap())
    }

    #[test]
    fn lru_evicts_the_value_read_longest_ago() {
        let r = rules(Eviction::Lru);
        let got = pick(
            r,
            vec![
                peek("new", 9_999_000, 1, Pin::None, Kind::Value),
                peek("old", 9_000_000, 100, Pin::None, Kind::Value),
                peek("mid", 9_500_000, 1, Pin::None, Kind::Value),
            ],
        );
        assert_eq!(got.as_deref(), Some("old"));
    }

    #[test]
    fn lfu_evicts_the_value_read_least_often_and_counts_fade() {
        let r = rules(Eviction::Lfu);
        let got = pick(
            r,
            vec![
                peek("hot", 9_999_000, 50, Pin::None, Kind::Value),
                peek("cold", 9_999_500, 2, Pin::None, Kind::Value),
            ],
        );
        assert_eq!(got.as_deref(), Some("cold"));
        // 50 reads ten minutes ago fade to 0: below 2 reads now.
        let got = pick(
            r,
            vec![
                peek("was-hot", 10_000_000 - 600_000, 50, Pin::None, Kind::Value),
                peek("warm", 9_999_500, 2, Pin::None, Kind::Value),
            ],
        );
        assert_eq!(got.as_deref(), Some("was-hot"));
    }

    #[test]
    fn pins_tombstones_and_parts_are_never_candidates() {
        let r = rules(Eviction::Lru);
        for (pin, kind) in [
            (Pin::Hard, Kind::Value),
            (Pin::None, Kind::Tombstone),
            (Pin::None, Kind::Part),
        ] {
            assert_eq!(pick(r, vec![peek("k", 0, 0, pin, kind)]), None);
        }
    }

    #[test]
    fn a_soft_pin_holds_while_anything_else_is_left_and_for_its_time_only() {
        let r = rules(Eviction::Lru);
        let soft = peek("soft", 1_000, 0, Pin::Soft, Kind::Value);
        let fresh_soft = peek("fresh-soft", 9_990_000, 0, Pin::Soft, Kind::Value);
        let plain = peek("plain", 9_999_999, 0, Pin::None, Kind::Value);
        // Read long ago: its soft pin has lapsed, so it is the oldest.
        assert_eq!(pick(r, vec![soft, plain.clone()]).as_deref(), Some("soft"));
        // Read lately: the plain value goes first, however new.
        assert_eq!(
            pick(r, vec![fresh_soft.clone(), plain]).as_deref(),
            Some("plain")
        );
        // Alone, it goes.
        assert_eq!(
            pick(r, vec![fresh_soft.clone()]).as_deref(),
            Some("fresh-soft")
        );
        // Asked for two, it gives the plain value only while the pool holds it.
        let c = |p: Peek| r.candidate(p, 128).unwrap();
        let plain = peek("plain", 9_999_999, 0, Pin::None, Kind::Value);
        let mut pool = EvictionPool::default();
        let (now, fresh) = (Instant::now(), Duration::from_secs(1));
        assert_eq!(
            names(pool.take(vec![c(fresh_soft.clone()), c(plain)], now, fresh, 2)),
            ["plain"]
        );
        assert_eq!(names(pool.take(vec![], now, fresh, 2)), ["fresh-soft"]);
    }

    fn names(v: Vec<Candidate>) -> Vec<String> {
        v.into_iter()
            .map(|c| String::from_utf8(c.key).unwrap())
            .collect()
    }

    #[test]
    fn the_pool_keeps_the_best_candidates_between_evictions_while_they_are_fresh() {
        let r = rules(Eviction::Lru);
        let c = |key: &str, at: u64| {
            r.candidate(peek(key, at, 0, Pin::None, Kind::Value), 128)
                .unwrap()
        };
        let mut pool = EvictionPool::default();
        let t0 = Instant::now();
        let fresh = Duration::from_secs(1);
        // Twenty sampled, one taken: the oldest; the next fifteen oldest stay.
        let sampled: Vec<Candidate> = (0..20).map(|i| c(&format!("k{i}"), 1_000 + i)).collect();
        assert_eq!(names(pool.take(sampled, t0, fresh, 1)), ["k0"]);
        // A fresh sample of newer keys loses to what the pool kept.
        let later = vec![c("new-a", 9_000_000), c("new-b", 9_000_001)];
        assert_eq!(names(pool.take(later, t0, fresh, 2)), ["k1", "k2"]);
        // A newer sample of a key held replaces its old rank.
        assert_eq!(
            names(pool.take(vec![c("k3", 9_500_000)], t0, fresh, 1)),
            ["k4"]
        );
        // Held candidates go stale after `fresh`: only the new sample is left.
        let t1 = t0 + fresh;
        assert_eq!(
            names(pool.take(vec![c("late", 9_999_000)], t1, fresh, 3)),
            ["late"]
        );
        assert_eq!(names(pool.take(vec![], t1, fresh, 3)), Vec::<String>::new());
        // Never more than SIZE held.
        let many: Vec<Candidate> = (0..100).map(|i| c(&format!("m{i}"), i)).collect();
        assert_eq!(pool.take(many, t1, fresh, 0), vec![]);
        assert_eq!(pool.take(vec![], t1, fresh, 100).len(), EvictionPool::SIZE);
    }

    #[test]
    fn an_expired_value_goes_first() {
        let r = rules(Eviction::Lru);
        let mut expired = peek("expired", 9_999_999, 9, Pin::Soft, Kind::Value);
        expired.expiry = Expiry(9_000_000);
        let old = peek("old", 1, 0, Pin::None, Kind::Value);
        assert_eq!(pick(r, vec![old, expired]).as_deref(), Some("expired"));
    }
}
