//! Lab 9's figures: tokens per second against batch size (every variant,
//! the bound, PyTorch's two references), and the weights streaming under
//! the GEMMs (the traced ring pass).

use super::{OffloadResults, Variant, LAB};
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
            .collect();
        series.push(Series {
            label: "bound: L·max(upload, GEMMs) + min, each at its fastest quarter".into(),
            color: BLACK,
            dashed: true,
            points: self.points.iter().map(|p| (p.batch as f64, tps(p.batch, self.bound_ms(p)))).collect(),
        });
        let torch = |label: &str, color, dashed, f: &dyn Fn(&super::BatchPoint) -> Option<f64>| Series {
            label: label.into(),
            color,
            dashed,
            points: self.points.iter().filter_map(|p| f(p).map(|ms| (p.batch as f64, tps(p.batch, ms)))).collect(),
        };
        if self.points.iter().any(|p| p.torch_to_ms.is_some()) {
            series.push(torch("PyTorch: .to(\"cuda\") in hooks", GREY, false, &|p| p.torch_to_ms.as_ref().map(|s| s.median)));
            series.push(torch("PyTorch: hand-written ring", GREY, true, &|p| p.torch_ring_ms.as_ref().map(|s| s.median)));
        }
        Figure {
            stem: format!("{LAB}-throughput"),
            title: format!(
                "Lab 9: a {} network streamed through {} of GPU memory",
                crate::units::Bytes(self.shape.network_bytes() as u64),
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
            panel_size: (900, 520),
        }
    }
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
