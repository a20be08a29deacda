//! UCX's `ucx_perftest` (Debian package ucx-utils), run in the same benchmark run inside a
//! fresh network namespace that has only loopback (`unshare -n`), so nothing leaves it.

use std::process::Command;

/// One UCX result.
#[derive(Debug, Clone)]
pub struct UcxResult {
    /// UCX's 50th percentile latency in ns, as UCX reports it (half a round trip for the
    /// `*_lat` ping-pong tests).
    pub p50_ns: f64,
    /// UCX's overall bandwidth, GB/s.
    pub gbps: f64,
    /// UCX's overall message rate, operations per second (of a pipelined stream).
    pub msg_rate: f64,
}

/// Whether ucx_perftest and unshare are usable here; the reason when not.
pub fn unavailable() -> Option<String> {
    let found = |p: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !found("ucx_perftest") {
        return Some("ucx_perftest not installed (apt-get install ucx-utils)".into());
    }
    if !found("unshare") {
        return Some("unshare not found".into());
    }
    let ok = Command::new("unshare")
        .args(["-n", "true"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        return Some("unshare -n not permitted (needs root or user namespaces)".into());
    }
    None
}

/// Runs one client/server pair of ucx_perftest with `UCX_TLS=tls`.
pub fn run(tls: &str, test: &str, size: usize, iters: u64) -> Option<UcxResult> {
    let port = 20000 + (std::process::id() % 20000);
    let script = format!(
        "ip link set lo up; export UCX_TLS={tls} UCX_NET_DEVICES=lo; \
         ucx_perftest -p {port} >/dev/null 2>&1 & sleep 0.5; \
         timeout 120 ucx_perftest 127.0.0.1 -p {port} -t {test} -s {size} -n {iters} -w {w} 2>&1; wait",
        w = (iters / 10).max(10)
    );
    let out = Command::new("timeout")
        .args(["150", "unshare", "-n", "sh", "-c", &script])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("Final:"))?;
    let nums: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // Final: iterations, typical/avg/overall latency (us), avg/overall bandwidth (MB/s),
    // avg/overall message rate (msg/s).
    if nums.len() < 8 {
        return None;
    }
    Some(UcxResult {
        p50_ns: nums[1] * 1000.0,
        gbps: nums[5] * 1e6 / 1e9 * 1.048576, // UCX's MB/s are MiB/s
        msg_rate: nums[7],
    })
}
