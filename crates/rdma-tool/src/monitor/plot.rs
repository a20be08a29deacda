//! `monitor --plot`: every sample's values kept as time series and drawn when the monitor
//! ends (after `--count` samples or on SIGINT/SIGTERM): latency percentiles in µs, hit
//! rates in %, pool and error counters each as counts over the run; op latency one panel
//! per opcode.

use super::Metric;
use crate::plot::{self, Grid, Panel, Series};
use crate::Result;
use serde_json::Value;
use std::path::PathBuf;

/// The series recorded so far.
pub struct Recorder {
    path: PathBuf,
    metric: Metric,
    series: Vec<Series>,
}

fn seconds(v: f64) -> String {
    plot::num(v)
}

impl Recorder {
    /// A recorder writing to `path` (checked by the caller).
    pub fn new(path: PathBuf, metric: Metric) -> Self {
        Self {
            path,
            metric,
            series: Vec::new(),
        }
    }

    fn add(&mut self, name: String, t: f64, v: Option<f64>) {
        let Some(v) = v.filter(|v| v.is_finite()) else {
            return;
        };
        let s = match self.series.iter().position(|s| s.name == name) {
            Some(i) => &mut self.series[i],
            None => {
                self.series.push(Series {
                    name,
                    points: Vec::new(),
                    thin: false,
                });
                self.series.last_mut().expect("just pushed")
            }
        };
        s.points.push((t, v));
    }

    /// Keeps one sample's values (`value` as `--json` prints it), taken `t` seconds in.
    pub fn sample(&mut self, t: f64, value: &Value) {
        match self.metric {
            Metric::RegLatency | Metric::DeregLatency => {
                if let Some(Value::Object(m)) = value.get("percentiles_us") {
                    for (k, v) in m {
                        self.add(k.clone(), t, v.as_f64());
                    }
                }
            }
            Metric::OpLatency => {
                if let Some(Value::Object(ops)) = value.get("ops") {
                    for (op, l) in ops {
                        if let Some(Value::Object(m)) = l.get("percentiles_us") {
                            for (k, v) in m {
                                self.add(format!("{op} {k}"), t, v.as_f64());
                            }
                        }
                    }
                }
            }
            Metric::CacheHitRate => {
                for (k, name) in [
                    ("hit_rate", "hit rate since the start"),
                    ("interval_hit_rate", "hit rate over the last interval"),
                ] {
                    let v = value.get(k).and_then(Value::as_f64).map(|r| r * 100.0);
                    self.add(name.into(), t, v);
                }
            }
            Metric::PoolUsage | Metric::Errors => {
                if let Value::Object(m) = value {
                    for (k, v) in m {
                        let v = match v {
                            // Error completions by status: their sum.
                            Value::Object(by) => Some(by.values().filter_map(Value::as_f64).sum()),
                            v => v.as_f64(),
                        };
                        self.add(k.replace('_', " "), t, v);
                    }
                }
            }
        }
    }

    /// Draws what was recorded (nothing recorded is an error: there is nothing to draw).
    pub fn write(self, target: &str) -> Result<()> {
        let metric = super::metric_name(self.metric);
        let title = format!("rdma-tool monitor {metric} of {target}");
        let x_desc = "time since the monitor started (s)".to_string();
        let panel = |title: String, y_desc: &str, series: Vec<Series>| Panel {
            title,
            x_desc: x_desc.clone(),
            y_desc: y_desc.into(),
            log_x: false,
            log_y: false,
            x_fmt: seconds,
            series,
        };
        let panels: Vec<Panel> = match self.metric {
            Metric::RegLatency | Metric::DeregLatency => vec![panel(
                format!("{metric}: percentiles since the start"),
                "latency (µs)",
                self.series,
            )],
            // One panel per opcode ("rdma_write p50" and "rdma_write p99" together).
            Metric::OpLatency => {
                let mut by_op: Vec<(String, Vec<Series>)> = Vec::new();
                for s in self.series {
                    let op = s.name.split(' ').next().unwrap_or("").to_string();
                    match by_op.iter_mut().find(|(o, _)| *o == op) {
                        Some((_, v)) => v.push(s),
                        None => by_op.push((op, vec![s])),
                    }
                }
                by_op
                    .into_iter()
                    .map(|(op, series)| {
                        panel(format!("{op}: post to completion"), "latency (µs)", series)
                    })
                    .collect()
            }
            Metric::CacheHitRate => vec![panel(
                "registration cache hit rate".into(),
                "hits / lookups (%)",
                self.series,
            )],
            Metric::Errors => vec![panel("errors since the start".into(), "count", self.series)],
            // Counters of very different sizes: one panel each.
            Metric::PoolUsage => self
                .series
                .into_iter()
                .map(|s| panel(format!("pool {}", s.name), "count", vec![s]))
                .collect(),
        };
        if panels.iter().all(|p| p.series.is_empty()) {
            return Err(crate::ToolError::Msg(format!(
                "--plot {}: no sample carried a value to draw",
                self.path.display()
            )));
        }
        let cols = if panels.len() > 1 { 2 } else { 1 };
        plot::render(
            &self.path,
            plot::grid_size(panels.len(), cols),
            &Grid {
                title: &title,
                cols,
                panels: &panels,
            },
        )
    }
}
