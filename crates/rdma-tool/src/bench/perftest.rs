//! perftest (`ib_write_lat`, `ib_read_lat`, `ib_write_bw`) run on the same device in the same
//! benchmark run, as the reference for the verbs provider.

use std::process::{Command, Stdio};
use std::time::Duration;

/// Where perftest runs: device, GID index, and the address its server listens on.
#[derive(Debug, Clone)]
pub struct Target {
    /// RDMA device name (`-d`).
    pub device: String,
    /// GID index (`-x`), if one must be forced (RoCE).
    pub gid_index: Option<String>,
    /// The server's IP address for perftest's own TCP handshake.
    pub ip: String,
}

/// Runs `test` (server in the background, client to it) and returns the client's result
/// row as numbers: for `*_lat` `[bytes, iters, t_min, t_max, t_typical, t_avg, ...]` (µs),
/// for `*_bw` `[bytes, iters, bw_peak, bw_avg, msg_rate]` (MB/s).
pub fn run(t: &Target, test: &str, size: usize, iters: u64) -> Option<Vec<f64>> {
    let port = (19000 + std::process::id() % 2000).to_string();
    let mut common = vec![
        "-d".to_string(),
        t.device.clone(),
        "-F".into(),
        "-s".into(),
        size.to_string(),
    ];
    common.extend(["-n".into(), iters.to_string(), "-p".into(), port]);
    if let Some(g) = &t.gid_index {
        common.extend(["-x".into(), g.clone()]);
    }
    let mut server = Command::new(test)
        .args(&common)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(500));
    let client = Command::new("timeout")
        .arg("120")
        .arg(test)
        .args(&common)
        .arg(&t.ip)
        .output();
    let _ = server.wait();
    let out = String::from_utf8_lossy(&client.ok()?.stdout).into_owned();
    let size_text = size.to_string();
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.first() == Some(&size_text.as_str()) && w.len() >= 5)
        .map(|w| w.iter().filter_map(|x| x.parse().ok()).collect())
}

/// Whether perftest is installed.
pub fn available() -> bool {
    Command::new("sh")
        .args(["-c", "command -v ib_write_lat"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
