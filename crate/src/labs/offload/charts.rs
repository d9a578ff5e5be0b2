//! Lab 9's figures: tokens per second against batch size (every variant,
//! the bound, PyTorch's references), the weights streaming under the GEMMs
//! (the traced ring pass), the passes past the streaming bound traced at
//! the same batch, tokens per second against the GPU memory a
//! placement holds (the budget sweep), and time a pass against the bytes
//! of a layer (FP16, FP8, 4 bits: where the bound goes).
//!
//! May use: `results` and what it stands on (`network`, `variant`),
//! `present`, and the lab's name (`LAB`, in `mod.rs`). No CUDA.

use super::network::LayerKind;
use super::results::{BatchPoint, OffloadResults};
use super::variant::Variant;
use super::LAB;
use crate::present::chart::{Figure, Panel, RGBColor, Series, XAxis};
use crate::present::gantt::Gantt;

/// One colour per variant, then the references'.
fn color(v: Variant) -> RGBColor {
    match v {
        Variant::Pageable => RGBColor(214, 39, 40),
        Variant::Pinned => RGBColor(255, 127, 14),
        Variant::Ring2 => RGBColor(148, 103, 189),
        Variant::RingK => RGBColor(44, 160, 44),
        Variant::Graph => RGBColor(31, 119, 180),
        Variant::Pool => RGBColor(23, 190, 207),
        Variant::Fused => RGBColor(140, 86, 75),
        Variant::Resident => RGBColor(227, 119, 194),
        Variant::Fp8 => RGBColor(188, 189, 34),
        Variant::Int4 => RGBColor(0, 0, 128),
    }
}

const BLACK: RGBColor = RGBColor(30, 30, 30);
const GREY: RGBColor = RGBColor(120, 120, 120);

impl OffloadResults {
    /// Tokens per second against tokens per pass: each variant, the bound
    /// (dashed) and PyTorch's two passes.
    pub fn throughput_chart(&self, origin: &str) -> Figure {
        let tps = |batch: usize, ms: f64| Self::tokens_per_s(batch, ms);
        let mut series: Vec<Series> = Variant::ALL
            .iter()
            .map(|&v| Series {
                label: v.label().into(),
                color: color(v),
                dashed: false,
                points: self.points.iter().filter_map(|p| p.variant(v).map(|x| (p.batch as f64, tps(p.batch, x.ms.median)))).collect(),
            })
            // A variant this run did not measure (FP8 or 4 bits on a GPU
            // without FP8; 4 bits in a recording made before it) has no line.
            .filter(|s| !s.points.is_empty())
            .collect();
        series.push(Series {
            label: "bound: L·max(upload, GEMMs) + min, each at its fastest quarter".into(),
            color: BLACK,
            dashed: true,
            points: self.points.iter().map(|p| (p.batch as f64, tps(p.batch, self.bound_ms(p)))).collect(),
        });
        let torch = |label: &str, color, dashed, f: &dyn Fn(&BatchPoint) -> Option<f64>| Series {
            label: label.into(),
            color,
            dashed,
            points: self.points.iter().filter_map(|p| f(p).map(|ms| (p.batch as f64, tps(p.batch, ms)))).collect(),
        };
        if self.points.iter().any(|p| p.torch_to_ms.is_some()) {
            series.push(torch("PyTorch: .to(\"cuda\") in hooks", GREY, false, &|p| p.torch_to_ms.as_ref().map(|s| s.median)));
            series.push(torch("PyTorch: hand-written ring", GREY, true, &|p| p.torch_ring_ms.as_ref().map(|s| s.median)));
        }
        // PyTorch past the bound, each in its lab variant's colour, dashed,
        // in the order its passes are listed; a second pass of the same
        // variant (4 bits, eager and compiled) in a lighter shade of it.
        let mut beyond: Vec<(Variant, Series)> = Vec::new();
        for p in &self.points {
            for (label, ms, like, _) in p.torch_beyond.iter().flat_map(|b| b.passes()) {
                let point = (p.batch as f64, tps(p.batch, ms.median));
                match beyond.iter_mut().find(|s| s.1.label == label) {
                    Some(s) => s.1.points.push(point),
                    None => {
                        let RGBColor(r, g, b) = color(like);
                        let lighter = |c: u8| c + (255 - c) / 2;
                        let shade = if beyond.iter().any(|s| s.0 == like) { RGBColor(lighter(r), lighter(g), lighter(b)) } else { color(like) };
                        beyond.push((like, Series { label: label.into(), color: shade, dashed: true, points: vec![point] }));
                    }
                }
            }
        }
        let beyond: Vec<Series> = beyond.into_iter().map(|s| s.1).collect();
        series.extend(beyond);
        Figure {
            stem: format!("{LAB}-throughput"),
            title: format!(
                "Lab 9: a {} network under a {} GPU budget (the ring of K holds {})",
                crate::units::Bytes(self.shape.network_bytes() as u64),
                crate::units::Bytes((self.config.gpu_budget << 20) as u64),
                crate::units::Bytes(self.gpu_bytes)
            ),
            subtitle: origin.into(),
            panels: vec![Panel {
                title: "tokens/s of a forward pass (median of the passes) against tokens per pass".into(),
                x_axis: XAxis::LogCount,
                x_label: "tokens per forward pass (batch)".into(),
                y_label: "tokens/s".into(),
                log_y: true,
                series,
            }],
            panel_size: (900, 640),
        }
    }
}

/// Tokens/s against the GPU memory each placement holds, one panel per
/// batch of the sweep: the planner's choice at every budget, FP16 (fused
/// layers) and FP8, from all-streamed to all-resident. None without a sweep.
pub fn budget_chart(r: &OffloadResults, origin: &str) -> Option<Figure> {
    let mut batches: Vec<usize> = r.sweeps.iter().map(|s| s.batch).collect();
    batches.dedup();
    if batches.is_empty() {
        return None;
    }
    let panels = batches
        .iter()
        .map(|&batch| {
            let series = [(LayerKind::Fused, Variant::Resident, "FP16, fused layers"), (LayerKind::Fp8, Variant::Fp8, "FP8")]
                .into_iter()
                .filter_map(|(kind, v, label)| {
                    let mut points: Vec<(f64, f64)> = r
                        .sweeps
                        .iter()
                        .filter(|s| s.batch == batch && s.kind == kind)
                        .filter_map(|s| {
                            let m = s.planned()?;
                            Some((r.shape.placement_bytes(batch, m.placement, kind.precision()) as f64, OffloadResults::tokens_per_s(batch, m.ms.median)))
                        })
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    points.dedup_by(|a, b| a.0 == b.0);
                    (!points.is_empty()).then(|| Series { label: format!("{label}: the planner's placement"), color: color(v), dashed: false, points })
                })
                .collect();
            Panel {
                title: format!("{batch} tokens: tokens/s against the GPU memory the pass holds (all-streamed to all-resident)"),
                x_axis: XAxis::LogBytes,
                x_label: "GPU memory the pass holds (layers, activations, cuBLAS's workspace)".into(),
                y_label: "tokens/s".into(),
                log_y: true,
                series,
            }
        })
        .collect();
    Some(Figure {
        stem: format!("{LAB}-budget"),
        title: format!("Lab 9: spending the GPU budget on resident layers ({} network)", crate::units::Bytes(r.shape.network_bytes() as u64)),
        subtitle: origin.into(),
        panels,
        panel_size: (900, 420),
    })
}

/// Where the bound goes as a layer's bytes shrink: time a pass against
/// the bytes of a layer, FP16 (fused layers), FP8 and 4 bits, each as
/// planned under the run's budget, one panel at the run's smallest batch
/// and one at its largest; beside each pass its streamed layers' uploads
/// alone (the link), its layers alone (the GPU) and, for 4 bits, their
/// dequantization alone ([`OffloadResults::precision_table`] prints
/// them). None in a run without a 4-bit pass.
pub fn precision_chart(r: &OffloadResults, origin: &str) -> Option<Figure> {
    let (first, last) = (r.points.first()?, r.points.last()?);
    let ends = if first.batch == last.batch { vec![first] } else { vec![first, last] };
    let ends: Vec<_> = ends.into_iter().map(|p| (p, r.precision_steps(p))).collect();
    if !ends.iter().any(|(_, steps)| steps.iter().any(|s| s.dequant_ms.is_some())) {
        return None;
    }
    let panels = ends
        .into_iter()
        .map(|(p, steps)| {
            let line = |label: &str, color, f: &dyn Fn(&super::results::PrecisionStep) -> Option<f64>| Series {
                label: label.into(),
                color,
                dashed: false,
                points: steps.iter().filter_map(|s| Some((s.layer_bytes as f64, f(s)?))).collect(),
            };
            let series = vec![
                line("the pass, as planned (median)", BLACK, &|s| Some(s.pass.median)),
                line("its streamed layers' uploads alone (the link)", color(Variant::Pageable), &|s| (s.link_ms > 0.0).then_some(s.link_ms)),
                line("its layers alone (the GPU: GEMMs, and dequantization)", color(Variant::RingK), &|s| Some(s.layers_ms)),
                line("of which the dequantization alone", color(Variant::Int4), &|s| s.dequant_ms),
            ];
            Panel {
                title: format!("{} tokens: ms a pass against the bytes of a layer", p.batch),
                x_axis: XAxis::LogBytes,
                x_label: "a layer's weights (FP16, FP8, 4 bits)".into(),
                y_label: "ms a pass".into(),
                log_y: true,
                series: series.into_iter().filter(|s| !s.points.is_empty()).collect(),
            }
        })
        .collect();
    Some(Figure {
        stem: format!("{LAB}-precision"),
        title: format!("Lab 9: where the bound goes as the bytes shrink (each precision as planned under {} MiB)", r.config.gpu_budget),
        subtitle: origin.into(),
        panels,
        panel_size: (760, 460),
    })
}

/// The passes past the streaming bound at the timeline's batch, each
/// traced by events as the ring of K is, in the table's order: the ring
/// of K, the ReLU fused, resident layers, FP8, 4 bits (those the run
/// measured). None in recordings made before them.
pub fn beyond_chart(r: &OffloadResults, origin: &str) -> Option<Gantt> {
    if r.timelines.is_empty() {
        return None;
    }
    let point = r.points.iter().find(|p| p.batch == r.timeline_batch)?;
    let runs = |v: Variant, fallback: f64| point.variant(v).map_or(crate::pipeline::timeline::Untraced::from(fallback), |x| x.ms.into());
    let mut panels = vec![crate::pipeline::timeline::Timeline { title: Variant::RingK.label().into(), ..r.timeline.clone() }
        .illustrating(runs(Variant::RingK, r.timeline_untraced_ms))];
    for t in &r.timelines {
        let title = match point.variant(t.variant).and_then(|x| x.plan.as_ref()) {
            Some(plan) => format!("{} ({})", t.variant.label(), plan.placement.label()),
            None => t.variant.label().to_string(),
        };
        panels.push(crate::pipeline::timeline::Timeline { title, ..t.timeline.clone() }.illustrating(runs(t.variant, t.untraced_ms)));
    }
    Some(Gantt::new(&format!("{LAB}-beyond"), &format!("Lab 9: past the streaming bound, {} tokens", r.timeline_batch), origin, panels))
}

/// The traced ring pass: uploads on the copy stream under the layers on the compute stream.
pub fn timeline_chart(r: &OffloadResults, origin: &str) -> Gantt {
    Gantt::new(
        &format!("{LAB}-timeline"),
        &format!("Lab 9: the weights streaming under the GEMMs ({}, {} tokens)", Variant::RingK.label(), r.timeline_batch),
        origin,
        vec![r.timeline.clone().illustrating(r.timeline_untraced_ms)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_chart_draws_the_planners_choices_and_the_beyond_chart_keeps_the_tables_order() {
        let r = crate::labs::offload::fixture::results_beyond();
        let f = budget_chart(&r, "test").expect("a sweep");
        assert_eq!(f.panels.len(), 3, "one panel a batch of the sweep");
        let fp16 = &f.panels[0].series[0];
        assert!(fp16.points.len() >= 2 && fp16.points.windows(2).all(|w| w[0].0 < w[1].0), "{:?}", fp16.points);
        let g = beyond_chart(&r, "test").expect("the passes past the bound were traced");
        let titles: Vec<&str> = g.timelines.iter().map(|t| t.title.as_str()).collect();
        assert_eq!(titles[0], Variant::RingK.label());
        assert!(titles[1].starts_with(Variant::Fused.label()) && titles[3].starts_with(Variant::Fp8.label()), "{titles:?}");
        assert!(g.order_faults().is_empty());
        // PyTorch's passes past the bound, each a dashed line over every batch, in its variant's colour.
        let t = r.throughput_chart("test");
        let fp8 = t.panels[0].series.iter().find(|s| s.label == "PyTorch: FP8 _scaled_mm, resident + ring").expect("PyTorch's FP8 line");
        assert!(fp8.dashed && fp8.color == color(Variant::Fp8) && fp8.points.len() == r.points.len(), "{fp8:?}");
        // A variant the run did not measure (4 bits, in a recording made before it) draws no line.
        assert!(t.panels[0].series.iter().all(|s| !s.points.is_empty() && s.label != Variant::Int4.label()), "{:?}", t.panels[0].series.iter().map(|s| &s.label).collect::<Vec<_>>());
        assert!(precision_chart(&r, "no 4 bits").is_none(), "a run without a 4-bit pass has no precision chart");
        assert!(budget_chart(&crate::labs::offload::fixture::results(), "old").is_none());
        assert!(beyond_chart(&crate::labs::offload::fixture::results(), "old").is_none());
    }

    /// On the H200's recording (its 4-bit pass): two panels, the smallest
    /// and the largest batch; each pass drawn at its precision's bytes, in
    /// the table's order (FP16, FP8, 4 bits: bytes falling); at the smallest
    /// batch the link bounds FP16 and the GPU the 4-bit pass, and the
    /// table prints what the chart draws.
    #[test]
    fn the_precision_chart_draws_each_pass_beside_its_bounds_parts() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/nvidia-h200/offload.json");
        let r = crate::labs::offload::OffloadRecord::load(&path).expect("the committed H200 recording of lab 9").results;
        let f = precision_chart(&r, "test").expect("a 4-bit pass");
        assert_eq!(f.panels.len(), 2);
        let steps = r.precision_steps(&r.points[0]);
        assert_eq!(steps.iter().map(|s| s.precision.name()).collect::<Vec<_>>(), ["FP16", "FP8", "4-bit"]);
        assert!(steps.windows(2).all(|w| w[0].layer_bytes > w[1].layer_bytes));
        assert_eq!((steps[0].bound_by(), steps[2].bound_by()), ("the link", "dequantization + GEMMs"));
        let passes = &f.panels[0].series[0];
        assert_eq!(passes.points, steps.iter().map(|s| (s.layer_bytes as f64, s.pass.median)).collect::<Vec<_>>());
        let dequant = f.panels[0].series.iter().find(|s| s.label.contains("dequantization alone")).expect("the 4-bit pass's dequantization");
        assert_eq!(dequant.points.len(), 1);
        let table = r.precision_table();
        for s in &steps {
            assert!(table.contains(&format!("{:.2}", s.pass.median)), "{table}");
        }
        assert!(r.precision_table().lines().count() == 2 + 3 * r.points.len(), "{table}");
    }
}
