//! PyTorch's ways of running the same network, measured in the same run
//! as the lab's own passes: `crate/reference/torch_offload.py` (weights
//! moved per layer by `.to("cuda")` in forward hooks, and the best
//! hand-written pinned ring; past the streaming bound, that ring with the
//! ReLU in cuBLASLt's epilogue, the lab's resident placement, FP8 weights
//! through `torch._scaled_mm`, 4-bit weights in the lab's layout
//! dequantized by PyTorch ops (eager, and compiled) before the FP16
//! GEMMs, and one layer alone eager, fused and through
//! `torch._weight_int4pack_mm`),
//! carried inside the binary and run with the Python that has PyTorch.
//! Its absence is a line in the results, never a failed lab.
//!
//! May use: `network`, `config`, `variant`, `lab_kit::reference` (runs the
//! script) and `measure::stats`. No CUDA of its own: PyTorch runs in its
//! own process.

use super::config::OffloadConfig;
use super::network::{Placement, Shape};
use super::variant::Variant;
use crate::measure::stats::Summary;
use serde::{Deserialize, Serialize};

/// The script, as in `crate/reference/`.
pub const SCRIPT: &str = include_str!("../../../reference/torch_offload.py");

/// PyTorch's times at one batch size, ms.
pub struct TorchBatch {
    pub batch: usize,
    pub to_hooks: Summary,
    pub ring: Summary,
    pub beyond: TorchBeyond,
}

/// PyTorch past the streaming bound at one batch size, ms (None: not run).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TorchBeyond {
    /// The ring with `torch._addmm_activation` (the ReLU in cuBLASLt's epilogue).
    pub fused_ring: Option<Summary>,
    /// The lab's FP16 placement, fused layers.
    pub resident: Option<Summary>,
    pub resident_placement: Option<Placement>,
    /// FP8 weights through `torch._scaled_mm` in the lab's FP8 placement.
    pub fp8: Option<Summary>,
    pub fp8_placement: Option<Placement>,
    /// Why there is no FP8 pass, where there is none.
    pub fp8_note: Option<String>,
    /// 4-bit weights in the lab's layout and 4-bit placement, each layer
    /// dequantized by PyTorch's eager ops (unpack, scale) into FP16, then
    /// the fused FP16 layer.
    #[serde(default)]
    pub int4: Option<Summary>,
    /// The same with the dequantization through `torch.compile`.
    #[serde(default)]
    pub int4_compiled: Option<Summary>,
    #[serde(default)]
    pub int4_placement: Option<Placement>,
    /// Why a 4-bit pass is missing, where one is.
    #[serde(default)]
    pub int4_note: Option<String>,
    /// One layer alone through `torch._weight_int4pack_mm` (BF16
    /// activations, the same 4-bit integers in its own tiled layout, the
    /// scales in BF16): a reference.
    #[serde(default)]
    pub layer_int4pack: Option<Summary>,
    #[serde(default)]
    pub int4pack_note: Option<String>,
    /// One layer alone: `relu(x @ W1) @ W2`, and the fused-epilogue form.
    pub layer_eager: Option<Summary>,
    pub layer_fused: Option<Summary>,
}

impl TorchBeyond {
    /// Its forward passes: (what, the time, the lab's variant it does as
    /// PyTorch, with its resident layers).
    pub fn passes(&self) -> Vec<(&'static str, &Summary, Variant, usize)> {
        let resident = |p: &Option<Placement>| p.map_or(0, |p| p.resident);
        let named = [
            ("PyTorch: ring, ReLU in the epilogue", &self.fused_ring, Variant::Fused, 0),
            ("PyTorch: resident + ring, fused", &self.resident, Variant::Resident, resident(&self.resident_placement)),
            ("PyTorch: FP8 _scaled_mm, resident + ring", &self.fp8, Variant::Fp8, resident(&self.fp8_placement)),
            ("PyTorch: 4-bit, eager dequantization, FP16", &self.int4, Variant::Int4, resident(&self.int4_placement)),
            ("PyTorch: 4-bit, compiled dequantization, FP16", &self.int4_compiled, Variant::Int4, resident(&self.int4_placement)),
        ];
        named.into_iter().filter_map(|(what, t, v, r)| Some((what, t.as_ref()?, v, r))).collect()
    }
}

pub struct TorchOffload {
    pub torch: String,
    pub batches: Vec<TorchBatch>,
}

#[derive(Deserialize)]
struct PrintedBatch {
    batch: usize,
    to_hooks_ms: Vec<f64>,
    ring_ms: Vec<f64>,
    #[serde(default)]
    fused_ring_ms: Option<Vec<f64>>,
    #[serde(default)]
    resident_ms: Option<Vec<f64>>,
    #[serde(default)]
    resident: Option<(usize, usize)>,
    #[serde(default)]
    fp8_ms: Option<Vec<f64>>,
    #[serde(default)]
    fp8: Option<(usize, usize)>,
    #[serde(default)]
    fp8_note: Option<String>,
    #[serde(default)]
    int4_ms: Option<Vec<f64>>,
    #[serde(default)]
    int4_compiled_ms: Option<Vec<f64>>,
    #[serde(default)]
    int4: Option<(usize, usize)>,
    #[serde(default)]
    int4_note: Option<String>,
    #[serde(default)]
    layer_int4pack_ms: Option<Vec<f64>>,
    #[serde(default)]
    int4pack_note: Option<String>,
    #[serde(default)]
    layer_eager_ms: Option<Vec<f64>>,
    #[serde(default)]
    layer_fused_ms: Option<Vec<f64>>,
}

#[derive(Deserialize)]
struct Printed {
    torch: String,
    batches: Vec<PrintedBatch>,
}

/// The lab's planned placements at one batch: FP16's, and FP8's and the
/// 4-bit pass's where the lab has them.
pub struct Planned {
    pub batch: usize,
    pub fp16: Placement,
    pub fp8: Option<Placement>,
    pub int4: Option<Placement>,
}

/// Runs the script with `python` on GPU `device` for the network `shape` and
/// the batches, ring, warm-up and repeats of `cfg`, and the lab's
/// placements `planned`. `Err` says why there is no reference, in a line.
pub fn torch_offload(python: &str, device: usize, shape: Shape, cfg: &OffloadConfig, planned: &[Planned]) -> Result<TorchOffload, String> {
    let placements = planned
        .iter()
        .map(|p| {
            let rk = |q: Option<Placement>| q.map_or((-1, 0), |q| (q.resident as i64, q.ring));
            let ((r8, k8), (r4, k4)) = (rk(p.fp8), rk(p.int4));
            format!("{}:{}:{}:{r8}:{k8}:{r4}:{k4}", p.batch, p.fp16.resident, p.fp16.ring)
        })
        .collect::<Vec<_>>()
        .join(",");
    let batches = cfg.batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let args = [
        format!("--layers={}", shape.layers),
        format!("--d-model={}", shape.d),
        format!("--batches={batches}"),
        format!("--ring={}", cfg.ring),
        format!("--warmup={}", cfg.warmup),
        format!("--repeats={}", cfg.repeats),
        format!("--device={device}"),
        format!("--placements={placements}"),
    ];
    parse(&crate::lab_kit::reference::run_script(python, "torch_offload.py", SCRIPT, &args)?)
}

/// The script's JSON line as times.
fn parse(stdout: &str) -> Result<TorchOffload, String> {
    let line = crate::lab_kit::reference::last_json_line(stdout)?;
    let p: Printed = serde_json::from_str(&line).map_err(|e| format!("the script's result is unreadable: {e}"))?;
    let batches = p
        .batches
        .into_iter()
        .map(|b| {
            let of = |v: &Option<Vec<f64>>| v.as_deref().map(|ms| Summary::of(ms).map_err(|e| e.to_string())).transpose();
            let placed = |p: Option<(usize, usize)>| p.map(|(resident, ring)| Placement { resident, ring });
            Ok(TorchBatch {
                batch: b.batch,
                to_hooks: Summary::of(&b.to_hooks_ms).map_err(|e| e.to_string())?,
                ring: Summary::of(&b.ring_ms).map_err(|e| e.to_string())?,
                beyond: TorchBeyond {
                    fused_ring: of(&b.fused_ring_ms)?,
                    resident: of(&b.resident_ms)?,
                    resident_placement: placed(b.resident),
                    fp8: of(&b.fp8_ms)?,
                    fp8_placement: placed(b.fp8),
                    fp8_note: b.fp8_note,
                    int4: of(&b.int4_ms)?,
                    int4_compiled: of(&b.int4_compiled_ms)?,
                    int4_placement: placed(b.int4),
                    int4_note: b.int4_note,
                    layer_int4pack: of(&b.layer_int4pack_ms)?,
                    int4pack_note: b.int4pack_note,
                    layer_eager: of(&b.layer_eager_ms)?,
                    layer_fused: of(&b.layer_fused_ms)?,
                },
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(TorchOffload { torch: p.torch, batches })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_line_becomes_times_and_a_missing_python_is_a_reason() {
        let t = parse("batch 8: ...\n{\"torch\": \"2.9.0\", \"batches\": [{\"batch\": 8, \"to_hooks_ms\": [3.0, 2.0, 4.0], \"ring_ms\": [1.0]}]}\n").unwrap();
        assert_eq!((t.torch.as_str(), t.batches.len(), t.batches[0].batch), ("2.9.0", 1, 8));
        assert_eq!((t.batches[0].to_hooks.median, t.batches[0].ring.median), (3.0, 1.0));
        assert!(t.batches[0].beyond.passes().is_empty(), "a line from before the passes past the bound has none");
        let t = parse(
            "{\"torch\": \"2.11.0\", \"batches\": [{\"batch\": 8, \"to_hooks_ms\": [3.0], \"ring_ms\": [1.0], \"fused_ring_ms\": [0.9], \"resident_ms\": [0.5], \"resident\": [4, 3], \"fp8_ms\": null, \"fp8\": null, \"fp8_note\": \"no FP8 here\", \"layer_eager_ms\": [0.1], \"layer_fused_ms\": [0.09]}]}",
        )
        .unwrap();
        let b = &t.batches[0].beyond;
        assert_eq!(b.passes().iter().map(|p| p.1.median).collect::<Vec<_>>(), [0.9, 0.5]);
        assert_eq!((b.resident_placement, b.fp8.is_none(), b.fp8_note.as_deref()), (Some(Placement { resident: 4, ring: 3 }), true, Some("no FP8 here")));
        assert_eq!(b.layer_fused.as_ref().unwrap().median, 0.09);
        assert!(b.int4.is_none() && b.int4_placement.is_none(), "a line from before the 4-bit pass has none");
        let t = parse(
            "{\"torch\": \"2.11.0\", \"batches\": [{\"batch\": 8, \"to_hooks_ms\": [3.0], \"ring_ms\": [1.0], \"int4_ms\": [0.7, 0.8, 0.6], \"int4_compiled_ms\": [0.4], \"int4\": [6, 2], \"int4_note\": null, \"layer_int4pack_ms\": null, \"int4pack_note\": \"no torch._weight_int4pack_mm in this PyTorch\"}]}",
        )
        .unwrap();
        let b = &t.batches[0].beyond;
        let passes: Vec<(f64, Variant, usize)> = b.passes().iter().map(|p| (p.1.median, p.2, p.3)).collect();
        assert_eq!(passes, [(0.7, Variant::Int4, 6), (0.4, Variant::Int4, 6)]);
        assert_eq!((b.layer_int4pack.is_none(), b.int4pack_note.as_deref()), (true, Some("no torch._weight_int4pack_mm in this PyTorch")));
        assert!(parse("nothing").is_err());
        let e = torch_offload("/no/such/python", 0, Shape { layers: 2, d: 64 }, &OffloadConfig::small(), &[]).err().unwrap();
        assert!(e.contains("could not be started"), "{e}");
    }
}
