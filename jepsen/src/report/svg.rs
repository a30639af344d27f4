//! A tiny SVG writer and the time axis the report's charts share.
//!
//! Owns element syntax, escaping, and mapping history time to pixels. Must not know what a
//! chart shows (that is `charts.rs`). Hand-written rather than a plotting crate: the report
//! needs rectangles, lines and text, and keeping the harness's dependencies light matters more
//! than chart polish.

use std::fmt::Write;

/// Escapes text for an SVG/HTML text node or attribute.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An SVG document under construction.
#[derive(Debug)]
pub struct Svg {
    width: f64,
    height: f64,
    body: String,
}

impl Svg {
    /// An empty drawing of the given size in pixels.
    pub fn new(width: f64, height: f64) -> Self {
        Self {
            width,
            height,
            body: String::new(),
        }
    }

    /// A filled rectangle, with an optional tooltip.
    #[allow(clippy::too_many_arguments)]
    pub fn rect(
        &mut self,
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: &str,
        opacity: f64,
        title: Option<&str>,
    ) {
        let w = w.max(0.6);
        let _ = write!(
            self.body,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{fill}" fill-opacity="{opacity:.2}""#
        );
        match title {
            Some(t) => {
                let _ = write!(self.body, "><title>{}</title></rect>", esc(t));
            }
            None => self.body.push_str("/>"),
        }
    }

    /// A straight line.
    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str, width: f64) {
        let _ = write!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" stroke-width="{width:.1}"/>"#
        );
    }

    /// A dashed straight line (a bound or a threshold).
    pub fn dashed_line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str, width: f64) {
        let _ = write!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" stroke-width="{width:.1}" stroke-dasharray="6 4"/>"#
        );
    }

    /// A small circle, with an optional tooltip.
    pub fn dot(&mut self, cx: f64, cy: f64, r: f64, fill: &str, title: Option<&str>) {
        let _ = write!(
            self.body,
            r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="{r:.1}" fill="{fill}""#
        );
        match title {
            Some(t) => {
                let _ = write!(self.body, "><title>{}</title></circle>", esc(t));
            }
            None => self.body.push_str("/>"),
        }
    }

    /// A polyline through `points`.
    pub fn polyline(&mut self, points: &[(f64, f64)], stroke: &str, width: f64) {
        if points.is_empty() {
            return;
        }
        self.body.push_str(r#"<polyline fill="none" points=""#);
        for (x, y) in points {
            let _ = write!(self.body, "{x:.1},{y:.1} ");
        }
        let _ = write!(
            self.body,
            r#"" stroke="{stroke}" stroke-width="{width:.1}"/>"#
        );
    }

    /// Text; `anchor` is `start`, `middle` or `end`.
    pub fn text(&mut self, x: f64, y: f64, text: &str, size: f64, anchor: &str, fill: &str) {
        let _ = write!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="{size:.0}" text-anchor="{anchor}" fill="{fill}" font-family="sans-serif">{}</text>"#,
            esc(text)
        );
    }

    /// The finished document.
    pub fn finish(self) -> String {
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}">{body}</svg>"#,
            w = self.width,
            h = self.height,
            body = self.body
        )
    }
}

/// Maps history time (ns) to x pixels over a plot area.
#[derive(Clone, Copy, Debug)]
pub struct TimeAxis {
    /// Left edge of the plot area.
    pub left: f64,
    /// Width of the plot area.
    pub width: f64,
    /// The time at the right edge.
    pub t_max_ns: u64,
}

impl TimeAxis {
    /// The x of time `t_ns` (clamped to the plot area).
    pub fn x(&self, t_ns: u64) -> f64 {
        let t_max = self.t_max_ns.max(1) as f64;
        self.left + self.width * (t_ns.min(self.t_max_ns) as f64 / t_max)
    }

    /// Draws ticks and second labels along `y`, with grid lines up to `grid_top`.
    pub fn draw(&self, svg: &mut Svg, y: f64, grid_top: f64) {
        let total_s = self.t_max_ns as f64 / 1e9;
        let step = nice_step(total_s / 10.0);
        let mut s = 0.0;
        while s <= total_s + 1e-9 {
            let x = self.x((s * 1e9) as u64);
            svg.line(x, grid_top, x, y, "#e4e4e4", 1.0);
            svg.line(x, y, x, y + 4.0, "#555", 1.0);
            svg.text(x, y + 16.0, &format!("{s:.0}s"), 11.0, "middle", "#333");
            s += step;
        }
        svg.line(self.left, y, self.left + self.width, y, "#555", 1.0);
    }
}

/// A round step (1, 2 or 5 times a power of ten) at least `raw`.
pub fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * magnitude >= raw {
            return m * magnitude;
        }
    }
    10.0 * magnitude
}

/// A distinct, stable colour per client number.
pub fn process_colour(process: u32) -> String {
    let hue = (f64::from(process) * 137.508) % 360.0;
    format!("hsl({hue:.0},62%,52%)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_steps_are_round() {
        let mut svg = Svg::new(10.0, 10.0);
        svg.text(0.0, 0.0, "<a & \"b\">", 10.0, "start", "#000");
        let out = svg.finish();
        assert!(out.contains("&lt;a &amp; &quot;b&quot;&gt;"));
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(0.3), 0.5);
    }
}
