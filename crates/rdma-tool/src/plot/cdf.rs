//! Latency CDFs: the fraction of operations at or below each latency, log-scale x.

use super::{color, msg, render, Figure, SIZE};
use crate::{Result, ToolError};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Pixels per legend line.
const LEGEND_LINE: i32 = 22;

fn legend_height(n: usize) -> u32 {
    16 + LEGEND_LINE as u32 * n as u32
}

struct Cdf<'a> {
    title: &'a str,
    series: Vec<&'a (&'a str, &'a hdrhistogram::Histogram<u64>)>,
}

impl Figure for Cdf<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let series = &self.series;
        let lo = series
            .iter()
            .map(|(_, h)| h.min())
            .min()
            .unwrap_or(1)
            .max(1) as f64
            / 1e3;
        let hi = series.iter().map(|(_, h)| h.max()).max().unwrap_or(1) as f64 / 1e3;
        let (lo, hi) = (lo * 0.9, (hi * 1.1).max(lo * 2.0));
        let (_, h) = root.dim_in_pixel();
        let legend_top = h as i32 - legend_height(series.len()) as i32;
        let (top, _) = root.split_vertically(legend_top);
        let mut chart = ChartBuilder::on(&top)
            .caption(self.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)
            .map_err(msg)?;
        chart
            .configure_mesh()
            .x_desc("latency (µs, log scale)")
            .y_desc("fraction of operations at or below")
            .draw()
            .map_err(msg)?;
        let mut labels = Vec::new();
        for (i, (name, h)) in series.iter().enumerate() {
            let color = color(i);
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
                .map_err(msg)?;
            labels.push((
                color,
                format!(
                    "{name} (p50 {:.1} µs, p99 {:.1} µs, n={})",
                    h.value_at_quantile(0.5) as f64 / 1e3,
                    h.value_at_quantile(0.99) as f64 / 1e3,
                    h.len()
                ),
            ));
        }
        // The legend under the chart, where it hides no line.
        let style = ("sans-serif", 15).into_font().color(&BLACK);
        for (i, (c, text)) in labels.into_iter().enumerate() {
            let y = legend_top + 12 + LEGEND_LINE * i as i32;
            root.draw(&PathElement::new(
                vec![(80, y), (110, y)],
                c.stroke_width(3),
            ))
            .map_err(msg)?;
            root.draw(&Text::new(text, (120, y - 8), style.clone()))
                .map_err(msg)?;
        }
        Ok(())
    }
}

/// Writes the CDF of each histogram (values in ns), x in microseconds on a log scale; empty
/// histograms are left out.
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
    let size = (SIZE.0, SIZE.1 + legend_height(series.len()));
    render(path, size, &Cdf { title, series })
}
