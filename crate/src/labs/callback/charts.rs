//! Lab 4's figures: throughput and efficiency against the CPU cost per
//! variant, with the model beside them, and the timelines of variant 1 (the
//! exercise's starting code) above variant 3 (its answer).

use super::{CallbackRecord, CallbackResults, Variant};
use crate::error::Result;
use crate::pipeline::op::OpKind;
use crate::pipeline::timeline::Timeline;
use crate::present::chart::write_text;
use crate::present::chart::Chart;
use crate::present::chart::{Figure, Panel, RGBColor, Series, XAxis};
use crate::present::gantt::Gantt;
use std::path::{Path, PathBuf};

fn color(v: Variant) -> RGBColor {
    match v {
        Variant::HostFnOnCompute => RGBColor(214, 39, 40),
        Variant::HostFnOnCallbackStream => RGBColor(255, 127, 14),
        Variant::HandOffToWorker => RGBColor(31, 119, 180),
        Variant::EventWaitingThread => RGBColor(148, 103, 189),
    }
}

/// C/G of every point (C pooled over the variants' runs).
fn ratios(r: &CallbackResults) -> Vec<f64> {
    r.points.iter().map(|p| p.cpu_ms() / r.gpu_ms.median).collect()
}

/// Iterations per second and efficiency (bound over measured) against C/G,
/// one line per variant; the bound's and variant 1's model as dashed lines.
pub fn throughput_and_efficiency(rec: &CallbackRecord, origin: &str) -> Figure {
    let r = &rec.results;
    let x = ratios(r);
    let n = r.config.iterations as f64;
    let per_variant = |f: &dyn Fn(&super::CostPoint, Variant) -> Option<f64>| -> Vec<Series> {
        r.config
            .variants
            .iter()
            .map(|&v| Series {
                label: v.label().into(),
                color: color(v),
                dashed: false,
                points: r.points.iter().zip(&x).filter_map(|(p, &x)| f(p, v).map(|y| (x, y))).collect(),
            })
            .collect()
    };
    let mut throughput = per_variant(&|p, v| r.throughput(p, v));
    let model = |v: Variant| -> Vec<(f64, f64)> { r.points.iter().zip(&x).map(|(p, &x)| (x, n / (r.model_ms(p, v) / 1e3))).collect() };
    throughput.push(Series {
        label: "bound: n·max(G, C) + min(G, C)".into(),
        color: RGBColor(44, 160, 44),
        dashed: true,
        points: model(Variant::HandOffToWorker),
    });
    throughput.push(Series {
        label: "model of 1: n·(G + C + host fn round trip)".into(),
        color: RGBColor(120, 120, 120),
        dashed: true,
        points: model(Variant::HostFnOnCompute),
    });
    let mut efficiency = per_variant(&|p, v| r.efficiency(p, v).map(|e| 100.0 * e.ratio));
    efficiency.push(Series { label: "target 90%".into(), color: RGBColor(44, 160, 44), dashed: true, points: x.iter().map(|&x| (x, 90.0)).collect() });
    let panel = |title: &str, y: &str, series| Panel {
        title: title.into(),
        x_axis: XAxis::LogRatio,
        x_label: "CPU per iteration / GPU per iteration (C/G)".into(),
        y_label: y.into(),
        log_y: false,
        series,
    };
    Figure {
        stem: "callback-throughput-efficiency".into(),
        title: format!("Callback stream: where the argmin runs ({} iterations, G = {:.3} ms)", r.config.iterations, r.gpu_ms.median),
        subtitle: origin.into(),
        panels: vec![panel("Throughput", "iterations / s", throughput), panel("Efficiency (bound / measured)", "%", efficiency)],
        panel_size: (620, 440),
    }
}

/// The iteration a span belongs to: the number its label ends with.
fn iteration_of(label: &str) -> Option<usize> {
    let digits: String = label.trim_end_matches(')').chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

/// The spans of iterations `from..to`, from the first one's kernel (waits
/// that began earlier are cut there) and shifted to start at zero, so a few
/// iterations of a long run can be seen.
pub fn iterations_window(t: &Timeline, from: usize, to: usize) -> Timeline {
    let spans: Vec<_> = t.spans.iter().filter(|s| iteration_of(&s.label).is_some_and(|i| (from..to).contains(&i))).cloned().collect();
    let first = |kernels: bool| spans.iter().filter(|s| !kernels || s.kind == OpKind::Kernel).map(|s| s.start_us).fold(f64::INFINITY, f64::min);
    let t0 = Some(first(true)).filter(|t| t.is_finite()).unwrap_or_else(|| first(false));
    let spans = spans.into_iter().filter(|s| s.end_us > t0).map(|mut s| {
        s.start_us = s.start_us.max(t0) - t0;
        s.end_us -= t0;
        s
    });
    Timeline { title: format!("{}, iterations {from}-{}", t.title, to - 1), spans: spans.collect(), ..t.clone() }
}

/// The recorded timeline of variant `v`.
pub fn timeline_of(r: &CallbackResults, v: Variant) -> Option<&Timeline> {
    r.timelines.iter().find(|t| t.title.ends_with(v.label()))
}

/// Variant 1 above variant 3, the same iterations (from the middle of the
/// run) on one time axis: turns taken against overlap.
pub fn timelines(rec: &CallbackRecord, origin: &str, iterations: usize) -> Option<Gantt> {
    let r = &rec.results;
    let from = r.config.iterations.saturating_sub(iterations) / 2;
    let to = (from + iterations).min(r.config.iterations);
    // Untraced, the window takes its share of the variant's runs at the
    // balanced point (where the timelines were drawn).
    let untraced = |v: Variant| {
        r.balanced().and_then(|p| p.variants.iter().find(|x| x.variant == v)).map(|x| x.total_ms.scaled((to - from) as f64 / r.config.iterations as f64))
    };
    let panels: Vec<Timeline> = [Variant::HostFnOnCompute, Variant::HandOffToWorker]
        .iter()
        .filter_map(|&v| {
            let t = iterations_window(timeline_of(r, v)?, from, to);
            Some(match untraced(v) {
                Some(runs) => t.illustrating(runs),
                None => t,
            })
        })
        .collect();
    (!panels.is_empty()).then(|| {
        let c = r.balanced().map_or(f64::NAN, |p| p.cpu_ms() / r.gpu_ms.median);
        Gantt::new("callback-timelines", &format!("Host function on the compute stream vs hand-off to a worker (C/G {c:.2})"), origin, panels)
    })
}

/// Lab 4 in the report: throughput and efficiency per variant, variant 1 vs 3 timelines,
/// every variant's full timeline as a Chrome trace, summary.
pub fn report(rec: &CallbackRecord, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = throughput_and_efficiency(rec, origin).save(dir)?;
    if let Some(g) = timelines(rec, origin, 12) {
        files.extend(g.save(dir)?);
    }
    for v in &rec.results.config.variants {
        if let Some(t) = timeline_of(&rec.results, *v) {
            let trace = dir.join(format!("callback-variant-{}.trace.json", v.number()));
            t.save_chrome_trace(&trace)?;
            files.push(trace);
        }
    }
    files.push(write_text(dir.join("callback-summary.txt"), format!("{origin}\n\n{}", rec.results.table()))?);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::timeline::Span;
    use crate::present::chart::Chart;

    fn rec() -> CallbackRecord {
        let mut r = crate::labs::callback::fixture::results();
        for (i, v) in Variant::ALL.iter().enumerate() {
            let spans = (0..r.config.iterations)
                .flat_map(|t| {
                    let s = t as f64 * 300.0 * if i == 0 { 2.0 } else { 1.0 };
                    [
                        Span {
                            lane: "stream 0: compute".into(),
                            kind: OpKind::Kernel,
                            label: format!("row_dot {t}"),
                            start_us: s,
                            end_us: s + 260.0,
                            class: None,
                            index: None,
                        },
                        Span {
                            lane: "CPU: worker thread".into(),
                            kind: OpKind::Host,
                            label: format!("argmin {t}"),
                            start_us: s + 270.0,
                            end_us: s + 540.0,
                            class: None,
                            index: None,
                        },
                    ]
                })
                .collect();
            r.timelines.push(Timeline {
                title: format!("measured: variant {}", v.label()),
                device: "GPU 0 (Test)".into(),
                spans,
                source: "cuda events".into(),
                untraced_ms: None,
            });
        }
        crate::measure::record::Record::new(super::super::LAB, crate::testing::fingerprint(), r)
    }

    #[test]
    fn a_window_keeps_whole_iterations_from_zero() {
        assert_eq!(iteration_of("wait for a slot (12)"), Some(12));
        assert_eq!(iteration_of("D2H scores 7"), Some(7));
        assert_eq!(iteration_of("measured"), None);
        let rec = rec();
        let t = timeline_of(&rec.results, Variant::HandOffToWorker).unwrap();
        let w = iterations_window(t, 5, 8);
        assert_eq!(w.spans.len(), 6);
        assert_eq!(w.start_us(), 0.0);
        assert!(w.title.ends_with("iterations 5-7"));
    }

    #[test]
    fn the_figures_render_with_every_variant() {
        let rec = rec();
        let f = throughput_and_efficiency(&rec, "test");
        assert_eq!(f.panels[0].series.len(), 6);
        let svg = f.to_svg().unwrap();
        for v in Variant::ALL {
            assert!(svg.contains(v.label()), "{}", v.label());
        }
        let g = timelines(&rec, "test", 8).unwrap();
        assert_eq!(g.timelines.len(), 2);
        assert!(
            g.timelines[0].title.contains("1: host fn on compute stream") && g.timelines[0].title.ends_with("iterations 60-67"),
            "{}",
            g.timelines[0].title
        );
        assert!(g.to_svg().unwrap().contains("makespan"));
    }
}
