//! Lab 2's figures: speed-up heatmaps, measured against the bounds, and the
//! serial and overlapped timelines (measured and predicted).

use super::{model, IssueOrder, OverlapRecord};
use crate::error::Result;
use crate::present::chart::write_text;
use crate::present::chart::Chart;
use crate::present::chart::{Figure, HeatPanel, Heatmap, Panel, RGBColor, Series, XAxis};
use crate::present::gantt::Gantt;
use std::path::{Path, PathBuf};

/// Speed-up over one chunk on one stream, by chunks x streams, per intensity.
pub fn speedup_heatmap(rec: &OverlapRecord, order: IssueOrder, origin: &str) -> Heatmap {
    let r = &rec.results;
    let panels = r
        .intensities
        .iter()
        .map(|ir| {
            let cols: Vec<usize> = r.config.chunks.clone();
            // The streams this order ran with (three for stream-per-stage).
            let mut rows: Vec<usize> = ir.points.iter().filter(|p| p.order == order).map(|p| p.streams).collect();
            rows.sort_unstable();
            rows.dedup();
            HeatPanel {
                title: format!("{} (ceiling {:.2}x)", ir.intensity.label(), model::speedup_ceiling(ir, r.copy_engines).unwrap_or(f64::NAN)),
                x_label: "chunks".into(),
                y_label: "streams".into(),
                columns: cols.iter().map(|c| c.to_string()).collect(),
                rows: rows.iter().map(|s| s.to_string()).collect(),
                values: rows.iter().map(|&s| cols.iter().map(|&c| ir.point(c, s, order).and_then(|p| model::speedup(ir, p))).collect()).collect(),
            }
        })
        .collect();
    Heatmap {
        stem: format!("overlap-speedup-{}", order.slug()),
        title: format!("Speed-up over one stream, {} issue order", order.label()),
        subtitle: origin.into(),
        panels,
    }
}

/// Best measured time per chunk count (over stream counts), each issue order,
/// against the bound for this device's copy engines and the serial sum.
pub fn measured_vs_bound(rec: &OverlapRecord, origin: &str) -> Figure {
    let r = &rec.results;
    let panels = r
        .intensities
        .iter()
        .map(|ir| {
            let mut series = Vec::new();
            for (order, color) in [
                (IssueOrder::DepthFirst, RGBColor(31, 119, 180)),
                (IssueOrder::BreadthFirst, RGBColor(255, 127, 14)),
                (IssueOrder::StageStreams, RGBColor(148, 103, 189)),
            ] {
                let points: Vec<(f64, f64)> = r
                    .config
                    .chunks
                    .iter()
                    .filter_map(|&c| {
                        ir.points.iter().filter(|p| p.chunks == c && p.order == order).map(|p| p.total_ms.median).min_by(f64::total_cmp).map(|t| (c as f64, t))
                    })
                    .collect();
                if !points.is_empty() {
                    series.push(Series { label: format!("measured, {}", order.label()), color, dashed: false, points });
                }
            }
            // The bound of the fastest point at each chunk count, from its own parts.
            let bound: Vec<(f64, f64)> = r
                .config
                .chunks
                .iter()
                .filter_map(|&c| {
                    let best = ir.points.iter().filter(|p| p.chunks == c).min_by(|a, b| a.total_ms.median.total_cmp(&b.total_ms.median))?;
                    Some((c as f64, model::Bounds::of(&best.parts, c).for_engines(r.copy_engines)))
                })
                .collect();
            series.push(Series { label: format!("bound ({} copy engines)", r.copy_engines), color: RGBColor(44, 160, 44), dashed: true, points: bound });
            let serial = model::Bounds::of(&ir.parts, 1).serial;
            series.push(Series {
                label: "H + K + D (no overlap)".into(),
                color: RGBColor(214, 39, 40),
                dashed: true,
                points: r.config.chunks.iter().map(|&c| (c as f64, serial)).collect(),
            });
            Panel { title: ir.intensity.label().into(), x_axis: XAxis::LogCount, x_label: "chunks".into(), y_label: "ms".into(), log_y: false, series }
        })
        .collect();
    Figure {
        stem: "overlap-measured-vs-bound".into(),
        title: "Chunked pipeline: measured against the model".into(),
        subtitle: origin.into(),
        panels,
        panel_size: (480, 400),
    }
}

/// A measured timeline beside the untraced runs of the point it shows.
fn illustrating(t: &crate::pipeline::timeline::Timeline, point: Option<&super::OverlapPoint>) -> crate::pipeline::timeline::Timeline {
    match point {
        Some(p) => t.clone().illustrating(p.total_ms),
        None => t.clone(),
    }
}

/// Serial, best measured and best predicted timelines for one intensity.
pub fn timelines(rec: &OverlapRecord, which: usize, origin: &str) -> Option<Gantt> {
    let ir = rec.results.intensities.get(which)?;
    Some(Gantt::new(
        &format!("overlap-timeline-{}", ir.intensity.label()),
        &format!("{} kernel: one stream vs the best chunked pipeline", ir.intensity.label()),
        origin,
        vec![illustrating(&ir.serial_timeline, ir.serial()), illustrating(&ir.best_timeline, ir.best()), ir.best_predicted.clone()],
    ))
}

/// Lab 2 in the report: heatmaps, measured vs bound, timelines (+ Chrome traces), summary.
pub fn report(rec: &OverlapRecord, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for order in &rec.results.config.orders {
        files.extend(speedup_heatmap(rec, *order, origin).save(dir)?);
    }
    files.extend(measured_vs_bound(rec, origin).save(dir)?);
    for (i, ir) in rec.results.intensities.iter().enumerate() {
        if let Some(g) = timelines(rec, i, origin) {
            files.extend(g.save(dir)?);
        }
        let trace = dir.join(format!("overlap-{}-best.trace.json", ir.intensity.label()));
        ir.best_timeline.save_chrome_trace(&trace)?;
        files.push(trace);
    }
    let mut text = format!("{origin}\n\n{}", rec.results.summary());
    for ir in &rec.results.intensities {
        text += &format!("\n{} ({} FMAs per element)\n{}", ir.intensity.label(), ir.iterations, model::efficiency_table(ir, rec.results.copy_engines));
    }
    files.push(write_text(dir.join("overlap-summary.txt"), text)?);
    Ok(files)
}
