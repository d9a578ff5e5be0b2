//! Figures drawn with plotters: described as data (panels of line series),
//! rendered to an SVG string (inline in notebooks as `image/svg+xml`) or to
//! SVG + PNG files for reports. PNG text uses an embedded DejaVu Sans, so no
//! system fonts are needed.

use crate::error::{LabError, Result};
use crate::units::Bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

pub use plotters::style::RGBColor;

/// One line on a panel.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub color: RGBColor,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XAxis {
    /// Sizes in bytes on a log2 axis, labelled "4 KiB", "1 MiB"...
    LogBytes,
    /// Counts on a log2 axis (1, 2, 4, ...).
    LogCount,
    /// Ratios on a log2 axis (0.25, 0.5, 1, 2, ...).
    LogRatio,
    Linear,
}

#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub x_axis: XAxis,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// A titled row of panels.
#[derive(Clone, Debug)]
pub struct Figure {
    /// File name without extension, e.g. "bandwidth-vs-size".
    pub stem: String,
    pub title: String,
    /// Where the data came from (device, date, live or recorded).
    pub subtitle: String,
    pub panels: Vec<Panel>,
    pub panel_size: (u32, u32),
}

/// Anything drawn with plotters that the labs show: it knows its size and how
/// to draw itself; output (SVG string, SVG + PNG files, inline) is shared.
pub trait Chart {
    /// File name without extension.
    fn stem(&self) -> &str;
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> std::result::Result<(), String>;

    fn to_svg(&self) -> Result<String>
    where
        Self: Sized,
    {
        render_svg(self)
    }
    fn save(&self, dir: &Path) -> Result<Vec<PathBuf>>
    where
        Self: Sized,
    {
        save_chart(self, dir)
    }
}

/// Registers the embedded font. Idempotent and cheap, called before every
/// render: evcxr resets statics between cells, so registering once is not enough.
fn ensure_fonts() -> Result<()> {
    for (style, bytes) in [(FontStyle::Normal, dejavu::sans::regular()), (FontStyle::Bold, dejavu::sans::bold())] {
        plotters::style::register_font("sans-serif", style, bytes).map_err(|_| LabError::Chart("embedded font is invalid".into()))?;
    }
    Ok(())
}

fn range(points: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in points.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        (lo / 1.5, hi * 1.5)
    } else {
        let lo = lo.min(0.0);
        (lo, if hi > lo { hi * 1.08 } else { lo + 1.0 })
    }
}

fn fmt_axis(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-2..1e4).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The corner of a panel where its legend covers the least of its lines:
/// each line sampled along its segments on the axes as drawn (log or
/// linear), against a box of the legend's size (from its rows and its
/// longest label) in each corner; ties keep the upper left.
fn legend_corner(p: &Panel, xs: (f64, f64), ys: (f64, f64), size: (u32, u32)) -> SeriesLabelPosition {
    let scale = |v: f64, (lo, hi): (f64, f64), log: bool| if log { (v.ln() - lo.ln()) / (hi.ln() - lo.ln()) } else { (v - lo) / (hi - lo) };
    let log_x = p.x_axis != XAxis::Linear;
    let longest = p.series.iter().map(|s| s.label.chars().count()).max().unwrap_or(0) as f64;
    // The plot area is the panel less its caption, margins and label areas.
    let (w, h) = ((size.0 as f64 - 84.0).max(1.0), (size.1 as f64 - 100.0).max(1.0));
    let (bw, bh) = (((longest * 6.5 + 40.0) / w).min(1.0), ((p.series.len() as f64 * 17.0 + 12.0) / h).min(1.0));
    let mut samples = Vec::new();
    for s in &p.series {
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_x || *x > 0.0) && (!p.log_y || *y > 0.0))
            .map(|&(x, y)| (scale(x, xs, log_x), scale(y, ys, p.log_y)))
            .collect();
        samples.extend(pts.iter().copied());
        for w in pts.windows(2) {
            samples.extend((1..16).map(|k| {
                let t = k as f64 / 16.0;
                (w[0].0 + t * (w[1].0 - w[0].0), w[0].1 + t * (w[1].1 - w[0].1))
            }));
        }
    }
    let covered = |left: bool, upper: bool| {
        let inside_x = |x: f64| if left { x <= bw } else { x >= 1.0 - bw };
        let inside_y = |y: f64| if upper { y >= 1.0 - bh } else { y <= bh };
        samples.iter().filter(|(x, y)| inside_x(*x) && inside_y(*y)).count()
    };
    [
        (SeriesLabelPosition::UpperLeft, covered(true, true)),
        (SeriesLabelPosition::UpperRight, covered(false, true)),
        (SeriesLabelPosition::LowerRight, covered(false, false)),
        (SeriesLabelPosition::LowerLeft, covered(true, false)),
    ]
    .into_iter()
    .min_by_key(|c| c.1)
    .map_or(SeriesLabelPosition::UpperLeft, |c| c.0)
}

macro_rules! draw_panel {
    ($area:expr, $p:expr, $x:expr, $y:expr, $xfmt:expr, $corner:expr) => {{
        let mut chart = ChartBuilder::on($area)
            .caption(&$p.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d($x, $y)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(&$p.x_label)
            .y_desc(&$p.y_label)
            .x_label_formatter($xfmt)
            .y_label_formatter(&|v: &f64| fmt_axis(*v))
            .label_style(("sans-serif", 12))
            .axis_desc_style(("sans-serif", 14))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| e.to_string())?;
        for s in &$p.series {
            let color = s.color;
            let style = ShapeStyle::from(&color).stroke_width(2);
            let pts = s.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite());
            let anno = if s.dashed {
                chart.draw_series(DashedLineSeries::new(pts, 8, 5, style)).map_err(|e| e.to_string())?
            } else {
                chart.draw_series(LineSeries::new(pts.clone(), style)).map_err(|e| e.to_string())?;
                chart.draw_series(pts.map(|p| Circle::new(p, 2, color.filled()))).map_err(|e| e.to_string())?
            };
            if s.dashed {
                anno.label(s.label.clone()).legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (7, 0)], color.stroke_width(2))
                        + PathElement::new(vec![(11, 0), (18, 0)], color.stroke_width(2))
                });
            } else {
                anno.label(s.label.clone()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            }
        }
        chart
            .configure_series_labels()
            .position($corner)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(|e| e.to_string())?;
    }};
}

impl Chart for Figure {
    fn stem(&self) -> &str {
        &self.stem
    }

    fn size(&self) -> (u32, u32) {
        (self.panel_size.0 * self.panels.len().max(1) as u32, self.panel_size.1 + 60)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        let body = draw_header(root, &self.title, &self.subtitle, self.size().0)?;
        let areas = body.split_evenly((1, self.panels.len().max(1)));
        for (area, p) in areas.iter().zip(&self.panels) {
            let xs = range(p.series.iter().flat_map(|s| s.points.iter().map(|q| q.0)), p.x_axis != XAxis::Linear);
            let ys = range(p.series.iter().flat_map(|s| s.points.iter().map(|q| q.1)), p.log_y);
            let bytes_fmt = |v: &f64| Bytes(v.round() as u64).to_string();
            let plain_fmt = |v: &f64| fmt_axis(*v);
            let count_fmt = |v: &f64| format!("{}", v.round());
            let corner = legend_corner(p, xs, ys, self.panel_size);
            match (p.x_axis, p.log_y) {
                (XAxis::LogCount, true) => draw_panel!(area, p, (xs.0..xs.1).log_scale().base(2.0), (ys.0..ys.1).log_scale(), &count_fmt, corner.clone()),
                (XAxis::LogCount, false) => draw_panel!(area, p, (xs.0..xs.1).log_scale().base(2.0), ys.0..ys.1, &count_fmt, corner.clone()),
                (XAxis::LogRatio, true) => draw_panel!(area, p, (xs.0..xs.1).log_scale().base(2.0), (ys.0..ys.1).log_scale(), &plain_fmt, corner.clone()),
                (XAxis::LogRatio, false) => draw_panel!(area, p, (xs.0..xs.1).log_scale().base(2.0), ys.0..ys.1, &plain_fmt, corner.clone()),
                (XAxis::LogBytes, true) => draw_panel!(area, p, (xs.0..xs.1).log_scale().base(2.0), (ys.0..ys.1).log_scale(), &bytes_fmt, corner.clone()),
                (XAxis::LogBytes, false) => draw_panel!(area, p, (xs.0..xs.1).log_scale().base(2.0), ys.0..ys.1, &bytes_fmt, corner.clone()),
                (XAxis::Linear, true) => draw_panel!(area, p, xs.0..xs.1, (ys.0..ys.1).log_scale(), &plain_fmt, corner.clone()),
                (XAxis::Linear, false) => draw_panel!(area, p, xs.0..xs.1, ys.0..ys.1, &plain_fmt, corner.clone()),
            }
        }
        root.present().map_err(|e| e.to_string())
    }
}

impl Figure {
    /// Inline display in the evcxr Jupyter kernel (a figure as a cell's value).
    pub fn evcxr_display(&self) {
        display_inline(self)
    }
}

/// A grid of values per panel (e.g. speed-up by chunks x streams), coloured
/// from white (low) to a strong colour (high), each cell labelled.
#[derive(Clone, Debug)]
pub struct Heatmap {
    pub stem: String,
    pub title: String,
    pub subtitle: String,
    pub panels: Vec<HeatPanel>,
}

#[derive(Clone, Debug)]
pub struct HeatPanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub columns: Vec<String>,
    pub rows: Vec<String>,
    /// values[row][column]; None leaves the cell blank.
    pub values: Vec<Vec<Option<f64>>>,
}

impl Heatmap {
    pub fn evcxr_display(&self) {
        display_inline(self)
    }
}

impl Chart for Heatmap {
    fn stem(&self) -> &str {
        &self.stem
    }
    fn size(&self) -> (u32, u32) {
        (440 * self.panels.len().max(1) as u32, 380)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        let body = draw_header(root, &self.title, &self.subtitle, self.size().0)?;
        let areas = body.split_evenly((1, self.panels.len().max(1)));
        for (area, p) in areas.iter().zip(&self.panels) {
            let (nc, nr) = (p.columns.len().max(1), p.rows.len().max(1));
            let all: Vec<f64> = p.values.iter().flatten().flatten().copied().filter(|v| v.is_finite()).collect();
            let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut chart = ChartBuilder::on(area)
                .caption(&p.title, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(50)
                .build_cartesian_2d(0.0..nc as f64, 0.0..nr as f64)
                .map_err(|e| e.to_string())?;
            let (cols, rows) = (p.columns.clone(), p.rows.clone());
            chart
                .configure_mesh()
                .disable_mesh()
                .x_labels(2 * nc + 1)
                .y_labels(2 * nr + 1)
                .x_label_formatter(&move |x: &f64| label_at(&cols, *x))
                .y_label_formatter(&move |y: &f64| label_at(&rows, *y))
                .x_desc(&p.x_label)
                .y_desc(&p.y_label)
                .label_style(("sans-serif", 12))
                .draw()
                .map_err(|e| e.to_string())?;
            for (r, row) in p.values.iter().enumerate() {
                for (c, v) in row.iter().enumerate() {
                    let Some(v) = v else { continue };
                    let t = if hi > lo { (v - lo) / (hi - lo) } else { 1.0 };
                    let shade = |full: u8| (255.0 - t * (255.0 - full as f64)) as u8;
                    let color = RGBColor(shade(31), shade(119), shade(180));
                    let (x, y) = (c as f64, r as f64);
                    chart.draw_series(std::iter::once(Rectangle::new([(x, y), (x + 1.0, y + 1.0)], color.filled()))).map_err(|e| e.to_string())?;
                    let ink = if t > 0.6 { WHITE } else { BLACK };
                    chart
                        .draw_series(std::iter::once(Text::new(
                            format!("{v:.2}"),
                            (x + 0.5, y + 0.5),
                            ("sans-serif", 12).into_font().color(&ink).pos(plotters::style::text_anchor::Pos::new(
                                plotters::style::text_anchor::HPos::Center,
                                plotters::style::text_anchor::VPos::Center,
                            )),
                        )))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        root.present().map_err(|e| e.to_string())
    }
}

/// The label of the cell whose centre is at `v` (cells span [i, i+1)).
fn label_at(labels: &[String], v: f64) -> String {
    let i = (v - 0.5).round();
    if (v - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
        labels[i as usize].clone()
    } else {
        String::new()
    }
}

/// White background, bold title, grey subtitle; returns the area below them.
pub(crate) fn draw_header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    width: u32,
) -> std::result::Result<DrawingArea<DB, Shift>, String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let header = root.titled(title, ("sans-serif", 22).into_font().style(FontStyle::Bold)).map_err(|e| e.to_string())?;
    header
        .draw(&Text::new(
            subtitle.to_string(),
            ((width / 2) as i32, 0),
            ("sans-serif", 13)
                .into_font()
                .color(&RGBColor(90, 90, 90))
                .pos(plotters::style::text_anchor::Pos::new(plotters::style::text_anchor::HPos::Center, plotters::style::text_anchor::VPos::Top)),
        ))
        .map_err(|e| e.to_string())?;
    Ok(header.margin(20, 0, 0, 0))
}

pub fn render_svg<C: Chart>(c: &C) -> Result<String> {
    ensure_fonts()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, c.size()).into_drawing_area();
        c.draw(&root).map_err(|e| LabError::Chart(format!("{}: {e}", c.stem())))?;
    }
    Ok(svg)
}

/// Writes `<dir>/<stem>.svg` and `<dir>/<stem>.png`, each via a temporary
/// file so a failure leaves no half-written figure.
pub fn save_chart<C: Chart>(c: &C, dir: &Path) -> Result<Vec<PathBuf>> {
    ensure_fonts()?;
    std::fs::create_dir_all(dir).map_err(|e| LabError::io(format!("creating {}", dir.display()), e))?;
    let stem = c.stem();
    let svg_path = dir.join(format!("{stem}.svg"));
    let png_path = dir.join(format!("{stem}.png"));
    let svg = render_svg(c)?;
    let tmp_svg = dir.join(format!(".{stem}.svg.tmp"));
    std::fs::write(&tmp_svg, svg).map_err(|e| LabError::io(format!("writing {}", tmp_svg.display()), e))?;
    let tmp_png = dir.join(format!(".{stem}.tmp.png"));
    {
        let root = BitMapBackend::new(&tmp_png, c.size()).into_drawing_area();
        c.draw(&root).map_err(|e| LabError::Chart(format!("{stem}: {e}")))?;
    }
    std::fs::rename(&tmp_svg, &svg_path).map_err(|e| LabError::io(format!("writing {}", svg_path.display()), e))?;
    std::fs::rename(&tmp_png, &png_path).map_err(|e| LabError::io(format!("writing {}", png_path.display()), e))?;
    Ok(vec![svg_path, png_path])
}

/// Prints a chart for evcxr to show inline as `image/svg+xml`.
pub fn display_inline<C: Chart>(c: &C) {
    match render_svg(c) {
        Ok(svg) => println!("EVCXR_BEGIN_CONTENT image/svg+xml\n{svg}\nEVCXR_END_CONTENT"),
        Err(e) => eprintln!("Error: {e}"),
    }
}

/// Writes a lab's text summary next to its figures.
pub fn write_text(path: PathBuf, text: String) -> Result<PathBuf> {
    std::fs::write(&path, text).map_err(|e| crate::LabError::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The legend goes to the corner its box covers least of the lines:
    /// lines rising to the upper right leave the upper left (the first
    /// choice on a tie) free; lines along the top and the left side push it
    /// to the lower right.
    #[test]
    fn the_legend_takes_the_corner_its_lines_leave_free() {
        let panel = |points: Vec<Vec<(f64, f64)>>| Panel {
            title: "t".into(),
            x_axis: XAxis::Linear,
            x_label: "x".into(),
            y_label: "y".into(),
            log_y: false,
            series: points
                .into_iter()
                .enumerate()
                .map(|(i, points)| Series { label: format!("line {i}"), color: RGBColor(0, 0, 0), dashed: false, points })
                .collect(),
        };
        let corner = |p: &Panel| format!("{:?}", legend_corner(p, (0.0, 10.0), (0.0, 10.0), (900, 640)));
        let rising = panel(vec![vec![(5.0, 0.0), (10.0, 10.0)]]);
        assert_eq!(corner(&rising), format!("{:?}", SeriesLabelPosition::UpperLeft));
        let top_and_left = panel(vec![vec![(0.0, 10.0), (10.0, 10.0)], vec![(0.0, 0.0), (0.0, 10.0)], vec![(10.0, 9.0), (10.0, 9.5)]]);
        assert_eq!(corner(&top_and_left), format!("{:?}", SeriesLabelPosition::LowerRight));
    }

    fn fig() -> Figure {
        Figure {
            stem: "test-figure".into(),
            title: "A test".into(),
            subtitle: "recorded on Test GPU".into(),
            panels: vec![Panel {
                title: "panel".into(),
                x_axis: XAxis::LogBytes,
                x_label: "size".into(),
                y_label: "GB/s".into(),
                log_y: false,
                series: vec![
                    Series {
                        label: "pinned".into(),
                        color: RGBColor(0, 0, 200),
                        dashed: false,
                        points: vec![(4096.0, 3.0), (1048576.0, 40.0), (f64::NAN, 1.0)],
                    },
                    Series { label: "link".into(), color: RGBColor(0, 0, 0), dashed: true, points: vec![(4096.0, 63.0), (1048576.0, 63.0)] },
                ],
            }],
            panel_size: (500, 400),
        }
    }

    #[test]
    fn svg_has_text_and_lines() {
        let svg = fig().to_svg().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..50]);
        for needle in ["A test", "recorded on Test GPU", "pinned", "GB/s", "KiB"] {
            assert!(svg.contains(needle), "svg lacks {needle}");
        }
        assert!(svg.contains("<polyline") || svg.contains("<path"), "no lines drawn");
    }

    #[test]
    fn saves_svg_and_a_real_png() {
        let dir = crate::testing::temp_dir("chart");
        let files = fig().save(&dir).unwrap();
        assert_eq!(files.len(), 2);
        let png = std::fs::read(&files[1]).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(png.len() > 5_000, "png suspiciously small: {}", png.len());
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().contains("tmp")).collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn heatmap_labels_every_cell() {
        let h = Heatmap {
            stem: "hm".into(),
            title: "speed-up".into(),
            subtitle: "test".into(),
            panels: vec![HeatPanel {
                title: "balanced".into(),
                x_label: "chunks".into(),
                y_label: "streams".into(),
                columns: vec!["1".into(), "2".into(), "4".into()],
                rows: vec!["1".into(), "2".into()],
                values: vec![vec![Some(1.0), Some(1.5), Some(2.0)], vec![None, Some(2.5), Some(2.75)]],
            }],
        };
        let svg = h.to_svg().unwrap();
        for v in ["1.00", "1.50", "2.75", "chunks", "streams"] {
            assert!(svg.contains(v), "heatmap lacks {v}");
        }
        assert_eq!(label_at(&["a".into(), "b".into()], 1.5), "b");
        assert_eq!(label_at(&["a".into(), "b".into()], 1.0), "");
    }

    #[test]
    fn empty_series_still_render() {
        let mut f = fig();
        f.panels[0].series.clear();
        f.panels[0].log_y = true;
        assert!(f.to_svg().is_ok());
    }
}
