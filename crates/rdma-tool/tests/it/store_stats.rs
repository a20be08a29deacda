//! `rdma-tool store stats` (issue #44, counters): the per-server counters every client adds
//! to the servers' index chunks, read back by another process. Each one-shot command adds
//! what it counted before it exits, so the counts are exact.

use crate::json_schemas::check;
use rdmapool::store::{placement, KeyHash};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Output, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

/// A `serve --json` process of node `node`, its stdout (kept open: it prints stats lines
/// now and then), and its address.
type Served = (Child, BufReader<ChildStdout>, String);

fn serve(node: u32) -> Served {
    serve_sized(node, "8M", "1M")
}

/// [`serve`] of a region of `size` in chunks of `chunk`.
fn serve_sized(node: u32, size: &str, chunk: &str) -> Served {
    let mut child = Command::new(EXE)
        .args(["serve", "--json", "--size", size, "--chunk-size", chunk])
        .args(["--node", &node.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let addr = v["listening"].as_str().unwrap().to_string();
    (child, stdout, addr)
}

/// The server a get of `key` counts on: its first replica of nodes 1 to 3, two replicas.
fn first_replica(key: &str) -> u64 {
    u64::from(placement::replicas(KeyHash::of(key.as_bytes()), &[1, 2, 3], 2)[0])
}

#[test]
fn store_stats_counts_every_get_on_its_keys_first_replica() {
    let servers: Vec<Served> = (1..=3).map(serve).collect();
    let list: Vec<&str> = servers.iter().map(|(_, _, a)| a.as_str()).collect();
    let list = list.join(",");
    let store = |args: &[&str]| -> Output {
        Command::new(EXE)
            .args(["store", "--servers", &list])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let keys = ["k0", "k1", "k2", "k3", "k4"];
    for k in keys {
        let out = store(&["put", k, "value"]);
        assert!(out.status.success(), "{out:?}");
    }
    // Hits: every key once, k0 twice more. Misses: three keys never put.
    let (mut hits, mut misses) = ([0u64; 4], [0u64; 4]);
    for k in keys.iter().chain(&["k0", "k0"]) {
        let out = store(&["get", k]);
        assert_eq!(out.stdout, b"value", "{out:?}");
        hits[first_replica(k) as usize] += 1;
    }
    for k in ["none0", "none1", "none2"] {
        let out = store(&["get", k]);
        assert_eq!(out.status.code(), Some(1), "a missing key: {out:?}");
        misses[first_replica(k) as usize] += 1;
    }
    let out = store(&["--json", "stats"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    check("store", &v);
    let rows = v["servers"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{v}");
    for row in rows {
        let node = row["node"].as_u64().unwrap() as usize;
        assert_eq!(
            (row["hits"].as_u64(), row["misses"].as_u64()),
            (Some(hits[node]), Some(misses[node])),
            "node {node}: {v}"
        );
        assert_eq!(
            (row["evictions"].as_u64(), row["expirations"].as_u64()),
            (Some(0), Some(0))
        );
        // Not a cache: no budget, no usage counted.
        assert_eq!(
            (row["used"].as_u64(), row["budget"].as_u64()),
            (Some(0), Some(0))
        );
        assert!(row["used_percent"].is_null(), "{row}");
    }
    let total = &v["total"];
    assert_eq!(
        (total["hits"].as_u64(), total["misses"].as_u64()),
        (Some(7), Some(3)),
        "{v}"
    );
    assert_eq!(total["hit_rate"].as_f64(), Some(0.7), "{v}");
    // The table: a row per server and the total, with its hit rate in percent.
    let out = store(&["stats"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert_eq!(lines[1][..2], ["node", "used"], "{text}");
    let total = lines.last().unwrap();
    assert_eq!(
        total[..],
        ["total", "0", "0", "-", "7", "3", "70.0%", "0", "0"],
        "{text}"
    );
    for (mut child, _, _) in servers {
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

#[test]
fn a_cache_from_the_command_line_evicts_keeps_its_pins_and_expires_values() {
    // `store --cache-budget`: one-shot puts past the budget evict instead of failing, a
    // hard-pinned value stays, `put --ttl` values are gone once past it; bad settings are
    // refused with a message, not a panic.
    // Each one-shot command takes one of 64 client ids, whose blocks go in chunks of their
    // own: servers of 64 MiB in 256 KiB chunks hold them all.
    let servers: Vec<Served> = (1..=3).map(|n| serve_sized(n, "64M", "256K")).collect();
    let list: Vec<&str> = servers.iter().map(|(_, _, a)| a.as_str()).collect();
    let list = list.join(",");
    let cache = |args: &[&str]| -> Output {
        Command::new(EXE)
            .args(["store", "--servers", &list, "--cache-budget", "64K"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = cache(&["put", "--pin", "hard", "pinned", "kept"]);
    assert!(out.status.success(), "{out:?}");
    // 60 values of 3000 bytes (4 KiB blocks), two copies each: about 120 KiB a server
    // against a budget of 64 KiB. Every put succeeds. Each command's first write to a
    // server adds what it wrote to the usage word there, and evicts if that is past it.
    let value = "x".repeat(3000);
    for i in 0..60 {
        let out = cache(&["put", &format!("flood{i}"), &value]);
        assert!(out.status.success(), "put {i}: {out:?}");
    }
    let out = cache(&["get", "pinned"]);
    assert_eq!(out.stdout, b"kept", "the hard pin was evicted: {out:?}");
    let out = cache(&["--json", "stats"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    check("store", &v);
    for row in v["servers"].as_array().unwrap() {
        assert_eq!(row["budget"].as_u64(), Some(64 << 10), "{row}");
        assert!(row["used"].as_u64().unwrap() > 0, "{row}");
    }
    let evicted = v["total"]["evictions"].as_u64().unwrap();
    assert!(evicted > 0, "no eviction past the budget: {v}");
    let held = (0..60)
        .filter(|i| cache(&["get", &format!("flood{i}")]).status.success())
        .count();
    assert!(
        held < 60,
        "every flood value held past the budget ({evicted} evictions)"
    );
    // A time to live: there, then gone to every client.
    let out = cache(&["put", "--ttl", "2s", "brief", "soon gone"]);
    assert!(out.status.success(), "{out:?}");
    let out = cache(&["get", "brief"]);
    assert_eq!(out.stdout, b"soon gone", "{out:?}");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let out = cache(&["get", "brief"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an expired value was returned: {out:?}"
    );
    // Bad settings: a time to live within the clock skew, a budget past a server's
    // chunks, an unknown pin, a policy without a budget.
    let out = cache(&["put", "--ttl", "20ms", "brief", "x"]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("time to live"), "{err}");
    let out = Command::new(EXE)
        .args(["store", "--servers", &list, "--cache-budget", "1G"])
        .args(["put", "big-budget", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cache budget"), "{err}");
    let out = cache(&["put", "--pin", "forever", "k", "v"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = Command::new(EXE)
        .args(["store", "--servers", &list, "--eviction", "lfu", "get", "k"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // Nothing stored was lost to the refusals.
    let out = cache(&["get", "pinned"]);
    assert_eq!(out.stdout, b"kept", "{out:?}");
    for (mut child, _, _) in servers {
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}
