//! What `stress` shows: progress while it runs (a bar with ETA on a terminal, a line every
//! few seconds otherwise) and the summary (text or JSON), registration apart from allocation.

use super::memory::MemoryMode;
use crate::units::show;
use serde_json::json;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Everything measured.
pub struct Summary {
    pub provider: String,
    pub memory: MemoryMode,
    pub hugepages: bool,
    pub size: usize,
    pub count: u64,
    pub threads: usize,
    pub region_bytes: usize,
    pub rounds_done: u64,
    pub registered_bytes: u64,
    pub wall: f64,
    pub alloc: hdrhistogram::Histogram<u64>,
    pub reg: hdrhistogram::Histogram<u64>,
    pub dereg: hdrhistogram::Histogram<u64>,
    pub failures: u64,
    pub retries: u64,
    pub first_error: Option<String>,
    pub stopped_early: Option<u64>,
    /// SIGINT or SIGTERM ended the run after `rounds_done` rounds.
    pub interrupted: bool,
}

/// Progress for a human: a bar on a terminal, plain lines every 5 s in a log.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
    last_line: Instant,
    count: u64,
}

impl Progress {
    pub fn new(count: u64, json: bool) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = tty.then(|| {
            let b = indicatif::ProgressBar::new(count);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} rounds, {elapsed} elapsed, ETA {eta} {msg}",
                )
                .expect("valid template"),
            );
            b
        });
        Self {
            bar,
            lines: !tty && !json,
            last_line: Instant::now(),
            count,
        }
    }

    pub fn tick(&mut self, s: &Summary, started: Instant) {
        if let Some(b) = &self.bar {
            b.inc(1);
            return;
        }
        if self.lines && self.last_line.elapsed() >= Duration::from_secs(5) {
            self.last_line = Instant::now();
            let el = started.elapsed().as_secs_f64();
            // Rounds cost what their registration (and, when fresh, allocation) costs; the
            // first round's allocation of pooled memory is not repeated.
            let alloc = s.alloc.mean() * s.alloc.len() as f64 / 1e9;
            let per_round = match s.memory {
                MemoryMode::Pooled => (el - alloc).max(0.0) / s.rounds_done as f64,
                MemoryMode::Fresh => el / s.rounds_done as f64,
            };
            let eta = per_round * (self.count - s.rounds_done) as f64;
            crate::errln!(
                "stress: round {}/{}, {:.0} s elapsed, ETA {:.0} s, registration p99 {}",
                s.rounds_done,
                self.count,
                el,
                eta,
                us(s.reg.value_at_quantile(0.99))
            );
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn us(ns: u64) -> String {
    format!("{:.1} us", ns as f64 / 1000.0)
}

/// p50/p90/p99/max in microseconds, or null when nothing was measured.
fn percentiles(h: &hdrhistogram::Histogram<u64>) -> serde_json::Value {
    if h.is_empty() {
        return serde_json::Value::Null;
    }
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    json!({ "samples": h.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": h.max() as f64 / 1000.0 })
}

fn line(name: &str, h: &hdrhistogram::Histogram<u64>) -> String {
    if h.is_empty() {
        return format!("{name}: not measured");
    }
    let q = |p: f64| us(h.value_at_quantile(p));
    format!(
        "{name}: p50 {}, p90 {}, p99 {}, max {} ({} samples)",
        q(0.5),
        q(0.9),
        q(0.99),
        us(h.max()),
        h.len()
    )
}

/// Prints the summary.
pub fn print(s: &Summary, as_json: bool) {
    let reg_seconds = s.reg.mean() * s.reg.len() as f64 / 1e9;
    let rate =
        (s.registered_bytes > 0 && s.wall > 0.0).then(|| s.registered_bytes as f64 / s.wall / 1e9);
    if as_json {
        let v = json!({
            "provider": s.provider, "memory": s.memory, "hugepages": s.hugepages,
            "size": s.size, "count": s.count, "rounds_done": s.rounds_done,
            "threads": s.threads, "region_bytes": s.region_bytes,
            "registered_bytes": s.registered_bytes, "seconds": s.wall,
            "registered_gbytes_per_s": rate,
            "allocation_us": percentiles(&s.alloc),
            "registration_us": percentiles(&s.reg),
            "deregistration_us": percentiles(&s.dereg),
            "failures": s.failures, "retries": s.retries, "first_error": s.first_error,
            "stopped_early_after_round": s.stopped_early,
            "interrupted": s.interrupted,
        });
        crate::outln!("{v}");
        return;
    }
    let pages = if s.hugepages {
        "2 MiB pages"
    } else {
        "4 KiB pages"
    };
    let memory = match s.memory {
        MemoryMode::Pooled => "allocated once, registered every round",
        MemoryMode::Fresh => "allocated every round",
    };
    crate::outln!(
        "{} rounds x {} threads x {} ({pages}, {memory}) on {}: {} registered and deregistered in {:.2} s{}",
        s.rounds_done,
        s.threads,
        show(s.region_bytes),
        s.provider,
        show(s.registered_bytes as usize),
        s.wall,
        rate.map(|r| format!(", {r:.2} GB/s")).unwrap_or_default()
    );
    if s.interrupted {
        crate::outln!(
            "interrupted after round {} of {}: the figures cover the rounds done",
            s.rounds_done,
            s.count
        );
    }
    crate::outln!("{}", line("registration (submit to ready)", &s.reg));
    crate::outln!("{}", line("deregistration", &s.dereg));
    crate::outln!("{}", line("allocation and first touch", &s.alloc));
    if !s.reg.is_empty() {
        crate::outln!(
            "registration time summed over the {} threads: {reg_seconds:.2} s (wall {:.2} s)",
            s.threads,
            s.wall
        );
    }
    crate::outln!(
        "failures {}, retries {}{}",
        s.failures,
        s.retries,
        s.first_error
            .as_deref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    );
}

/// p50/p99/p99.9/max in microseconds for a kind of a mixed run, or null when none.
fn mix_percentiles(h: &hdrhistogram::Histogram<u64>) -> serde_json::Value {
    if h.is_empty() {
        return serde_json::Value::Null;
    }
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    json!({ "samples": h.len(), "p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "max": h.max() as f64 / 1000.0 })
}

/// Prints a mixed run's summary: each kind apart.
pub fn print_mix(
    plan: &super::mix::Plan,
    r: &super::mix::MixResult,
    provider: &str,
    as_json: bool,
) {
    let rate = |ops: u64| {
        if r.wall > 0.0 {
            ops as f64 / r.wall
        } else {
            0.0
        }
    };
    // The share of the threads' time each kind took (its latencies summed over wall x threads).
    let share = |h: &hdrhistogram::Histogram<u64>| {
        let busy = h.mean() * h.len() as f64 / 1e9;
        if r.wall > 0.0 {
            busy / (r.wall * plan.threads as f64)
        } else {
            0.0
        }
    };
    if as_json {
        let mut kinds = serde_json::Map::new();
        for k in &r.kinds {
            let mut v = json!({
                "ops": k.ops, "ops_per_s": rate(k.ops), "failures": k.failures,
                "first_error": k.first_error, "latency_us": mix_percentiles(&k.latency),
                "time_share": share(&k.latency),
            });
            match k.kind {
                super::mix::Kind::Reg => {
                    v["region_bytes"] = json!(plan.region_bytes);
                    v["deregistration_us"] = mix_percentiles(&k.dereg);
                }
                super::mix::Kind::Cache => {
                    v["buffer_bytes"] = json!(plan.cache_size);
                    v["working_set"] = json!(plan.cache_buffers);
                    v["miss_every"] = json!(plan.cache_miss_every);
                    v["new_buffer_us"] = mix_percentiles(&k.misses);
                    if let Some(c) = &r.cache {
                        v["hits"] = json!(c.hits);
                        v["misses"] = json!(c.misses);
                        v["evictions"] = json!(c.evictions);
                        v["uncached"] = json!(c.uncached);
                    }
                }
                super::mix::Kind::Pool => {
                    v["buffer_bytes"] = json!(plan.pool_size);
                    if let Some(p) = &r.pool {
                        v["chunks"] = json!(p.chunks);
                        v["empty"] = json!(p.empty);
                        v["growths"] = json!(p.growths);
                    }
                }
            }
            kinds.insert(k.kind.name().into(), v);
        }
        let v = json!({
            "provider": provider, "mix": plan.kinds, "threads": plan.threads,
            "count": plan.count, "seconds": r.wall, "kinds": kinds,
            "failures": r.kinds.iter().map(|k| k.failures).sum::<u64>(),
            "interrupted_after_round": r.interrupted_after,
        });
        crate::outln!("{v}");
        return;
    }
    let names: Vec<&str> = plan.kinds.iter().map(|k| k.name()).collect();
    crate::outln!(
        "mix {} x {} threads x {} rounds on {provider} in {:.2} s (kinds interleaved: ops/s over the whole run, time = share of the threads' time)",
        names.join(","),
        plan.threads,
        plan.count,
        r.wall
    );
    if let Some(done) = r.interrupted_after {
        crate::outln!(
            "interrupted after round {done} of {}: the figures cover the rounds done",
            plan.count
        );
    }
    crate::outln!(
        "{:<6} {:>9} {:>11} {:>6} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "kind",
        "ops",
        "ops/s",
        "time",
        "p50",
        "p99",
        "p99.9",
        "max",
        "failures"
    );
    for k in &r.kinds {
        let h = &k.latency;
        let q = |p: f64| {
            if h.is_empty() {
                "-".to_string()
            } else {
                us(h.value_at_quantile(p))
            }
        };
        let max = if h.is_empty() {
            "-".into()
        } else {
            us(h.max())
        };
        crate::outln!(
            "{:<6} {:>9} {:>11.0} {:>5.0}% {:>10} {:>10} {:>10} {:>10} {:>8}",
            k.kind.name(),
            k.ops,
            rate(k.ops),
            share(h) * 100.0,
            q(0.5),
            q(0.99),
            q(0.999),
            max,
            k.failures
        );
    }
    for k in &r.kinds {
        match k.kind {
            super::mix::Kind::Reg => crate::outln!(
                "reg: {} regions through the registrar, submit to ready; {}",
                show(plan.region_bytes),
                line("deregistration", &k.dereg)
            ),
            super::mix::Kind::Cache => {
                if let Some(c) = &r.cache {
                    crate::outln!(
                        "cache: {} buffers of {} shared, one lookup in {} on a new buffer: hits {}, misses {}, evictions {}, uncached {}",
                        plan.cache_buffers, show(plan.cache_size), plan.cache_miss_every,
                        c.hits, c.misses, c.evictions, c.uncached
                    );
                    crate::outln!(
                        "cache: {}",
                        line("lookups on new buffers (register)", &k.misses)
                    );
                }
            }
            super::mix::Kind::Pool => {
                if let Some(p) = &r.pool {
                    crate::outln!(
                        "pool: {} buffers, the last 4 per thread held: chunks {}, empty {}, growths {}",
                        show(plan.pool_size), p.chunks, p.empty, p.growths
                    );
                }
            }
        }
        if let Some(e) = &k.first_error {
            crate::outln!("{}: first failure: {e}", k.kind.name());
        }
    }
}
