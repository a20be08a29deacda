//! How `monitor` prints a sample: one JSON object per line (`--json`), one line refreshed
//! in place on a terminal, or plain lines with the elapsed time when stdout is not one.

use super::source::{Lat, Sample};
use super::Metric;
use crate::{Result, ToolError};
use serde_json::{json, Map, Value};
use std::io::{IsTerminal, Write};
use std::time::Duration;

/// The output state.
pub struct Output {
    metric: Metric,
    json: bool,
    tty: bool,
    target: String,
    printed: bool,
}

fn key(p: f64) -> String {
    if p >= 100.0 {
        "max".into()
    } else {
        format!("p{p}")
    }
}

fn latency(l: &Lat) -> (Value, String) {
    let mut m = Map::new();
    let mut text = format!("count {}", l.count);
    for &(p, v) in &l.percentiles_us {
        m.insert(key(p), json!(v));
        text.push_str(&format!("  {} {:.1} us", key(p), v));
    }
    (json!({"count": l.count, "percentiles_us": m}), text)
}

fn rate(hits: u64, misses: u64) -> Option<f64> {
    let all = hits + misses;
    (all > 0).then(|| hits as f64 / all as f64)
}

fn pct(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{:.1}%", r * 100.0))
}

impl Output {
    pub fn new(metric: Metric, json: bool, target: Option<&str>) -> Self {
        Self {
            metric,
            json,
            tty: !json && std::io::stdout().is_terminal(),
            target: target.unwrap_or("probe").to_string(),
            printed: false,
        }
    }

    fn body(&self, s: &Sample, prev: Option<&Sample>) -> (Value, String) {
        let c = |k: &str| s.c.get(k).copied().unwrap_or(0);
        let pc = |k: &str| prev.and_then(|p| p.c.get(k).copied()).unwrap_or(0);
        match self.metric {
            Metric::RegLatency => latency(&s.reg),
            Metric::DeregLatency => latency(&s.dereg),
            Metric::OpLatency => {
                let every = c("op_sample_every");
                let mut ops = Map::new();
                let mut text = if every == 0 {
                    "off in the target (its endpoint samples no work requests)".to_string()
                } else {
                    format!("1 in {every} sampled")
                };
                for (op, l) in &s.ops {
                    let (v, t) = latency(l);
                    ops.insert(op.clone(), v);
                    text.push_str(&format!(" | {op} {t}"));
                }
                if every != 0 && s.ops.is_empty() {
                    text.push_str(" | no work request completed yet");
                }
                (json!({"sample_every": every, "ops": ops}), text)
            }
            Metric::CacheHitRate => {
                let (h, m) = (c("cache_hits"), c("cache_misses"));
                let all = rate(h, m);
                let recent = prev.and_then(|_| {
                    rate(
                        h.saturating_sub(pc("cache_hits")),
                        m.saturating_sub(pc("cache_misses")),
                    )
                });
                (
                    json!({"hits": h, "misses": m, "hit_rate": all, "interval_hit_rate": recent}),
                    format!(
                        "hit rate {} (last interval {})  hits {h}  misses {m}",
                        pct(all),
                        pct(recent)
                    ),
                )
            }
            Metric::PoolUsage => {
                let keys = [
                    "pool_in_use",
                    "pool_allocations",
                    "pool_chunks",
                    "pool_empty",
                ];
                let mut m = Map::new();
                let mut text = String::new();
                for k in keys {
                    let short = &k[5..];
                    m.insert(short.into(), json!(c(k)));
                    text.push_str(&format!("{short} {}  ", c(k)));
                }
                (Value::Object(m), text.trim_end().to_string())
            }
            Metric::Errors => {
                let keys = [
                    "registration_errors",
                    "retries",
                    "timeouts",
                    "cancellations",
                    "connection_errors",
                ];
                let mut m = Map::new();
                let mut text = String::new();
                for k in keys {
                    m.insert(k.into(), json!(c(k)));
                    text.push_str(&format!("{k} {}  ", c(k)));
                }
                m.insert("completion_errors".into(), json!(s.completion_errors));
                m.insert("qp_errors".into(), json!(s.qp_errors));
                let bad: u64 = s.completion_errors.values().sum();
                text.push_str(&format!("error completions {bad}"));
                for (st, n) in &s.completion_errors {
                    text.push_str(&format!(" {st}={n}"));
                }
                // The QPs they came from, when the target counts per QP (a few, by name).
                const SHOWN: usize = 3;
                for (qp, statuses) in s.qp_errors.iter().take(SHOWN) {
                    let list: Vec<String> =
                        statuses.iter().map(|(st, n)| format!("{st}={n}")).collect();
                    text.push_str(&format!("  qp {qp}: {}", list.join(" ")));
                }
                if s.qp_errors.len() > SHOWN {
                    text.push_str(&format!("  (+{} QPs)", s.qp_errors.len() - SHOWN));
                }
                (Value::Object(m), text)
            }
        }
    }

    /// Prints sample number `n`, taken `at` after the start; returns its values (as the
    /// JSON line carries them).
    pub fn sample(
        &mut self,
        n: u64,
        at: Duration,
        s: &Sample,
        prev: Option<&Sample>,
    ) -> Result<Value> {
        let (value, text) = self.body(s, prev);
        let kept = value.clone();
        let metric = super::metric_name(self.metric);
        let mut o = std::io::stdout().lock();
        let r = if self.json {
            let mut v = json!({
                "sample": n,
                "elapsed_s": at.as_secs_f64(),
                "target": self.target,
                "pid": s.pid,
                "metric": metric,
            });
            if let (Value::Object(dst), Value::Object(src)) = (&mut v, value) {
                dst.extend(src);
            }
            writeln!(o, "{v}")
        } else if self.tty {
            write!(o, "\r\x1b[2K{metric} [{}] {text}", self.target).and_then(|_| o.flush())
        } else {
            writeln!(o, "{:>8.1}s {metric} {text}", at.as_secs_f64())
        };
        self.printed = true;
        r.map_err(|e| ToolError::Io("stdout".into(), e))?;
        Ok(kept)
    }

    /// Ends the in-place line on a terminal.
    pub fn finish(&self) -> Result<()> {
        if self.tty && self.printed {
            crate::outln!();
        }
        Ok(())
    }
}
