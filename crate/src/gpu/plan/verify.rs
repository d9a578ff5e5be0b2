//! Checking a run's result: every element of the buffer that holds it
//! (`host out`, or a device buffer read back) against what the plan's
//! model says it must hold.

use super::PlanRig;
use crate::error::{LabError, Result};
use crate::gpu::kernels::compute_reference;
use crate::gpu::HostBuffer;
use crate::measure::pattern;
use crate::pipeline::cells::Cells;
use crate::pipeline::cells::Provenance;
use crate::pipeline::plan::{Checked, Plan, OUTPUT};

impl PlanRig {
    /// Checks each buffer `plan` says holds its result against `expected`
    /// (their cells in the plan's model, in the same order): `host out`,
    /// or a device buffer read back into `host out` first.
    pub(super) fn check(&mut self, plan: &Plan, expected: &[&Cells], seed: u64) -> Result<()> {
        for (c, cells) in plan.checked.iter().zip(expected) {
            let name = match *c {
                Checked::HostOut => OUTPUT.to_string(),
                Checked::Device(i) => {
                    let g = plan.device_gpu(i);
                    let (name, elements) = plan.device_buffer(i);
                    let buffer = super::placed(&self.devices, g, i)?;
                    self.setup[g].download(&mut self.host_out, buffer, 4 * elements)?;
                    self.gpu.bind()?;
                    name
                }
            };
            self.verify(&format!("{}: {name}", plan.name), cells, seed)?;
        }
        Ok(())
    }

    /// Checks `host out` (as read, or as a device buffer was read back into
    /// it) against `expected`, naming it `plan` in errors: inputs and untouched poison in
    /// full, kernel outputs at the first and last element of every run of
    /// them and about 4096 places between (the CPU reference costs the
    /// kernel's whole FMA chain per element).
    pub(super) fn verify(&self, plan: &str, expected: &Cells, seed: u64) -> Result<()> {
        compare(pattern::as_f32(self.host_out.words()), expected, seed, self.iterations, plan)
    }
}

/// Compares `got` with what `expected` says each element holds, for data
/// made from `seed` and a kernel of `iterations` FMAs per element; `plan`
/// names the buffer in errors (see [`PlanRig::verify`]).
fn compare(got: &[f32], expected: &Cells, seed: u64, iterations: i32, plan: &str) -> Result<()> {
    let step = (expected.len() / 4096).max(1);
    for (r, p) in expected.runs() {
        let (first, last) = (r.start, r.end - 1);
        match p {
            // Kernel results: each run's edges and about 4096 places
            // between (the CPU reference is the kernel's whole FMA chain).
            Provenance::Output(_) | Provenance::Repeated(..) | Provenance::Summed { .. } => {
                // Over the host's cores: each sample is a chain of
                // `iterations` dependent FMAs on the CPU.
                use rayon::prelude::*;
                let sampled = (first.div_ceil(step) * step..r.end).step_by(step);
                let places: Vec<usize> = std::iter::once(first).chain(sampled).chain(std::iter::once(last)).collect();
                if let Some(e) = places.into_par_iter().find_map_first(|i| check_one(got, i, p.stepped(i - first), seed, iterations, plan).err()) {
                    return Err(e);
                }
            }
            Provenance::Garbage => check_one(got, first, p, seed, iterations, plan)?,
            // Copies and poison: every element, over the host's cores.
            Provenance::Input(_) | Provenance::Unset => {
                if let Some(i) = first_mismatch(&got[r], p, seed) {
                    check_one(got, first + i, p.stepped(i), seed, iterations, plan)?;
                }
            }
        }
    }
    Ok(())
}

/// The first element of `got` that is not what a run of copies or poison
/// starting at `p` holds, over the host's cores. Chunks of 64 Ki elements
/// with a plain loop each: per-element parallel search costs about 20 ns
/// an element in rayon's bookkeeping, ten times the comparison.
fn first_mismatch(got: &[f32], p: Provenance, seed: u64) -> Option<usize> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let poison = pattern::POISON as u32;
    got.par_chunks(CHUNK).enumerate().find_map_first(|(c, chunk)| {
        let base = c * CHUNK;
        match p {
            Provenance::Input(j) => {
                // Two elements per hash where the input's index is even.
                let j = j as usize + base;
                let odd = j % 2;
                let head = (odd == 1 && chunk[0].to_bits() != pattern::f32_at(seed, j).to_bits()).then_some(0);
                head.or_else(|| {
                    let pairs = chunk[odd..].chunks(2).enumerate().position(|(w, xs)| {
                        let want = pattern::f32_pair_at(seed, (j + odd) / 2 + w);
                        xs.iter().zip(want).any(|(x, y)| x.to_bits() != y.to_bits())
                    })?;
                    let k = odd + 2 * pairs;
                    Some(if chunk[k].to_bits() == pattern::f32_at(seed, j + k).to_bits() { k + 1 } else { k })
                })
            }
            _ => chunk.iter().position(|x| x.to_bits() != poison),
        }
        .map(|k| base + k)
    })
}

/// Checks element `i` of `got` against what `want` says it holds (see
/// [`compare`]).
fn check_one(got: &[f32], i: usize, want: Provenance, seed: u64, iterations: i32, plan: &str) -> Result<()> {
    let poison = f32::from_bits(pattern::POISON as u32);
    // The sum of a Summed element's terms' sizes (how far a rounding can move it).
    let mut scale = 0.0f32;
    let value = match want {
        Provenance::Unset => poison,
        Provenance::Input(j) => pattern::f32_at(seed, j as usize),
        Provenance::Output(j) => compute_reference(pattern::f32_at(seed, j as usize), iterations),
        Provenance::Repeated(j, k) => (0..k).fold(pattern::f32_at(seed, j as usize), |x, _| compute_reference(x, iterations)),
        Provenance::Summed { first, stride, ranks, passes } => {
            let pass = |j: u32| (0..passes).fold(pattern::f32_at(seed, j as usize), |x, _| compute_reference(x, iterations));
            let terms: Vec<f32> = (0..ranks as u32).map(|r| pass(first + r * stride)).collect();
            scale = terms.iter().map(|t| t.abs()).sum();
            terms.into_iter().reduce(|sum, x| sum + x).unwrap_or(0.0)
        }
        Provenance::Garbage => {
            return Err(LabError::schedule(format!(
                "{plan} element {i} comes from a kernel run on data that was never uploaded, or from a sum of elements no input holds"
            )))
        }
    };
    // Two ranks' sum is the same whichever adds first; more ranks
    // are summed in an order NCCL chooses (a rounding apart).
    let close = match want {
        Provenance::Summed { ranks, .. } if ranks > 2 => (got[i] - value).abs() <= 2.0 * f32::EPSILON * ranks as f32 * scale,
        _ => false,
    };
    if got[i].to_bits() != value.to_bits() && !close {
        let what = if got[i].to_bits() == poison.to_bits() { " (never written: still poison)".to_string() } else { String::new() };
        return Err(LabError::wrong_data(plan.to_string(), i, format!("got {}{what}, expected {value} ({want:?})", got[i])));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What checking a lab-sized result costs (16 Mi elements): printed,
    /// run with --ignored --nocapture.
    #[test]
    #[ignore]
    fn checking_a_large_result_is_quick() {
        let (seed, n) = (3, 1 << 24);
        let out: Vec<f32> = (0..n).map(|i| compute_reference(pattern::f32_at(seed, i), 100)).collect();
        let copied: Vec<f32> = (0..n).map(|i| pattern::f32_at(seed, i)).collect();
        let t = std::time::Instant::now();
        compare(&out, &Cells::run(n, Provenance::Output(0)), seed, 100, "plan").unwrap();
        let outputs = t.elapsed();
        let t = std::time::Instant::now();
        compare(&copied, &Cells::run(n, Provenance::Input(0)), seed, 100, "plan").unwrap();
        println!("outputs {outputs:?}, inputs {:?}", t.elapsed());
        let poison = vec![f32::from_bits(pattern::POISON as u32); n];
        let t = std::time::Instant::now();
        compare(&poison, &Cells::run(n, Provenance::Unset), seed, 100, "plan").unwrap();
        println!("unset {:?}", t.elapsed());
    }

    #[test]
    fn poison_a_wrong_value_and_a_sum_rounded_by_nccl_are_told_apart() {
        let seed = 7;
        let n = 64;
        let expected = Cells::run(n, Provenance::Output(0));
        let good: Vec<f32> = (0..n).map(|i| compute_reference(pattern::f32_at(seed, i), 10)).collect();
        compare(&good, &expected, seed, 10, "plan: host out").unwrap();
        let mut poisoned = good.clone();
        poisoned[n - 1] = f32::from_bits(pattern::POISON as u32);
        let e = compare(&poisoned, &expected, seed, 10, "plan: host out").unwrap_err().to_string();
        assert!(e.contains("element 63") && e.contains("never written: still poison"), "{e}");
        let mut off = good.clone();
        off[0] += 1.0;
        let e = compare(&off, &expected, seed, 10, "plan: host out").unwrap_err().to_string();
        assert!(e.contains("element 0") && !e.contains("poison"), "{e}");
        // The same results of another FMA count are wrong at the runs' edges.
        assert!(compare(&good, &expected, seed, 11, "plan").is_err());
        // Inputs are checked at every element, kernel outputs at the edges.
        let inputs = Cells::run(n, Provenance::Input(0));
        let mut copied: Vec<f32> = (0..n).map(|i| pattern::f32_at(seed, i)).collect();
        compare(&copied, &inputs, seed, 10, "plan").unwrap();
        copied[33] = 0.5;
        assert!(compare(&copied, &inputs, seed, 10, "plan").unwrap_err().to_string().contains("element 33"));
        // The first wrong element is named wherever it is: inputs starting
        // at an odd or even index, one or several chunks long.
        for (start, len) in [(0, 7), (1, 7), (5, 200_000), (6, 200_000)] {
            let inputs = Cells::run(len, Provenance::Input(start));
            let good: Vec<f32> = (0..len).map(|i| pattern::f32_at(seed, start as usize + i)).collect();
            compare(&good, &inputs, seed, 10, "plan").unwrap();
            for bad in [0, 1, 2, len / 2, len / 2 + 1, (1 << 16) + 1, len - 2, len - 1].into_iter().filter(|&b| b < len) {
                let mut got = good.clone();
                got[bad] = 2.0;
                got[len - 1] = 3.0;
                let e = compare(&got, &inputs, seed, 10, "plan").unwrap_err().to_string();
                assert!(e.contains(&format!("element {bad} ")) || e.contains(&format!("element {bad}:")), "start {start}, wrong at {bad}: {e}");
            }
        }
        let garbage = Cells::run(n, Provenance::Garbage);
        assert!(compare(&copied, &garbage, seed, 10, "plan").unwrap_err().to_string().contains("never uploaded"));
    }
}
