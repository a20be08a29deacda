//! `bench data --plot`: the rows the table prints, drawn. The size sweep becomes latency and
//! bandwidth against message size for each operation (ours next to every reference measured
//! in the same run, both axes log-scale); the engine benchmarks become bar pairs, ours next
//! to each row's reference.

use super::report::Row;
use crate::plot::{self, BarPair, BarPanel, Grid, Panel, Series};
use crate::Result;
use std::path::Path;

/// An axis label for a size in bytes: decimal units, as the ticks fall on powers of ten.
fn size_label(v: f64) -> String {
    let v = v.round().max(0.0);
    for (div, unit) in [(1e9, "GB"), (1e6, "MB"), (1e3, "kB")] {
        if v >= div {
            return format!("{} {unit}", plot::num(v / div));
        }
    }
    format!("{v} B")
}

/// Adds `(x, y)` to the series called `name`, creating it (in order of first appearance).
pub(super) fn push(series: &mut Vec<Series>, name: String, thin: bool, p: (f64, f64)) {
    let s = match series.iter().position(|s| s.name == name) {
        Some(i) => &mut series[i],
        None => {
            series.push(Series {
                name,
                points: Vec::new(),
                thin,
            });
            series.last_mut().expect("just pushed")
        }
    };
    if !s.points.iter().any(|q| q.0 == p.0) {
        s.points.push(p);
    }
}

/// The sweep's panels: for each operation, latency then bandwidth against size.
fn sweep_panels(rows: &[Row], provider: &str) -> Vec<Panel> {
    let transports: Vec<&str> = dedup(rows.iter().map(|r| r.transport.as_str()));
    let ops: Vec<&str> = dedup(rows.iter().map(|r| r.op.as_str()));
    let tag = |t: &str| {
        if transports.len() > 1 {
            format!(" ({t})")
        } else {
            String::new()
        }
    };
    let mut panels = Vec::new();
    for op in ops {
        for (metric, y_desc) in [
            ("latency", "median round trip (µs, log scale)"),
            ("bandwidth", "throughput (GB/s, log scale)"),
        ] {
            let mut series = Vec::new();
            let mine = rows.iter().filter(|r| r.op == op && r.metric == metric);
            for r in mine.clone() {
                let ours = match metric {
                    "latency" => r.median_ns / 1e3,
                    _ => r.gbps,
                };
                let name = format!("rdmapool {provider} {}", r.transport);
                push(&mut series, name, false, (r.size as f64, ours));
            }
            // References after ours, so ours keep the first colours. A row without one
            // (perftest missing or silent for it) adds no point.
            for r in mine.filter(|r| r.reference != "-" && r.reference_value > 0.0) {
                let reference = match metric {
                    "latency" => r.reference_value / 1e3,
                    _ => r.reference_value,
                };
                let name = format!("{}{}", r.reference, tag(&r.transport));
                push(&mut series, name, true, (r.size as f64, reference));
            }
            if series.is_empty() {
                continue;
            }
            panels.push(Panel {
                title: format!("{op}: {metric} by message size"),
                x_desc: "message size (bytes, log scale)".into(),
                y_desc: y_desc.into(),
                log_x: true,
                log_y: true,
                x_fmt: size_label,
                series,
            });
        }
    }
    panels
}

/// The distinct strings of `it`, in order of first appearance.
pub(super) fn dedup<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for s in it {
        if !v.contains(&s) {
            v.push(s);
        }
    }
    v
}

/// The engine benchmarks' panels: one per metric (latency in µs, rate in Mop/s).
fn engine_panels(rows: &[Row]) -> Vec<BarPanel> {
    let mut panels = Vec::new();
    for (metric, unit) in [
        ("latency", "median 8 B WRITE round trip (µs)"),
        ("rate", "message rate (Mop/s)"),
    ] {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.metric == metric).collect();
        if mine.is_empty() {
            continue;
        }
        let refs = dedup(mine.iter().map(|r| r.reference.as_str()));
        let transports = dedup(mine.iter().map(|r| r.transport.as_str()));
        // The words every mode shares go to the title; the bars are labelled by the rest.
        let first = mine[0].op.as_str();
        let mut common = mine.iter().fold(first.len(), |n, r| {
            first
                .bytes()
                .zip(r.op.bytes())
                .take(n)
                .take_while(|(a, b)| a == b)
                .count()
        });
        common = first[..common].rfind(' ').map_or(0, |i| i + 1);
        if mine.len() == 1 {
            common = 0;
        }
        let shared = first[..common].trim();
        let scale = if metric == "latency" { 1e-3 } else { 1.0 };
        panels.push(BarPanel {
            title: format!(
                "{metric}{}: each next to its reference",
                if shared.is_empty() {
                    String::new()
                } else {
                    format!(" of {shared}")
                }
            ),
            unit: unit.into(),
            ours: "rdmapool, as labelled below".into(),
            reference: format!("reference: {}", refs.join("; ")),
            rows: mine
                .iter()
                .map(|r| BarPair {
                    label: if transports.len() > 1 {
                        format!("{}, {}", r.transport, &r.op[common..])
                    } else {
                        r.op[common..].to_string()
                    },
                    ours: if metric == "latency" {
                        r.median_ns * scale
                    } else {
                        r.mops
                    },
                    reference: r.reference_value * scale,
                })
                .collect(),
        });
    }
    panels
}

/// Writes the sweep's rows as line charts.
pub fn sweep(path: &Path, provider: &str, rows: &[Row]) -> Result<()> {
    let panels = sweep_panels(rows, provider);
    let title = format!("rdma-tool bench data on {provider}: ours next to the references");
    let size = plot::grid_size(panels.len(), 2);
    plot::render(
        path,
        size,
        &Grid {
            title: &title,
            cols: 2,
            panels: &panels,
        },
    )
}

/// Writes the engine benchmarks' rows as bar pairs.
pub fn engine(path: &Path, provider: &str, rows: &[Row]) -> Result<()> {
    let panels = engine_panels(rows);
    let title = format!("rdma-tool bench data engine modes on {provider}");
    let size = plot::grid_size(panels.len(), 1);
    plot::render(
        path,
        size,
        &Grid {
            title: &title,
            cols: 1,
            panels: &panels,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(size: usize, reference: &str, reference_value: f64) -> Row {
        Row {
            provider: "verbs".into(),
            transport: "rxe0".into(),
            op: "write".into(),
            metric: "latency".into(),
            size,
            iters: 10,
            median_ns: 50_000.0,
            p99_ns: 90_000.0,
            gbps: 0.0,
            mops: 0.0,
            reference: reference.into(),
            reference_value,
            ratio: 0.0,
        }
    }

    #[test]
    fn rows_without_a_reference_add_no_reference_series() {
        // As on verbs: perftest compared only the 8 B size.
        let rows = [
            row(8, "perftest ib_write_lat x2", 76_500.0),
            row(4096, "-", 0.0),
        ];
        let panels = sweep_panels(&rows, "verbs");
        assert_eq!(panels.len(), 1);
        let names: Vec<&str> = panels[0].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["rdmapool verbs rxe0", "perftest ib_write_lat x2"]);
        assert_eq!(panels[0].series[0].points.len(), 2);
        assert_eq!(panels[0].series[1].points, [(8.0, 76.5)]);
    }
}
