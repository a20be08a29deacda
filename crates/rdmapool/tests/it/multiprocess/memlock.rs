//! The locked-memory limit and pinned bytes across processes: clear errors past the limit, a
//! default pool inside an ordinary account's limit, retries on ENOMEM, nothing left pinned.

use super::*;

#[test]
fn exceeding_the_memlock_limit_is_a_clear_error() {
    if soft_only("mlock accounting in an unprivileged child") {
        return;
    }
    let mut peer = Peer::spawn(HERE, "memlock", &[]);
    assert_eq!(peer.line(), "small None", "64 KiB fits under a 1 MiB limit");
    let big = peer.line();
    assert!(
        big.contains("RLIMIT_MEMLOCK") && big.contains("ulimit -l"),
        "{big}"
    );
    assert!(big.contains("1048576 bytes"), "names the limit: {big}");
    assert_eq!(
        peer.line(),
        "pinned 0",
        "failed and dropped registrations unpin everything"
    );
}

/// A default buffer pool fits an ordinary account's 8 MiB locked-memory limit with room to
/// spare, in a child that really has that limit (and, run as root, no CAP_IPC_LOCK). With
/// the old default (one 2 MiB chunk per class: 16 MiB) `new` failed here.
#[test]
fn a_default_pool_fits_an_ordinary_accounts_memlock_limit() {
    if soft_only("mlock accounting in an unprivileged child") {
        return;
    }
    let mut peer = Peer::spawn(HERE, "ordinary-account", &[]);
    let default = peer.line();
    let Some(counts) = default.strip_prefix("default ok ") else {
        panic!("the default pool under an 8 MiB limit: {default}");
    };
    let counts: Vec<u64> = counts.split(' ').map(|n| n.parse().unwrap()).collect();
    assert_eq!(counts[0], 4 << 20, "the pool's registered bytes");
    assert!(
        counts[1] <= ORDINARY_MEMLOCK / 2,
        "{} bytes pinned: more than half the limit",
        counts[1]
    );
    assert_eq!(peer.line(), "beside None", "2 MiB more fit beside it");
    let tiny = peer.line();
    assert!(
        tiny.contains("RLIMIT_MEMLOCK") && tiny.contains("ulimit -l") && tiny.contains("1048576"),
        "a pool over the limit names it and the fix: {tiny}"
    );
}

#[test]
fn registrar_retries_enomem_fails_an_impossible_region_at_once_and_honours_its_timeout() {
    if soft_only("mlock accounting in an unprivileged child") {
        return;
    }
    let mut peer = Peer::spawn(HERE, "registrar-memlock", &[]);
    // 8 MiB can never fit under a 1 MiB limit: failing at once beats retrying an error
    // that cannot change.
    let oversize = peer.line();
    assert!(
        oversize.starts_with("oversize 0 ") && oversize.contains("RLIMIT_MEMLOCK"),
        "{oversize}"
    );
    // 512 KiB fits the limit, not beside 768 KiB already pinned: retried, then fails.
    let retried = peer.line();
    assert!(
        retried.starts_with("retried 3 ") && retried.contains("RLIMIT_MEMLOCK"),
        "{retried}"
    );
    let timeout = peer.line();
    assert!(
        timeout.starts_with("timeout 1 ") && timeout.contains("ETIMEDOUT"),
        "{timeout}"
    );
    assert_eq!(peer.line(), "small true");
    assert_eq!(
        peer.line(),
        "pinned 0 0",
        "pinned bytes and live regions back to zero"
    );
}

#[test]
fn every_registration_path_returns_pinned_bytes_and_regions_to_zero() {
    if soft_only("the soft provider's pinned-bytes accounting") {
        return;
    }
    let mut peer = Peer::spawn(HERE, "leak-check", &[]);
    for what in ["registrar", "cache", "pool"] {
        assert_eq!(
            peer.line(),
            format!("{what} 0 0"),
            "pinned bytes and live regions after the {what}"
        );
    }
}
