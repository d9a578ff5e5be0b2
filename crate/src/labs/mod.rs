//! One module per lab. Each has `measure` (runs on the GPU), `model` (what
//! the numbers should be and what they mean), `exercise` (the checker),
//! `charts` (plotters), and its record type.

pub mod bandwidth;
pub mod callback;
pub mod double_buffer;
pub mod overlap;

use crate::error::{LabError, Result};

/// The bound of a two-stage pipeline over `n` items whose stages take `a`
/// and `b` each: n·max(a, b) + min(a, b) (the slower stage every item, the
/// faster one once to fill the pipeline). Lab 3 (copy, kernel) and lab 4
/// (GPU, CPU) are judged against it.
pub fn two_stage_bound_ms(n: usize, a: f64, b: f64) -> f64 {
    n as f64 * a.max(b) + a.min(b)
}

/// FMAs per element that make a kernel take `target_ms`, from its time at
/// two work levels (kernel time is linear in the work). `time` runs the
/// kernel with the given iterations and returns its median ms.
pub fn calibrate_iterations(target_ms: f64, mut time: impl FnMut(i32) -> Result<f64>) -> Result<i32> {
    let (lo, hi) = (64, 1024);
    let (t_lo, t_hi) = (time(lo)?, time(hi)?);
    let per_iter = (t_hi - t_lo) / (hi - lo) as f64;
    if per_iter <= 0.0 {
        return Err(LabError::Verification(format!("kernel time did not grow with work ({t_lo} ms at {lo}, {t_hi} ms at {hi})")));
    }
    let fixed = t_lo - per_iter * lo as f64;
    Ok((((target_ms - fixed) / per_iter).round() as i64).clamp(1, 1 << 20) as i32)
}
