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
    let mut child = Command::new(EXE)
        .args(["serve", "--json", "--size", "8M", "--chunk-size", "1M"])
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
