//! Where `monitor` reads from: a Unix socket (one JSON snapshot per connection), an HTTP
//! URL (Prometheus text, percentiles estimated from the histogram buckets), or this
//! probe's own context (its `ctx.metrics()`). All three become a [`Sample`].

use crate::{Result, ToolError};
use rdmapool::metrics::ContextMetrics;
use rdmapool_exporter::UnixName;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// What is read.
pub enum Source {
    /// A Unix socket of `Endpoint`.
    Unix(UnixName),
    /// An HTTP endpoint: address, Host header, path.
    Http(SocketAddr, String, String),
    /// The probe workload's context in this process (its metrics once the probe runs).
    Local(Option<ContextMetrics>),
}

/// One latency histogram as read: the count and the asked percentiles (µs).
#[derive(Default, Clone)]
pub struct Lat {
    pub count: u64,
    pub percentiles_us: Vec<(f64, f64)>,
}

/// One reading of an endpoint.
#[derive(Default, Clone)]
pub struct Sample {
    pub pid: Option<u64>,
    pub reg: Lat,
    pub dereg: Lat,
    pub c: BTreeMap<&'static str, u64>,
    pub completion_errors: BTreeMap<String, u64>,
    /// Error completions per QP (`device/qp_num` to status to count), for the QPs that had
    /// any (empty when the target does not count per QP).
    pub qp_errors: BTreeMap<String, BTreeMap<String, u64>>,
    /// Sampled work-request latency by opcode label (`rdma_write`, ...).
    pub ops: BTreeMap<String, Lat>,
}

/// Counter names shared by both formats: (sample key, JSON path, Prometheus name).
const COUNTERS: [(&str, [&str; 2], &str); 14] = [
    (
        "op_sample_every",
        ["op_sample_every", ""],
        "rdmapool_op_sample_every",
    ),
    (
        "connection_errors",
        ["connections", "errors"],
        "rdmapool_connection_errors_total",
    ),
    (
        "registration_errors",
        ["registration", "errors"],
        "rdmapool_registration_errors_total",
    ),
    (
        "retries",
        ["registrar", "retries"],
        "rdmapool_registration_retries_total",
    ),
    (
        "timeouts",
        ["registrar", "timeouts"],
        "rdmapool_registration_timeouts_total",
    ),
    (
        "cancellations",
        ["registrar", "cancellations"],
        "rdmapool_registration_cancellations_total",
    ),
    ("cache_hits", ["cache", "hits"], "rdmapool_cache_hits_total"),
    (
        "cache_misses",
        ["cache", "misses"],
        "rdmapool_cache_misses_total",
    ),
    (
        "pool_in_use",
        ["pool", "in_use"],
        "rdmapool_pool_buffers_in_use",
    ),
    (
        "pool_allocations",
        ["pool", "allocations"],
        "rdmapool_pool_allocations_total",
    ),
    ("pool_empty", ["pool", "empty"], "rdmapool_pool_empty_total"),
    (
        "pool_chunks",
        ["pool", "chunks"],
        "rdmapool_pool_chunks_total",
    ),
    (
        "registered_bytes",
        ["registered_bytes", ""],
        "rdmapool_registered_bytes",
    ),
    (
        "pinned_bytes",
        ["pinned_bytes", ""],
        "rdmapool_pinned_bytes",
    ),
];

impl Source {
    /// `http://host:port[/path]`, `@abstract`, or a socket path; `None`: the probe.
    pub fn parse(target: Option<&str>) -> Result<Self> {
        let Some(t) = target else {
            return Ok(Self::Local(None));
        };
        if t.starts_with("https://") {
            return Err(ToolError::Msg(format!(
                "--target {t}: metrics are served over plain HTTP on loopback; use http://"
            )));
        }
        let Some(rest) = t.strip_prefix("http://") else {
            return Ok(Self::Unix(UnixName::parse(t)));
        };
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/metrics"),
        };
        let addrs: Vec<_> = host
            .to_socket_addrs()
            .map_err(|_| ToolError::Msg(format!("--target {t}: {host} is not a host:port")))?
            .collect();
        // An endpoint serves HTTP on loopback only: any other address is not one (and the
        // monitor sends nothing off this host).
        let addr = addrs
            .iter()
            .find(|a| a.ip().is_loopback())
            .copied()
            .ok_or_else(|| {
                ToolError::Msg(format!(
                    "--target {t}: {host} is not on this host; an rdmapool metrics endpoint \
                     serves HTTP on loopback only (127.0.0.0/8 or [::1]): run monitor on the \
                     process's machine, with http://127.0.0.1:PORT or its Unix socket"
                ))
            })?;
        Ok(Self::Http(addr, host.to_string(), path.to_string()))
    }

    /// Whether any percentile can be asked (HTTP interpolates between buckets).
    pub fn any_percentile(&self) -> bool {
        matches!(self, Self::Http(..))
    }

    /// Reads one sample, with the percentiles `ps` of both latency histograms.
    pub fn read(&self, ps: &[f64]) -> Result<Sample> {
        match self {
            Self::Local(m) => from_json(&rdmapool::metrics::snapshot_of(m).to_json(), ps),
            Self::Unix(name) => {
                let io = |e| ToolError::Io(format!("metrics socket {name}"), e);
                let mut c =
                    std::os::unix::net::UnixStream::connect_addr(&name.to_addr().map_err(io)?)
                        .map_err(io)?;
                c.set_read_timeout(Some(Duration::from_secs(5)))
                    .map_err(io)?;
                let mut s = String::new();
                c.read_to_string(&mut s).map_err(io)?;
                from_json(&s, ps)
            }
            Self::Http(addr, host, path) => {
                let io = |e| ToolError::Io(format!("http://{host}{path}"), e);
                let mut c = TcpStream::connect_timeout(addr, Duration::from_secs(5)).map_err(io)?;
                c.set_read_timeout(Some(Duration::from_secs(5)))
                    .map_err(io)?;
                write!(
                    c,
                    "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                )
                .map_err(io)?;
                let mut s = String::new();
                c.read_to_string(&mut s).map_err(io)?;
                let (head, body) = s.split_once("\r\n\r\n").unwrap_or((&s, ""));
                if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
                    let line = head.lines().next().unwrap_or("no response");
                    return Err(ToolError::Msg(format!("http://{host}{path}: {line}")));
                }
                Ok(from_prometheus(body, ps))
            }
        }
    }
}

fn json_lat(v: &Value, ps: &[f64]) -> Lat {
    let p = &v["latency"]["percentiles_us"];
    Lat {
        count: v["count"].as_u64().unwrap_or(0),
        percentiles_us: ps
            .iter()
            .map(|&q| {
                let key = if q >= 100.0 {
                    "max".into()
                } else {
                    format!("p{q}")
                };
                (q, p[key.as_str()].as_f64().unwrap_or(f64::NAN))
            })
            .collect(),
    }
}

/// A JSON snapshot (`Snapshot::to_json`).
pub fn from_json(s: &str, ps: &[f64]) -> Result<Sample> {
    let v: Value = serde_json::from_str(s.trim())
        .map_err(|e| ToolError::Msg(format!("the metrics socket sent no JSON snapshot: {e}")))?;
    if v["schema"] != 1 {
        return Err(ToolError::Msg(format!(
            "unknown metrics schema {} (this monitor reads schema 1)",
            v["schema"]
        )));
    }
    let mut out = Sample {
        pid: v["pid"].as_u64(),
        reg: json_lat(&v["registration"], ps),
        dereg: json_lat(&v["deregistration"], ps),
        ..Sample::default()
    };
    for (key, [a, b], _) in COUNTERS {
        let x = if b.is_empty() { &v[a] } else { &v[a][b] };
        out.c.insert(key, x.as_u64().unwrap_or(0));
    }
    if let Some(m) = v["op_latency"].as_object() {
        for (op, l) in m {
            out.ops.insert(op.clone(), json_lat(l, ps));
        }
    }
    if let Some(m) = v["completions"].as_object() {
        for (k, n) in m.iter().filter(|(k, _)| *k != "success") {
            out.completion_errors
                .insert(k.clone(), n.as_u64().unwrap_or(0));
        }
    }
    for qp in v["objects"]["qps"].as_array().into_iter().flatten() {
        let name = format!("{}/{}", qp["device"].as_str().unwrap_or("?"), qp["qp"]);
        for (status, n) in qp["completions"].as_object().into_iter().flatten() {
            let n = n.as_u64().unwrap_or(0);
            if status != "success" && n > 0 {
                let e = out.qp_errors.entry(name.clone()).or_default();
                e.insert(status.clone(), n);
            }
        }
    }
    Ok(out)
}

/// The value at percentile `p` from cumulative buckets `(le seconds, count)`, µs, by linear
/// interpolation inside the bucket (as Prometheus' `histogram_quantile` does).
pub fn bucket_percentile(buckets: &[(f64, u64)], count: u64, p: f64) -> f64 {
    if count == 0 {
        return 0.0;
    }
    let rank = p / 100.0 * count as f64;
    let (mut lo, mut below) = (0.0, 0u64);
    for &(le, n) in buckets {
        if n as f64 >= rank && le.is_finite() {
            let inside = (n - below).max(1) as f64;
            return (lo + (le - lo) * ((rank - below as f64) / inside).clamp(0.0, 1.0)) * 1e6;
        }
        if le.is_finite() {
            (lo, below) = (le, n);
        }
    }
    lo * 1e6 // in the +Inf bucket: the highest finite bound, as histogram_quantile does
}

/// One histogram series of `name`; `labels` is empty or `key="value",`.
fn prom_lat(text: &str, name: &str, labels: &str, ps: &[f64]) -> Lat {
    let mut buckets = Vec::new();
    let mut count = 0;
    let bucket = format!("{name}_bucket{{{labels}le=\"");
    let count_name = if labels.is_empty() {
        format!("{name}_count ")
    } else {
        format!("{name}_count{{{}}} ", labels.trim_end_matches(','))
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(&bucket) {
            if let Some((le, n)) = rest.split_once("\"} ") {
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::NAN)
                };
                buckets.push((le, n.trim().parse().unwrap_or(0)));
            }
        } else if let Some(n) = line.strip_prefix(&count_name) {
            count = n.trim().parse::<f64>().unwrap_or(0.0) as u64;
        }
    }
    Lat {
        count,
        percentiles_us: ps
            .iter()
            .map(|&p| (p, bucket_percentile(&buckets, count, p)))
            .collect(),
    }
}

/// Prometheus text exposition as served at `/metrics`.
pub fn from_prometheus(text: &str, ps: &[f64]) -> Sample {
    let mut out = Sample {
        reg: prom_lat(text, "rdmapool_registration_duration_seconds", "", ps),
        dereg: prom_lat(text, "rdmapool_deregistration_duration_seconds", "", ps),
        ..Sample::default()
    };
    let value = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0) as u64
    };
    for (key, _, name) in COUNTERS {
        out.c.insert(key, value(name));
    }
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("rdmapool_op_duration_seconds_count{opcode=\"") else {
            continue;
        };
        if let Some((op, _)) = rest.split_once('"') {
            let labels = format!("opcode=\"{op}\",");
            let l = prom_lat(text, "rdmapool_op_duration_seconds", &labels, ps);
            out.ops.insert(op.to_string(), l);
        }
    }
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("rdmapool_completions_total{status=\"") else {
            continue;
        };
        if let Some((status, n)) = rest.split_once("\"} ") {
            if status != "success" {
                out.completion_errors
                    .insert(status.to_string(), n.trim().parse().unwrap_or(0));
            }
        }
    }
    for line in text.lines() {
        let Some((qp, status, n)) = qp_series(line) else {
            continue;
        };
        if status != "success" && n > 0 {
            out.qp_errors.entry(qp).or_default().insert(status, n);
        }
    }
    out
}

/// `(device/qp, status, count)` of one `rdmapool_qp_completions_total` sample line.
fn qp_series(line: &str) -> Option<(String, String, u64)> {
    let rest = line.strip_prefix("rdmapool_qp_completions_total{device=\"")?;
    let (device, rest) = rest.split_once("\",qp=\"")?;
    let (qp, rest) = rest.split_once("\",status=\"")?;
    let (status, n) = rest.split_once("\"} ")?;
    let n = n.trim().parse::<f64>().ok()? as u64;
    Some((format!("{device}/{qp}"), status.to_string(), n))
}
