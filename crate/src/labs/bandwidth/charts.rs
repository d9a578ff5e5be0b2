//! Lab 1's figures: bandwidth vs size, ratio to pageable, the two clocks, and
//! the price of pinning.

use super::model::{self, Acquisition};
use super::{BandwidthRecord, Direction};
use crate::error::Result;
use crate::gpu::HostMemoryKind;
use crate::present::chart::write_text;
use crate::present::chart::Chart;
use crate::present::chart::{Figure, Panel, RGBColor, Series, XAxis};
use std::path::{Path, PathBuf};

pub fn kind_color(kind: HostMemoryKind) -> RGBColor {
    match kind {
        HostMemoryKind::Pageable => RGBColor(214, 39, 40),
        HostMemoryKind::Pinned => RGBColor(31, 119, 180),
        HostMemoryKind::WriteCombined => RGBColor(44, 160, 44),
        HostMemoryKind::Registered => RGBColor(255, 127, 14),
    }
}

const PANEL: (u32, u32) = (520, 420);

fn panel(title: String, y_label: &str, log_y: bool, series: Vec<Series>) -> Panel {
    Panel { title, x_axis: XAxis::LogBytes, x_label: "copy size".into(), y_label: y_label.into(), log_y, series }
}

/// A dashed horizontal reference line across the swept sizes.
fn reference_line(rec: &BandwidthRecord, label: String, y: f64) -> Option<Series> {
    let sizes = rec.results.config.sizes();
    let (lo, hi) = (sizes.first()?, sizes.last()?);
    Some(Series { label, color: RGBColor(60, 60, 60), dashed: true, points: vec![(lo.0 as f64, y), (hi.0 as f64, y)] })
}

/// A panel per measured direction, a line per memory kind that `value` yields points for.
fn per_direction(
    rec: &BandwidthRecord,
    y_label: &str,
    kinds: impl Fn(HostMemoryKind) -> bool,
    value: impl Fn(HostMemoryKind, Direction) -> (String, Vec<(f64, f64)>),
    reference: impl Fn(Direction) -> Option<Series>,
) -> Vec<Panel> {
    let r = &rec.results;
    r.directions()
        .into_iter()
        .map(|d| {
            let mut series: Vec<Series> = r
                .kinds()
                .into_iter()
                .filter(|k| kinds(*k))
                .map(|k| {
                    let (label, points) = value(k, d);
                    Series { label, color: kind_color(k), dashed: false, points }
                })
                .collect();
            series.extend(reference(d));
            panel(d.label().to_string(), y_label, false, series)
        })
        .collect()
}

/// GB/s against size, a panel per direction, a line per memory kind, the
/// link's theoretical rate dashed.
pub fn bandwidth_vs_size(rec: &BandwidthRecord, origin: &str) -> Figure {
    let r = &rec.results;
    let panels = per_direction(
        rec,
        "GB/s (device time)",
        |_| true,
        |k, d| (k.label().into(), r.series(k, d).iter().map(|p| (p.bytes.0 as f64, p.gbps.median)).collect()),
        |d| model::link_gbps(&rec.fingerprint, d).and_then(|l| reference_line(rec, format!("PCIe theoretical {l:.0} GB/s"), l)),
    );
    Figure { stem: "bandwidth-by-size".into(), title: "Host<->device bandwidth by host memory kind".into(), subtitle: origin.into(), panels, panel_size: PANEL }
}

/// Bandwidth of each page-locked kind over pageable's, per size.
pub fn ratio_to_pageable(rec: &BandwidthRecord, origin: &str) -> Figure {
    let r = &rec.results;
    let panels = per_direction(
        rec,
        "speed-up over pageable",
        |k| k.is_page_locked(),
        |k, d| (format!("{} / pageable", k.label()), model::ratio_to_pageable(r, k, d).iter().map(|(b, x)| (b.0 as f64, *x)).collect()),
        |_| reference_line(rec, "no gain".into(), 1.0),
    );
    Figure { stem: "bandwidth-ratio-to-pageable".into(), title: "How much page-locked memory buys".into(), subtitle: origin.into(), panels, panel_size: PANEL }
}

/// The two clocks: how long the CPU is blocked in the copy call (dashed)
/// against how long the device works (solid), pageable vs pinned.
pub fn two_clocks(rec: &BandwidthRecord, origin: &str) -> Figure {
    let r = &rec.results;
    let panels = [Direction::H2d, Direction::D2h]
        .into_iter()
        .filter(|d| r.directions().contains(d))
        .map(|d| {
            let mut series = Vec::new();
            for k in [HostMemoryKind::Pageable, HostMemoryKind::Pinned] {
                let pts = r.series(k, d);
                if pts.is_empty() {
                    continue;
                }
                series.push(Series {
                    label: format!("{}: device busy", k.label()),
                    color: kind_color(k),
                    dashed: false,
                    points: pts.iter().map(|p| (p.bytes.0 as f64, p.device_ms.median * 1e3)).collect(),
                });
                series.push(Series {
                    label: format!("{}: CPU blocked in call", k.label()),
                    color: kind_color(k),
                    dashed: true,
                    points: pts.iter().map(|p| (p.bytes.0 as f64, p.host_call_ms.median * 1e3)).collect(),
                });
            }
            panel(format!("{}: cuMemcpyAsync", d.label()), "µs per copy (log)", true, series)
        })
        .collect();
    Figure { stem: "bandwidth-two-clocks".into(), title: "Two clocks: CPU blocked vs device busy".into(), subtitle: origin.into(), panels, panel_size: PANEL }
}

/// What pinning costs, and after how many copies it has paid for itself.
pub fn pinning_cost(rec: &BandwidthRecord, origin: &str) -> Figure {
    let r = &rec.results;
    let c = &r.pin_cost;
    let cost = |f: &dyn Fn(&super::PinCostPoint) -> f64| c.iter().map(|p| (p.bytes.0 as f64, f(p))).collect::<Vec<_>>();
    let (pageable, pinned, registered) = (kind_color(HostMemoryKind::Pageable), kind_color(HostMemoryKind::Pinned), kind_color(HostMemoryKind::Registered));
    let costs = vec![
        Series { label: "pageable, new: fresh pages + first write".into(), color: pageable, dashed: false, points: cost(&|p| p.pageable_first.total_ms()) },
        Series { label: "pageable, loop: malloc + write + free".into(), color: pageable, dashed: true, points: cost(&|p| p.pageable_reused.total_ms()) },
        Series { label: "pinned, first cuMemHostAlloc + free".into(), color: pinned, dashed: false, points: cost(&|p| p.pinned_first.total_ms()) },
        Series { label: "pinned, again".into(), color: pinned, dashed: true, points: cost(&|p| p.pinned_reused.total_ms()) },
        Series { label: "register + unregister".into(), color: registered, dashed: false, points: cost(&|p| p.registered.total_ms()) },
    ];
    let be = model::break_even(r);
    let mut breaks = Vec::new();
    for a in Acquisition::ALL {
        // D2H only, the exercise's direction, so the panel stays readable;
        // `break_even_table` has both directions.
        let points: Vec<_> = be
            .iter()
            .filter(|b| b.acquisition == a && b.direction == Direction::D2h)
            .filter_map(|b| b.copies.filter(|n| *n > 0.0).map(|n| (b.bytes.0 as f64, n)))
            .collect();
        if !points.is_empty() {
            let (color, dashed) = match a {
                Acquisition::Once => (pinned, false),
                Acquisition::EveryUse => (pinned, true),
                Acquisition::Register => (registered, false),
            };
            breaks.push(Series { label: format!("D2H, {}", a.label()), color, dashed, points });
        }
    }
    Figure {
        stem: "bandwidth-pinning-cost".into(),
        title: "The price of pinning".into(),
        subtitle: origin.into(),
        panels: vec![
            panel("get + give back".into(), "ms (log)", true, costs),
            panel("D2H copies until it pays off (gap: at once or never)".into(), "break-even copies (log)", true, breaks),
        ],
        panel_size: PANEL,
    }
}

pub fn all(rec: &BandwidthRecord, origin: &str) -> Vec<Figure> {
    vec![bandwidth_vs_size(rec, origin), ratio_to_pageable(rec, origin), two_clocks(rec, origin), pinning_cost(rec, origin)]
}

/// Lab 1 in the report: bandwidth, ratio, two clocks, pinning cost, summary.
pub fn report(rec: &BandwidthRecord, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for fig in all(rec, origin) {
        files.extend(fig.save(dir)?);
    }
    let text = format!(
        "{origin}\n\n{}\n{}\n{}\n{}",
        rec.fingerprint.describe(),
        model::summary_table(rec),
        crate::lab_kit::host_memory::cost_table(&rec.results.pin_cost),
        model::break_even_table(&rec.results)
    );
    files.push(write_text(dir.join("bandwidth-summary.txt"), text)?);
    Ok(files)
}
