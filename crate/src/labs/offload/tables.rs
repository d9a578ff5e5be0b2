//! Lab 9's tables: the summary a run prints (per batch each part alone,
//! each pass against its bound and the queue model, the planner's
//! choices, the placement sweep, FP8's accuracy, PyTorch beside), the
//! headline rows and the measured figures behind them.
//!
//! May use: `results` (what they print) and what it stands on
//! (`network`, `variant`, `lab_kit`, `measure::stats`, `units`). No CUDA.

use super::network::{budget_bytes, Precision};
use super::results::{OffloadResults, TorchPass};
use super::variant::Variant;
use crate::lab_kit::check::pct;
use crate::lab_kit::headline::HeadlineFigure;
use crate::measure::stats::Efficiency;
use crate::units::Bytes;

impl OffloadResults {
    /// The measured numbers behind the headline.
    pub fn headline_figures(&self) -> Vec<HeadlineFigure> {
        let mut v = Vec::new();
        if let (Some((batch, best, _)), Some(first)) = (self.beyond_the_ring(), self.points.first()) {
            if let Some(ring) = first.variant(Variant::RingK) {
                v.push(HeadlineFigure::new(format!("{batch} tokens: {} over the all-streamed ring of K", best.variant.short()), "x", ring.ms.over(&best.ms)));
            }
        }
        if let (Some(first), Some(last)) = (self.points.first(), self.points.last()) {
            for p in [first, last] {
                if let (Some(best), Some(base)) = (p.best(), p.variant(Variant::Pageable)) {
                    v.push(HeadlineFigure::new(format!("{} tokens: speed-up over pageable copy-then-compute", p.batch), "x", base.ms.over(&best.ms)));
                }
            }
        }
        v
    }

    pub fn headline(&self) -> Vec<(String, String)> {
        let mut rows = vec![(
            "network / GPU budget".into(),
            format!(
                "{} / {} ({:.1}x)",
                Bytes(self.shape.network_bytes() as u64),
                Bytes(budget_bytes(self.config.gpu_budget) as u64),
                self.network_over_budget()
            ),
        )];
        if let Some((batch, eff)) = self.worst_efficiency() {
            rows.push(("best pass against the bound, worst batch".into(), format!("{} at {batch} tokens", pct(eff))));
        }
        if let Some((v, batch, off)) = self.worst_prediction() {
            rows.push(("queue model's worst miss".into(), format!("{:+.1}% ({}, {batch} tokens)", 100.0 * off, v.label())));
        }
        if let Some((batch, best, x)) = self.beyond_the_ring() {
            rows.push(("best pass / all-streamed ring of K".into(), format!("{x:.2}x at {batch} tokens ({})", best.variant.label())));
        }
        if let Some((batch, budget, miss)) = self.worst_planner_miss() {
            rows.push(("planner's choice / best placement swept, worst".into(), format!("{:+.1}% ({budget} MiB, {batch} tokens)", 100.0 * miss)));
        }
        if let Some(a) = &self.fp8 {
            rows.push(("FP8: worst sampled row off the FP16 CPU reference".into(), format!("{:.3} (tolerance {:.2})", a.max_error, a.tolerance)));
        }
        if let Some(a) = &self.int4 {
            rows.push(("4 bits: worst sampled row off the CPU's twin of its pass".into(), format!("{:.3} (tolerance {:.2})", a.max_error, a.tolerance)));
        }
        let torch: [(&str, TorchPass); 3] = [
            ("PyTorch's .to() offload / best pass, worst batch", |p| p.torch_to_ms.as_ref()),
            ("PyTorch's hand-written ring / best pass, worst batch", |p| p.torch_ring_ms.as_ref()),
            ("PyTorch's fastest pass / best pass, worst batch", |p| p.torch_passes().into_iter().map(|t| t.1).min_by(|a, b| a.median.total_cmp(&b.median))),
        ];
        for (what, of) in torch {
            let ratios = self.points.iter().filter_map(|p| Some((p.batch, of(p)?.median / p.best()?.ms.median)));
            if let Some((batch, r)) = ratios.min_by(|a, b| a.1.total_cmp(&b.1)) {
                rows.push((what.into(), format!("{r:.2}x at {batch} tokens")));
            }
        }
        if let Some(c) = self.crossover_batch() {
            rows.push(("crossover batch (GEMMs = upload)".into(), format!("{c:.0} tokens")));
        }
        rows
    }

    pub fn summary(&self) -> String {
        let l = self.shape.layers;
        let mut s = format!(
            "network: {l} layers of d = {} ({} each, {} in all) in host memory; GPU: a ring of {} layers + activations = {} of a {} MiB budget (the network {:.1}x the budget); cuBLAS {}\n{}\n",
            self.shape.d,
            Bytes(self.shape.layer_bytes() as u64),
            Bytes(self.shape.network_bytes() as u64),
            self.config.ring,
            Bytes(self.gpu_bytes),
            self.config.gpu_budget,
            self.network_over_budget(),
            self.cublas,
            self.chose
        );
        s += "per layer alone (medians of its passes): upload from pinned / pageable memory, GEMMs + ReLU\n";
        s += "bound = L*max(upload, GEMMs) + min, each part at its fastest quarter (25th percentile of its passes)";
        if let Some(point) = self.upload_point() {
            let (up, at) = (&point.h2d_ms, format!(" at {} tokens", point.batch));
            s += &format!(
                "; the upload the run's one, {:.3} ms ({:.1} GB/s{at}): it moves the same {} at every batch",
                up.fast_end(),
                self.shape.layer_bytes() as f64 / up.fast_end() / 1e6,
                Bytes(self.shape.layer_bytes() as u64)
            );
        }
        s += "\nof bound: bound / the pass's median, and beside it what the middle half of its passes read\n";
        if let Some(m) = &self.machine {
            s += &format!(
                "the host, for the checker's queue model: a CPU thread resumes {:.1} µs after the GPU work it waited for; issuing one op takes {:.1} µs\n",
                m.wake_ms * 1e3,
                m.issue_ms * 1e3
            );
        }
        let mut effs = Vec::new();
        for p in &self.points {
            s += &format!(
                "\n{} tokens: upload {:.3} ms ({:.1} GB/s), pageable {:.3} ms, GEMMs {:.3} ms ({:.1} TFLOP/s) -> bound {:.2} ms ({}-bound)\n",
                p.batch,
                p.h2d_ms.median,
                self.shape.layer_bytes() as f64 / p.h2d_ms.median / 1e6,
                p.h2d_pageable_ms.median,
                p.layer_ms.median,
                self.shape.layer_flops(p.batch) / p.layer_ms.median / 1e9,
                self.bound_ms(p),
                if self.link_bound(p) { "link" } else { "compute" }
            );
            let mut parts = Vec::new();
            if let Some(f) = &p.layer_fused_ms {
                parts.push(format!("GEMMs with the ReLU fused {:.3} ms ({:.1} TFLOP/s)", f.median, self.shape.layer_flops(p.batch) / f.median / 1e9));
            }
            if let (Some(up), Some(l)) = (&p.h2d_fp8_ms, &p.layer_fp8_ms) {
                parts.push(format!(
                    "FP8 upload {:.3} ms ({:.1} GB/s), FP8 GEMMs {:.3} ms ({:.1} TFLOP/s)",
                    up.median,
                    self.shape.layer_bytes_in(Precision::Fp8) as f64 / up.median / 1e6,
                    l.median,
                    self.shape.layer_flops(p.batch) / l.median / 1e9
                ));
            }
            if let (Some(up), Some(l)) = (&p.h2d_int4_ms, &p.layer_int4_ms) {
                let alone = p.dequant_int4_ms.as_ref().map_or(String::new(), |q| format!(" (its dequantization alone {:.3} ms)", q.median));
                parts.push(format!(
                    "4-bit upload {:.3} ms ({:.1} GB/s), dequantization + FP8 GEMMs {:.3} ms{alone}",
                    up.median,
                    self.shape.layer_bytes_in(Precision::Int4) as f64 / up.median / 1e6,
                    l.median
                ));
            }
            if !parts.is_empty() {
                s += &format!("  {}\n", parts.join("; "));
            }
            s += &format!("  {:<42} {:>10} {:>9} {:>12} {:>21} {:>12}\n", "variant", "ms", "spread", "tokens/s", "of its bound", "queue model");
            for v in &p.variants {
                let e = self.variant_efficiency(p, v);
                effs.extend(e);
                s += &format!(
                    "  {:<42} {:>10.2} {:>8.1}% {:>12.0} {:>21} {:>+11.1}%\n",
                    v.variant.label(),
                    v.ms.median,
                    100.0 * v.ms.relative_spread(),
                    Self::tokens_per_s(p.batch, v.ms.median),
                    e.map_or("-".into(), |e| e.cell()),
                    100.0 * (v.predicted_ms / v.ms.median - 1.0)
                );
            }
            for (label, t, like, resident) in p.torch_passes() {
                let e = self.efficiency_of(p, like.kind(), resident, t);
                effs.extend(e);
                s += &format!(
                    "  {:<42} {:>10.2} {:>8.1}% {:>12.0} {:>21}\n",
                    label,
                    t.median,
                    100.0 * t.relative_spread(),
                    Self::tokens_per_s(p.batch, t.median),
                    e.map_or("-".into(), |e| e.cell())
                );
            }
            for v in &p.variants {
                if let Some(plan) = &v.plan {
                    s += &format!("  {} ({}): {}\n", v.variant.short(), Bytes(plan.gpu_bytes as u64), plan.why);
                }
            }
            let gains: Vec<String> = Variant::STEPS
                .iter()
                .filter_map(|&(from, to)| {
                    let g = p.variant(from)?.ms.over(&p.variant(to)?.ms);
                    Some(format!("{} over {} {:.2}x ({:.2}-{:.2})", to.short(), from.short(), g.median, g.min, g.max))
                })
                .collect();
            s += &format!("  each step's gain, median (range of the passes): {}\n", gains.join("; "));
            if let Some(best) = p.best() {
                let beside: Vec<String> = p
                    .torch_passes()
                    .iter()
                    .map(|(what, t, ..)| format!("{:.2}x {}", t.median / best.ms.median, what.trim_start_matches("PyTorch: ")))
                    .collect();
                if !beside.is_empty() {
                    s += &format!("  best pass ({}) against PyTorch's: {}\n", best.variant.short(), beside.join(", "));
                }
            }
            if let (Some(ours), Some(theirs)) = (self.best_fp16_layer(p), p.torch_beyond.as_ref().and_then(|b| b.layer_fused.as_ref())) {
                s += &format!(
                    "  one FP16 layer alone: ours {:.3} ms ({}), PyTorch's fused-epilogue layer {:.3} ms: {:.2}x\n",
                    ours.1.median,
                    ours.0,
                    theirs.median,
                    theirs.median / ours.1.median
                );
            }
            if let Some(b) = &p.torch_beyond {
                // PyTorch's 4-bit reference, one layer, beside ours.
                if let (Some(ours), Some(theirs)) = (&p.layer_int4_ms, &b.layer_int4pack) {
                    s += &format!(
                        "  one 4-bit layer alone: ours {:.3} ms (dequantization + FP8 GEMMs), torch._weight_int4pack_mm's {:.3} ms: {:.2}x\n",
                        ours.median,
                        theirs.median,
                        theirs.median / ours.median
                    );
                }
            }
        }
        if !self.sweeps.is_empty() {
            s += "\nplacements under a budget (tokens/s against GPU memory; R resident layers, a ring of K):\n";
            s += &format!(
                "  {:>7} {:>9} {:<5} {:<28} {:>10} {:>12} {:>12} {:>12}\n",
                "tokens", "budget", "", "placement", "GPU mem", "ms", "tokens/s", "queue model"
            );
            for sw in &self.sweeps {
                for m in &sw.measured {
                    let mark = if m.placement == sw.plan.placement { "plan" } else { "" };
                    s += &format!(
                        "  {:>7} {:>5} MiB {:<5} {:<28} {:>10} {:>12.2} {:>12.0} {:>+11.1}%\n",
                        sw.batch,
                        sw.budget_mib,
                        mark,
                        format!("{} {}", sw.kind.precision().name(), m.placement.label()),
                        Bytes(self.shape.placement_bytes(sw.batch, m.placement, sw.kind.precision()) as u64).to_string(),
                        m.ms.median,
                        Self::tokens_per_s(sw.batch, m.ms.median),
                        100.0 * (m.predicted_ms / m.ms.median - 1.0)
                    );
                }
                if let (true, Some(miss), Some(best)) = (sw.is_grid(), sw.planner_miss(), sw.best()) {
                    let how = match &sw.head_to_head {
                        Some((planned, fastest)) => format!(", the two in turn: {:.2} against {:.2} ms", planned.median, fastest.median),
                        None => String::new(),
                    };
                    s += &format!(
                        "  {:>7} {:>5} MiB: the planner's choice is {:+.1}% from the best measured ({}{how})\n",
                        sw.batch,
                        sw.budget_mib,
                        100.0 * miss,
                        best.placement.label()
                    );
                }
            }
        }
        if let Some(a) = &self.fp8 {
            s += &format!(
                "\nFP8 (E4M3 weights and activations, one FP32 scale per tensor): every sampled row within {:.3} of the FP16 CPU reference (tolerance {:.2} at {} layers; {} passes); the largest activation took {:.0}% of its scale's range\n",
                a.max_error,
                a.tolerance,
                self.shape.layers,
                a.verified_passes,
                100.0 * a.range_used
            );
        } else if let Some(why) = &self.fp8_missing {
            s += &format!("\nno FP8 variant: {why}\n");
        }
        if let Some(a) = &self.int4 {
            s += &format!(
                "4 bits (a scale per {} inputs, dequantized into E4M3 for FP8's GEMMs): every sampled row within {:.3} of the CPU's FP8 pass over the same E4M3 bytes (tolerance {:.2} at {} layers; {} passes), and {:.3} off the FP16 CPU reference (what 4 bits cost); the largest activation took {:.0}% of its scale's range\n",
                super::network::INT4_GROUP,
                a.max_error,
                a.tolerance,
                self.shape.layers,
                a.verified_passes,
                a.off_fp16,
                100.0 * a.range_used
            );
        } else if let Some(why) = &self.int4_missing {
            s += &format!("no 4-bit variant: {why}\n");
        }
        if let Some(why) = Efficiency::note(&effs) {
            s += &format!("\n{why}\n");
        }
        s += &match &self.torch {
            Ok(v) => format!("\nPyTorch {v} ran in the same run (crate/reference/torch_offload.py)\n"),
            Err(why) => format!("\nno PyTorch reference: {why}\n"),
        };
        // Why a PyTorch 4-bit pass is missing, where one is: once, not per batch.
        let mut notes: Vec<&str> = Vec::new();
        for note in self.points.iter().flat_map(|p| p.torch_beyond.iter()).flat_map(|b| [&b.int4_note, &b.int4pack_note]).flatten() {
            if !notes.contains(&note.as_str()) {
                notes.push(note);
            }
        }
        for note in notes {
            s += &format!("PyTorch, 4 bits: {note}\n");
        }
        s += &format!("every pass verified: {} passes, sampled rows within {:.1e} relative error of the CPU reference\n", self.verified_passes, self.max_error);
        s
    }

    /// Where the bound goes as a layer's bytes shrink: at every batch, each
    /// precision's pass as planned under the run's budget beside its
    /// bound's parts ([`OffloadResults::precision_steps`]): the figures
    /// `charts::precision_chart` draws where the run has a 4-bit pass (the
    /// chart needs one; the table prints FP16 and FP8 without it). Empty
    /// where the run measured no pass past FP16.
    pub fn precision_table(&self) -> String {
        let steps: Vec<_> = self.points.iter().map(|p| (p, self.precision_steps(p))).collect();
        if steps.iter().all(|(_, at)| at.len() < 2) {
            return String::new();
        }
        let mut s = format!(
            "each precision as planned under the {} MiB budget, ms a pass: the pass (median), its streamed layers' uploads alone, its {} layers alone (of which dequantization), its placement's bound\n",
            self.config.gpu_budget, self.shape.layers
        );
        s += &format!(
            "  {:>7} {:<9} {:>10} {:<28} {:>9} {:>9} {:>9} {:>9} {:>9}  {}\n",
            "tokens", "weights", "a layer", "placement", "pass", "link", "layers", "dequant", "bound", "bound by"
        );
        for (p, at) in steps {
            for step in at {
                s += &format!(
                    "  {:>7} {:<9} {:>10} {:<28} {:>9.2} {:>9.2} {:>9.2} {:>9} {:>9.2}  {}\n",
                    p.batch,
                    step.precision.name(),
                    Bytes(step.layer_bytes as u64).to_string(),
                    step.placement.label(),
                    step.pass.median,
                    step.link_ms,
                    step.layers_ms,
                    step.dequant_ms.map_or("-".into(), |d| format!("{d:.2}")),
                    step.bound_ms,
                    step.bound_by()
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::variant::Variant;
    use super::*;
    use crate::lab_kit::two_stage_bound_ms;

    #[test]
    fn the_bound_takes_the_runs_one_upload_at_its_best_and_each_batchs_gemms() {
        let r = crate::labs::offload::fixture::results();
        let (slow, fast) = (&r.points[0], &r.points[1]);
        // The link-bound batch's uploads ran slow (1.25 ms at their fastest
        // quarter): its bound still takes the run's 1.2 ms.
        assert_eq!((slow.h2d_ms.fast_end(), r.upload_ms().unwrap().fast_end()), (1.25, 1.2));
        assert_eq!(r.bound_parts(slow), (1.2, 0.6));
        assert_eq!(r.bound_ms(slow), two_stage_bound_ms(96, 1.2, 0.6));
        assert_eq!(r.bound_ms(fast), two_stage_bound_ms(96, 1.2, 1.8));
        assert!(r.link_bound(slow) && !r.link_bound(fast));
        let ring = &slow.variant(Variant::RingK).unwrap().ms;
        let e = r.efficiency(slow, ring);
        assert!((e.ratio - 1.0 / 1.03).abs() < 1e-12 && !e.above_bound(), "{e:?}");
        // GEMMs as long as an upload halfway between the two batches.
        assert_eq!(r.crossover_batch(), Some(4096.0 + 0.5 * 12288.0));
        let s = r.summary();
        assert!(s.contains("the upload the run's one, 1.200 ms (55.9 GB/s at 16384 tokens)"), "{s}");
        assert!(s.contains("4096 tokens: upload 1.300 ms") && s.contains("-> bound 115.80 ms (link-bound)"), "{s}");
        assert!(s.contains("97.1% (95.5..97.1)"), "the share with its passes' and its parts' spread: {s}");
        assert!(s.contains("the host, for the checker's queue model: a CPU thread resumes 6.0 µs"), "{s}");
        assert!(!s.contains("above 100%"), "{s}");
    }

    #[test]
    fn a_recording_made_before_quartiles_and_host_costs_still_renders() {
        let mut r = crate::labs::offload::fixture::results();
        r.machine = None;
        for p in &mut r.points {
            for s in [&mut p.h2d_ms, &mut p.layer_ms].into_iter().chain(p.variants.iter_mut().map(|v| &mut v.ms)) {
                s.middle = None;
            }
        }
        // Each part at its fastest run instead of its fastest quarter.
        assert_eq!(r.upload_ms().unwrap().fast_end(), 0.99 * 1.2);
        let s = r.summary();
        assert!(s.contains("4096 tokens") && s.contains("of bound") && !s.contains("the host, for the checker"), "{s}");
        let back: OffloadResults = serde_json::from_str(&serde_json::to_string(&r).unwrap().replace(",\"machine\":null", "")).unwrap();
        assert_eq!(back.machine, None);
    }
}
