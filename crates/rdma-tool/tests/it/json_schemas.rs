//! Every `--json` output of rdma-tool, from real runs of the built binary on the soft
//! provider, validated against its JSON Schema in `crates/rdma-tool/schemas/`.
//!
//! Each schema must also pin what it describes: for every key of every object the tool
//! printed, the same object without that key, or with that key's value replaced by one of the
//! wrong type, must be refused. A schema that accepted anything would fail here.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

fn validator(name: &str) -> jsonschema::Validator {
    let path = format!("{}/schemas/{name}.schema.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let schema: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    jsonschema::draft202012::new(&schema).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `v` is valid under schema `name`, and every key of the objects it holds matters.
pub(crate) fn check(name: &str, v: &Value) {
    let s = validator(name);
    let errors: Vec<String> = s.iter_errors(v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{name}: {v}\nerrors: {errors:#?}");
    // The objects to break: the value itself, or the first element of an array.
    let (target, rebuild): (&Value, Box<dyn Fn(Value) -> Value>) = match v {
        Value::Array(items) => {
            let rest = items[1..].to_vec();
            (
                &items[0],
                Box::new(move |first| {
                    let mut all = vec![first];
                    all.extend(rest.clone());
                    Value::Array(all)
                }),
            )
        }
        other => (other, Box::new(|x| x)),
    };
    let obj = target.as_object().expect("an object");
    for key in obj.keys() {
        let mut without = obj.clone();
        without.remove(key);
        assert!(
            !s.is_valid(&rebuild(Value::Object(without))),
            "{name}: accepted an object without {key:?}"
        );
        let mut retyped = obj.clone();
        retyped.insert(key.clone(), json!({"wrong": [1]}));
        assert!(
            !s.is_valid(&rebuild(Value::Object(retyped))),
            "{name}: accepted {key:?} of the wrong type"
        );
    }
}

fn run(args: &[&str]) -> Output {
    Command::new(EXE)
        .args(args)
        .output()
        .expect("rdma-tool runs")
}

/// Runs a command that must succeed; returns its stdout's JSON lines.
fn json_lines(args: &[&str]) -> Vec<Value> {
    let out = run(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: {e}: {l}")))
        .collect();
    assert!(!lines.is_empty(), "{args:?} printed nothing");
    lines
}

#[test]
fn devices_json_lists_the_soft_device_and_filters() {
    let out = run(&["devices", "--json"]);
    assert!(out.status.success());
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    check("devices", &all);
    let out = run(&[
        "devices",
        "--json",
        "--provider",
        "soft",
        "--device",
        "soft0",
    ]);
    let one: Value = serde_json::from_slice(&out.stdout).unwrap();
    check("devices", &one);
    assert_eq!(one.as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one[0]["devices"][0]["name"], "soft0");
}

#[test]
fn demo_json_is_one_object_with_every_check_passed() {
    let v = json_lines(&["demo", "--json"]);
    assert_eq!(v.len(), 1, "one object: {v:?}");
    check("demo", &v[0]);
    assert_eq!(v[0]["passed"], true);
    assert_eq!(v[0]["checks_failed"], 0);
    assert_eq!(v[0]["device"], "soft0");
    let checks: usize = v[0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["checks"].as_array().unwrap().len())
        .sum();
    assert_eq!(v[0]["checks"], checks as u64);
    assert!(checks >= 6, "{}", v[0]);
}

#[test]
fn stress_json_matches_its_schema() {
    let v = json_lines(&[
        "stress",
        "--size",
        "4M",
        "--count",
        "2",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(v.len(), 1);
    check("stress", &v[0]);
    assert_eq!(v[0]["rounds_done"], 2);
}

#[test]
fn stress_mix_json_matches_its_schema() {
    let v = json_lines(&[
        "stress",
        "--mix",
        "reg,cache,pool",
        "--size",
        "8M",
        "--count",
        "3",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(v.len(), 1);
    check("stress-mix", &v[0]);
    for kind in ["reg", "cache", "pool"] {
        assert_eq!(v[0]["kinds"][kind]["ops"], 6, "{kind}: {}", v[0]);
    }
}

#[test]
fn monitor_json_matches_its_schema_for_every_metric() {
    for metric in [
        "reg_latency",
        "dereg_latency",
        "op_latency",
        "cache_hit_rate",
        "pool_usage",
        "errors",
    ] {
        let v = json_lines(&[
            "monitor",
            "--metric",
            metric,
            "--percentile",
            "50,99,100",
            "--count",
            "2",
            "--interval",
            "100ms",
            "--json",
        ]);
        assert_eq!(v.len(), 2, "{metric}: {v:?}");
        for s in &v {
            check("monitor", s);
            assert_eq!(s["metric"], metric);
        }
    }
}

#[test]
fn bench_reg_json_lines_match_their_schema() {
    let v = json_lines(&[
        "bench",
        "reg",
        "--async-size",
        "4M",
        "--page-size-region",
        "4M",
        "--parallel-size",
        "8M",
        "--json",
    ]);
    assert_eq!(v.len(), 6, "{v:?}");
    for r in &v {
        check("bench-reg", r);
    }
}

#[test]
fn bench_data_json_lines_match_their_schema() {
    let v = json_lines(&[
        "bench",
        "data",
        "--op",
        "read",
        "--size",
        "64K",
        "--iters",
        "100",
        "--transport",
        "local",
        "--no-ucx",
        "--json",
    ]);
    assert!(v.len() >= 2, "{v:?}");
    for r in &v {
        check("bench-data", r);
        assert_eq!(r["size"], 65536);
    }
}

#[test]
fn bench_store_json_lines_match_their_schema() {
    let v = json_lines(&[
        "bench",
        "store",
        "--clients",
        "1",
        "--size",
        "64",
        "--transport",
        "local",
        "--keys",
        "2",
        "--duration",
        "100ms",
        "--json",
    ]);
    // put x1, get x1, the get latency, get_many of both keys, put r=2 vs r=1; then
    // redis-benchmark's SET and GET when redis-server is installed (CI installs it).
    assert!(v.len() == 5 || v.len() == 7, "{v:?}");
    for r in &v {
        check("bench-store", r);
    }
    assert_eq!(v[0]["op"], "put x1");
    assert_eq!(v[3]["op"], "get_many(2) x1");
    assert!(v[3]["mops"].as_f64().is_some_and(|x| x > 0.0), "{}", v[3]);
    assert_eq!(v[4]["op"], "put r=2 vs r=1");
}

/// Whether `program` runs here.
fn installed(program: &str, version_flag: &str) -> bool {
    Command::new(program)
        .arg(version_flag)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The references `bench ycsb` starts that are installed here: redis-server and memcached.
/// One missing is a failure when `RDMAPOOL_TEST_REFERENCES_REQUIRED` or `CI` is set (CI
/// installs both, Debian's `redis-server` and `memcached`), else it is left out, saying so.
fn ycsb_references() -> Vec<&'static str> {
    let required = std::env::var_os("RDMAPOOL_TEST_REFERENCES_REQUIRED").is_some()
        || std::env::var_os("CI").is_some();
    let mut found = Vec::new();
    for (name, flag) in [("redis-server", "--version"), ("memcached", "-V")] {
        if installed(name, flag) {
            found.push(name);
        } else if required {
            panic!("{name} is not installed (RDMAPOOL_TEST_REFERENCES_REQUIRED or CI is set)");
        } else {
            eprintln!("{name} is not installed: its rows are not checked");
        }
    }
    found
}

/// The rows of one `bench ycsb` run: each valid, in order of `ops`, one per installed
/// reference (or one with none), each reference's with a positive rate and ratio.
fn check_ycsb_rows(v: &[Value], ops: &[&str], refs: &[&str]) {
    let per_op = refs.len().max(1);
    assert_eq!(v.len(), ops.len() * per_op, "{v:?}");
    for (i, r) in v.iter().enumerate() {
        check("bench-ycsb", r);
        assert_eq!(r["op"], ops[i / per_op], "{r}");
        assert_eq!(r["transport"], "local", "{r}");
        assert!(r["mops"].as_f64().is_some_and(|x| x > 0.0), "{r}");
        match refs.get(i % per_op) {
            Some(name) => {
                let reference = r["reference"].as_str().unwrap();
                assert!(reference.starts_with(name), "{r}");
                assert!(
                    r["reference_value"].as_f64().is_some_and(|x| x > 0.0),
                    "{r}"
                );
                assert!(r["ratio"].as_f64().is_some_and(|x| x > 0.0), "{r}");
            }
            None => assert_eq!(r["reference"], "-", "{r}"),
        }
    }
}

/// `bench ycsb` for real, briefly: every workload built, with redis-server and memcached
/// started by the bench.
#[test]
fn bench_ycsb_json_lines_match_their_schema() {
    let refs = ycsb_references();
    let v = json_lines(&[
        "bench",
        "ycsb",
        "--records",
        "200",
        "--duration",
        "200ms",
        "--clients",
        "1",
        "--transport",
        "local",
        "--json",
    ]);
    let ops = [
        "ycsb-a x1",
        "ycsb-b x1",
        "ycsb-c x1",
        "ycsb-f x1",
        "ycsb-d x1",
    ];
    check_ycsb_rows(&v, &ops, &refs);
    assert!(v.iter().all(|r| r["size"] == 1024), "{v:?}");
}

/// `bench ycsb --hit-rate` for real, tiny, beside one workload's throughput: every
/// hit-rate row (both streams at 1% and 10%, one per installed reference and one against the
/// exact LRU) valid, each hit rate in [0, 1], and the exact LRU hitting at least as often at
/// 10% as at 1% on the same stream (LRU is a stack algorithm: a larger one holds all a
/// smaller one does). No speed is asserted.
#[test]
fn bench_ycsb_hit_rate_rows_match_their_schema() {
    let refs = ycsb_references();
    let v = json_lines(&[
        "bench",
        "ycsb",
        "--hit-rate",
        "--workload",
        "c",
        "--duration",
        "100ms",
        "--clients",
        "1",
        "--records",
        "1000",
        "--record-size",
        "64",
        "--hit-gets",
        "3000",
        "--transport",
        "local",
        "--json",
    ]);
    let (rate, hit): (Vec<Value>, Vec<Value>) = v.into_iter().partition(|r| r["metric"] == "rate");
    check_ycsb_rows(&rate, &["ycsb-c x1"], &refs);
    let ops = [
        "hit-zipf 1% x1",
        "hit-zipf 10% x1",
        "hit-scan 1% x1",
        "hit-scan 10% x1",
    ];
    let per_op = refs.len() + 1;
    assert_eq!(hit.len(), ops.len() * per_op, "{hit:?}");
    let rate_of = |r: &Value, key: &str| {
        let x = r[key].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&x), "{key} {x}: {r}");
        x
    };
    for (i, r) in hit.iter().enumerate() {
        check("bench-ycsb", r);
        assert_eq!(r["op"], ops[i / per_op], "{r}");
        assert_eq!(r["metric"], "hit_rate", "{r}");
        assert_eq!(r["transport"], "local", "{r}");
        assert_eq!(r["size"], 64, "{r}");
        assert_eq!(r["iters"], 3000, "{r}");
        rate_of(r, "value");
        rate_of(r, "reference_value");
        let want = refs.get(i % per_op).copied().unwrap_or("exact-lru");
        assert!(r["reference"].as_str().unwrap().starts_with(want), "{r}");
    }
    let exact = |op: &str| {
        let r = hit
            .iter()
            .find(|r| r["op"] == op && r["reference"] == "exact-lru")
            .unwrap_or_else(|| panic!("no exact-lru row of {op}"));
        rate_of(r, "reference_value")
    };
    for stream in ["hit-zipf", "hit-scan"] {
        let (small, large) = (
            exact(&format!("{stream} 1% x1")),
            exact(&format!("{stream} 10% x1")),
        );
        assert!(
            large >= small,
            "{stream}: exact LRU {large} at 10% < {small} at 1%"
        );
    }
}

/// `bench ycsb --trace`: a small trace replayed to its end by 1 and by 2 clients, on every
/// system: each run does every request of it.
#[test]
fn bench_ycsb_trace_replay_matches_the_schema_and_runs_every_request() {
    let refs = ycsb_references();
    let path = std::env::temp_dir().join(format!("rdma-tool-trace-{}.csv", std::process::id()));
    let mut text = String::from("timestamp,key,size,op\n");
    for i in 0..300 {
        let op = ["get", "SET", "get", "delete"][i % 4];
        text.push_str(&format!("{i},key{},{},{op}\n", i % 40, 100 + i));
    }
    std::fs::write(&path, text).unwrap();
    let v = json_lines(&[
        "bench",
        "ycsb",
        "--trace",
        path.to_str().unwrap(),
        "--clients",
        "1,2",
        "--transport",
        "local",
        "--json",
    ]);
    let _ = std::fs::remove_file(&path);
    check_ycsb_rows(&v, &["trace x1", "trace x2"], &refs);
    for r in &v {
        assert_eq!(r["iters"], 300, "{r}");
    }
}

#[test]
fn bench_pool_json_lines_match_their_schema() {
    let v = json_lines(&[
        "bench",
        "pool",
        "--clients",
        "1",
        "--duration",
        "100ms",
        "--live",
        "4",
        "--latency-size",
        "8",
        "--bandwidth-size",
        "64K",
        "--iters",
        "200",
        "--servers",
        "2",
        "--json",
    ]);
    // One alloc+free row, the row of two servers against one, then WRITE and READ: a
    // latency and a bandwidth row each; then the pool batches (WRITE against singles and
    // against raw lists, FAA against singles).
    assert_eq!(v.len(), 9, "{v:?}");
    for r in &v {
        check("bench-pool", r);
    }
    assert_eq!(v[0]["metric"], "rate");
    assert_eq!(v[1]["op"], "alloc+free x1, 2 servers");
    assert_eq!(v[1]["metric"], "rate");
    assert_eq!(v[6]["op"], "pool batch write 32");
    assert!(v[6]["mops"].as_f64().is_some_and(|x| x > 0.0), "{}", v[6]);
    assert_eq!(v[8]["op"], "pool batch faa 32");
}

#[test]
fn bench_copy_json_lines_match_their_schema() {
    let v = json_lines(&["bench", "copy", "--size", "4K", "--volume", "64K", "--json"]);
    // The intra-host copy and the C library's, each at its worst alignment.
    assert_eq!(v.len(), 2, "{v:?}");
    for r in &v {
        check("bench-copy", r);
        assert!(r["ratio"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    assert!(v[0]["op"].as_str().unwrap().starts_with("copy_bytes"));
}

#[test]
fn serve_json_lines_and_pool_json_against_it() {
    let mut child = Command::new(EXE)
        .args([
            "serve",
            "--json",
            "--size",
            "8M",
            "--chunk-size",
            "256K",
            "--node",
            "5",
            "--lease",
            "3s",
            "--drain",
            "2s",
            "--interval",
            "200ms",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let listening: Value = serde_json::from_str(&line).unwrap();
    check("serve", &listening);
    assert_eq!(listening["node"], 5);
    assert_eq!(listening["lease_ms"], 3000);
    let addr = listening["listening"].as_str().unwrap().to_string();

    let pool = |args: &[&str]| -> Value {
        let mut all = vec!["pool", "--json", "--servers", &addr, "--client-id", "3"];
        all.extend_from_slice(args);
        let v = json_lines(&all);
        assert_eq!(v.len(), 1, "{args:?}: {v:?}");
        check("pool", &v[0]);
        v[0].clone()
    };
    let a = pool(&["alloc", "64"]);
    assert_eq!(a["op"], "alloc");
    let ptr = a["ptr"].as_str().unwrap().to_string();
    assert_eq!(pool(&["write", &ptr, "0", "hi"])["written"], 2);
    assert_eq!(pool(&["read", &ptr, "0", "2"])["hex"], "6869");
    assert_eq!(pool(&["cas", &ptr, "8", "0", "7"])["swapped"], true);
    assert_eq!(pool(&["faa", &ptr, "8", "1"])["old"], 7);
    let stats = pool(&["stats"]);
    assert_eq!(stats["allocations"][0], ptr.as_str());
    assert_eq!(pool(&["free", &ptr])["freed"], ptr.as_str());

    // A shell line that fails prints an error object, and the shell's exit code says so.
    let mut shell = Command::new(EXE)
        .args([
            "pool",
            "--json",
            "--servers",
            &addr,
            "--client-id",
            "4",
            "shell",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(shell.stdin.take().unwrap(), "alloc 64\nfree 9:9\n").unwrap();
    let out = shell.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    check("pool", &lines[0]);
    check("pool", &lines[1]);
    assert!(lines[1]["error"].is_string(), "{}", lines[1]);

    drop(child.stdin.take());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    // A `stats` line every --interval while it ran (the pool commands above take seconds),
    // then `stopped`.
    let lines: Vec<Value> = rest
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (stopped, stats) = lines.split_last().unwrap();
    assert!(!stats.is_empty(), "no stats line: {rest}");
    for st in stats {
        check("serve", st);
        assert_eq!(st["stats"], 5, "{st}");
        let (chunks, owned, free) = (&st["chunks"], &st["chunks_owned"], &st["chunks_free"]);
        assert_eq!(
            chunks.as_u64(),
            Some(owned.as_u64().unwrap() + free.as_u64().unwrap()),
            "{st}"
        );
    }
    check("serve", stopped);
    assert_eq!(stopped["stopped"], 5);
}

/// `store --json` of every operation against two servers, with no `--client-id` (one-shot
/// ids), including a value and a key that are not UTF-8: lossless (issue #40).
#[test]
fn store_json_of_every_operation_is_lossless() {
    let start = |node: &str| {
        let mut child = Command::new(EXE)
            .args([
                "serve",
                "--json",
                "--size",
                "8M",
                "--chunk-size",
                "1M",
                "--node",
                node,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        let addr = v["listening"].as_str().unwrap().to_string();
        (child, addr)
    };
    let (mut a, a_addr) = start("1");
    let (mut b, b_addr) = start("2");
    let servers = format!("{a_addr},{b_addr}");
    let store = |args: &[&str], stdin: Option<&[u8]>| -> Output {
        let mut child = Command::new(EXE)
            .args(["store", "--json", "--servers", &servers])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            input.write_all(bytes).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    };
    let one = |out: Output| -> Value {
        let text = String::from_utf8(out.stdout).unwrap();
        let v: Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{e}: {text} / {}", String::from_utf8_lossy(&out.stderr)));
        check("store", &v);
        v
    };
    let put = one(store(&["put", "text", "hello"], None));
    assert_eq!(put["op"], "put");
    assert!(
        put["writer"].as_u64().unwrap() >= 1 << 62,
        "a one-shot id: {put}"
    );
    let binary = [0u8, 0xff, 0xfe, 0x80, b'x'];
    one(store(&["put", "bin", "--file", "-"], Some(&binary)));
    let got = one(store(&["get", "text"], None));
    assert_eq!(
        (&got["encoding"], &got["value"]),
        (&json!("utf-8"), &json!("hello"))
    );
    let got = one(store(&["get", "bin"], None));
    assert_eq!(got["encoding"], "base64", "{got}");
    use base64::Engine as _;
    let back = base64::engine::general_purpose::STANDARD
        .decode(got["value"].as_str().unwrap())
        .unwrap();
    assert_eq!(back, binary, "the value is lossless");
    let missing = store(&["get", "nothing"], None);
    assert_eq!(missing.status.code(), Some(1));
    let v = one(missing);
    assert_eq!(v["found"], false);
    let ls = one(store(&["ls"], None));
    assert_eq!(ls["encoding"], "utf-8");
    assert_eq!(ls["keys"], json!(["bin", "text"]));
    assert_eq!(one(store(&["rm", "bin"], None))["removed"], true);
    let st = one(store(&["stats"], None));
    assert_eq!(st["keys"], 1);
    let r = one(store(&["repair"], None));
    assert_eq!(r["failed"], 0);
    // The numbered view: none, then set (the keys move by its repair), then read back.
    assert_eq!(one(store(&["view"], None))["number"], 0);
    let set = one(store(&["view", "--set", "2,1"], None));
    assert_eq!(
        (&set["number"], &set["members"]),
        (&json!(1), &json!([1, 2]))
    );
    assert_eq!(set["repair"]["failed"], 0, "{set}");
    assert_eq!(one(store(&["view"], None))["number"], 1);
    let got = one(store(&["get", "text"], None));
    assert_eq!(got["value"], "hello", "read under the view");
    // The background repairer: a line per repair, until SIGTERM.
    let mut bg = Command::new(EXE)
        .args(["store", "--json", "--servers", &servers])
        .args(["repair", "--every", "100ms", "--tombstone-hold", "1s"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(bg.stdout.take().unwrap());
    let mut line = String::new();
    lines.read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    check("store", &v);
    assert_eq!(v["keys"], 2, "{v}");
    // SAFETY: signalling our own child by its pid.
    assert_eq!(unsafe { libc::kill(bg.id() as i32, libc::SIGTERM) }, 0);
    assert!(bg.wait().unwrap().success());
    for c in [&mut a, &mut b] {
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success());
    }
}
