//! SVG plots of the figure sweeps, written as text (no plotting dependency).
//!
//! A [`Plot`] has a numeric x axis (linear or base-2 logarithmic, ticks chosen by the caller)
//! with one polyline and its markers per series, or a categorical x axis with one bar per
//! (category, series). The y axis starts at 0 with "nice" ticks (1, 2 or 5 times a power of
//! ten). Every series is one `<g class="series" data-series="...">` element holding its
//! polyline (or bars), so tools and tests can find each series; the legend names each series
//! in the same order. All text is XML-escaped; non-finite values are left out, never drawn.

use std::fmt::Write as _;

/// Canvas size and margins, in SVG user units (pixels).
const WIDTH: f64 = 880.0;
const HEIGHT: f64 = 470.0;
const MARGIN_LEFT: f64 = 78.0;
/// Room for the legend: labels of up to about 34 characters.
const MARGIN_RIGHT: f64 = 280.0;
const MARGIN_TOP: f64 = 70.0;
const MARGIN_BOTTOM: f64 = 58.0;
/// Most y ticks drawn (the step grows until the count fits).
const Y_TICKS_MAX: usize = 8;

/// Colours of series in order (colour-blind-safe palette of Okabe and Ito), then repeated.
const COLOURS: [&str; 7] = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"];

/// How x values map onto the axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Base-2 logarithmic (transaction sizes 1, 2, 4, ... 32); x must be positive.
    Log2,
}

/// The x axis of a plot.
#[derive(Debug, Clone, PartialEq)]
pub enum XAxis {
    /// Numbers, with ticks at the given values.
    Numeric { scale: Scale, ticks: Vec<f64> },
    /// Named categories, in order; a point's x is the category's index.
    Categories(Vec<String>),
}

/// One line (or set of bars) of a plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// (x, y) pairs in drawing order; non-finite ones are skipped.
    pub points: Vec<(f64, f64)>,
}

/// Everything a plot shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub title: String,
    /// Up to two lines under the title (what was fixed, how it was run).
    pub subtitle: [String; 2],
    pub x_label: String,
    pub y_label: String,
    pub x_axis: XAxis,
    pub series: Vec<Series>,
}

/// Escapes text for XML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0 (except tab, newline, return).
            control if control.is_control() && !matches!(control, '\t' | '\n' | '\r') => escaped.push(' '),
            other => escaped.push(other),
        }
    }
    escaped
}

/// Ticks from 0 covering `max`: a step of 1, 2 or 5 times a power of ten, at most
/// [`Y_TICKS_MAX`] + 1 ticks. Returns the ticks (the last is the axis top, >= `max`).
pub fn nice_ticks(max: f64) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 { max } else { 1.0 };
    let raw_step = max / Y_TICKS_MAX as f64;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|factor| factor * magnitude)
        .find(|step| (max / step).ceil() as usize <= Y_TICKS_MAX)
        .unwrap_or(10.0 * magnitude);
    let count = (max / step).ceil().max(1.0) as usize;
    (0..=count).map(|index| index as f64 * step).collect()
}

/// A tick label: `0`, `500`, `2.5k`, `120k`, `1.5M`.
pub fn tick_label(value: f64) -> String {
    let trimmed = |number: f64| {
        let text = format!("{number:.1}");
        text.strip_suffix(".0").map(str::to_string).unwrap_or(text)
    };
    if value.abs() >= 1e6 {
        format!("{}M", trimmed(value / 1e6))
    } else if value.abs() >= 1e3 {
        format!("{}k", trimmed(value / 1e3))
    } else if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        trimmed(value)
    }
}

/// Pixel geometry of the plotting area.
struct Frame {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    y_top: f64,
}

impl Frame {
    fn y(&self, value: f64) -> f64 {
        self.bottom - (value / self.y_top) * (self.bottom - self.top)
    }
}

impl Plot {
    /// The plot as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let y_max =
            self.series.iter().flat_map(|series| series.points.iter().map(|point| point.1)).fold(0.0, |max, y| {
                if y.is_finite() {
                    f64::max(max, y)
                } else {
                    max
                }
            });
        let y_ticks = nice_ticks(y_max);
        let frame = Frame {
            left: MARGIN_LEFT,
            right: WIDTH - MARGIN_RIGHT,
            top: MARGIN_TOP,
            bottom: HEIGHT - MARGIN_BOTTOM,
            y_top: *y_ticks.last().expect("at least two ticks"),
        };
        let mut svg = String::new();
        let _ = writeln!(svg, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(svg, "<title>{}</title>", escape(&self.title));
        let _ = writeln!(svg, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="20" font-size="15" font-weight="bold">{}</text>"#,
            frame.left,
            escape(&self.title)
        );
        for (line, y) in self.subtitle.iter().zip([38, 54]) {
            let _ = writeln!(svg, r#"<text x="{}" y="{y}" fill="rgb(85,85,85)">{}</text>"#, frame.left, escape(line));
        }
        self.write_y_axis(&mut svg, &frame, &y_ticks);
        match &self.x_axis {
            XAxis::Numeric { scale, ticks } => {
                let map = NumericMap::new(*scale, ticks, &self.series, &frame);
                self.write_numeric_x_axis(&mut svg, &frame, &map, ticks);
                self.write_lines(&mut svg, &frame, &map);
            }
            XAxis::Categories(categories) => self.write_bars(&mut svg, &frame, categories),
        }
        self.write_legend(&mut svg, &frame, matches!(self.x_axis, XAxis::Categories(_)));
        svg.push_str("</svg>\n");
        svg
    }

    fn write_y_axis(&self, svg: &mut String, frame: &Frame, ticks: &[f64]) {
        let _ = writeln!(svg, r#"<g class="y-axis" stroke="rgb(51,51,51)">"#);
        for &tick in ticks {
            let y = frame.y(tick);
            let _ = writeln!(
                svg,
                r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}"/><text x="{}" y="{:.1}" text-anchor="end" stroke="none">{}</text>"##,
                frame.left,
                frame.right,
                frame.left - 5.0,
                frame.left,
                frame.left - 8.0,
                y + 4.0,
                escape(&tick_label(tick))
            );
        }
        let _ =
            writeln!(svg, r#"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}"/></g>"#, frame.left, frame.top, frame.bottom);
        let middle = (frame.top + frame.bottom) / 2.0;
        let _ = writeln!(
            svg,
            r#"<text class="y-label" x="18" y="{middle:.1}" text-anchor="middle" transform="rotate(-90 18 {middle:.1})">{}</text>"#,
            escape(&self.y_label)
        );
    }

    fn write_x_label(&self, svg: &mut String, frame: &Frame) {
        let _ = writeln!(
            svg,
            r#"<text class="x-label" x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            (frame.left + frame.right) / 2.0,
            HEIGHT - 16.0,
            escape(&self.x_label)
        );
    }

    fn write_numeric_x_axis(&self, svg: &mut String, frame: &Frame, map: &NumericMap, ticks: &[f64]) {
        let _ = writeln!(svg, r#"<g class="x-axis" stroke="rgb(51,51,51)">"#);
        for &tick in ticks.iter().filter(|tick| map.accepts(**tick)) {
            let x = map.x(tick);
            let _ = writeln!(
                svg,
                r#"<line x1="{x:.1}" y1="{0}" x2="{x:.1}" y2="{1}"/><text x="{x:.1}" y="{2}" text-anchor="middle" stroke="none">{3}</text>"#,
                frame.bottom,
                frame.bottom + 5.0,
                frame.bottom + 19.0,
                escape(&tick_label(tick))
            );
        }
        let _ =
            writeln!(svg, r#"<line x1="{}" y1="{2}" x2="{}" y2="{2}"/></g>"#, frame.left, frame.right, frame.bottom);
        self.write_x_label(svg, frame);
    }

    fn write_lines(&self, svg: &mut String, frame: &Frame, map: &NumericMap) {
        for (index, series) in self.series.iter().enumerate() {
            let colour = COLOURS[index % COLOURS.len()];
            let points: Vec<(f64, f64)> = series
                .points
                .iter()
                .filter(|(x, y)| map.accepts(*x) && y.is_finite())
                .map(|&(x, y)| (map.x(x), frame.y(y)))
                .collect();
            let _ = writeln!(svg, r#"<g class="series" data-series="{}" fill="{colour}">"#, escape(&series.name));
            let coordinates: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                coordinates.join(" ")
            );
            for &(x, y) in &points {
                svg.push_str(&marker(index, x, y));
            }
            svg.push_str("</g>\n");
        }
    }

    fn write_bars(&self, svg: &mut String, frame: &Frame, categories: &[String]) {
        let slot = (frame.right - frame.left) / categories.len().max(1) as f64;
        let bar = slot * 0.7 / self.series.len().max(1) as f64;
        let _ = writeln!(svg, r#"<g class="x-axis" stroke="rgb(51,51,51)">"#);
        for (index, category) in categories.iter().enumerate() {
            let x = frame.left + slot * (index as f64 + 0.5);
            let _ = writeln!(
                svg,
                r#"<text x="{x:.1}" y="{}" text-anchor="middle" stroke="none">{}</text>"#,
                frame.bottom + 19.0,
                escape(category)
            );
        }
        let _ =
            writeln!(svg, r#"<line x1="{}" y1="{2}" x2="{}" y2="{2}"/></g>"#, frame.left, frame.right, frame.bottom);
        self.write_x_label(svg, frame);
        for (index, series) in self.series.iter().enumerate() {
            let colour = COLOURS[index % COLOURS.len()];
            let _ = writeln!(svg, r#"<g class="series" data-series="{}" fill="{colour}">"#, escape(&series.name));
            for &(x, y) in series.points.iter().filter(|(x, y)| y.is_finite() && *x >= 0.0) {
                let category = x as usize;
                let Some(name) = categories.get(category) else { continue };
                let left = frame.left + slot * category as f64 + slot * 0.15 + bar * index as f64;
                let top = frame.y(y);
                let _ = writeln!(
                    svg,
                    r#"<rect class="bar" data-category="{}" x="{left:.1}" y="{top:.1}" width="{bar:.1}" height="{:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="rgb(51,51,51)">{}</text>"#,
                    escape(name),
                    frame.bottom - top,
                    left + bar / 2.0,
                    top - 4.0,
                    escape(&tick_label(y.round()))
                );
            }
            svg.push_str("</g>\n");
        }
    }

    /// One entry per series: a line with its marker, or a swatch for bars.
    fn write_legend(&self, svg: &mut String, frame: &Frame, bars: bool) {
        let left = frame.right + 16.0;
        let _ = writeln!(svg, r#"<g class="legend">"#);
        for (index, series) in self.series.iter().enumerate() {
            let colour = COLOURS[index % COLOURS.len()];
            let y = frame.top + 10.0 + 22.0 * index as f64;
            if bars {
                let _ =
                    write!(svg, r#"<rect x="{}" y="{}" width="12" height="12" fill="{colour}"/>"#, left + 6.0, y - 6.0);
            } else {
                let _ = write!(
                    svg,
                    r#"<line x1="{left}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="2"/><g fill="{colour}">{}</g>"#,
                    left + 24.0,
                    marker(index, left + 12.0, y).trim_end()
                );
            }
            let _ = writeln!(svg, r#"<text x="{}" y="{}">{}</text>"#, left + 30.0, y + 4.0, escape(&series.name));
        }
        svg.push_str("</g>\n");
    }
}

/// A series' marker at (x, y): circle, square, triangle, diamond, in turn.
fn marker(series: usize, x: f64, y: f64) -> String {
    match series % 4 {
        0 => format!(r#"<circle class="marker" cx="{x:.1}" cy="{y:.1}" r="4"/>"#) + "\n",
        1 => format!(r#"<rect class="marker" x="{:.1}" y="{:.1}" width="8" height="8"/>"#, x - 4.0, y - 4.0) + "\n",
        2 => {
            format!(
                r#"<polygon class="marker" points="{x:.1},{:.1} {:.1},{:.1} {:.1},{:.1}"/>"#,
                y - 5.0,
                x - 5.0,
                y + 4.0,
                x + 5.0,
                y + 4.0
            ) + "\n"
        }
        _ => {
            format!(
                r#"<polygon class="marker" points="{x:.1},{:.1} {:.1},{y:.1} {x:.1},{:.1} {:.1},{y:.1}"/>"#,
                y - 5.0,
                x + 5.0,
                y + 5.0,
                x - 5.0
            ) + "\n"
        }
    }
}

/// Maps numeric x values onto the frame.
struct NumericMap {
    scale: Scale,
    low: f64,
    high: f64,
    left: f64,
    right: f64,
}

impl NumericMap {
    fn new(scale: Scale, ticks: &[f64], series: &[Series], frame: &Frame) -> Self {
        let values = ticks.iter().copied().chain(series.iter().flat_map(|series| series.points.iter().map(|p| p.0)));
        let usable: Vec<f64> = values
            .filter(|x| x.is_finite() && (scale == Scale::Linear || *x > 0.0))
            .map(|x| if scale == Scale::Log2 { x.log2() } else { x })
            .collect();
        let low = usable.iter().copied().fold(f64::INFINITY, f64::min);
        let high = usable.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (low, high) = if low.is_finite() && high > low { (low, high) } else { (low.min(0.0), low.max(0.0) + 1.0) };
        let (low, high) = if low.is_finite() { (low, high) } else { (0.0, 1.0) };
        // A little room at both ends so that markers are not cut by the axes.
        let pad = (high - low) * 0.04;
        Self { scale, low: low - pad, high: high + pad, left: frame.left, right: frame.right }
    }

    fn accepts(&self, x: f64) -> bool {
        x.is_finite() && (self.scale == Scale::Linear || x > 0.0)
    }

    fn x(&self, x: f64) -> f64 {
        let value = if self.scale == Scale::Log2 { x.log2() } else { x };
        self.left + (value - self.low) / (self.high - self.low) * (self.right - self.left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_one_two_or_five_times_a_power_of_ten_and_cover_the_maximum() {
        let unit = nice_ticks(1.0);
        assert_eq!(unit.len(), 6, "{unit:?}");
        assert!((unit[1] - 0.2).abs() < 1e-12 && (unit[5] - 1.0).abs() < 1e-12, "{unit:?}");
        let ticks = nice_ticks(123_456.0);
        assert_eq!(ticks.first(), Some(&0.0));
        assert!(*ticks.last().unwrap() >= 123_456.0);
        assert!(ticks.len() <= Y_TICKS_MAX + 1);
        assert_eq!(ticks[1], 20_000.0);
        for bad in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            assert_eq!(nice_ticks(bad).last(), Some(&1.0), "{bad}");
        }
        for max in [3.0, 7.5, 99.0, 101.0, 9_999.0, 1e9] {
            let ticks = nice_ticks(max);
            assert!(ticks.len() <= Y_TICKS_MAX + 1 && *ticks.last().unwrap() >= max, "{max}: {ticks:?}");
        }
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(tick_label(0.0), "0");
        assert_eq!(tick_label(500.0), "500");
        assert_eq!(tick_label(2_500.0), "2.5k");
        assert_eq!(tick_label(120_000.0), "120k");
        assert_eq!(tick_label(1_500_000.0), "1.5M");
        assert_eq!(tick_label(0.2), "0.2");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape(r#"GET*/PUT+ <a & "b">'"#), "GET*/PUT+ &lt;a &amp; &quot;b&quot;&gt;&apos;");
        assert_eq!(escape("a\u{1}b"), "a b");
    }

    #[test]
    fn a_log2_axis_spaces_powers_of_two_evenly_and_skips_non_positive_x() {
        let frame = Frame { left: 0.0, right: 100.0, top: 0.0, bottom: 100.0, y_top: 1.0 };
        let series = vec![Series { name: "s".into(), points: vec![(1.0, 1.0), (0.0, 1.0), (32.0, 1.0)] }];
        let map = NumericMap::new(Scale::Log2, &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0], &series, &frame);
        let steps: Vec<f64> = [1.0, 2.0, 4.0, 8.0].windows(2).map(|pair| map.x(pair[1]) - map.x(pair[0])).collect();
        assert!(steps.iter().all(|step| (step - steps[0]).abs() < 1e-9), "{steps:?}");
        assert!(!map.accepts(0.0));
        assert!(map.x(1.0) > 0.0 && map.x(32.0) < 100.0);
    }
}
