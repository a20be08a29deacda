//! Benchmark results: one row per measurement, printed as a table or JSON lines.

use serde::Serialize;

/// One measured result and its comparison with a reference from the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Provider measured ("soft", "verbs", or the reference's own name).
    pub provider: String,
    /// Path used ("tcp", "local").
    pub transport: String,
    /// Operation ("write", "read", "cas", "faa").
    pub op: String,
    /// "latency" or "bandwidth": which metric `ratio` compares.
    pub metric: String,
    /// Message size in bytes.
    pub size: usize,
    /// Operations measured.
    pub iters: u64,
    /// Median round trip of one operation, ns.
    pub median_ns: f64,
    /// 99th percentile round trip, ns.
    pub p99_ns: f64,
    /// Throughput in GB/s (1e9 bytes per second) with a window of operations in flight.
    pub gbps: f64,
    /// Message rate in millions of operations per second (rows of metric "rate"; else 0).
    #[serde(default)]
    pub mops: f64,
    /// The reference this row is compared with.
    pub reference: String,
    /// The reference's value (ns for latency, GB/s for bandwidth).
    pub reference_value: f64,
    /// Ours relative to the reference: latency = our median / reference median (lower is
    /// better), bandwidth = our GB/s / reference GB/s (higher is better).
    pub ratio: f64,
}

/// Prints rows as an aligned table.
pub fn print_table(rows: &[Row]) {
    crate::outln!(
        "{:<9} {:<18} {:<9} {:>6} {:>7} {:>11} {:>11} {:>11}  {:<32} {:>11} {:>7}",
        "transport",
        "op",
        "metric",
        "size",
        "iters",
        "median",
        "p99",
        "GB/s|Mop/s",
        "reference",
        "ref value",
        "ratio"
    );
    for r in rows {
        let refv = match r.metric.as_str() {
            _ if r.reference_value.is_nan() || r.reference_value <= 0.0 => "-".into(),
            "latency" => fmt_ns(r.reference_value),
            "rate" => format!("{:.3} Mop/s", r.reference_value),
            _ => format!("{:.2} GB/s", r.reference_value),
        };
        let value = if r.metric == "rate" {
            format!("{:.3} Mop/s", r.mops)
        } else {
            format!("{:.3}", r.gbps)
        };
        // A row without a reference (perftest missing or silent) has no ratio: "-", not 0.
        let ratio = if r.ratio.is_finite() && r.ratio > 0.0 {
            format!("{:.2}", r.ratio)
        } else {
            "-".into()
        };
        crate::outln!(
            "{:<9} {:<18} {:<9} {:>6} {:>7} {:>11} {:>11} {:>11}  {:<32} {:>11} {:>7}",
            r.transport,
            r.op,
            r.metric,
            crate::units::show(r.size),
            r.iters,
            fmt_ns(r.median_ns),
            fmt_ns(r.p99_ns),
            value,
            r.reference,
            refv,
            ratio
        );
    }
}

/// Nanoseconds as text with a fitting unit.
pub fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() || ns <= 0.0 {
        "-".into()
    } else if ns < 10_000.0 {
        format!("{:.2} us", ns / 1000.0)
    } else if ns < 10_000_000.0 {
        format!("{:.1} us", ns / 1000.0)
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

/// Prints rows as JSON, one object per line.
pub fn print_json(rows: &[Row]) {
    for r in rows {
        crate::outln!(
            "{}",
            serde_json::to_string(r).expect("JSON of plain values")
        );
    }
}
