//! Plots that read well without the terminal output, with plotters: latency CDFs,
//! ours-versus-reference bars, and line charts (sweeps over message size, time series).
//! Axes carry units, every plot a title and a legend. The format follows the file's
//! extension: `.svg` (text as SVG text) or `.png` (text drawn with an embedded DejaVu Sans
//! subset, so no system font library is needed).

mod bars;
mod cdf;
mod lines;

pub use bars::BarPanel;
pub use bars::{bars, BarPair};
pub use cdf::latency_cdf;
pub use lines::{num, Panel, Series};

use crate::{Result, ToolError};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// One panel's size in pixels.
pub const SIZE: (u32, u32) = (900, 540);
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// The `n`th series colour.
fn color(n: usize) -> RGBColor {
    COLORS[n % COLORS.len()]
}

/// DejaVu Sans (Basic Latin, Latin-1, µ and a few symbols); its license is beside it.
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");

/// The file formats written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics.
    Svg,
    /// A PNG bitmap.
    Png,
}

/// The format `path` names by its extension, or an error naming the two that work.
pub fn check_path(path: &Path) -> Result<Format> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") => Ok(Format::Svg),
        Some(e) if e.eq_ignore_ascii_case("png") => Ok(Format::Png),
        _ => Err(ToolError::Msg(format!(
            "--plot {}: the format follows the extension; name the file *.svg or *.png",
            path.display()
        ))),
    }
}

/// Text as plotters reports its errors.
fn msg(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Something drawn on a drawing area of any backend.
pub trait Figure {
    /// Draws onto `area`.
    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String>;
}

/// Writes `fig` to `path` (`.svg` or `.png`) at `size` pixels.
pub fn render(path: &Path, size: (u32, u32), fig: &impl Figure) -> Result<()> {
    let fail = |e: String| ToolError::Msg(format!("plotting to {}: {e}", path.display()));
    // Every family name resolves to the embedded font (SVG too: it sizes the legend box).
    for family in ["sans-serif", "serif", "monospace"] {
        plotters::style::register_font(family, FontStyle::Normal, FONT)
            .map_err(|_| fail("the embedded font does not parse".into()))?;
    }
    match check_path(path)? {
        Format::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            root.fill(&WHITE).map_err(msg).map_err(fail)?;
            fig.draw(&root).map_err(fail)?;
            root.present().map_err(msg).map_err(fail)
        }
        Format::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            root.fill(&WHITE).map_err(msg).map_err(fail)?;
            fig.draw(&root).map_err(fail)?;
            root.present().map_err(msg).map_err(fail)
        }
    }
}

/// Panels side by side, `cols` to a row, under one title.
pub struct Grid<'a, F> {
    /// The whole figure's title.
    pub title: &'a str,
    /// Panels per row.
    pub cols: usize,
    /// The panels, row by row.
    pub panels: &'a [F],
}

impl<F: Figure> Figure for Grid<'_, F> {
    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let area = area.titled(self.title, ("sans-serif", 24)).map_err(msg)?;
        let cols = self.cols.max(1);
        let rows = self.panels.len().div_ceil(cols).max(1);
        for (p, a) in self.panels.iter().zip(area.split_evenly((rows, cols))) {
            p.draw(&a)?;
        }
        Ok(())
    }
}

/// The pixel size of a grid of `n` panels, `cols` to a row.
pub fn grid_size(n: usize, cols: usize) -> (u32, u32) {
    let cols = cols.max(1).min(n.max(1));
    let rows = n.div_ceil(cols).max(1);
    (SIZE.0 * cols as u32, SIZE.1 * rows as u32 + 40)
}

/// The corner of a chart whose legend-sized box (`width` of the chart, a line per series)
/// covers the fewest of the lines' points (and points sampled between them). `lines` are
/// in chart coordinates normalised to 0..1, y up.
fn emptiest_corner(lines: &[Vec<(f64, f64)>], width: f64) -> SeriesLabelPosition {
    let h = (0.05 + 0.045 * lines.len() as f64).min(0.9);
    let mut samples = Vec::new();
    for p in lines {
        samples.extend(p.iter().copied());
        for pair in p.windows(2) {
            for k in 1..10 {
                let t = k as f64 / 10.0;
                samples.push((
                    pair[0].0 + (pair[1].0 - pair[0].0) * t,
                    pair[0].1 + (pair[1].1 - pair[0].1) * t,
                ));
            }
        }
    }
    let inside = |left: bool, top: bool| {
        samples
            .iter()
            .filter(|(x, y)| {
                let in_x = if left { *x <= width } else { *x >= 1.0 - width };
                let in_y = if top { *y >= 1.0 - h } else { *y <= h };
                in_x && in_y
            })
            .count()
    };
    [
        (SeriesLabelPosition::LowerRight, inside(false, false)),
        (SeriesLabelPosition::UpperLeft, inside(true, true)),
        (SeriesLabelPosition::UpperRight, inside(false, true)),
        (SeriesLabelPosition::LowerLeft, inside(true, false)),
    ]
    .into_iter()
    .min_by_key(|(_, n)| *n)
    .map_or(SeriesLabelPosition::UpperLeft, |(p, _)| p)
}
