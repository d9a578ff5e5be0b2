//! Lab 7's results and the table the command line prints: each kernel's
//! result ([`VariantResult`]), the copies the device-memory ceiling is
//! taken from ([`CopyPoint`]), and what the run holds
//! ([`KernelPipelineResults`]): the ceiling, each kernel's share of it, the
//! lab's best pipelined kernel and the plain CUDA reference at its best,
//! the table and its lines on the ceiling and on block 0's warps. The
//! summary in words and the headline are in `headline.rs`, the charts in
//! `charts.rs`.
//!
//! May use: `super::settings`, `super::kernel` and `super::warps` (what a
//! kernel is and what its warps did), `measure::stats`,
//! `pipeline::timeline`, `units`. No GPU.

use super::kernel::{KernelResources, TileKind, WarpPhase};
use super::settings::{KernelPipelineConfig, Role, Variant};
use super::warps::{phase_shares, tile_period_us, tile_range};
use crate::measure::stats::Summary;
use crate::pipeline::timeline::Timeline;
use serde::{Deserialize, Serialize};

/// GB/s of useful traffic (n floats read, n written) in `ms`.
pub fn gbps(n: usize, ms: f64) -> f64 {
    2.0 * n as f64 * 4.0 / (ms * 1e6)
}

/// One variant's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantResult {
    pub variant: Variant,
    /// Skipped, and why (a GPU without the TMA, a shape that does not fit).
    pub skipped: Option<String>,
    pub resources: Option<KernelResources>,
    /// Each timed run, ms (CUDA events).
    pub ms: Option<Summary>,
}

/// One D2D copy size of the ceiling sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyPoint {
    pub mib: usize,
    /// Each timed copy, ms (CUDA events).
    pub ms: Summary,
}

impl CopyPoint {
    /// Read + write GB/s at the median.
    pub fn gbps(&self) -> f64 {
        gbps((self.mib << 20) / 4, self.ms.median)
    }
}

/// The lab's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelPipelineResults {
    pub config: KernelPipelineConfig,
    /// The D2D copy of the input (the lab's size), ms, one per round.
    pub copy_ms: Summary,
    /// Larger D2D copies, each size twice the one before, up to
    /// `config.ceiling_max_mib` (or what the memory holds): the
    /// device-memory ceiling is the fastest of these and the lab's own.
    #[serde(default)]
    pub ceiling_sweep: Vec<CopyPoint>,
    pub variants: Vec<VariantResult>,
    /// One round on the stream: a D2D copy of the input and every kernel.
    #[serde(default)]
    pub round: Option<Timeline>,
    /// What block 0's warps did over their first tiles, per traced kernel
    /// ([`KernelPipelineConfig::diagram_variants`]), titled by variant.
    #[serde(default)]
    pub warps: Vec<Timeline>,
}

impl KernelPipelineResults {
    /// GB/s of useful traffic (every input read once, every output written once) in `ms`.
    pub fn gbps(&self, ms: f64) -> f64 {
        gbps(self.config.elements(), ms)
    }
    /// The lab's own copy as a point of the sweep.
    pub fn own_copy(&self) -> CopyPoint {
        CopyPoint { mib: self.config.mib, ms: self.copy_ms }
    }
    /// The copy that reaches the ceiling: the fastest (GB/s, median) of
    /// the lab's own size and the sweep's larger ones.
    pub fn ceiling_copy(&self) -> CopyPoint {
        let own = self.own_copy();
        self.ceiling_sweep.iter().filter(|p| p.gbps() > own.gbps()).max_by(|a, b| a.gbps().total_cmp(&b.gbps())).cloned().unwrap_or(own)
    }
    /// The device-memory ceiling, GB/s read + write: the fastest copy's median.
    pub fn ceiling_gbps(&self) -> f64 {
        self.ceiling_copy().gbps()
    }
    /// A result's share of the ceiling (median run).
    pub fn share(&self, r: &VariantResult) -> Option<f64> {
        r.ms.as_ref().map(|m| self.gbps(m.median) / self.ceiling_gbps())
    }
    /// The kernels that ran (not skipped), in the table's order.
    pub(super) fn ran(&self) -> impl Iterator<Item = &VariantResult> {
        self.variants.iter().filter(|r| r.ms.is_some())
    }
    /// The fastest (median) of the kernels that ran and are `which`.
    fn fastest(&self, which: impl Fn(&Variant) -> bool) -> Option<&VariantResult> {
        self.ran().filter(|r| which(&r.variant)).min_by(|a, b| a.ms.as_ref().unwrap().median.total_cmp(&b.ms.as_ref().unwrap().median))
    }
    /// The lab's fastest kernel that pipelines (async copies, warp-specialized or TMA).
    pub fn best_pipelined(&self) -> Option<&VariantResult> {
        self.fastest(|v| v.kind != TileKind::Naive && v.role != Role::PlainReference)
    }
    /// The plain CUDA reference (kernels/tile_plain.cu) at its best: the
    /// fastest (median) of every launch of its sweep that ran.
    pub fn plain_reference(&self) -> Option<&VariantResult> {
        self.fastest(|v| v.role == Role::PlainReference)
    }
    pub fn by_role(&self, role: Role) -> Option<&VariantResult> {
        self.ran().find(|r| r.variant.role == role)
    }

    /// The table the command line prints.
    pub fn table(&self) -> String {
        let mut out = self.ceiling_lines();
        // The kernel column as wide as the longest name.
        let w = self.variants.iter().map(|r| r.variant.name.chars().count()).max().unwrap_or(0).max(48);
        let (best, yardstick) = (self.best_pipelined(), self.plain_reference());
        out += &format!(
            "  {:<w$} {:>4} {:>6} {:>5} {:>4} {:>7} {:>5} {:>3} {:>9} {:>17} {:>7} {:>7}\n",
            "kernel", "regs", "smem", "occ", "bps", "grid", "lcl", "vec", "ms", "25%..75%", "GB/s", "of ceil"
        );
        for r in &self.variants {
            match (&r.ms, &r.resources, &r.skipped) {
                (Some(m), Some(res), _) => {
                    let (lo, hi) = m.middle_range();
                    let is = |best: Option<&VariantResult>| best.is_some_and(|b| std::ptr::eq(b, r));
                    let mark = if is(best) {
                        "  <- the lab's best"
                    } else if is(yardstick) {
                        "  <- the yardstick at its best"
                    } else {
                        ""
                    };
                    out += &format!(
                        "  {:<w$} {:>4} {:>6} {:>4.0}% {:>4} {:>7} {:>5} {:>3} {:>9.4} {:>8.4}..{:<8.4} {:>7.0} {:>6.1}%{mark}\n",
                        r.variant.name,
                        res.registers,
                        crate::units::Bytes((res.static_smem + res.dynamic_smem) as u64).to_string(),
                        100.0 * res.occupancy,
                        res.blocks_per_sm,
                        res.grid,
                        res.local_bytes,
                        r.variant.vector_width,
                        m.median,
                        lo,
                        hi,
                        self.gbps(m.median),
                        100.0 * self.share(r).unwrap_or(0.0)
                    )
                }
                (_, _, Some(why)) => out += &format!("  {:<w$} skipped: {why}\n", r.variant.name),
                _ => {}
            }
        }
        out += "  (regs: registers per thread; smem: shared memory per block; occ: the share of an SM's threads that fit; bps: blocks per SM launched; lcl: spilled bytes per thread; vec: outputs a thread blurs and stores at once; the plain CUDA reference is not the lab's own: the yardstick it is held to, swept over tiles and blocks per SM and held at its best)\n";
        out += &self.yardstick_lines();
        out += &self.summary_lines();
        out += &self.warp_lines();
        out
    }

    /// The device-memory ceiling and the copies it was taken from: the lab's
    /// own size and each larger one, with which reaches the ceiling.
    pub fn ceiling_lines(&self) -> String {
        let c = self.ceiling_copy();
        let mut out = format!(
            "device-memory ceiling: {:.0} GB/s read + write, a D2D copy of {} MiB ({:.4} ms, 25%..75% {:.4}..{:.4})\n",
            c.gbps(),
            c.mib,
            c.ms.median,
            c.ms.middle_range().0,
            c.ms.middle_range().1
        );
        let own = self.own_copy();
        if c.mib != own.mib {
            out += &format!(
                "  the same copy of the lab's {} MiB: {:.0} GB/s ({:.4} ms, 25%..75% {:.4}..{:.4}), {:.1}% of the ceiling: a copy this size does not reach it\n",
                own.mib,
                own.gbps(),
                own.ms.median,
                own.ms.middle_range().0,
                own.ms.middle_range().1,
                100.0 * own.gbps() / c.gbps()
            );
        }
        if self.ceiling_sweep.is_empty() {
            out +=
                "  (this recording has no larger copies: made before the lab swept them, its ceiling is the lab's own size's, which a larger copy may beat)\n";
        } else {
            let sizes: Vec<String> = std::iter::once(&own).chain(&self.ceiling_sweep).map(|p| format!("{} MiB {:.0}", p.mib, p.gbps())).collect();
            out += &format!("  copies swept (GB/s, median): {}\n", sizes.join(", "));
        }
        out
    }

    /// Per traced kernel: how long block 0 took a tile, and
    /// how the first warp of each job split that time between phases.
    pub fn warp_lines(&self) -> String {
        if self.warps.is_empty() {
            return String::new();
        }
        let mut out = String::from("what block 0's warps did, tile by tile (a traced build; share of each warp's stamped time):\n");
        for t in &self.warps {
            let (a, b) = tile_range(t).unwrap_or((0, 0));
            out += &format!("  {:<48} tiles {a} to {b}: a tile every {:.2} us\n", t.title, tile_period_us(t).unwrap_or(f64::NAN));
            let mut seen = Vec::new();
            for lane in t.lanes() {
                let job = lane.split(": ").nth(1).unwrap_or("all alike").to_string();
                if seen.contains(&job) {
                    continue;
                }
                seen.push(job);
                let shares = phase_shares(t, &lane);
                let parts: Vec<String> =
                    WarpPhase::ALL.iter().zip(shares).filter(|(_, s)| *s > 0.0).map(|(p, s)| format!("{} {:.0}%", p.label(), 100.0 * s)).collect();
                out += &format!("    {:<22} {}\n", lane, parts.join(", "));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::charts::report;
    use super::super::fixture::results as fixture;
    use super::super::LAB;
    use super::*;

    #[test]
    fn the_ceiling_is_the_fastest_copy_of_the_sweep_with_the_labs_own_beside_it() {
        let mut r = fixture();
        let own = r.ceiling_gbps();
        let best_share = r.share(r.best_pipelined().unwrap()).unwrap();
        // A copy twice the size runs at 1.25x the GB/s (2x the bytes in 1.6x
        // the time), four times the size only 0.5% more.
        let at = |mib: usize, ms: f64| CopyPoint { mib, ms: crate::testing::flat(ms) };
        r.ceiling_sweep = vec![at(2 * r.config.mib, 1.6), at(4 * r.config.mib, 3.184)];
        let c = r.ceiling_copy();
        assert_eq!(c.mib, 4 * r.config.mib);
        assert!((r.ceiling_gbps() / own - 4.0 / 3.184).abs() < 1e-9, "{} vs {own}", r.ceiling_gbps());
        // Every share is against the ceiling, not the lab's own copy.
        let share = r.share(r.best_pipelined().unwrap()).unwrap();
        assert!((share / best_share - 3.184 / 4.0).abs() < 1e-9, "{share} vs {best_share}");
        let t = r.ceiling_lines();
        assert!(t.contains(&format!("a D2D copy of {} MiB", 4 * r.config.mib)), "{t}");
        assert!(t.contains(&format!("the same copy of the lab's {} MiB", r.config.mib)) && t.contains("does not reach it"), "{t}");
        assert!(r.headline()[0].1.ends_with(&format!("({} MiB copy)", 4 * r.config.mib)), "{:?}", r.headline());
        // A sweep slower than the lab's own copy leaves the ceiling where it was.
        r.ceiling_sweep = vec![at(2 * r.config.mib, 2.5)];
        assert_eq!(r.ceiling_copy().mib, r.config.mib);
        assert!(!r.ceiling_lines().contains("does not reach it"));
        // A recording from before the sweep says its ceiling may be beaten.
        r.ceiling_sweep.clear();
        assert!(r.ceiling_lines().contains("no larger copies"), "{}", r.ceiling_lines());
    }

    #[test]
    fn the_warp_timeline_names_each_job_and_splits_its_time() {
        let r = fixture();
        let ws = &r.warps[1];
        assert_eq!(ws.lanes(), ["warp 0: loader", "warp 1: compute", "warp 2: compute", "warp 3: storer"]);
        assert!(ws.spans.iter().all(|s| s.class.as_deref().and_then(WarpPhase::of_class).is_some() && s.label.starts_with("tile ")), "{:?}", ws.spans[0]);
        let shares = phase_shares(ws, "warp 3: storer");
        assert_eq!(shares, [0.0, 0.5, 0.0, 0.5]);
        let lines = r.warp_lines();
        // One line per job (the second compute warp is left out), tiles and time per kernel.
        assert!(lines.contains("naive") && lines.contains("tiles 0 to 1: a tile every 2.00 us"), "{lines}");
        // Warp-specialized: loader 0.5, compute 1.0 and storer 1.0 us a tile: the median warp's 1.0, not the panel's width.
        assert_eq!(tile_period_us(ws), Some(1.0));
        assert!(lines.contains("warp 0: loader") && lines.contains("copy in 60%, wait 40%"), "{lines}");
        assert!(lines.contains("warp 1: compute") && lines.contains("wait 25%, compute 75%") && !lines.contains("warp 2: compute"), "{lines}");
        assert!(lines.contains("warp 0 ") && lines.contains("copy in 50%, wait 25%, compute 25%"), "{lines}");
        assert!(r.table().contains("what block 0's warps did"), "the table carries the warp lines");
        // The chart keeps warps 0, 1 and the last: the naive kernel's warp 2 is not drawn.
        let g = r.warp_chart("test").unwrap();
        assert_eq!(g.timelines[0].lanes(), ["warp 0", "warp 1", "warp 3"]);
        assert_eq!(g.timelines[1].lanes(), ["warp 0: loader", "warp 1: compute", "warp 3: storer"]);
        let svg = crate::present::chart::Chart::to_svg(&g).unwrap();
        assert!(svg.contains("µs") && svg.contains("copy in") && svg.contains("store") && svg.contains("its tiles 0 to 1"), "legend, units, title");
        assert!(r.round_chart("test").is_none(), "no round timeline, no chart");
        let dir = crate::testing::temp_dir("kernel-pipeline-report");
        let rec = crate::measure::record::Record::new(LAB, crate::testing::fingerprint(), r);
        let files = report(&rec, &dir, "test").unwrap();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert!(names.contains(&"kernel-pipeline-warps.svg".to_string()), "{names:?}");
        assert!(names.contains(&"kernel-pipeline-warps-warp-specialized-2-stages-2-compute-warps.trace.json".to_string()), "{names:?}");
    }
}
