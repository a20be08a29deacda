//! The Redis reference of `bench store`: a `redis-server` started here on loopback with
//! persistence off (stopped when dropped), clients on it through the `redis` crate (one
//! connection each, as an application would), and `redis-benchmark`'s own figures.

use super::super::pool::{clients, Rate};
use super::super::report::Row;
use super::super::Stats;
use crate::{Result, ToolError};
use redis::Commands;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process on 127.0.0.1.
pub(in crate::bench) struct RedisServer {
    child: Child,
    port: u16,
}

/// A Redis error as the tool's.
pub(in crate::bench) fn redis_err(e: redis::RedisError) -> ToolError {
    ToolError::Msg(format!("redis: {e}"))
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port, persistence off; waits until it
    /// answers.
    pub(in crate::bench) fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// [`RedisServer::start`] with `extra` configuration arguments
    /// (`--maxmemory-policy allkeys-lru`).
    pub(in crate::bench) fn start_with(extra: &[&str]) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| ToolError::Io("a free port for redis-server".into(), e))?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args([
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ToolError::Msg(
                    "redis-server not found (install the Debian package redis-server)".into(),
                ),
                _ => ToolError::Io("starting redis-server".into(), e),
            })?;
        let server = Self { child, port };
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match server.connect().and_then(|mut c| {
                redis::cmd("PING")
                    .query::<String>(&mut c)
                    .map_err(redis_err)
            }) {
                Ok(_) => return Ok(server),
                Err(e) if Instant::now() >= until => {
                    return Err(ToolError::Msg(format!("redis-server did not answer: {e}")))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// A new connection to the server.
    pub(in crate::bench) fn connect(&self) -> Result<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .and_then(|c| c.get_connection())
            .map_err(redis_err)
    }

    /// The server's `used_memory` (`INFO memory`), through `conn`: the bytes Redis counts
    /// against `maxmemory`.
    pub(in crate::bench) fn used_memory(conn: &mut redis::Connection) -> Result<u64> {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(conn)
            .map_err(redis_err)?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| ToolError::Msg("redis: INFO memory has no used_memory".into()))
    }

    /// `n` clients doing `op` (put: SET, get: GET, mget: MGET of all their keys) on their
    /// own `keys` keys for `secs`.
    pub(super) fn clients(
        &self,
        n: usize,
        keys: usize,
        value: &[u8],
        op: &str,
        secs: f64,
    ) -> Result<Rate> {
        let put = op == "put";
        clients(n, secs, |i| {
            let mut conn = self.connect()?;
            let names: Vec<String> = (0..keys).map(|k| format!("c{i}:k{k}")).collect();
            for k in &names {
                conn.set::<_, _, ()>(k, value).map_err(redis_err)?;
            }
            let mut next = 0usize;
            Ok(move || -> Result<()> {
                let k = &names[next % names.len()];
                next += 1;
                if op == "mget" {
                    let got: Vec<Option<Vec<u8>>> = conn.mget(&names).map_err(redis_err)?;
                    if got
                        .iter()
                        .any(|v| v.as_ref().map(Vec::len) != Some(value.len()))
                    {
                        return Err(ToolError::Msg("redis: an MGET missed a key it SET".into()));
                    }
                } else if put {
                    conn.set::<_, _, ()>(k, value).map_err(redis_err)?;
                } else {
                    let got: Option<Vec<u8>> = conn.get(k).map_err(redis_err)?;
                    if got.map(|v| v.len()) != Some(value.len()) {
                        return Err(ToolError::Msg("redis: a GET missed a key it SET".into()));
                    }
                }
                Ok(())
            })
        })
    }

    /// `redis-benchmark`'s figures for SET and GET at each size and client count.
    pub(super) fn benchmark(&self, sizes: &[usize], counts: &[usize]) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        for &size in sizes {
            let requests = if size >= 256 << 10 { 2000 } else { 20000 };
            for &n in counts {
                let out = Command::new("redis-benchmark")
                    .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                    .args([
                        "-t",
                        "set,get",
                        "-d",
                        &size.to_string(),
                        "-c",
                        &n.to_string(),
                    ])
                    .args(["-n", &requests.to_string(), "--csv"])
                    .output()
                    .map_err(|e| ToolError::Io("running redis-benchmark".into(), e))?;
                let text = String::from_utf8_lossy(&out.stdout);
                for line in text.lines().skip(1) {
                    let f: Vec<&str> = line.split(',').map(|c| c.trim_matches('"')).collect();
                    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
                    // "p95_latency_ms","p99_latency_ms","max_latency_ms"
                    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
                    let (Some(test), Some(rps), Some(p50), Some(p99)) =
                        (f.first(), num(1), num(4), num(6))
                    else {
                        continue;
                    };
                    let stats = Stats {
                        median_ns: p50 * 1e6,
                        p99_ns: p99 * 1e6,
                    };
                    rows.push(Row {
                        provider: "redis-benchmark".into(),
                        transport: "tcp".into(),
                        op: format!("{test} x{n}"),
                        metric: "rate".into(),
                        size,
                        iters: requests,
                        median_ns: stats.median_ns,
                        p99_ns: stats.p99_ns,
                        gbps: 0.0,
                        mops: rps / 1e6,
                        reference: "-".into(),
                        reference_value: 0.0,
                        ratio: 0.0,
                    });
                }
            }
        }
        if rows.is_empty() {
            return Err(ToolError::Msg("redis-benchmark printed no figures".into()));
        }
        Ok(rows)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
