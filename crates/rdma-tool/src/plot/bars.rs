//! Ours-versus-reference bars, one pair per row.

use super::{color, msg, render, Figure, SIZE};
use crate::{Result, ToolError};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// One bar pair: a label, our value and the reference's, in the panel's unit.
pub struct BarPair {
    /// What the pair measures (the x-axis label).
    pub label: String,
    /// Our value.
    pub ours: f64,
    /// The reference's value.
    pub reference: f64,
}

/// A panel of bar pairs.
pub struct BarPanel {
    /// The panel's title.
    pub title: String,
    /// The y axis' description, with its unit.
    pub unit: String,
    /// The legend of the first bar of each pair.
    pub ours: String,
    /// The legend of the second bar.
    pub reference: String,
    /// The pairs.
    pub rows: Vec<BarPair>,
}

impl Figure for BarPanel {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let rows = &self.rows;
        let top = rows
            .iter()
            .map(|r| r.ours.max(r.reference))
            .filter(|v| v.is_finite())
            .fold(0f64, f64::max)
            * 1.25;
        let n = rows.len();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(70)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..n as f64, 0f64..top.max(f64::MIN_POSITIVE))
            .map_err(msg)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|_| String::new())
            .y_desc(&self.unit)
            .draw()
            .map_err(msg)?;
        for (k, name) in [&self.ours, &self.reference].into_iter().enumerate() {
            let c = color(k);
            let bars = rows.iter().enumerate().map(|(i, r)| {
                let v = if k == 0 { r.ours } else { r.reference };
                let v = if v.is_finite() { v } else { 0.0 };
                let x0 = i as f64 + 0.1 + 0.4 * k as f64;
                Rectangle::new([(x0, 0.0), (x0 + 0.38, v)], c.filled())
            });
            chart
                .draw_series(bars)
                .map_err(msg)?
                .label(name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        // Each pair's label centred under it, split into lines at ", " so long names fit.
        let base = root.get_base_pixel();
        let style = ("sans-serif", 13)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top));
        for (i, r) in rows.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
            for (k, line) in r.label.split(", ").enumerate() {
                let at = (x - base.0, y - base.1 + 8 + 15 * k as i32);
                root.draw(&Text::new(line.to_string(), at, style.clone()))
                    .map_err(msg)?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.9))
            .draw()
            .map_err(msg)
    }
}

/// Writes ours-versus-reference bars, one pair per row, values in `unit`.
pub fn bars(path: &Path, title: &str, unit: &str, reference: &str, rows: &[BarPair]) -> Result<()> {
    if rows.is_empty() {
        return Err(ToolError::Msg(format!(
            "--plot {}: no rows",
            path.display()
        )));
    }
    let panel = BarPanel {
        title: title.into(),
        unit: unit.into(),
        ours: "rdmapool".into(),
        reference: reference.into(),
        rows: rows
            .iter()
            .map(|r| BarPair {
                label: r.label.clone(),
                ours: r.ours,
                reference: r.reference,
            })
            .collect(),
    };
    render(path, SIZE, &panel)
}
