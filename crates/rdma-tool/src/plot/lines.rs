//! Line charts: one panel of named series over a shared x axis, either axis on a log scale
//! (drawn as log10 of the values with labels of the values themselves), points marked.

use super::{color, emptiest_corner, msg, Figure};
use plotters::coord::Shift;
use plotters::prelude::*;

/// One named line.
pub struct Series {
    /// The legend entry.
    pub name: String,
    /// (x, y) points in the axes' units, in x order.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed-looking (thin), for references next to ours.
    pub thin: bool,
}

/// One chart: title, axes, series.
pub struct Panel {
    /// The panel's title.
    pub title: String,
    /// The x axis' description, with its unit.
    pub x_desc: String,
    /// The y axis' description, with its unit.
    pub y_desc: String,
    /// Log-scale x.
    pub log_x: bool,
    /// Log-scale y.
    pub log_y: bool,
    /// How an x value is labelled (for example as a size, 4K).
    pub x_fmt: fn(f64) -> String,
    /// The lines.
    pub series: Vec<Series>,
}

fn axis(log: bool, v: f64) -> f64 {
    if log {
        v.max(f64::MIN_POSITIVE).log10()
    } else {
        v
    }
}

fn range(log: bool, vals: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (lo, hi) = vals
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .map(|v| axis(log, v))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let lo = if from_zero && !log { lo.min(0.0) } else { lo };
    let pad = if hi > lo {
        (hi - lo) * 0.08
    } else if log {
        0.5
    } else {
        hi.abs().max(1.0) * 0.5
    };
    let lo = if from_zero && !log && lo >= 0.0 {
        0.0
    } else {
        lo - pad
    };
    (lo, hi + pad)
}

/// A number with three significant digits, without trailing zeros (`0.0447`, `5.5`, `31.6`,
/// `316`); below 0.001 and from 1e6 on, in exponent form.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || !a.is_finite() {
        return if a == 0.0 { "0".into() } else { format!("{v}") };
    }
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:.2e}");
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

impl Panel {
    /// The corner where the legend hides the fewest points and lines.
    fn legend_corner(&self, x: (f64, f64), y: (f64, f64)) -> SeriesLabelPosition {
        let norm = |(px, py): (f64, f64)| {
            (
                (axis(self.log_x, px) - x.0) / (x.1 - x.0),
                (axis(self.log_y, py) - y.0) / (y.1 - y.0),
            )
        };
        let lines: Vec<Vec<(f64, f64)>> = self
            .series
            .iter()
            .map(|s| s.points.iter().map(|&q| norm(q)).collect())
            .collect();
        emptiest_corner(&lines, 0.45)
    }
}

impl Figure for Panel {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let pts = || self.series.iter().flat_map(|s| s.points.iter());
        let (x0, x1) = range(self.log_x, pts().map(|p| p.0), false);
        let (y0, y1) = range(self.log_y, pts().map(|p| p.1), true);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(msg)?;
        let (lx, ly, xf) = (self.log_x, self.log_y, self.x_fmt);
        let x_label = move |v: &f64| xf(if lx { 10f64.powf(*v) } else { *v });
        let y_label = move |v: &f64| num(if ly { 10f64.powf(*v) } else { *v });
        // On a log axis, about one label per decade (so they fall on powers of ten).
        let ticks = |log: bool, lo: f64, hi: f64| {
            if log {
                ((hi - lo).ceil() as usize + 1).clamp(2, 12)
            } else {
                8
            }
        };
        chart
            .configure_mesh()
            .x_labels(ticks(lx, x0, x1))
            .y_labels(ticks(ly, y0, y1))
            .x_desc(&self.x_desc)
            .y_desc(&self.y_desc)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .draw()
            .map_err(msg)?;
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            let width = if s.thin { 1 } else { 3 };
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .filter(|(x, y)| (!lx || *x > 0.0) && (!ly || *y > 0.0))
                .map(|&(x, y)| (axis(lx, x), axis(ly, y)))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(width)))
                .map_err(msg)?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width))
                });
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
                .map_err(msg)?;
        }
        chart
            .configure_series_labels()
            .position(self.legend_corner((x0, x1), (y0, y1)))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(msg)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_keep_three_significant_digits() {
        for (v, want) in [
            (0.0447, "0.0447"),
            (0.04, "0.04"),
            (5.5, "5.5"),
            (31.62, "31.6"),
            (316.2, "316"),
            (2308.0, "2308"),
            (0.0, "0"),
            (-1.25, "-1.25"),
            (0.00012, "1.20e-4"),
        ] {
            assert_eq!(super::num(v), want, "{v}");
        }
    }
}
