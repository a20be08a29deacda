//! Which servers hold a key (docs/STORE.md section 4): the `r` live servers with the highest
//! rendezvous score for the key's hash, best first. A server joining or leaving moves only
//! the keys for which it is, or becomes, one of the top `r`.

use super::format::KeyHash;
use rdmapool_pool::remote::layout::hash64;

/// The rendezvous score of `node` for the key hashed `h`.
pub fn score(h: KeyHash, node: u32) -> u64 {
    hash64(h.0 ^ u64::from(node).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Every node of `live`, best first for the key hashed `h` (ties, which need equal scores
/// of distinct nodes, go to the lower id). The first `r` are the key's replicas, the first
/// of them its primary.
pub fn ranked(h: KeyHash, live: &[u32]) -> Vec<u32> {
    let mut v: Vec<u32> = live.to_vec();
    v.sort_unstable();
    v.dedup();
    v.sort_by_key(|&n| (std::cmp::Reverse(score(h, n)), n));
    v
}

/// The key's replicas among `live`: the first `r` of [`ranked`] (fewer if fewer are live).
pub fn replicas(h: KeyHash, live: &[u32], r: usize) -> Vec<u32> {
    let mut v = ranked(h, live);
    v.truncate(r);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn replicas_are_distinct_and_stable_in_any_listing_order() {
        let h = KeyHash::of(b"user:1");
        let a = replicas(h, &[1, 2, 3, 4, 5], 2);
        assert_eq!(a.len(), 2);
        assert_ne!(a[0], a[1]);
        assert_eq!(a, replicas(h, &[5, 4, 3, 3, 2, 1], 2));
        assert_eq!(replicas(h, &[7], 2), [7], "fewer live servers than r");
        assert!(replicas(h, &[], 2).is_empty());
    }

    proptest! {
        /// A server leaving changes a key's replicas only if it was one of them, and then
        /// the others stay, in order; a server joining takes at most one place.
        #[test]
        fn membership_changes_move_only_their_own_share(h: u64, n in 2u32..12, gone in 0u32..12, r in 1usize..4) {
            let h = KeyHash(h);
            let all: Vec<u32> = (1..=n).collect();
            let gone = gone % n + 1;
            let before = replicas(h, &all, r);
            let rest: Vec<u32> = all.iter().copied().filter(|&x| x != gone).collect();
            let after = replicas(h, &rest, r);
            if !before.contains(&gone) {
                prop_assert_eq!(&before, &after);
            } else {
                let kept: Vec<u32> = before.iter().copied().filter(|&x| x != gone).collect();
                prop_assert_eq!(&after[..kept.len()], &kept[..]);
            }
            // Joining is the same change read backwards.
            let moved = before.iter().filter(|x| !after.contains(x)).count();
            prop_assert!(moved <= 1);
        }
    }
}
