//! Plots that read well without the terminal output (SVG, with plotters): latency CDFs,
//! ours-versus-reference bars, and time series. Axes carry units, every plot a title and a
//! legend.

use crate::{Result, ToolError};
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (900, 540);
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn err(path: &Path, e: impl std::fmt::Display) -> ToolError {
    ToolError::Msg(format!("plotting to {}: {e}", path.display()))
}

/// Checks that `path` names an SVG file (the only format written).
pub fn check_path(path: &Path) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") => Ok(()),
        _ => Err(ToolError::Msg(format!(
            "--plot {}: only SVG is written; name the file *.svg",
            path.display()
        ))),
    }
}

/// The CDF of each histogram (values in ns), x in microseconds on a log scale.
pub fn latency_cdf(
    path: &Path,
    title: &str,
    series: &[(&str, &hdrhistogram::Histogram<u64>)],
) -> Result<()> {
    let series: Vec<_> = series.iter().filter(|(_, h)| !h.is_empty()).collect();
    if series.is_empty() {
        return Err(ToolError::Msg(format!(
            "--plot {}: nothing was measured",
            path.display()
        )));
    }
    let lo = series
        .iter()
        .map(|(_, h)| h.min())
        .min()
        .unwrap_or(1)
        .max(1) as f64
        / 1e3;
    let hi = series.iter().map(|(_, h)| h.max()).max().unwrap_or(1) as f64 / 1e3;
    let (lo, hi) = (lo * 0.9, (hi * 1.1).max(lo * 2.0));
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .y_desc("fraction of operations at or below")
        .draw()
        .map_err(|e| err(path, e))?;
    for (i, (name, h)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let total = h.len() as f64;
        let points: Vec<(f64, f64)> = h
            .iter_recorded()
            .map(|v| {
                let x = v.value_iterated_to() as f64 / 1e3;
                (x.max(lo), v.count_since_last_iteration() as f64)
            })
            .scan(0f64, |acc, (x, c)| {
                *acc += c;
                Some((x, *acc / total))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| err(path, e))?
            .label(format!(
                "{name} (p50 {:.1} µs, p99 {:.1} µs, n={})",
                h.value_at_quantile(0.5) as f64 / 1e3,
                h.value_at_quantile(0.99) as f64 / 1e3,
                h.len()
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}

/// One bar pair: a label, our value and the reference's, in `unit`.
pub struct BarPair {
    pub label: String,
    pub ours: f64,
    pub reference: f64,
}

/// Ours-versus-reference bars, one pair per row.
pub fn bars(path: &Path, title: &str, unit: &str, reference: &str, rows: &[BarPair]) -> Result<()> {
    if rows.is_empty() {
        return Err(ToolError::Msg(format!(
            "--plot {}: no rows",
            path.display()
        )));
    }
    let top = rows
        .iter()
        .map(|r| r.ours.max(r.reference))
        .fold(0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let n = rows.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..top.max(f64::MIN_POSITIVE))
        .map_err(|e| err(path, e))?;
    let labels: Vec<String> = rows.iter().map(|r| r.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            labels.get(i).cloned().unwrap_or_default()
        })
        .y_desc(unit)
        .draw()
        .map_err(|e| err(path, e))?;
    for (k, (name, color)) in [("rdmapool", COLORS[0]), (reference, COLORS[1])]
        .into_iter()
        .enumerate()
    {
        let bars = rows.iter().enumerate().map(|(i, r)| {
            let v = if k == 0 { r.ours } else { r.reference };
            let x0 = i as f64 + 0.1 + 0.4 * k as f64;
            Rectangle::new([(x0, 0.0), (x0 + 0.38, v)], color.filled())
        });
        chart
            .draw_series(bars)
            .map_err(|e| err(path, e))?
            .label(name.to_string())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()
        .map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}
