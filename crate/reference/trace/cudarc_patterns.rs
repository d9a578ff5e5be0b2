//! A learner's CUDA program in Rust, on cudarc alone (no overlap-lab code):
//! what `overlap-lab trace -- cudarc_patterns MODE` traces and diagnoses,
//! beside `patterns.cu` (the same kernel, batch sizes, CPU work and checks).
//!
//! - `pageable`: one stream; each batch uploaded from a `Vec`, computed,
//!   downloaded into a `Vec`.
//! - `pinned`: the same through page-locked buffers (`alloc_pinned_with_flags`):
//!   pageable's fix.
//! - `copy-stream`: pinned, the uploads on a stream of their own into two
//!   device buffers used in turn. cudarc orders the two streams itself (it
//!   records an event where a buffer is written and waits for it where the
//!   buffer is read): pinned's fix.
//!
//! Build: `cargo build --release --example cudarc_patterns`.
//! Usage: `cudarc_patterns MODE [batches (20)] [MiB per batch (32)]`; prints
//! its loop's wall time and how many outputs it checked.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, HostSlice, LaunchConfig, PinnedHostSlice, PushKernelArg};

/// `patterns.cu`'s kernel (`work.cuh`, shared by the three programs).
const KERNEL: &str = include_str!("work.cuh");
const ITERS: i32 = 2400;

/// A batch's host buffer: a `Vec` (pageable) or page-locked memory.
trait Host: HostSlice<f32> {
    fn values(&mut self) -> Result<&mut [f32], DriverError>;
    fn read(&self) -> Result<&[f32], DriverError>;
}

impl Host for Vec<f32> {
    fn values(&mut self) -> Result<&mut [f32], DriverError> {
        Ok(self)
    }
    fn read(&self) -> Result<&[f32], DriverError> {
        Ok(self)
    }
}

impl Host for PinnedHostSlice<f32> {
    fn values(&mut self) -> Result<&mut [f32], DriverError> {
        self.as_mut_slice()
    }
    fn read(&self) -> Result<&[f32], DriverError> {
        self.as_slice()
    }
}

/// Batch k's input value i, as `patterns.cu` writes it.
fn input(i: usize, k: usize) -> f32 {
    ((i * 7 + k * 13) % 1000) as f32
}

/// Every batch's host input and output, the outputs poisoned (-1 is a
/// value the kernel never writes).
fn fill<H: Host>(inputs: &mut [H], outputs: &mut [H]) -> Result<(), DriverError> {
    for (k, (i, o)) in inputs.iter_mut().zip(outputs.iter_mut()).enumerate() {
        for (j, v) in i.values()?.iter_mut().enumerate() {
            *v = input(j, k);
        }
        o.values()?.fill(-1.0);
    }
    Ok(())
}

/// The CPU's own work on batch k before it is issued (a fresh eighth of its input).
fn produce<H: Host>(input_k: &mut H, k: usize) -> Result<(), DriverError> {
    let values = input_k.values()?;
    let eighth = values.len() / 8;
    for (j, v) in values[..eighth].iter_mut().enumerate() {
        *v = input(j, k);
    }
    Ok(())
}

fn launch(stream: &Arc<CudaStream>, work: &CudaFunction, input: &CudaSlice<f32>, output: &mut CudaSlice<f32>) -> Result<(), DriverError> {
    let n = input.len() as u64;
    let cfg = LaunchConfig { grid_dim: (264, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (a, b) = (1.0f32, 0.0f32);
    let mut args = stream.launch_builder(work);
    args.arg(input).arg(output).arg(&n).arg(&ITERS).arg(&a).arg(&b);
    // SAFETY: the arguments match `work`'s signature (two float pointers of
    // n values each, n, iters, a, b), and both buffers hold n values.
    unsafe { args.launch(cfg) }.map(|_| ())
}

/// Every batch: the CPU's work on it, upload, compute, download; uploads on
/// `copy` (into `inputs_on_gpu[k % len]`), the rest on `compute`. Returns the
/// loop's wall time, ms.
fn run<H: Host>(
    copy: &Arc<CudaStream>,
    compute: &Arc<CudaStream>,
    work: &CudaFunction,
    host: (&mut [H], &mut [H]),
    inputs_on_gpu: &mut [CudaSlice<f32>],
    output_on_gpu: &mut CudaSlice<f32>,
) -> Result<f64, DriverError> {
    let (inputs, outputs) = host;
    compute.context().synchronize()?;
    let t0 = Instant::now();
    for (k, (input_k, output_k)) in inputs.iter_mut().zip(outputs.iter_mut()).enumerate() {
        produce(input_k, k)?;
        let slot = k % inputs_on_gpu.len();
        copy.memcpy_htod(input_k, &mut inputs_on_gpu[slot])?;
        launch(compute, work, &inputs_on_gpu[slot], output_on_gpu)?;
        compute.memcpy_dtoh(output_on_gpu, output_k)?;
    }
    compute.context().synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

/// Every output against the CPU's answer; the number checked, or the first wrong one.
fn check<H: Host>(outputs: &[H]) -> Result<usize, String> {
    let mut checked = 0;
    for (k, o) in outputs.iter().enumerate() {
        for (i, &v) in o.read().map_err(|e| e.to_string())?.iter().enumerate() {
            if v != input(i, k) + 1.0 {
                return Err(format!("batch {k}: element {i} is {v}, want {}", input(i, k) + 1.0));
            }
        }
        checked += o.len();
    }
    Ok(checked)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!("usage: {} pageable|pinned|copy-stream [batches (20, at most 1000)] [MiB per batch (32, at most 4096)]", args[0]);
        std::process::exit(64)
    };
    let Some(mode) = args.get(1).map(String::as_str) else { usage() };
    // Whole numbers from 1 to `most` (the host holds every batch twice).
    let number = |at: usize, default: usize, most: usize| {
        args.get(at).map_or(Some(default), |a| a.parse().ok().filter(|&v| v > 0 && v <= most)).unwrap_or_else(|| usage())
    };
    let (batches, mib) = (number(2, 20, 1000), number(3, 32, 4096));
    if !matches!(mode, "pageable" | "pinned" | "copy-stream") {
        usage()
    }
    match measure(mode, batches, mib) {
        Ok((ms, checked)) => println!("cudarc_patterns {mode}: {batches} batches of {mib} MiB in {ms:.2} ms (wall), {checked} values checked"),
        Err(e) => {
            eprintln!("cudarc_patterns {mode}: {e}");
            std::process::exit(1)
        }
    }
}

fn measure(mode: &str, batches: usize, mib: usize) -> Result<(f64, usize), String> {
    let fail = |e: DriverError| e.to_string();
    // SAFETY: only probes whether the driver library loads (cudarc panics
    // on its first call where it does not).
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda) on this machine".into());
    }
    // SAFETY: as above, for NVRTC, which compiles the kernel.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("no NVRTC (libnvrtc) on this machine".into());
    }
    let ctx = CudaContext::new(0).map_err(fail)?;
    let ptx = cudarc::nvrtc::compile_ptx(KERNEL).map_err(|e| e.to_string())?;
    let work = ctx.load_module(ptx).map_err(fail)?.load_function("work").map_err(fail)?;
    let compute = ctx.new_stream().map_err(fail)?;
    let copy = if mode == "copy-stream" { ctx.new_stream().map_err(fail)? } else { compute.clone() };
    let n = mib * (1 << 20) / 4;
    let slots = if mode == "copy-stream" { 2 } else { 1 };
    // Left unset (`alloc_zeros` would clear them with memsets before the
    // loop): every value is written by an upload or the kernel before it
    // is read.
    // SAFETY: as said: no value is read before it is written.
    let buffer = || unsafe { compute.alloc::<f32>(n) };
    let mut inputs_on_gpu = (0..slots).map(|_| buffer()).collect::<Result<Vec<_>, _>>().map_err(fail)?;
    let mut output_on_gpu = buffer().map_err(fail)?;
    if mode == "pageable" {
        let (mut inputs, mut outputs) = (vec![vec![0f32; n]; batches], vec![vec![0f32; n]; batches]);
        fill(&mut inputs, &mut outputs).map_err(fail)?;
        let ms = run(&copy, &compute, &work, (&mut inputs, &mut outputs), &mut inputs_on_gpu, &mut output_on_gpu).map_err(fail)?;
        return Ok((ms, check(&outputs)?));
    }
    // Plain page-locked memory (flags 0, as cudaMallocHost gives): cudarc's
    // `alloc_pinned` asks for write-combined memory, which the CPU reads
    // back slowly.
    // SAFETY: every value is written by `fill` before any is read.
    let pinned = || unsafe { ctx.alloc_pinned_with_flags::<f32>(n, 0) };
    let mut inputs = (0..batches).map(|_| pinned()).collect::<Result<Vec<_>, _>>().map_err(fail)?;
    let mut outputs = (0..batches).map(|_| pinned()).collect::<Result<Vec<_>, _>>().map_err(fail)?;
    fill(&mut inputs, &mut outputs).map_err(fail)?;
    let ms = run(&copy, &compute, &work, (&mut inputs, &mut outputs), &mut inputs_on_gpu, &mut output_on_gpu).map_err(fail)?;
    Ok((ms, check(&outputs)?))
}
