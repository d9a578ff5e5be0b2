//! The lab kit: what every lab is made of, and nothing of any one lab.
//! The lab table's entry ([`table`]: a lab's name, settings, run,
//! recording and report, from which the command line and the report are
//! derived), exercise verdicts ([`check`]) and the checker of a learner's
//! loop ([`loop_check`]), experiments of variants measured beside the queue
//! model ([`experiment`]), the figures behind a lab's headline and how
//! long each lab runs ([`headline`]), a learner's progress through the exercises
//! ([`progress`]), the PyTorch references run beside a lab ([`mod@reference`]),
//! host memory as labs 1 and 6 acquire it
//! ([`host_memory`]), live-or-recorded runs for the notebooks
//! ([`LabRun`]), and the calibration every lab's kernel goes through
//! ([`calibrate_iterations`]).
//!
//! May use: `error`, `units`, `measure`, `pipeline`, the safe types of
//! `gpu`, `present`. Never `labs`: a lab uses the kit, not the other way.

pub mod check;
pub mod experiment;
pub mod headline;
pub mod host_memory;
pub mod loop_check;
mod notebook;
pub mod progress;
pub mod reference;
pub mod table;

pub use notebook::{live_here, LabRun, Source};
pub use table::{Entry, Kept, Lab, LabConfig, PartsMade, Preset, Recorded, RunContext, Word};

use crate::error::{LabError, Result};
use crate::measure::stats::{Efficiency, Summary};

/// The bound of a two-stage pipeline over `n` items whose stages take `a`
/// and `b` each: n·max(a, b) + min(a, b) (the slower stage every item, the
/// faster one once to fill the pipeline). Lab 3 (copy, kernel), lab 4
/// (GPU, CPU) and lab 9 (upload, layer) are judged against it.
pub fn two_stage_bound_ms(n: usize, a: f64, b: f64) -> f64 {
    n as f64 * a.max(b) + a.min(b)
}

/// [`two_stage_bound_ms`] from each stage timed alone, at its fast end
/// (the rule of every bound: see [`Efficiency`]).
pub fn two_stage_bound(n: usize, a: &Summary, b: &Summary) -> f64 {
    two_stage_bound_ms(n, a.fast_end(), b.fast_end())
}

/// A run of a two-stage pipeline against [`two_stage_bound`].
pub fn two_stage_efficiency(n: usize, a: &Summary, b: &Summary, measured: &Summary) -> Efficiency {
    Efficiency::new(two_stage_bound(n, a, b), &[a, b], measured)
}

/// FMAs per element that make a kernel take `target_ms`, from its time at
/// two work levels (kernel time is linear in the work). `time` runs the
/// kernel with the given iterations and returns its median ms.
///
/// The heavier level starts at 1024 FMAs and grows 8x at a time until the
/// kernel takes clearly longer than at the light level: under a sanitizer
/// or a profiler, a kernel's fixed cost can be so large that 1024 FMAs do
/// not show, while the slope found further out is still the kernel's own.
pub fn calibrate_iterations(target_ms: f64, mut time: impl FnMut(i32) -> Result<f64>) -> Result<i32> {
    const LO: i32 = 64;
    const MAX: i32 = crate::gpu::kernels::MAX_FMA_CHAIN;
    let mut t_lo = time(LO)?;
    let mut hi = 1024;
    loop {
        // Each level twice, interleaved, keeping its fastest time: a fixed
        // cost can only inflate a time, and under Nsight Compute the first
        // launches are replayed for profiling and take 100x longer.
        let first_hi = time(hi)?;
        t_lo = t_lo.min(time(LO)?);
        let t_hi = first_hi.min(time(hi)?);
        // Growth that launch noise cannot fake: 20% and 5 µs over the light kernel.
        if t_hi > 1.2 * t_lo && t_hi - t_lo > 0.005 {
            let per_iter = (t_hi - t_lo) / (hi - LO) as f64;
            let fixed = t_lo - per_iter * LO as f64;
            return Ok((((target_ms - fixed) / per_iter).round() as i64).clamp(1, MAX as i64) as i32);
        }
        if hi >= MAX {
            return Err(LabError::calibration(
                format!(
                    "the kernel took {} at {LO} FMAs per element and {} at {hi}: its time does not grow with its work",
                    crate::units::fmt_ms(t_lo),
                    crate::units::fmt_ms(t_hi)
                ),
                "Something other than the kernel sets its time: another process on this GPU, or a profiler or sanitizer that serializes launches. Run on an idle GPU, without the tool, to measure",
            ));
        }
        hi = (hi * 8).min(MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_fits_a_line_and_looks_further_when_the_fixed_cost_hides_the_work() {
        // 0.5 ms fixed + 1 µs per FMA: 64 and 1024 are enough.
        let it = calibrate_iterations(2.5, |i| Ok(0.5 + 1e-3 * i as f64)).unwrap();
        assert_eq!(it, 2000);
        // 400 ms fixed (a sanitizer) + 1 µs per FMA: 1024 FMAs add 0.2%,
        // so the heavier level grows until the work shows.
        let mut asked = Vec::new();
        let it = calibrate_iterations(500.0, |i| {
            asked.push(i);
            Ok(400.0 + 1e-3 * i as f64)
        })
        .unwrap();
        assert_eq!(it, 100_000);
        assert!(asked.len() > 2 && asked.iter().any(|&i| i > 1024), "{asked:?}");
        // A profiler that slows the first launches 100x (Nsight Compute's
        // replays) inflates the light level only at first: its later, faster
        // time is the one that counts.
        let mut launches = 0;
        let it = calibrate_iterations(2.5, |i| {
            launches += 1;
            Ok(0.5 + 1e-3 * i as f64 + if launches <= 2 { 300.0 } else { 0.0 })
        })
        .unwrap();
        assert_eq!(it, 2000);
    }

    #[test]
    fn a_two_stage_bound_takes_each_stage_at_its_fast_end() {
        // Stage a's median is 2.0 but its fastest quarter reads 1.5: a few
        // slow runs of a part do not lift the bound.
        let a = Summary::of(&[1.4, 1.5, 2.0, 2.1, 2.2]).unwrap();
        let b = Summary::of(&[1.0, 1.0, 1.0, 1.0, 1.0]).unwrap();
        assert_eq!(a.fast_end(), 1.5);
        assert_eq!(two_stage_bound(10, &a, &b), 10.0 * 1.5 + 1.0);
        let run = Summary::of(&[16.0, 16.0, 17.0, 18.0, 18.0]).unwrap();
        let e = two_stage_efficiency(10, &a, &b, &run);
        // The low end of the range is widened by the parts' own spread: a's
        // middle half reads 1.5..2.1, 40% of its fast end.
        assert_eq!((e.bound_ms, e.ratio, e.parts_spread), (16.0, 16.0 / 17.0, (2.1 - 1.5) / 1.5));
        assert_eq!(e.range, (16.0 * (1.0 - e.parts_spread) / 18.0, 1.0));
    }

    #[test]
    fn a_kernel_whose_time_never_grows_is_a_calibration_error_not_a_data_error() {
        let e = calibrate_iterations(2.0, |_| Ok(1.0)).unwrap_err();
        assert!(matches!(e, LabError::Calibration { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.starts_with("calibration failed:") && msg.contains("does not grow") && msg.contains("sanitizer"), "{msg}");
        assert!(!msg.contains("verification"), "{msg}");
        // A target below the fixed cost asks for the lightest kernel, not a negative one.
        assert_eq!(calibrate_iterations(0.1, |i| Ok(0.5 + 1e-3 * i as f64)).unwrap(), 1);
    }
}
