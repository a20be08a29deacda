//! The store's timing rules (docs/STORE.md section 8), as functions of the time they are
//! asked at: the client passes the clock's reading, and the tests below pass instants of
//! their own, so the rules are tested in virtual time (issues #23, #40 and #42 asked for it).
//!
//! - **Grace**: a block a put, a remove or a repair replaced is freed only once the grace
//!   period has passed since it was replaced ([`free_after`]).
//! - **Tombstone hold**: a removed key's tombstone is cleared only when two repairs found it
//!   clean, with the same version, at least the hold apart ([`tombstone`]).
//! - **Second look**: a block allocated in a gone writer's chunk and named by no index slot
//!   is freed only when a second reclaim pass, at least twice the grace after the first,
//!   finds it so again ([`SecondLook`]).

use super::format::Version;
use std::collections::HashSet;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// When a block replaced at `replaced` may be freed.
pub(crate) fn free_after(replaced: Instant, grace: Duration) -> Instant {
    replaced + grace
}

/// What a repair does with a clean tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TombstoneRule {
    /// Clear it now.
    Clear,
    /// Keep it, remembered as found clean at `since` with this version.
    Hold { since: Instant },
}

/// The rule for a tombstone of `version` a repair finds clean at `now`, given when an
/// earlier repair of this client found it clean and with which version (`seen`).
pub(crate) fn tombstone(
    seen: Option<(Version, Instant)>,
    version: Version,
    now: Instant,
    hold: Duration,
) -> TombstoneRule {
    let since = match seen {
        Some((v, t)) if v == version => t,
        _ => now,
    };
    if now.saturating_duration_since(since) < hold {
        TombstoneRule::Hold { since }
    } else {
        TombstoneRule::Clear
    }
}

/// The second look of the reclaim: what one pass found (unnamed blocks of gone writers),
/// and since when, waiting for a later pass to find it again.
#[derive(Debug)]
pub(crate) struct SecondLook<T> {
    since: Option<Instant>,
    blocks: HashSet<T>,
}

impl<T> Default for SecondLook<T> {
    fn default() -> Self {
        Self {
            since: None,
            blocks: HashSet::new(),
        }
    }
}

impl<T: Copy + Eq + Hash> SecondLook<T> {
    /// A pass at `now` that found `seen`: returns the blocks to free now (found by the last
    /// remembered pass too, at least `wait` ago). A pass sooner than `wait` after the
    /// remembered one changes nothing, so the first look is never pushed back by passes in
    /// between; otherwise what this pass found and does not free is remembered from `now`.
    pub(crate) fn look(&mut self, seen: &HashSet<T>, now: Instant, wait: Duration) -> HashSet<T> {
        let ripe = self
            .since
            .is_some_and(|t| now.saturating_duration_since(t) >= wait);
        if !ripe && self.since.is_some() {
            return HashSet::new();
        }
        let due: HashSet<T> = if ripe {
            self.blocks.intersection(seen).copied().collect()
        } else {
            HashSet::new()
        };
        self.blocks = seen.difference(&due).copied().collect();
        self.since = (!self.blocks.is_empty()).then_some(now);
        due
    }

    /// How many blocks wait for their second look.
    pub(crate) fn pending(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_millis(20);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_replaced_block_is_freed_only_after_the_grace_period() {
        let t0 = Instant::now();
        let due = free_after(at(t0, 100), GRACE);
        assert!(at(t0, 119) < due, "freed inside the grace period");
        assert!(at(t0, 120) >= due);
    }

    #[test]
    fn a_tombstone_is_cleared_only_after_two_clean_looks_the_hold_apart() {
        let t0 = Instant::now();
        let hold = Duration::from_secs(60);
        let v = Version { seq: 3, writer: 7 };
        // First look: held from now.
        assert_eq!(
            tombstone(None, v, t0, hold),
            TombstoneRule::Hold { since: t0 }
        );
        // A look within the hold keeps the first look's time.
        assert_eq!(
            tombstone(Some((v, t0)), v, at(t0, 59_999), hold),
            TombstoneRule::Hold { since: t0 }
        );
        assert_eq!(
            tombstone(Some((v, t0)), v, at(t0, 60_000), hold),
            TombstoneRule::Clear
        );
        // A newer remove (another version) starts the hold again.
        let newer = Version { seq: 4, writer: 7 };
        assert_eq!(
            tombstone(Some((v, t0)), newer, at(t0, 120_000), hold),
            TombstoneRule::Hold {
                since: at(t0, 120_000)
            }
        );
    }

    #[test]
    fn an_unnamed_block_is_freed_at_the_second_look_twice_the_grace_later() {
        let t0 = Instant::now();
        let wait = GRACE * 2;
        let mut look = SecondLook::default();
        let seen: HashSet<u32> = [1, 2, 3].into();
        assert!(
            look.look(&seen, t0, wait).is_empty(),
            "first look frees nothing"
        );
        assert_eq!(look.pending(), 3);
        // A pass too soon changes nothing (nor pushes the first look back).
        assert!(look.look(&[1, 2].into(), at(t0, 39), wait).is_empty());
        assert_eq!(look.pending(), 3);
        // Block 3 was named (or freed) since; 4 is new: only 1 and 2 are due.
        let due = look.look(&[1, 2, 4].into(), at(t0, 40), wait);
        assert_eq!(due, [1, 2].into());
        assert_eq!(look.pending(), 1, "4 waits for its own second look");
        assert_eq!(look.look(&[4].into(), at(t0, 80), wait), [4].into());
        assert_eq!(look.pending(), 0);
        // Nothing found: nothing remembered, the next find starts a first look.
        assert!(look.look(&HashSet::new(), at(t0, 200), wait).is_empty());
        assert!(look.look(&[5].into(), at(t0, 201), wait).is_empty());
        assert_eq!(look.pending(), 1);
    }
}
