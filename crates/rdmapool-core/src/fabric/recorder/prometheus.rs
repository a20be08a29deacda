//! [`Snapshot`] as Prometheus text exposition (format 0.0.4). Every name is documented in
//! `docs/METRICS.md`.

use super::{opcode_label, LatencySummary, ObjectCompletions, Snapshot, BUCKETS_SECONDS};
use crate::fabric::WcStatus;
use std::fmt::Write;

/// The `status` label of a completion status: its `ibv_wc_status` name without the
/// `IBV_WC_` prefix, in lower case (`success`, `wr_flush_err`, `rem_access_err`, ...).
pub fn status_label(s: WcStatus) -> String {
    let mut out = String::new();
    for (i, ch) in format!("{s:?}").chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_lowercase());
    }
    out
}

/// A label value as Prometheus text wants it: backslash, double quote and newline escaped.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One counter family of live objects: a series per object and status seen.
fn per_object(o: &mut String, name: &str, help: &str, key: &str, objs: &[ObjectCompletions]) {
    head(o, name, "counter", help);
    for obj in objs {
        for &(s, n) in &obj.completions {
            let _ = writeln!(
                o,
                "rdmapool_{name}{{device=\"{}\",{key}=\"{}\",status=\"{}\"}} {n}",
                label_value(&obj.device),
                obj.id,
                status_label(s)
            );
        }
    }
}

fn head(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        o,
        "# HELP rdmapool_{name} {help}\n# TYPE rdmapool_{name} {kind}"
    );
}

fn one(o: &mut String, name: &str, kind: &str, help: &str, v: u64) {
    head(o, name, kind, help);
    let _ = writeln!(o, "rdmapool_{name} {v}");
}

fn histogram(o: &mut String, name: &str, help: &str, l: &LatencySummary) {
    head(o, name, "histogram", help);
    series(o, name, "", l);
}

/// The lines of one histogram series; `labels` is empty or `key="value",`.
fn series(o: &mut String, name: &str, labels: &str, l: &LatencySummary) {
    for (le, n) in BUCKETS_SECONDS.iter().zip(l.buckets.iter()) {
        let _ = writeln!(o, "rdmapool_{name}_bucket{{{labels}le=\"{le}\"}} {n}");
    }
    let _ = writeln!(
        o,
        "rdmapool_{name}_bucket{{{labels}le=\"+Inf\"}} {}",
        l.count
    );
    let braces = |l: &str| {
        if l.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", l.trim_end_matches(','))
        }
    };
    let _ = writeln!(o, "rdmapool_{name}_sum{} {}", braces(labels), l.sum_seconds);
    let _ = writeln!(o, "rdmapool_{name}_count{} {}", braces(labels), l.count);
}

impl Snapshot {
    /// The sections the layers above core report (memory servers, store clients): each
    /// metric once, with one line per section that has it, labelled by the section's label
    /// (no series when there are none).
    fn section_series(&self, o: &mut String) {
        let mut metrics: Vec<(&str, &str, &str)> = Vec::new();
        for sec in &self.sections {
            for s in &sec.series {
                if !metrics.iter().any(|&(m, _, _)| m == s.metric) {
                    let kind = match s.kind {
                        super::SeriesKind::Counter => "counter",
                        super::SeriesKind::Gauge => "gauge",
                    };
                    metrics.push((s.metric, kind, s.help));
                }
            }
        }
        for (metric, kind, help) in metrics {
            head(o, metric, kind, help);
            for sec in &self.sections {
                for s in sec.series.iter().filter(|s| s.metric == metric) {
                    let (label, value) = sec.label;
                    let _ = writeln!(o, "rdmapool_{metric}{{{label}=\"{value}\"}} {}", s.value);
                }
            }
        }
    }

    /// The snapshot in the Prometheus text exposition format.
    pub fn to_prometheus(&self) -> String {
        let mut o = String::new();
        histogram(
            &mut o,
            "registration_duration_seconds",
            "Time one memory registration call took.",
            &self.registration_latency,
        );
        histogram(
            &mut o,
            "deregistration_duration_seconds",
            "Time one deregistration took.",
            &self.deregistration_latency,
        );
        let counters: [(&str, &str, u64); 15] = [
            (
                "connection_errors_total",
                "Connection attempts (connect or accept) that failed.",
                self.connection_errors,
            ),
            (
                "registrations_total",
                "Successful memory registrations.",
                self.registrations,
            ),
            (
                "registration_errors_total",
                "Memory registrations that failed.",
                self.registration_errors,
            ),
            (
                "deregistrations_total",
                "Regions deregistered.",
                self.deregistrations,
            ),
            (
                "registration_retries_total",
                "Registrar retries after ENOMEM/EAGAIN.",
                self.retries,
            ),
            (
                "registration_timeouts_total",
                "Registrar requests past their timeout.",
                self.timeouts,
            ),
            (
                "registration_cancellations_total",
                "Registrar requests cancelled.",
                self.cancellations,
            ),
            (
                "cache_hits_total",
                "Registration cache hits.",
                self.cache_hits,
            ),
            (
                "cache_misses_total",
                "Registration cache misses.",
                self.cache_misses,
            ),
            (
                "cache_evictions_total",
                "Registration cache evictions.",
                self.cache_evictions,
            ),
            (
                "cache_invalidations_total",
                "Cache entries dropped because the memory changed.",
                self.cache_invalidations,
            ),
            (
                "pool_allocations_total",
                "Pool buffers handed out.",
                self.pool_allocations,
            ),
            (
                "pool_empty_total",
                "Pool allocations that found no free slot.",
                self.pool_empty,
            ),
            (
                "pool_chunks_total",
                "Pool chunks registered.",
                self.pool_chunks,
            ),
            (
                "sends_posted_total",
                "Send work requests posted (RDMA READ, WRITE, atomics, SEND).",
                self.sends_posted,
            ),
        ];
        for (name, help, v) in counters {
            one(&mut o, name, "counter", help, v);
        }
        if !self.op_latency.is_empty() {
            head(
                &mut o,
                "op_duration_seconds",
                "histogram",
                "Sampled time from posting a work request to polling its successful completion, by opcode.",
            );
            for (op, l) in &self.op_latency {
                let labels = format!("opcode=\"{}\",", opcode_label(*op));
                series(&mut o, "op_duration_seconds", &labels, l);
            }
        }
        let gauges: [(&str, &str, u64); 4] = [
            (
                "op_sample_every",
                "One signalled work request in this many is timed (0: off).",
                u64::from(self.op_sample_every),
            ),
            (
                "registered_bytes",
                "Bytes in live registered regions.",
                self.registered_bytes,
            ),
            (
                "pinned_bytes",
                "Bytes pinned by soft-provider registrations.",
                self.pinned_bytes,
            ),
            (
                "pool_buffers_in_use",
                "Pool buffers handed out and not returned.",
                self.pool_in_use,
            ),
        ];
        for (name, help, v) in gauges {
            one(&mut o, name, "gauge", help, v);
        }
        head(
            &mut o,
            "connections_total",
            "counter",
            "Connections established, by side (active: connect; passive: accept).",
        );
        let _ = writeln!(
            o,
            "rdmapool_connections_total{{side=\"active\"}} {}\nrdmapool_connections_total{{side=\"passive\"}} {}",
            self.connections_active, self.connections_passive
        );
        head(
            &mut o,
            "completions_total",
            "counter",
            "Work completions polled, by status.",
        );
        let success = self
            .completions
            .iter()
            .find(|(s, _)| *s == WcStatus::Success)
            .map_or(0, |&(_, n)| n);
        // Success is always present so the series exists before the first completion.
        let _ = writeln!(
            o,
            "rdmapool_completions_total{{status=\"success\"}} {success}"
        );
        for &(s, n) in self
            .completions
            .iter()
            .filter(|(s, _)| *s != WcStatus::Success)
        {
            let _ = writeln!(
                o,
                "rdmapool_completions_total{{status=\"{}\"}} {n}",
                status_label(s)
            );
        }
        self.section_series(&mut o);
        if self.objects_tracked {
            per_object(
                &mut o,
                "cq_completions_total",
                "Work completions polled from each live CQ, by status.",
                "cq",
                &self.cqs,
            );
            per_object(
                &mut o,
                "qp_completions_total",
                "Work completions of each live QP, by status.",
                "qp",
                &self.qps,
            );
            one(
                &mut o,
                "cqs_live",
                "gauge",
                "CQs alive in the process (at most 1024 are listed by CQ).",
                self.cqs_live as u64,
            );
            one(
                &mut o,
                "qps_live",
                "gauge",
                "QPs alive in the process (at most 1024 are listed by QP).",
                self.qps_live as u64,
            );
        }
        o
    }
}
