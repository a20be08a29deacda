//! What a cache evicts, chosen without I/O (docs/STORE.md section 12): from the blocks a
//! client sampled on a server, Redis-style approximate LRU or LFU, leaving pinned values
//! alone; and how a key is evicted, by clearing its slots (`clear`, a state machine).

use crate::format::{Expiry, Kind, Peek, Pin};

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
    /// Lower is evicted first.
    rank: (u8, u64, u64),
}

/// What the eviction of one server may take, and how it ranks it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// The policy.
    pub(crate) policy: Eviction,
    /// Now, in milliseconds since the Unix epoch (with the clock skew added: what a
    /// reader would take as expired).
    pub(crate) now_ms: u64,
    /// A soft-pinned value read (or put) within this many milliseconds is kept while any
    /// other candidate is left.
    pub(crate) soft_pin_ms: u64,
}

impl Rules {
    /// `peek` as a candidate of `bytes` bytes, or `None` when it may never be evicted: a
    /// tombstone, a striped value's part (it goes with its manifest), a hard-pinned value.
    pub(crate) fn candidate(&self, peek: Peek, bytes: u64) -> Option<Candidate> {
        if !matches!(peek.kind, Kind::Value | Kind::Manifest) || peek.pin == Pin::Hard {
            return None;
        }
        let expired = peek.expiry != Expiry::NEVER && peek.expiry.is_past(self.now_ms);
        let age = self.now_ms.saturating_sub(peek.accessed_ms);
        let soft_held = peek.pin == Pin::Soft && age < self.soft_pin_ms;
        // Expired values first, soft-pinned ones held last; then the policy's order.
        let tier = match (expired, soft_held) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        };
        let rank = match self.policy {
            Eviction::Lru => (tier, peek.accessed_ms, 0),
            Eviction::Lfu => {
                let minutes = age / 60_000;
                let count = peek.accesses.checked_shr(minutes as u32).unwrap_or(0);
                (tier, count, peek.accessed_ms)
            }
        };
        Some(Candidate {
            key: peek.key,
            version: peek.version,
            kind: peek.kind,
            bytes,
            rank,
        })
    }
}

/// The candidate of `group` to evict: the lowest ranked. `None` for an empty group.
pub(crate) fn victim(group: Vec<Candidate>) -> Option<Candidate> {
    group.into_iter().min_by_key(|c| c.rank)
}

/// The victims of one eviction, from each sampled group's [`victim`], each key once: those
/// that are not soft-pinned values read lately, or, when every group found only those,
/// them (a soft pin holds while anything else is left).
pub(crate) fn victims(groups: Vec<Vec<Candidate>>) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    for v in groups.into_iter().filter_map(victim) {
        if !out.iter().any(|o| o.key == v.key) {
            out.push(v);
        }
    }
    if out.iter().any(|c| !c.soft_held()) {
        out.retain(|c| !c.soft_held());
    }
    out
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

    fn peek(key: &str, accessed_ms: u64, accesses: u64, pin: Pin, kind: Kind) -> Peek {
        Peek {
            key: key.as_bytes().to_vec(),
            version: Version { seq: 1, writer: 7 },
            tombstone: kind == Kind::Tombstone,
            kind,
            expiry: Expiry::NEVER,
            pin,
            accessed_ms,
            accesses,
        }
    }

    fn rules(policy: Eviction) -> Rules {
        Rules {
            policy,
            now_ms: 10_000_000,
            soft_pin_ms: 60_000,
        }
    }

    fn pick(r: Rules, peeks: Vec<Peek>) -> Option<String> {
        let group = peeks
            .into_iter()
            .filter_map(|p| r.candidate(p, 128))
            .collect();
        victim(group).map(|c| String::from_utf8(c.key).unwrap())
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
        // A group that found only it keeps it while another group found anything else.
        let group = |p: Peek| vec![r.candidate(p, 128).unwrap()];
        let plain = peek("plain", 9_999_999, 0, Pin::None, Kind::Value);
        let names = |v: Vec<Candidate>| -> Vec<String> {
            v.into_iter()
                .map(|c| String::from_utf8(c.key).unwrap())
                .collect()
        };
        assert_eq!(
            names(victims(vec![group(fresh_soft.clone()), group(plain)])),
            ["plain"]
        );
        assert_eq!(names(victims(vec![group(fresh_soft)])), ["fresh-soft"]);
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
