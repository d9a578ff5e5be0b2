//! Lab 7's pictures: the share of the ceiling against stages in flight,
//! block 0's warps, one round on the stream, and the report's files.
//!
//! May use: `super::results` (what it draws), `super::warps`,
//! `present` (charts, timelines), `pipeline::timeline`. No GPU.

use super::kernel::TileKind;
use super::warps::{phase_palette, tile_range};
use super::{KernelPipelineRecord, KernelPipelineResults, Role, VariantResult, LAB};
use crate::error::Result;
use crate::pipeline::timeline::{Span, Timeline};
use crate::present::gantt::Gantt;

impl KernelPipelineResults {
    /// Share of the ceiling against stages in flight per block: the stage
    /// sweep (a line per tile size and blocks per SM), the warp-specialized
    /// and TMA kernels, and, dashed and flat, the naive kernel at one block
    /// per SM and at as many as fit (one tile in flight per block) and the
    /// plain CUDA reference at its best over its sweep (two stages).
    pub fn chart(&self, origin: &str) -> crate::present::chart::Figure {
        use crate::present::chart::{Figure, Panel, RGBColor, Series, XAxis};
        const PALETTE: [RGBColor; 4] = [RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(148, 103, 189), RGBColor(140, 86, 75)];
        let pct = |r: &VariantResult| 100.0 * self.share(r).unwrap_or(f64::NAN);
        let ran: Vec<&VariantResult> = self.ran().collect();
        let stages_max = ran.iter().map(|r| r.variant.shape.stages).max().unwrap_or(1).max(2) as f64;
        let mut series = Vec::new();
        let sweep_lines = self.config.sweep_blocks_per_sm.iter().flat_map(|&b| self.config.sweep_tiles.iter().map(move |&t| (b, t)));
        for (i, (blocks, tile)) in sweep_lines.enumerate() {
            let points = ran
                .iter()
                .filter(|r| r.variant.role == Role::Sweep && r.variant.shape.tile == tile && r.variant.blocks_per_sm == blocks.0)
                .map(|r| (r.variant.shape.stages as f64, pct(r)))
                .collect();
            series.push(Series { label: format!("async copies, tile {tile}{}", blocks.in_name()), color: PALETTE[i % PALETTE.len()], dashed: false, points });
        }
        for (kind, label, color) in
            [(TileKind::WarpSpecialized, "warp-specialized", RGBColor(255, 127, 14)), (TileKind::Tma, "TMA bulk copies", RGBColor(23, 190, 207))]
        {
            let points: Vec<(f64, f64)> = ran.iter().filter(|r| r.variant.kind == kind).map(|r| (r.variant.shape.stages as f64, pct(r))).collect();
            if !points.is_empty() {
                series.push(Series { label: format!("{label}, tile {}", self.config.tile), color, dashed: false, points });
            }
        }
        for (role, label, color) in
            [(Role::Baseline, "naive, one block per SM", RGBColor(214, 39, 40)), (Role::Occupancy, "naive, as many blocks as fit", RGBColor(120, 120, 120))]
        {
            if let Some(r) = self.by_role(role) {
                series.push(Series { label: label.into(), color, dashed: true, points: vec![(1.0, pct(r)), (stages_max, pct(r))] });
            }
        }
        // The yardstick at its best over its sweep: one line, its launch named.
        if let Some(r) = self.plain_reference() {
            let label = format!("plain CUDA reference at its best, 2 stages, {}", r.variant.launch_words());
            series.push(Series { label, color: RGBColor(0, 0, 0), dashed: true, points: vec![(1.0, pct(r)), (stages_max, pct(r))] });
        }
        Figure {
            stem: format!("{LAB}-stages"),
            title: "Lab 7: tiles in flight per block against the device-memory ceiling".into(),
            subtitle: origin.into(),
            panels: vec![Panel {
                title: format!(
                    "{} MiB blurred, one block per SM unless said; ceiling {:.0} GB/s (D2D copy of {} MiB)",
                    self.config.mib,
                    self.ceiling_gbps(),
                    self.ceiling_copy().mib
                ),
                x_axis: XAxis::Linear,
                x_label: "stages (tiles in flight per block)".into(),
                y_label: "% of the device-memory ceiling".into(),
                log_y: false,
                series,
            }],
            panel_size: (760, 460),
        }
    }
}

impl KernelPipelineResults {
    /// What each warp does when, a panel per traced kernel on one time
    /// axis: warps 0 and 1 and the last (the loader, a compute warp and the
    /// storer in the warp-specialized kernel; in the others every warp does
    /// the same). The Chrome traces keep every warp.
    pub fn warp_chart(&self, origin: &str) -> Option<Gantt> {
        if self.warps.is_empty() {
            return None;
        }
        let panels = self
            .warps
            .iter()
            .map(|t| {
                let lanes = t.lanes();
                let shown: Vec<&String> = lanes.iter().enumerate().filter(|(i, _)| *i < 2 || *i + 1 == lanes.len()).map(|(_, l)| l).collect();
                // Each panel from its own first stamp: the kernels ran at different times.
                let t0 = t.start_us();
                let spans = t
                    .spans
                    .iter()
                    .filter(|s| shown.contains(&&s.lane))
                    .map(|s| Span { start_us: s.start_us - t0, end_us: s.end_us - t0, ..s.clone() })
                    .collect();
                Timeline { spans, ..t.clone() }
            })
            .collect();
        let (a, b) = self.warps.first().and_then(tile_range).unwrap_or((0, 0));
        Some(
            Gantt::new(&format!("{LAB}-warps"), &format!("Lab 7: what each warp of block 0 does, its tiles {a} to {b}"), origin, panels)
                .with_classes(phase_palette()),
        )
    }

    /// One round on the stream: a D2D copy of the input and every kernel, back to back.
    pub fn round_chart(&self, origin: &str) -> Option<Gantt> {
        let mut t = self.round.clone()?;
        // Untraced, a round is the copy and every kernel timed alone.
        let kernels: Option<f64> = self.variants.iter().filter(|v| v.skipped.is_none()).map(|v| v.ms.as_ref().map(|s| s.median)).sum();
        if let Some(k) = kernels {
            t = t.illustrating(self.copy_ms.median + k);
        }
        Some(Gantt::new(&format!("{LAB}-round"), "Lab 7: one round of a D2D copy of the input and every kernel on the stream", origin, vec![t]))
    }
}

/// The report's files for a recording: the stage chart, the warp and
/// round timelines (with Chrome traces), and the table.
pub fn report(rec: &KernelPipelineRecord, dir: &std::path::Path, origin: &str) -> Result<Vec<std::path::PathBuf>> {
    use crate::present::chart::Chart;
    let mut files = rec.results.chart(origin).save(dir)?;
    for g in [rec.results.warp_chart(origin), rec.results.round_chart(origin)].into_iter().flatten() {
        files.extend(g.save(dir)?);
    }
    for t in &rec.results.warps {
        let trace = dir.join(format!("{LAB}-warps-{}.trace.json", crate::units::slug(&t.title)));
        t.save_chrome_trace(&trace)?;
        files.push(trace);
    }
    if let Some(t) = &rec.results.round {
        let trace = dir.join(format!("{LAB}-round.trace.json"));
        t.save_chrome_trace(&trace)?;
        files.push(trace);
    }
    files.push(crate::present::chart::write_text(dir.join(format!("{LAB}-summary.txt")), format!("{origin}\n\n{}", rec.results.table()))?);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::super::fixture::results as fixture;

    #[test]
    fn the_chart_draws_a_line_per_tile_and_the_naive_references() {
        let r = fixture();
        let f = r.chart("test");
        let labels: Vec<_> = f.panels[0].series.iter().map(|s| s.label.as_str()).collect();
        assert!(labels.contains(&"async copies, tile 1024") && labels.contains(&"naive, one block per SM"), "{labels:?}");
        assert!(!labels.iter().any(|l| l.starts_with("TMA")), "skipped kernels draw nothing: {labels:?}");
        // The yardstick: one line, at its best over its sweep, its launch named.
        let plain: Vec<_> = labels.iter().filter(|l| l.starts_with("plain")).collect();
        assert_eq!(plain, [&"plain CUDA reference at its best, 2 stages, tile 1024, as many blocks as fit"], "{labels:?}");
        crate::present::chart::render_svg(&f).unwrap();
    }
}
