//! PyTorch's copy between the same two GPUs, and its all-reduce over the
//! same GPUs, measured in the same run as the lab's own (the issue's
//! references): `crate/reference/torch_peer_copy.py` and
//! `torch_all_reduce.py`, carried inside the binary and run with the
//! Python that has PyTorch. Their absence is a line in the results, never
//! a failed lab.

use super::all_reduce;
use crate::measure::stats::Summary;
use serde::{Deserialize, Serialize};

/// The copy's script, as in `crate/reference/`.
pub const SCRIPT: &str = include_str!("../../../reference/torch_peer_copy.py");

/// The all-reduce's script, as in `crate/reference/`.
pub const ALL_REDUCE_SCRIPT: &str = include_str!("../../../reference/torch_all_reduce.py");

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

/// PyTorch's all-reduce (torch.distributed over NCCL, one process per
/// GPU, a float32 sum in place) per size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TorchAllReduce {
    pub torch: String,
    /// The NCCL PyTorch ran, "2.27.7".
    pub nccl: String,
    /// The GPUs, by rank.
    pub gpus: Vec<usize>,
    /// (bytes each GPU sums, ms per all-reduce) per size, in the order asked.
    pub points: Vec<(u64, Summary)>,
}

impl TorchAllReduce {
    /// Each size's bus bandwidth, GB/s (`all_reduce::bus_gbps` over
    /// these GPUs; NaN where a time by difference came out 0 or less).
    pub fn bus_gbps(&self) -> Vec<(u64, Summary)> {
        let ranks = self.gpus.len();
        self.points.iter().map(|&(bytes, ms)| (bytes, ms.map_decreasing(|ms| all_reduce::bus_gbps(bytes as f64, ms, ranks)))).collect()
    }
}

#[derive(Deserialize)]
struct PrintedAllReduce {
    torch: String,
    nccl: String,
    gpus: Vec<usize>,
    sizes: Vec<u64>,
    ms: Vec<Vec<f64>>,
}

/// Runs the all-reduce script with `python` over `gpus` (one process
/// each) at each of `sizes` (bytes each GPU sums), each all-reduce timed
/// as `copies` all-reduces minus one, `runs` times (as the lab times its
/// own). `Err` says why there is no reference (no Python, no PyTorch, a
/// failed rank), in a line.
pub fn torch_all_reduce(python: &str, gpus: &[usize], sizes: &[u64], (copies, runs): (usize, usize)) -> Result<TorchAllReduce, String> {
    let list = |v: Vec<String>| v.join(",");
    let args = [
        format!("--gpus={}", list(gpus.iter().map(usize::to_string).collect())),
        format!("--sizes-bytes={}", list(sizes.iter().map(u64::to_string).collect())),
        format!("--copies={copies}"),
        format!("--runs={runs}"),
    ];
    parse_all_reduce(&crate::lab_kit::reference::run_script(python, "torch_all_reduce.py", ALL_REDUCE_SCRIPT, &args)?)
}

/// The all-reduce script's JSON line as times per size.
fn parse_all_reduce(stdout: &str) -> Result<TorchAllReduce, String> {
    let line = crate::lab_kit::reference::last_json_line(stdout)?;
    let p: PrintedAllReduce = serde_json::from_str(&line).map_err(|e| format!("the script's result is unreadable: {e}"))?;
    if p.sizes.len() != p.ms.len() {
        return Err(format!("the script's result is unreadable: {} sizes but {} lists of times", p.sizes.len(), p.ms.len()));
    }
    let points = p
        .sizes
        .iter()
        .zip(&p.ms)
        .map(|(&bytes, ms)| Summary::of(ms).map(|s| (bytes, s)).map_err(|e| format!("the script's times at {bytes} bytes: {e}")))
        .collect::<Result<_, String>>()?;
    Ok(TorchAllReduce { torch: p.torch, nccl: p.nccl, gpus: p.gpus, points })
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

    #[test]
    fn the_all_reduce_scripts_line_becomes_times_and_bus_bandwidths() {
        let out = "NCCL INFO ...\n{\"torch\": \"2.9.0\", \"nccl\": \"2.27.7\", \"gpus\": [0, 1, 2, 3], \"sizes\": [1000000, 4000000], \"ms\": [[0.02, 0.01, 0.04], [0.015]]}\n";
        let t = parse_all_reduce(out).unwrap();
        assert_eq!((t.torch.as_str(), t.nccl.as_str(), t.gpus.as_slice()), ("2.9.0", "2.27.7", &[0, 1, 2, 3][..]));
        assert_eq!(t.points.iter().map(|p| (p.0, p.1.median, p.1.n)).collect::<Vec<_>>(), [(1_000_000, 0.02, 3), (4_000_000, 0.015, 1)]);
        // 1 MB in 0.02 ms is 50 GB/s of algorithm bandwidth; over 4 GPUs a
        // link carries 2·3/4 of it: 75 GB/s; the fastest run bounds the max.
        let bus = t.bus_gbps();
        assert!((bus[0].1.median - 75.0).abs() < 1e-9 && (bus[0].1.max - 150.0).abs() < 1e-9 && (bus[0].1.min - 37.5).abs() < 1e-9, "{bus:?}");
        assert_eq!(bus[1].0, 4_000_000);
        assert!(parse_all_reduce("nothing").unwrap_err().contains("no result"));
        assert!(parse_all_reduce("{\"torch\": 1}").unwrap_err().contains("unreadable"));
        let e = parse_all_reduce("{\"torch\": \"2\", \"nccl\": \"2\", \"gpus\": [0], \"sizes\": [8, 16], \"ms\": [[1.0]]}").unwrap_err();
        assert!(e.contains("2 sizes but 1 lists"), "{e}");
        assert!(parse_all_reduce("{\"torch\": \"2\", \"nccl\": \"2\", \"gpus\": [0], \"sizes\": [8], \"ms\": [[]]}").unwrap_err().contains("at 8 bytes"));
        let e = torch_all_reduce("/no/such/python3", &[0, 1], &[1 << 20], (3, 1)).unwrap_err();
        assert!(e.contains("could not be started"), "{e}");
        assert!(ALL_REDUCE_SCRIPT.contains("def main()") && ALL_REDUCE_SCRIPT.contains("dist.all_reduce(x)") && ALL_REDUCE_SCRIPT.contains("NCCL_NVLS_ENABLE"));
    }
}
