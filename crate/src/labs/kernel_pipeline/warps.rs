//! Block 0's warps as a timeline, from the stamps of a traced build
//! (`kernels/tile_blur.cuh`), and what it shows: which tiles, how long a
//! tile took, how each warp split its time between phases.
//!
//! May use: `super::kernel` (what a trace holds), `pipeline` (timelines),
//! `measure::stats`, `present::gantt` (the phases' colours).

use super::kernel::{TileKind, TileShape, WarpPhase, WarpTrace};
use crate::measure::stats::Summary;
use crate::pipeline::op::OpKind;
use crate::pipeline::timeline::{Span, Timeline};

/// Block 0's warps of a traced run as a timeline: a lane per warp ("warp
/// 0: loader" where warps have different jobs), a span per phase of each
/// of its first tiles.
pub fn warp_timeline(kind: TileKind, shape: TileShape, trace: &WarpTrace, title: &str, device: &str) -> Timeline {
    let spans = trace
        .spans
        .iter()
        .map(|w| Span {
            lane: match kind.warp_role(w.warp, shape.threads) {
                Some(role) => format!("warp {}: {role}", w.warp),
                None => format!("warp {}", w.warp),
            },
            kind: OpKind::Kernel,
            label: format!("tile {}: {}", w.tile, w.phase.label()),
            start_us: w.start_us,
            end_us: w.end_us,
            class: Some(w.phase.class().into()),
            index: Some(w.tile),
        })
        .collect();
    Timeline { title: title.into(), device: device.into(), spans, source: "SM cycle counter, traced build".into(), untraced_ms: None }
}

/// Each warp phase's class, legend label and colour on the warp timelines:
/// copies in the H2D colour, compute in the kernel's, stores in the D2H's,
/// waiting in grey, the same meaning as on the stream timelines.
pub fn phase_palette() -> Vec<(String, String, plotters::style::RGBColor)> {
    use crate::present::gantt::kind_color;
    WarpPhase::ALL
        .into_iter()
        .map(|p| {
            let color = match p {
                WarpPhase::Copy => kind_color(OpKind::H2d),
                WarpPhase::Wait => plotters::style::RGBColor(200, 200, 200),
                WarpPhase::Compute => kind_color(OpKind::Kernel),
                WarpPhase::Store => kind_color(OpKind::D2h),
            };
            (p.class().to_string(), p.label().to_string(), color)
        })
        .collect()
}

/// The block's tiles a warp timeline covers, first and last.
pub fn tile_range(t: &Timeline) -> Option<(u32, u32)> {
    t.spans.iter().filter_map(|s| s.index).fold(None, |r, k| Some(r.map_or((k, k), |(a, b): (u32, u32)| (a.min(k), b.max(k)))))
}

/// How often block 0 finished a tile, µs: for each warp, the time from
/// the end of its work on the first traced tile to the end of its work on
/// the last, over the tiles between; the median over warps. (Not the
/// panel's width: copies are issued tiles ahead, and a warp-specialized
/// loader runs stages ahead of the storer.)
pub fn tile_period_us(t: &Timeline) -> Option<f64> {
    let (a, b) = tile_range(t)?;
    if b == a {
        return None;
    }
    let done = |lane: &str, tile: u32| {
        t.spans.iter().filter(|s| s.lane == lane && s.index == Some(tile)).map(|s| s.end_us).fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))))
    };
    let periods: Vec<f64> = t.lanes().iter().filter_map(|lane| Some((done(lane, b)? - done(lane, a)?) / (b - a) as f64)).collect();
    Summary::of(&periods).ok().map(|s| s.median)
}

/// The share of a lane's stamped time in each phase, in [`WarpPhase::ALL`] order.
pub fn phase_shares(t: &Timeline, lane: &str) -> [f64; 4] {
    let mut busy = [0.0; 4];
    for s in t.spans.iter().filter(|s| s.lane == lane) {
        if let Some(p) = s.class.as_deref().and_then(WarpPhase::of_class) {
            busy[WarpPhase::ALL.iter().position(|x| *x == p).unwrap_or(0)] += s.end_us - s.start_us;
        }
    }
    let total: f64 = busy.iter().sum();
    busy.map(|b| if total > 0.0 { b / total } else { 0.0 })
}
