//! PyTorch's copy between the same two GPUs, measured in the same run as
//! the lab's own (the reference): `crate/reference/torch_peer_copy.py`,
//! carried inside the binary and run with the Python that has PyTorch.
//! Its absence is a line in the results, never a failed lab.

use crate::measure::stats::Summary;
use serde::{Deserialize, Serialize};

/// The script, as in `crate/reference/`.
pub const SCRIPT: &str = include_str!("../../../reference/torch_peer_copy.py");

/// PyTorch's bandwidths, GB/s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TorchPeer {
    pub torch: String,
    pub bytes: u64,
    pub one_way: Summary,
    pub both_ways: Summary,
}

#[derive(Deserialize)]
struct Printed {
    torch: String,
    bytes: u64,
    one_way_ms: Vec<f64>,
    both_ways_ms: Vec<f64>,
}

/// Runs the script with `python` between GPUs `from` and `to` at `bytes`,
/// each copy timed as `copies` copies minus one, `runs` times (as the lab
/// times its own). `Err` says why there is no reference (no Python, no
/// PyTorch, a failed copy), in a line.
pub fn torch_peer(python: &str, (from, to): (usize, usize), bytes: usize, (copies, runs): (usize, usize)) -> Result<TorchPeer, String> {
    let args = [format!("--from={from}"), format!("--to={to}"), format!("--bytes={bytes}"), format!("--copies={copies}"), format!("--runs={runs}")];
    parse(&crate::lab_kit::reference::run_script(python, "torch_peer_copy.py", SCRIPT, &args)?)
}

/// The script's JSON line as bandwidths.
fn parse(stdout: &str) -> Result<TorchPeer, String> {
    let line = crate::lab_kit::reference::last_json_line(stdout)?;
    let p: Printed = serde_json::from_str(&line).map_err(|e| format!("the script's result is unreadable: {e}"))?;
    let to_gbps = |ms: &[f64]| -> Result<Summary, String> {
        let s = Summary::of(ms).map_err(|e| e.to_string())?;
        Ok(s.map_decreasing(|ms| if ms > 0.0 { p.bytes as f64 / ms / 1e6 } else { f64::NAN }))
    };
    Ok(TorchPeer { torch: p.torch.clone(), bytes: p.bytes, one_way: to_gbps(&p.one_way_ms)?, both_ways: to_gbps(&p.both_ways_ms)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_line_becomes_bandwidths_and_a_missing_python_is_a_reason() {
        let p = parse("warming up\n{\"torch\": \"2.9.0\", \"bytes\": 1000000, \"one_way_ms\": [0.01, 0.02, 0.01], \"both_ways_ms\": [0.02]}\n").unwrap();
        assert_eq!((p.torch.as_str(), p.bytes), ("2.9.0", 1_000_000));
        assert!((p.one_way.median - 100.0).abs() < 1e-9 && (p.one_way.min - 50.0).abs() < 1e-9, "{p:?}");
        assert!(parse("nothing").unwrap_err().contains("no result"));
        assert!(parse("{\"torch\": 1}").unwrap_err().contains("unreadable"));
        let e = torch_peer("/no/such/python3", (0, 1), 1 << 20, (3, 1)).unwrap_err();
        assert!(e.contains("could not be started"), "{e}");
        assert!(SCRIPT.contains("def main()") && SCRIPT.contains("copy_"));
    }
}
