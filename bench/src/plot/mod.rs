//! SVG line charts, drawn with `plotters`' SVG backend (no fonts: the viewer draws the text).
//! This file is the generic API every lock-bench plot is made with; `figures` turns a
//! `results.json` into the report's plots with it, `w5_figures` a `w5.json` into W5's growth
//! curves, and `redraw` is `lock-bench plot`, which tells the two files apart.
//!
//! # The API (for any workload's curves, as `figures` and `w5_figures` use it)
//!
//! Build a [`LineChart`] — a title, an [`Axis`] for x and for y, and the [`Series`] — and
//! call [`LineChart::svg`] for the SVG text or [`LineChart::write`] to write it to a file:
//!
//! ```ignore
//! use crate::plot::{Axis, LineChart, Series};
//!
//! let chart = LineChart {
//!     title: "W1 against locks held".into(),
//!     x: Axis::linear("locks held").zero_based().covering(0.0, 1e6),
//!     y: Axis::linear("pairs/s").zero_based(),
//!     series: vec![Series::new("lockd, Pipeline stream", vec![(1e3, 7000.0), (1e6, 6500.0)])],
//!     markers: true,
//! };
//! chart.write(&out.join("w1-against-held.svg"))?;
//! ```
//!
//! Each series is drawn as a line through its points in the order given (sort them by x
//! first), in a colour of its own (the n-th series always in the n-th colour of
//! [`COLOURS`]), and named in the legend, which goes in the corner the lines cross least.
//! Each axis spans the values (from 0 if [`Axis::zero_based`], and over a span of its own
//! too if [`Axis::covering`], so the plots of one run can share an x range). Tick labels are
//! compact numbers (`200k`, `1M`, `0.5`). Bad input is refused with an error naming the series and the point: more than
//! [`SERIES_MAX`] series or [`POINTS_MAX`] points in one, a title or label longer than
//! [`TEXT_MAX`] characters, a value that is not finite, a value ≤ 0 on a log axis, or no
//! point at all.

pub mod figures;
pub mod redraw;
pub mod w5_figures;

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// Width of every chart, in pixels.
pub const WIDTH: u32 = 800;
/// Height of every chart, in pixels.
pub const HEIGHT: u32 = 500;
/// Most series one chart takes (the legend must stay readable).
pub const SERIES_MAX: usize = 12;
/// Most points one series takes.
pub const POINTS_MAX: usize = 100_000;
/// Longest title, axis label or series name, in characters.
pub const TEXT_MAX: usize = 200;

/// The legend's share of the plot area's width and height, for choosing its corner.
const LEGEND_SHARE: (f64, f64) = (0.45, 0.3);
/// Samples along each segment of a line when choosing the legend's corner.
const LEGEND_SAMPLES: usize = 16;

/// The series colours, in order: blue, green, red, orange, purple, brown, pink, grey, olive,
/// cyan, navy, maroon (RGB).
pub const COLOURS: [(u8, u8, u8); SERIES_MAX] = [
    (31, 119, 180),
    (44, 160, 44),
    (214, 39, 40),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (0, 0, 128),
    (128, 0, 0),
];

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Evenly spaced values.
    Linear,
    /// Evenly spaced powers of ten; every value must be above 0.
    Log,
}

/// One axis: its label, scale and range rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// The label under (x) or beside (y) the axis, with the unit.
    pub label: String,
    /// Linear or log.
    pub scale: Scale,
    /// On a linear axis, start at 0 even when every value is above it (throughput, counts).
    pub from_zero: bool,
    /// Values the drawn range covers as well as the series' (`lo`, `hi`), so that the plots
    /// of one run share a range even where a series lacks its ends.
    pub covers: Option<(f64, f64)>,
}

impl Axis {
    /// A linear axis that spans the values.
    pub fn linear(label: &str) -> Self {
        Self {
            label: label.to_owned(),
            scale: Scale::Linear,
            from_zero: false,
            covers: None,
        }
    }

    /// A log axis that spans the values.
    pub fn log(label: &str) -> Self {
        Self {
            scale: Scale::Log,
            ..Self::linear(label)
        }
    }

    /// The same axis starting at 0 (linear axes only; ignored on a log axis).
    pub fn zero_based(self) -> Self {
        Self {
            from_zero: true,
            ..self
        }
    }

    /// The same axis with its drawn range covering `lo..=hi` too (values that are not finite,
    /// or not above 0 on a log axis, are ignored).
    pub fn covering(self, lo: f64, hi: f64) -> Self {
        Self {
            covers: Some((lo.min(hi), lo.max(hi))),
            ..self
        }
    }

    /// The drawn range of values `lo..=hi` (the series' extremes, lo ≤ hi), widened to
    /// [`Axis::covers`].
    fn range(&self, lo: f64, hi: f64) -> (f64, f64) {
        let (lo, hi) = match self.covers {
            Some((c_lo, c_hi))
                if c_lo.is_finite()
                    && c_hi.is_finite()
                    && (self.scale == Scale::Linear || c_lo > 0.0) =>
            {
                (lo.min(c_lo), hi.max(c_hi))
            }
            _ => (lo, hi),
        };
        match self.scale {
            Scale::Linear => {
                let lo = if self.from_zero { lo.min(0.0) } else { lo };
                let span = hi - lo;
                if span <= 0.0 {
                    let pad = if hi == 0.0 { 1.0 } else { hi.abs() * 0.1 };
                    (lo - pad, hi + pad)
                } else {
                    let lo = if self.from_zero && lo == 0.0 {
                        0.0
                    } else {
                        lo - span * 0.05
                    };
                    (lo, hi + span * 0.05)
                }
            }
            Scale::Log => {
                // Whole decades, so the axis begins and ends at a labelled power of ten; the
                // start a hair below its power, which plotters' ticks would otherwise skip as
                // soon as the logarithm's rounding puts it above.
                let lo = 10f64.powf(lo.log10().floor());
                let hi = 10f64.powf(hi.log10().ceil());
                (lo * (1.0 - 1e-9), if hi > lo { hi } else { lo * 10.0 })
            }
        }
    }
}

/// One named line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The name in the legend.
    pub name: String,
    /// (x, y) points, drawn in this order.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series named `name` through `points`.
    pub fn new(name: &str, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.to_owned(),
            points,
        }
    }
}

/// A corner of the plot area (where the legend goes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Corner {
    UpperLeft,
    UpperRight,
    LowerRight,
    LowerLeft,
}

/// A line chart: see the module's documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// The caption above the chart.
    pub title: String,
    /// The horizontal axis.
    pub x: Axis,
    /// The vertical axis.
    pub y: Axis,
    /// The lines, each in its own colour.
    pub series: Vec<Series>,
    /// Mark every point with a dot (for few points, e.g. a sweep).
    pub markers: bool,
}

impl LineChart {
    /// The chart as a complete SVG document.
    pub fn svg(&self) -> Result<String> {
        let ((x_lo, x_hi), (y_lo, y_hi)) = self.extent()?;
        let (x_lo, x_hi) = self.x.range(x_lo, x_hi);
        let (y_lo, y_hi) = self.y.range(y_lo, y_hi);
        let mut text = String::new();
        {
            let root = SVGBackend::with_string(&mut text, (WIDTH, HEIGHT)).into_drawing_area();
            let corner = self.legend_corner((x_lo, x_hi), (y_lo, y_hi));
            let drawn = match (self.x.scale, self.y.scale) {
                (Scale::Linear, Scale::Linear) => self.draw(&root, corner, x_lo..x_hi, y_lo..y_hi),
                (Scale::Log, Scale::Linear) => {
                    self.draw(&root, corner, (x_lo..x_hi).log_scale(), y_lo..y_hi)
                }
                (Scale::Linear, Scale::Log) => {
                    self.draw(&root, corner, x_lo..x_hi, (y_lo..y_hi).log_scale())
                }
                (Scale::Log, Scale::Log) => self.draw(
                    &root,
                    corner,
                    (x_lo..x_hi).log_scale(),
                    (y_lo..y_hi).log_scale(),
                ),
            };
            drawn.with_context(|| format!("drawing the chart {:?}", self.title))?;
        }
        Ok(text)
    }

    /// Writes [`LineChart::svg`] to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let svg = self.svg()?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))
    }

    /// Checks the input; answers the extremes of x and y over every point.
    fn extent(&self) -> Result<((f64, f64), (f64, f64))> {
        let title = &self.title;
        for (what, text) in [
            ("title", title),
            ("x label", &self.x.label),
            ("y label", &self.y.label),
        ] {
            if text.chars().count() > TEXT_MAX {
                bail!("chart {title:?}: its {what} is longer than {TEXT_MAX} characters");
            }
        }
        if self.series.is_empty() {
            bail!("chart {title:?}: no series to draw");
        }
        if self.series.len() > SERIES_MAX {
            bail!(
                "chart {title:?}: {} series, at most {SERIES_MAX}",
                self.series.len()
            );
        }
        let (mut x, mut y) = (
            (f64::INFINITY, f64::NEG_INFINITY),
            (f64::INFINITY, f64::NEG_INFINITY),
        );
        for series in &self.series {
            let name = &series.name;
            if name.chars().count() > TEXT_MAX {
                bail!("chart {title:?}: a series name is longer than {TEXT_MAX} characters");
            }
            if series.points.len() > POINTS_MAX {
                bail!(
                    "chart {title:?}, series {name:?}: {} points, at most {POINTS_MAX}",
                    series.points.len()
                );
            }
            for (i, &(px, py)) in series.points.iter().enumerate() {
                for (axis, value, scale) in [("x", px, self.x.scale), ("y", py, self.y.scale)] {
                    if !value.is_finite() {
                        bail!("chart {title:?}, series {name:?}, point {i}: {axis} is {value}");
                    }
                    if scale == Scale::Log && value <= 0.0 {
                        bail!(
                            "chart {title:?}, series {name:?}, point {i}: {axis} = {value} on a \
                             log axis (must be above 0)"
                        );
                    }
                }
                x = (x.0.min(px), x.1.max(px));
                y = (y.0.min(py), y.1.max(py));
            }
        }
        if !x.0.is_finite() {
            bail!("chart {title:?}: every series is empty");
        }
        Ok((x, y))
    }

    /// The corner of the plot area the lines cross least, for the legend: each line is
    /// sampled along its segments in the drawn ranges (`x` and `y`, on their scales), and the
    /// corner box of [`LEGEND_SHARE`] of the width and height with the fewest samples wins
    /// (upper left on a tie).
    fn legend_corner(&self, x: (f64, f64), y: (f64, f64)) -> Corner {
        let unit = |axis: &Axis, (lo, hi): (f64, f64), v: f64| match axis.scale {
            Scale::Linear => (v - lo) / (hi - lo),
            Scale::Log => (v.ln() - lo.ln()) / (hi.ln() - lo.ln()),
        };
        let (w, h) = LEGEND_SHARE;
        let corners = [
            (Corner::UpperLeft, (0.0, w), (1.0 - h, 1.0)),
            (Corner::UpperRight, (1.0 - w, 1.0), (1.0 - h, 1.0)),
            (Corner::LowerRight, (1.0 - w, 1.0), (0.0, h)),
            (Corner::LowerLeft, (0.0, w), (0.0, h)),
        ];
        let mut crossings = [0usize; 4];
        for series in &self.series {
            let points: Vec<(f64, f64)> = series
                .points
                .iter()
                .map(|&(px, py)| (unit(&self.x, x, px), unit(&self.y, y, py)))
                .collect();
            let segments = points.windows(2).map(|w| (w[0], w[1]));
            let lone = points
                .first()
                .filter(|_| points.len() == 1)
                .map(|&p| (p, p));
            for ((x0, y0), (x1, y1)) in segments.chain(lone) {
                for step in 0..=LEGEND_SAMPLES {
                    let t = step as f64 / LEGEND_SAMPLES as f64;
                    let (sx, sy) = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t);
                    for (count, (_, (xa, xb), (ya, yb))) in crossings.iter_mut().zip(&corners) {
                        if (*xa..=*xb).contains(&sx) && (*ya..=*yb).contains(&sy) {
                            *count += 1;
                        }
                    }
                }
            }
        }
        let best = (0..corners.len())
            .min_by_key(|&i| crossings[i])
            .unwrap_or(0);
        corners[best].0
    }

    /// Draws the chart on `root` with the coordinates `x` and `y`, the legend at `corner`.
    fn draw<X, Y>(
        &self,
        root: &DrawingArea<SVGBackend<'_>, Shift>,
        corner: Corner,
        x: X,
        y: Y,
    ) -> Result<()>
    where
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let failed = |e: &dyn std::fmt::Display| anyhow!("plotters: {e}");
        root.fill(&WHITE).map_err(|e| failed(&e))?;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(x, y)
            .map_err(|e| failed(&e))?;
        chart
            .configure_mesh()
            .x_desc(self.x.label.as_str())
            .y_desc(self.y.label.as_str())
            .x_labels(ticks(self.x.scale))
            .y_labels(ticks(self.y.scale))
            .x_label_formatter(&|v| tick_label(self.x.scale, *v))
            .y_label_formatter(&|v| tick_label(self.y.scale, *v))
            .light_line_style(WHITE.mix(0.0))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .draw()
            .map_err(|e| failed(&e))?;
        for (i, series) in self.series.iter().enumerate() {
            let (r, g, b) = COLOURS[i % COLOURS.len()];
            let colour = RGBColor(r, g, b);
            let line = ShapeStyle::from(&colour).stroke_width(2);
            chart
                .draw_series(LineSeries::new(series.points.iter().copied(), line))
                .map_err(|e| failed(&e))?
                .label(series.name.as_str())
                .legend(move |(lx, ly)| {
                    PathElement::new(vec![(lx, ly), (lx + 20, ly)], colour.stroke_width(2))
                });
            if self.markers {
                chart
                    .draw_series(
                        series
                            .points
                            .iter()
                            .map(|&p| Circle::new(p, 3, colour.filled())),
                    )
                    .map_err(|e| failed(&e))?;
            }
        }
        chart
            .configure_series_labels()
            .position(match corner {
                Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
                Corner::UpperRight => SeriesLabelPosition::UpperRight,
                Corner::LowerRight => SeriesLabelPosition::LowerRight,
                Corner::LowerLeft => SeriesLabelPosition::LowerLeft,
            })
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.5))
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| failed(&e))?;
        root.present().map_err(|e| failed(&e))?;
        Ok(())
    }
}

/// How many ticks to ask plotters for: on a log axis enough that it draws a grid line at
/// each of 1–9 × 10^k (it draws only the powers of ten below that), of which
/// [`tick_label`] labels 1, 2 and 5.
fn ticks(scale: Scale) -> usize {
    match scale {
        Scale::Linear => 10,
        // plotters draws the 1–9 ticks of each decade once this is at least ten times the
        // decades (7 decades at 70: 10^-1 ms to 10^6 locks is covered).
        Scale::Log => 70,
    }
}

/// The label of the tick at `value`: [`compact`], and on a log axis only at 1, 2 and 5 ×
/// 10^k (the other ticks keep their grid line unlabelled, so the labels do not collide).
fn tick_label(scale: Scale, value: f64) -> String {
    if scale == Scale::Log && value > 0.0 {
        let mantissa = value / 10f64.powf(value.log10().floor());
        let near = |m: f64| (mantissa - m).abs() < 0.01 || (mantissa - m * 10.0).abs() < 0.1;
        if !(near(1.0) || near(2.0) || near(5.0)) {
            return String::new();
        }
    }
    compact(value)
}

/// A tick label: `1.5M`, `200k`, `32`, `0.5`, `0.05` (at most three significant digits).
pub fn compact(value: f64) -> String {
    let (scaled, suffix) = match value.abs() {
        v if v >= 1e9 => (value / 1e9, "G"),
        v if v >= 1e6 => (value / 1e6, "M"),
        v if v >= 1e4 => (value / 1e3, "k"),
        _ => (value, ""),
    };
    let digits = if scaled == 0.0 {
        0
    } else {
        // Three significant digits, none after the point for values of 100 and more.
        (2 - scaled.abs().log10().floor() as i32).clamp(0, 6) as usize
    };
    let text = format!("{scaled:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    };
    format!("{text}{suffix}")
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod w5_tests;
