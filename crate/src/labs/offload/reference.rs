//! PyTorch's two ways of running the same network, measured in the same run
//! as the lab's own passes: `crate/reference/torch_offload.py` (weights
//! moved per layer by `.to("cuda")` in forward hooks, and the best
//! hand-written pinned ring), carried inside the binary and run with the
//! Python that has PyTorch. Its absence is a line in the results, never a
//! failed lab.

use super::{OffloadConfig, Shape};
use crate::measure::stats::Summary;
use serde::Deserialize;

/// The script, as in `crate/reference/`.
pub const SCRIPT: &str = include_str!("../../../reference/torch_offload.py");

/// PyTorch's times at one batch size, ms.
pub struct TorchBatch {
    pub batch: usize,
    pub to_hooks: Summary,
    pub ring: Summary,
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
}

#[derive(Deserialize)]
struct Printed {
    torch: String,
    batches: Vec<PrintedBatch>,
}

/// Runs the script with `python` on GPU `device` for the network `shape` and
/// the batches, ring, warm-up and repeats of `cfg`. `Err` says why there
/// is no reference, in a line.
pub fn torch_offload(python: &str, device: usize, shape: Shape, cfg: &OffloadConfig) -> Result<TorchOffload, String> {
    let batches = cfg.batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let args = [
        format!("--layers={}", shape.layers),
        format!("--d-model={}", shape.d),
        format!("--batches={batches}"),
        format!("--ring={}", cfg.ring),
        format!("--warmup={}", cfg.warmup),
        format!("--repeats={}", cfg.repeats),
        format!("--device={device}"),
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
            Ok(TorchBatch {
                batch: b.batch,
                to_hooks: Summary::of(&b.to_hooks_ms).map_err(|e| e.to_string())?,
                ring: Summary::of(&b.ring_ms).map_err(|e| e.to_string())?,
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
        assert!(parse("nothing").is_err());
        let e = torch_offload("/no/such/python", 0, Shape { layers: 2, d: 64 }, &OffloadConfig::small()).err().unwrap();
        assert!(e.contains("could not be started"), "{e}");
    }
}
