//! `rdma-tool monitor` attached to a real `rdma-tool stress --metrics-socket` child, and run
//! on its own probe. Durations are never asserted: only schema, counts and their order.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

/// Kills the child on every exit path of the test.
struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn snapshot(name: &str) -> Option<serde_json::Value> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)
        .or_else(|_| std::os::unix::net::SocketAddr::from_pathname(name))
        .ok()?;
    let mut c = std::os::unix::net::UnixStream::connect_addr(&addr).ok()?;
    let mut s = String::new();
    c.read_to_string(&mut s).ok()?;
    serde_json::from_str(&s).ok()
}

fn monitor(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(EXE)
        .arg("monitor")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

use std::os::linux::net::SocketAddrExt;

#[test]
fn monitor_follows_a_stress_run_over_its_metrics_socket() {
    let name = format!("rdma-tool-monitor-test-{}", std::process::id());
    let target = format!("@{name}");
    let child = Command::new(EXE)
        .args([
            "stress",
            "--size=1M",
            "--count=1000000",
            "--threads=2",
            "--small-pages",
        ])
        .args(["--metrics-socket", &target, "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Kill(child);
    let pid = child.0.id() as u64;
    // Wait for the socket and for the first registrations.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = snapshot(&name) {
            if v["registration"]["count"].as_u64() > Some(0) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no registrations seen on {target}"
        );
        assert!(child.0.try_wait().unwrap().is_none(), "stress exited early");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = snapshot(&name).unwrap()["registration"]["count"]
        .as_u64()
        .unwrap();
    let samples = monitor(&[
        "--target",
        &target,
        "--metric",
        "reg_latency",
        "--percentile",
        "50,99",
        "--count",
        "3",
        "--interval",
        "200ms",
        "--json",
    ]);
    let after = snapshot(&name).unwrap();
    assert_eq!(samples.len(), 3);
    let mut last = before;
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s["sample"], i as u64 + 1);
        assert_eq!(s["metric"], "reg_latency");
        assert_eq!(s["target"], target.as_str());
        assert_eq!(s["pid"], pid, "the stress child's own snapshot");
        let p = s["percentiles_us"].as_object().unwrap();
        assert_eq!(p.len(), 2);
        assert!(p["p50"].is_number() && p["p99"].is_number(), "{s}");
        assert!(s["elapsed_s"].is_number());
        let n = s["count"].as_u64().unwrap();
        assert!(n > 0 && n >= last, "count {n} after {last}");
        last = n;
    }
    // The child's own snapshot, read after the monitor, is at least the last sample.
    assert_eq!(after["pid"], pid);
    let direct = after["registration"]["count"].as_u64().unwrap();
    assert!(direct >= last, "direct {direct} < monitor's last {last}");
    assert!(after["deregistration"]["count"].as_u64().unwrap() > 0);
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "stress still running"
    );
}

#[test]
fn monitor_without_target_runs_its_probe() {
    let samples = monitor(&[
        "--metric",
        "cache_hit_rate",
        "--count",
        "3",
        "--interval",
        "150ms",
        "--json",
    ]);
    assert_eq!(samples.len(), 3);
    let last = &samples[2];
    assert_eq!(last["target"], "probe");
    assert!(
        last["hits"].as_u64().unwrap() + last["misses"].as_u64().unwrap() > 0,
        "{last}"
    );
    let reg = monitor(&["--count", "2", "--interval", "150ms", "--json"]);
    assert!(reg[1]["count"].as_u64().unwrap() > 0, "{}", reg[1]);
}

#[test]
fn op_latency_of_the_probe_has_every_opcode() {
    let samples = monitor(&[
        "--metric",
        "op_latency",
        "--percentile",
        "50,99,100",
        "--count",
        "3",
        "--interval",
        "200ms",
        "--json",
    ]);
    let last = &samples[2];
    assert_eq!(last["metric"], "op_latency");
    assert_eq!(last["sample_every"], 1, "{last}");
    for op in ["rdma_write", "rdma_read", "comp_swap", "fetch_add"] {
        let o = &last["ops"][op];
        assert!(o["count"].as_u64().unwrap() > 0, "{op} in {last}");
        let p = &o["percentiles_us"];
        let (p50, p99, max) = (
            p["p50"].as_f64().unwrap(),
            p["p99"].as_f64().unwrap(),
            p["max"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{op}: {p}");
    }
}

#[test]
fn bad_percentiles_and_durations_are_refused() {
    for args in [
        &["--percentile", "97", "--count", "1"][..],
        &["--percentile", "0", "--count", "1"][..],
        &["--interval", "5d", "--count", "1"][..],
    ] {
        let out = Command::new(EXE)
            .arg("monitor")
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
    }
}

#[test]
fn monitor_reads_prometheus_text_over_http() {
    // A free loopback port (released again for the child to bind).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(EXE)
        .args([
            "stress",
            "--size=1M",
            "--count=1000000",
            "--threads=1",
            "--small-pages",
            "--json",
        ])
        .env("RDMAPOOL_METRICS_HTTP", &addr)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Kill(child);
    let url = format!("http://{addr}/metrics");
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        let out = Command::new(EXE)
            .args(["monitor", "--target", &url, "--count", "1", "--json"])
            .args(["--percentile", "50,97.5,100"])
            .output()
            .unwrap();
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if v["count"].as_u64() > Some(0) {
                break v;
            }
        }
        assert!(Instant::now() < deadline, "nothing served at {url}");
        assert!(child.0.try_wait().unwrap().is_none(), "stress exited early");
        std::thread::sleep(Duration::from_millis(100));
    };
    let p = first["percentiles_us"].as_object().unwrap();
    assert!(p.contains_key("p97.5") && p.contains_key("max"), "{first}");
    let errs = monitor(&[
        "--target",
        &url,
        "--metric",
        "errors",
        "--count",
        "2",
        "--interval",
        "100ms",
        "--json",
    ]);
    assert_eq!(errs[1]["registration_errors"], 0, "{}", errs[1]);
    assert!(errs[1]["completion_errors"].is_object());
}
