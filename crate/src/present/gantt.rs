//! Timelines drawn as Gantt charts: one or more [`Timeline`]s stacked on a
//! shared time axis, a lane per stream or thread, each span in its op
//! kind's colour (or its class's, where the lab gives its spans one), with a legend of
//! the colours drawn.

use crate::pipeline::op::{Link, Memory, OpKind};
use crate::pipeline::timeline::{self, OrderFault, Span, Timeline};
use crate::present::chart::{draw_header, Chart};
use plotters::coord::Shift;
use plotters::prelude::*;

/// An op kind's colour, the same on every chart of the labs.
pub fn kind_color(kind: OpKind) -> RGBColor {
    match kind {
        OpKind::H2d => RGBColor(31, 119, 180),
        OpKind::Kernel => RGBColor(44, 160, 44),
        OpKind::D2h => RGBColor(255, 127, 14),
        OpKind::Host => RGBColor(148, 103, 189),
        OpKind::Alloc(_) => RGBColor(140, 86, 75),
        OpKind::Free(_) => RGBColor(127, 127, 127),
        OpKind::D2d(l) if l.is_peer() => RGBColor(214, 39, 40),
        OpKind::D2d(_) => RGBColor(23, 190, 207),
        OpKind::AllReduce(_) => RGBColor(227, 119, 194),
    }
}

/// A span's fill: its class's colour in `palette`, else its kind's.
fn span_color(s: &Span, palette: &[(String, String, RGBColor)]) -> RGBColor {
    s.class.as_ref().and_then(|c| palette.iter().find(|p| &p.0 == c)).map_or_else(|| kind_color(s.kind), |p| p.2)
}

/// A span narrower than this many pixels is drawn without its edge, and
/// joined to its neighbour of the same colour less than half a pixel away.
const NARROW_PX: f64 = 3.0;

/// The boxes drawn for `t`'s spans, (lane's row, start, end, colour) in
/// axis units: each span, but narrow spans of one colour on one lane that
/// nearly touch drawn as one box, as a screen shows them anyway (a
/// profiler trace's thousands of tiny kernels would otherwise be thousands
/// of sub-pixel boxes, megabytes of SVG). Such a box is as opaque as its
/// spans fill it: a lane busy a tenth of the time reads pale, not solid.
fn drawn_boxes(
    t: &Timeline,
    lanes: &[String],
    t0: f64,
    per_unit: f64,
    px_per_unit: f64,
    classes: &[(String, String, RGBColor)],
) -> Vec<(usize, f64, f64, RGBAColor)> {
    let mut spans: Vec<(usize, f64, f64, RGBColor)> = t
        .spans
        .iter()
        .map(|s| (lanes.iter().position(|l| l == &s.lane).unwrap_or(0), (s.start_us - t0) / per_unit, (s.end_us - t0) / per_unit, span_color(s, classes)))
        .collect();
    spans.sort_by(|x, y| x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)));
    let narrow = |a: f64, b: f64| (b - a) * px_per_unit < NARROW_PX;
    // (row, start, end, colour, the spans' own length inside it, spans,
    // whether its last span is narrow): only narrow spans join, so a wide
    // span keeps a box of its own, drawn solid.
    let mut boxes: Vec<(usize, f64, f64, RGBColor, f64, usize, bool)> = Vec::with_capacity(spans.len());
    for (row, a, b, colour) in spans {
        match boxes.last_mut() {
            Some(last) if last.0 == row && last.3 == colour && (a - last.2) * px_per_unit < 0.5 && last.6 && narrow(a, b) => {
                last.4 += b - a.max(last.2).min(b);
                last.2 = last.2.max(b);
                last.5 += 1;
            }
            _ => boxes.push((row, a, b, colour, b - a, 1, narrow(a, b))),
        }
    }
    boxes
        .into_iter()
        .map(|(row, a, b, colour, filled, n, _)| {
            let opacity = if n > 1 && b > a { (filled / (b - a)).clamp(0.15, 1.0) } else { 1.0 };
            (row, a, b, colour.mix(opacity))
        })
        .collect()
}

/// One or more timelines stacked on a shared time axis (e.g. measured above
/// predicted, or no-overlap above overlapped).
#[derive(Clone, Debug)]
pub struct Gantt {
    pub stem: String,
    pub title: String,
    pub subtitle: String,
    pub timelines: Vec<Timeline>,
    pub width: u32,
    /// Spans of a class of the lab's own ([`Span::class`]): (class, legend
    /// label, colour) each.
    pub classes: Vec<(String, String, RGBColor)>,
}

const LANE_PX: u32 = 34;
/// The height of a warning line under a chart's header.
const WARNING_PX: u32 = 18;

impl Gantt {
    pub fn new(stem: &str, title: &str, subtitle: &str, timelines: Vec<Timeline>) -> Gantt {
        Gantt { stem: stem.into(), title: title.into(), subtitle: subtitle.into(), timelines, width: 1100, classes: Vec::new() }
    }
    /// This chart with spans of these classes in these colours, named so in
    /// its legend: (class, label, colour) each.
    pub fn with_classes(self, classes: Vec<(String, String, RGBColor)>) -> Gantt {
        Gantt { classes, ..self }
    }
    fn panel_height(t: &Timeline) -> u32 {
        t.lanes().len().max(1) as u32 * LANE_PX + 90
    }

    /// The pairs of its measured panels drawn against the order their
    /// untraced runs rank them ([`timeline::order_faults`]).
    pub fn order_faults(&self) -> Vec<OrderFault> {
        timeline::order_faults(&self.timelines)
    }

    /// The clocks that timed its measured panels ([`timeline::clocks`]):
    /// one, for a chart whose variants compare.
    pub fn clocks(&self) -> Vec<String> {
        timeline::clocks(&self.timelines)
    }

    /// Its title as drawn: where several panels are drawn beside their
    /// runs, the clock that timed them, or that they were timed by
    /// several, which do not compare.
    pub fn drawn_title(&self) -> String {
        let measured = self.timelines.iter().filter(|t| t.untraced_ms.is_some()).count();
        match self.clocks().as_slice() {
            [] => self.title.clone(),
            _ if measured < 2 => self.title.clone(),
            [one] => format!("{}, timed by {one}", self.title),
            several => format!("{}, timed by {}: clocks that do not compare", self.title, several.join(" and ")),
        }
    }

    pub fn evcxr_display(&self) {
        super::chart::display_inline(self)
    }

    /// The lines drawn in red under the header: each pair of panels drawn
    /// out of their table's order, wrapped to the chart's width.
    fn warning_lines(&self) -> Vec<String> {
        let per_line = (self.width / 7) as usize;
        self.order_faults().iter().flat_map(|f| wrap(&format!("Drawn out of its table's order: {f}."), per_line)).collect()
    }
}

/// `text` in lines of at most `width` characters, broken between words.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(if lines.is_empty() { word.to_string() } else { format!("  {word}") }),
        }
    }
    lines
}

impl Chart for Gantt {
    fn stem(&self) -> &str {
        &self.stem
    }
    fn size(&self) -> (u32, u32) {
        (self.width, self.timelines.iter().map(Gantt::panel_height).sum::<u32>() + 70 + WARNING_PX * self.warning_lines().len() as u32)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> std::result::Result<(), String> {
        let mut body = draw_header(root, &self.drawn_title(), &self.subtitle, self.width)?;
        // A chart that draws its variants against their table's order says
        // so above its panels: the picture is what a learner remembers.
        let warnings = self.warning_lines();
        if !warnings.is_empty() {
            let (notes, below) = body.split_vertically(WARNING_PX * warnings.len() as u32);
            body = below;
            for (i, line) in warnings.iter().enumerate() {
                notes
                    .draw(&Text::new(line.clone(), (12, (i as u32 * WARNING_PX) as i32), ("sans-serif", 13).into_font().color(&RGBColor(200, 0, 0))))
                    .map_err(|e| e.to_string())?;
            }
        }
        // One time axis for all panels, starting at the earliest span.
        let t0 = self.timelines.iter().map(|t| t.start_us()).fold(f64::INFINITY, f64::min);
        let t0 = if t0.is_finite() { t0 } else { 0.0 };
        let t1 = self.timelines.iter().map(|t| t.end_us()).fold(0.0, f64::max).max(t0 + 1.0);
        // Spans inside a kernel last microseconds: below 2 ms the axis reads µs.
        let (per_unit, unit) = if t1 - t0 < 2000.0 { (1.0, "µs") } else { (1e3, "ms") };
        let heights: Vec<u32> = self.timelines.iter().map(Gantt::panel_height).collect();
        let mut rest = body;
        for (t, h) in self.timelines.iter().zip(heights) {
            let (area, below) = rest.split_vertically(h);
            rest = below;
            let lanes = t.lanes();
            let n = lanes.len().max(1);
            let clock = if t.source.is_empty() { String::new() } else { format!(", {}", t.source) };
            // A measured run is drawn beside the untraced runs' time its
            // table prints, and says how far it is from it where that is
            // more than the charts allow (a traced run pays for its stamps).
            let untraced = t
                .untraced_ms
                .map_or(String::new(), |u| format!("; untraced {:.3} ms{}", u.ms, t.disagreement().map_or(String::new(), |why| format!(": {why}"))));
            let makespan = if unit == "ms" { format!("{:.3} ms", t.makespan_us() / 1e3) } else { format!("{:.1} µs", t.makespan_us()) };
            let caption = format!("{} (makespan {makespan}{clock}{untraced})", t.title);
            let mut chart = ChartBuilder::on(&area)
                .caption(caption, ("sans-serif", 15))
                .margin(8)
                .x_label_area_size(30)
                .y_label_area_size(170)
                // 15% headroom on the right keeps the legend off the last spans.
                .build_cartesian_2d(0.0..(t1 - t0) / per_unit * 1.15, 0.0..n as f64)
                .map_err(|e| e.to_string())?;
            // How many pixels one unit of the axis takes.
            let px_per_unit = chart.plotting_area().dim_in_pixel().0 as f64 / ((t1 - t0) / per_unit * 1.15);
            let names = lanes.clone();
            chart
                .configure_mesh()
                .disable_y_mesh()
                .y_labels(n * 2 + 1)
                .y_label_formatter(&move |y: &f64| {
                    let i = (*y - 0.5).round();
                    if (*y - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                        names[names.len() - 1 - i as usize].clone()
                    } else {
                        String::new()
                    }
                })
                .x_desc(unit)
                .label_style(("sans-serif", 12))
                .light_line_style(RGBColor(238, 238, 238))
                .draw()
                .map_err(|e| e.to_string())?;
            for (row, a, b, colour) in drawn_boxes(t, &lanes, t0, per_unit, px_per_unit, &self.classes) {
                let y = (n - 1 - row) as f64;
                chart.draw_series(std::iter::once(Rectangle::new([(a, y + 0.15), (b, y + 0.85)], colour.filled()))).map_err(|e| e.to_string())?;
                // A hairline edge keeps back-to-back spans apart, where a
                // span is wide enough to keep its colour inside it (a
                // traced program's kernels can be a pixel wide).
                if (b - a) * px_per_unit >= NARROW_PX {
                    chart.draw_series(std::iter::once(Rectangle::new([(a, y + 0.15), (b, y + 0.85)], WHITE.stroke_width(1)))).map_err(|e| e.to_string())?;
                }
            }
            // A legend entry per colour drawn: the lab's classes, else op kinds.
            let drawn = [
                OpKind::H2d,
                OpKind::Kernel,
                OpKind::D2h,
                OpKind::D2d(Link { from: 0, to: 0 }),
                OpKind::D2d(Link { from: 0, to: 1 }),
                OpKind::AllReduce(2),
                OpKind::Host,
                OpKind::Alloc(Memory::Device),
                OpKind::Free(Memory::Device),
            ];
            let mut legend: Vec<(&str, RGBColor)> =
                self.classes.iter().filter(|c| t.spans.iter().any(|s| s.class.as_ref() == Some(&c.0))).map(|c| (c.1.as_str(), c.2)).collect();
            let unclassed = |s: &&Span| s.class.as_ref().is_none_or(|c| !self.classes.iter().any(|p| &p.0 == c));
            legend.extend(drawn.iter().filter(|k| t.spans.iter().filter(unclassed).any(|s| s.kind.drawn() == **k)).map(|k| (k.label(), kind_color(*k))));
            for (label, c) in legend {
                chart
                    .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
                    .map_err(|e| e.to_string())?
                    .label(label)
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(180, 180, 180))
                .label_font(("sans-serif", 12))
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Narrow spans that nearly touch are one box, as opaque as they fill
    /// it; a wide span is its own box, solid, and a box never joins lanes
    /// or colours.
    #[test]
    fn narrow_spans_are_one_box_as_opaque_as_they_fill_it_and_wide_ones_stay_solid() {
        let span =
            |lane: &str, kind, start_us: f64, end_us: f64| Span { lane: lane.into(), kind, label: String::new(), start_us, end_us, class: None, index: None };
        // 1 px = 100 µs: 1000 kernels of 10 µs every 20 µs (half filled),
        // then one 5000 µs kernel, then a copy of 5 µs.
        let mut spans: Vec<Span> = (0..1000).map(|i| span("stream 7", OpKind::Kernel, 20.0 * i as f64, 20.0 * i as f64 + 10.0)).collect();
        spans.push(span("stream 7", OpKind::Kernel, 20000.0, 25000.0));
        spans.push(span("stream 7", OpKind::H2d, 25000.0, 25005.0));
        spans.push(span("stream 9", OpKind::Kernel, 0.0, 10.0));
        let t = Timeline { spans, ..Timeline::default() };
        let lanes = t.lanes();
        let boxes = drawn_boxes(&t, &lanes, 0.0, 1.0, 0.01, &[]);
        assert_eq!(boxes.len(), 4, "{boxes:?}");
        let (row, a, b, c) = boxes[0];
        assert_eq!((row, a, b), (0, 0.0, 19990.0));
        assert!((c.3 - 10000.0 / 19990.0).abs() < 1e-9, "opacity {}", c.3);
        assert_eq!((boxes[1].1, boxes[1].2, boxes[1].3 .3), (20000.0, 25000.0, 1.0), "the wide kernel alone and solid");
        assert_eq!((boxes[2].1, boxes[2].2), (25000.0, 25005.0), "another colour, another box");
        assert_eq!(boxes[3].0, 1, "another lane, another box");
    }

    #[test]
    fn gantt_renders_every_span() {
        let tl = crate::testing::sample_timeline();
        let mut other = tl.clone();
        other.title = "measured".into();
        let g = Gantt::new("test-gantt", "A pipeline", "test", vec![other, tl.clone()]);
        let svg = g.to_svg().unwrap();
        // 10 spans per timeline, plus legend swatches.
        assert!(svg.matches("<rect").count() >= 20, "{}", svg.matches("<rect").count());
        assert!(svg.contains("stream 1") && svg.contains("CPU main") && svg.contains("makespan"));
        // Chunk 2 waits behind chunk 0 on stream 0: H2D 300-400, kernel, D2H ends at 600.
        assert!((tl.makespan_us() - 600.0).abs() < 1e-9, "{}", tl.makespan_us());
        assert_eq!(tl.busy_us(OpKind::H2d), 300.0);
        let dir = crate::testing::temp_dir("gantt");
        assert_eq!(g.save(&dir).unwrap().len(), 2);
    }

    #[test]
    fn a_measured_panel_says_how_far_it_is_from_the_untraced_runs() {
        // The sample's makespan is 600 µs.
        let tl = crate::testing::sample_timeline();
        let svg = |t: Timeline| Gantt::new("g", "A pipeline", "test", vec![t]).to_svg().unwrap();
        let close = svg(tl.clone().illustrating(0.57));
        assert!(close.contains("untraced 0.570 ms") && !close.contains("slowed"), "within 10%: no excuse needed");
        let slow = svg(tl.clone().illustrating(0.4));
        assert!(slow.contains("untraced 0.400 ms: tracing slowed this run by 50%"), "{slow}");
        let very = svg(tl.clone().illustrating(0.1));
        assert!(very.contains("tracing slowed this run 6.0x"), "{very}");
        let fast = svg(tl.clone().illustrating(0.8));
        assert!(fast.contains("this run was 25% faster"), "{fast}");
        assert!(!svg(tl).contains("untraced"), "a panel with nothing to compare with claims nothing");
    }

    /// A measured panel drawn `ms` long beside untraced runs around
    /// `median` (middle half ± 0.1 ms), timed by `clock`.
    fn measured(title: &str, ms: f64, median: f64, clock: &str) -> Timeline {
        let tl = crate::testing::sample_timeline();
        let stretch = 1e3 * ms / tl.makespan_us();
        let spans = tl.spans.iter().map(|s| Span { start_us: s.start_us * stretch, end_us: s.end_us * stretch, ..s.clone() }).collect();
        let runs: Vec<f64> = (0..15).map(|i| median + 0.1 * (i as f64 - 7.0) / 4.0).collect();
        Timeline { title: title.into(), spans, source: clock.into(), ..tl }.illustrating(crate::measure::stats::Summary::of(&runs).unwrap())
    }

    #[test]
    fn a_chart_names_its_clock_and_says_where_it_is_drawn_out_of_order() {
        let model = crate::testing::sample_timeline();
        let ordered = Gantt::new("g", "A pipeline", "test", vec![measured("fast", 4.8, 4.75, "cuda events"), measured("slow", 5.2, 5.5, "cuda events"), model]);
        assert!(ordered.order_faults().is_empty());
        let svg = ordered.to_svg().unwrap();
        assert!(svg.contains("A pipeline, timed by cuda events") && !svg.contains("out of its table"), "{svg}");
        // Lab 6's alloc-stall as recorded at c7db9c4: the fastest variant
        // drawn by CUPTI slower than the next, drawn by events.
        let wrong =
            Gantt::new("g", "A pipeline", "test", vec![measured("stream-ordered", 7.25, 4.75, "cupti"), measured("cuMemAlloc", 5.13, 5.53, "cuda events")]);
        assert_eq!(wrong.order_faults().len(), 1);
        let svg = wrong.to_svg().unwrap();
        assert!(svg.contains("A pipeline, timed by cupti and cuda events: clocks that do not compare"), "{svg}");
        let warning = svg.split("<text").find(|t| t.contains("Drawn out of its table")).unwrap_or_else(|| panic!("no warning: {svg}"));
        assert!(warning.contains("stream-ordered") && warning.contains("is drawn slower than") && warning.contains("cuMemAlloc"), "{warning}");
        let right = Gantt::new(
            "g",
            "A pipeline",
            "test",
            vec![measured("stream-ordered", 4.8, 4.75, "cuda events"), measured("cuMemAlloc", 5.13, 5.53, "cuda events")],
        );
        assert!(right.order_faults().is_empty() && wrong.size().1 > right.size().1, "room for the warning");
        // One measured panel: its caption names its clock; the title does not repeat it.
        assert_eq!(Gantt::new("g", "One run", "test", vec![measured("run", 5.0, 5.0, "cupti")]).drawn_title(), "One run");
    }

    #[test]
    fn long_lines_wrap_between_words() {
        assert_eq!(wrap("aa bb cc dd", 7), ["aa bb", "  cc dd"]);
        assert_eq!(wrap("short", 80), ["short"]);
    }
}
