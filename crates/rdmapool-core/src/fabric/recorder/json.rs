//! [`Snapshot`] as one JSON object (what the Unix-socket endpoint sends). The schema is
//! documented in `docs/METRICS.md`; `"schema": 1` names this version of it.

use super::prometheus::status_label;
use super::{opcode_label, LatencySummary, ObjectCompletions, Section, Snapshot, PERCENTILES};
use crate::fabric::WcStatus;
use std::fmt::Write;

/// A finite number as JSON (non-finite values, which never occur here, become 0).
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "0".into()
    }
}

/// A string as JSON (quoted, with `"`, `\\` and control characters escaped).
fn string(v: &str) -> String {
    let mut o = String::from('"');
    for ch in v.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn by_status(completions: &[(WcStatus, u64)]) -> String {
    let mut o = String::new();
    for (i, &(s, n)) in completions.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(o, "{sep}\"{}\":{n}", status_label(s));
    }
    o
}

/// Live CQs or QPs as a JSON array; `key` names their id (`cq` or `qp`).
fn objects(key: &str, objs: &[ObjectCompletions]) -> String {
    let items: Vec<String> = objs
        .iter()
        .map(|obj| {
            format!(
                "{{\"device\":{},\"{key}\":{},\"completions\":{{{}}}}}",
                string(&obj.device),
                obj.id,
                by_status(&obj.completions)
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

/// The sections the layers above core report, a JSON array per family: `,"pool_servers":
/// [{"node":1,"leases":2,...}]` (nothing for a family with no live section).
fn sections(sections: &[Section]) -> String {
    let mut out = String::new();
    let mut families: Vec<&str> = Vec::new();
    for s in sections {
        if !families.contains(&s.family) {
            families.push(s.family);
        }
    }
    for family in families {
        let items: Vec<String> = sections
            .iter()
            .filter(|s| s.family == family)
            .map(|s| {
                let mut members = vec![format!("\"{}\":{}", s.label.0, s.label.1)];
                members.extend(
                    s.series
                        .iter()
                        .map(|v| format!("\"{}\":{}", v.key, v.value)),
                );
                format!("{{{}}}", members.join(","))
            })
            .collect();
        out.push_str(&format!(",\"{family}\":[{}]", items.join(",")));
    }
    out
}

fn latency(l: &LatencySummary) -> String {
    let mut o = format!(
        "{{\"count\":{},\"sum_seconds\":{},\"percentiles_us\":{{",
        l.count,
        num(l.sum_seconds)
    );
    for (i, (p, v)) in PERCENTILES.iter().zip(l.percentiles_us.iter()).enumerate() {
        let key = if *p >= 100.0 {
            "max".to_string()
        } else {
            format!("p{p}")
        };
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(o, "{sep}\"{key}\":{}", num(*v));
    }
    o.push_str("}}");
    o
}

impl Snapshot {
    /// The snapshot as one line of JSON.
    ///
    /// Percentile keys are `p50`, `p75`, `p90`, `p95`, `p99`, `p99.9`, `p99.99` and `max`,
    /// in microseconds.
    pub fn to_json(&self) -> String {
        let completions = by_status(&self.completions);
        let mut ops = String::new();
        for (i, (op, l)) in self.op_latency.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(
                ops,
                "{sep}\"{}\":{{\"count\":{},\"latency\":{}}}",
                opcode_label(*op),
                l.count,
                latency(l)
            );
        }
        format!(
            concat!(
                "{{\"schema\":1,\"pid\":{},\"uptime_seconds\":{},",
                "\"registration\":{{\"count\":{},\"errors\":{},\"latency\":{}}},",
                "\"deregistration\":{{\"count\":{},\"latency\":{}}},",
                "\"registrar\":{{\"retries\":{},\"timeouts\":{},\"cancellations\":{}}},",
                "\"cache\":{{\"hits\":{},\"misses\":{},\"evictions\":{},\"invalidations\":{}}},",
                "\"pool\":{{\"allocations\":{},\"in_use\":{},\"empty\":{},\"chunks\":{}}},",
                "\"connections\":{{\"active\":{},\"passive\":{},\"errors\":{}}},",
                "\"registered_bytes\":{},\"pinned_bytes\":{},\"completions\":{{{}}},",
                "\"sends_posted\":{},",
                "\"op_sample_every\":{},\"op_latency\":{{{}}},",
                "\"objects\":{{\"tracked\":{},\"cqs_live\":{},\"qps_live\":{},",
                "\"cqs\":{},\"qps\":{}}}{}}}"
            ),
            self.pid,
            num(self.uptime_seconds),
            self.registrations,
            self.registration_errors,
            latency(&self.registration_latency),
            self.deregistrations,
            latency(&self.deregistration_latency),
            self.retries,
            self.timeouts,
            self.cancellations,
            self.cache_hits,
            self.cache_misses,
            self.cache_evictions,
            self.cache_invalidations,
            self.pool_allocations,
            self.pool_in_use,
            self.pool_empty,
            self.pool_chunks,
            self.connections_active,
            self.connections_passive,
            self.connection_errors,
            self.registered_bytes,
            self.pinned_bytes,
            completions,
            self.sends_posted,
            self.op_sample_every,
            ops,
            self.objects_tracked,
            self.cqs_live,
            self.qps_live,
            objects("cq", &self.cqs),
            objects("qp", &self.qps),
            sections(&self.sections)
        )
    }
}
