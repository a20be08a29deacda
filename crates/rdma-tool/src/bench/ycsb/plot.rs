//! `bench ycsb --plot`: the rows the table prints, drawn. One panel per workload (or the
//! trace): throughput against the client count, ours on each transport (thick) next to each
//! reference (thin), the rate on a log scale. Beside them, with `--hit-rate`, one panel per
//! hit-rate stream: the hit rate (0 to 1) against the cache size (percent of the working
//! set, log scale), ours on each transport next to Redis, memcached and the exact LRU.

use super::super::plot::{dedup, push};
use super::super::report::Row;
use super::hit::HitRow;
use crate::plot::{self, Grid, Panel, Series};
use crate::Result;
use std::path::Path;

/// An x label: a client count, where the tick falls on a whole one (none between).
fn clients_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-6 && v >= 0.0 {
        format!("{}", v.round())
    } else {
        String::new()
    }
}

/// The client count of a row's `op` (`ycsb-a x2` → 2).
fn clients_of(op: &str) -> Option<f64> {
    op.rsplit_once(" x")
        .and_then(|(_, n)| n.parse::<usize>().ok())
        .map(|n| n as f64)
}

/// The system a reference names (`redis-server x2` → `redis-server`).
fn system(reference: &str) -> &str {
    reference
        .rsplit_once(" x")
        .map_or(reference, |(name, _)| name)
}

/// The panels: one per workload.
fn panels(rows: &[Row], provider: &str) -> Vec<Panel> {
    let workloads = dedup(rows.iter().map(|r| r.op.split(' ').next().unwrap_or("")));
    let mut panels = Vec::new();
    for w in workloads {
        let mine = rows
            .iter()
            .filter(|r| r.op.split(' ').next() == Some(w))
            .filter_map(|r| clients_of(&r.op).map(|n| (r, n)));
        let mut series: Vec<Series> = Vec::new();
        for (r, n) in mine.clone() {
            let name = format!("rdmapool {provider} {}", r.transport);
            push(&mut series, name, false, (n, r.mops));
        }
        // References after ours, so ours keep the first colours.
        for (r, n) in mine.filter(|(r, _)| r.reference != "-" && r.reference_value > 0.0) {
            let name = system(&r.reference).to_string();
            push(&mut series, name, true, (n, r.reference_value));
        }
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        if series.is_empty() {
            continue;
        }
        panels.push(Panel {
            title: format!("{w}: throughput by client count"),
            x_desc: "clients".into(),
            y_desc: "operations per second (Mop/s, log scale)".into(),
            log_x: false,
            log_y: true,
            x_fmt: clients_label,
            series,
        });
    }
    panels
}

/// An x label of a hit-rate panel: a cache size in percent.
fn percent_label(v: f64) -> String {
    format!("{}%", plot::num(v))
}

/// The cache size of a hit-rate row's `op` (`hit-zipf 10% x1` → 10).
fn percent_of(op: &str) -> Option<f64> {
    op.split(' ')
        .nth(1)
        .and_then(|p| p.strip_suffix('%'))
        .and_then(|p| p.parse().ok())
}

/// The hit-rate panels: one per stream.
fn hit_panels(rows: &[HitRow], provider: &str) -> Vec<Panel> {
    let streams = dedup(
        rows.iter()
            .map(|r| r.row.op.split(' ').next().unwrap_or("")),
    );
    let mut panels = Vec::new();
    for stream in streams {
        let mine = rows
            .iter()
            .filter(|r| r.row.op.split(' ').next() == Some(stream))
            .filter_map(|r| percent_of(&r.row.op).map(|p| (r, p)));
        let mut series: Vec<Series> = Vec::new();
        for (r, p) in mine.clone() {
            let name = format!("rdmapool {provider} {}", r.row.transport);
            push(&mut series, name, false, (p, r.value));
        }
        for (r, p) in mine {
            let name = system(&r.row.reference).to_string();
            push(&mut series, name, true, (p, r.row.reference_value));
        }
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        panels.push(Panel {
            title: format!("{stream}: hit rate by cache size"),
            x_desc: "cache size (% of the working set, log scale)".into(),
            y_desc: "hit rate (hits / gets)".into(),
            log_x: true,
            log_y: false,
            x_fmt: percent_label,
            series,
        });
    }
    panels
}

/// Writes the rows as line charts: a panel per workload (throughput), then a panel per
/// hit-rate stream.
pub(super) fn draw(path: &Path, provider: &str, rows: &[Row], hits: &[HitRow]) -> Result<()> {
    let mut panels = panels(rows, provider);
    panels.extend(hit_panels(hits, provider));
    let title = if hits.is_empty() {
        format!("rdma-tool bench ycsb on {provider}: ours next to Redis and memcached")
    } else {
        format!("rdma-tool bench ycsb on {provider}: ours next to Redis, memcached and exact LRU")
    };
    let cols = if panels.len() > 1 { 2 } else { 1 };
    plot::render(
        path,
        plot::grid_size(panels.len(), cols),
        &Grid {
            title: &title,
            cols,
            panels: &panels,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(op: &str, transport: &str, mops: f64, reference: &str, value: f64) -> Row {
        Row {
            provider: "soft".into(),
            transport: transport.into(),
            op: op.into(),
            metric: "rate".into(),
            size: 1024,
            iters: 10,
            median_ns: 1000.0,
            p99_ns: 2000.0,
            gbps: 0.0,
            mops,
            reference: reference.into(),
            reference_value: value,
            ratio: if value > 0.0 { mops / value } else { 0.0 },
        }
    }

    #[test]
    fn a_panel_per_workload_ours_per_transport_and_each_reference_once() {
        let rows = [
            row("ycsb-a x1", "tcp", 0.02, "redis-server x1", 0.015),
            row("ycsb-a x1", "tcp", 0.02, "memcached x1", 0.016),
            row("ycsb-a x2", "tcp", 0.03, "redis-server x2", 0.03),
            row("ycsb-a x1", "local", 0.2, "redis-server x1", 0.015),
            row("ycsb-c x1", "local", 0.3, "-", 0.0),
        ];
        let p = panels(&rows, "soft");
        assert_eq!(p.len(), 2);
        let names: Vec<&str> = p[0].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "rdmapool soft tcp",
                "rdmapool soft local",
                "redis-server",
                "memcached"
            ]
        );
        assert_eq!(p[0].series[0].points, [(1.0, 0.02), (2.0, 0.03)]);
        assert_eq!(p[0].series[2].points, [(1.0, 0.015), (2.0, 0.03)]);
        assert_eq!(p[1].series.len(), 1, "no reference series without one");
    }

    #[test]
    fn a_hit_rate_panel_per_stream_by_cache_size() {
        let hit = |op: &str, transport: &str, ours: f64, reference: &str, theirs: f64| HitRow {
            row: Row {
                metric: "hit_rate".into(),
                ratio: ours / theirs,
                ..row(op, transport, 0.01, reference, theirs)
            },
            value: ours,
        };
        let rows = [
            hit("hit-zipf 1% x1", "local", 0.4, "redis-server x1", 0.3),
            hit("hit-zipf 1% x1", "local", 0.4, "exact-lru", 0.42),
            hit("hit-zipf 10% x1", "local", 0.7, "redis-server x1", 0.6),
            hit("hit-zipf 10% x1", "local", 0.7, "exact-lru", 0.71),
            hit("hit-scan 1% x1", "tcp", 0.3, "exact-lru", 0.33),
        ];
        let p = hit_panels(&rows, "soft");
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].title, "hit-zipf: hit rate by cache size");
        let names: Vec<&str> = p[0].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["rdmapool soft local", "redis-server", "exact-lru"]);
        assert_eq!(p[0].series[0].points, [(1.0, 0.4), (10.0, 0.7)]);
        assert_eq!(p[0].series[2].points, [(1.0, 0.42), (10.0, 0.71)]);
        assert_eq!(p[1].series[0].name, "rdmapool soft tcp");
        assert_eq!(percent_label(0.5), "0.5%");
        assert_eq!(percent_of("hit-scan 12.5% x1"), Some(12.5));
    }
}
