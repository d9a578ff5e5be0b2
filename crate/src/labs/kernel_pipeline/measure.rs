//! Lab 7 on the GPU: each tile kernel run over the same data, timed by CUDA
//! events, verified against the CPU reference, beside the device-memory
//! ceiling (a large device-to-device copy) measured in the same run.

use crate::error::{LabError, Result};
use crate::gpu::kernels::{blur_reference, BLUR_RADIUS};
use crate::gpu::{DeviceBuffer, Event, Gpu, HostBuffer, KernelResources, PinnedBuffer, Stream, TileKernel};
use crate::measure::pattern;
use crate::measure::stats::Summary;
use serde::{Deserialize, Serialize};

/// The device buffers and host staging every kernel of one run shares.
pub struct TileData {
    /// Outputs (a multiple of every tile size the run takes).
    pub n: usize,
    padded_host: PinnedBuffer,
    result_host: PinnedBuffer,
    padded: DeviceBuffer,
    output: DeviceBuffer,
    /// The CPU reference of the current input.
    reference: Vec<f32>,
    stream: Stream,
    timing: (Event, Event),
}

impl TileData {
    /// Buffers for `n` outputs (`n` a multiple of 4).
    pub fn new(gpu: &Gpu, n: usize) -> Result<TileData> {
        if n == 0 || n % 4 != 0 {
            return Err(LabError::config(format!("lab 7's data: {n} elements must be a positive multiple of 4")));
        }
        let padded_bytes = (n + 2 * BLUR_RADIUS) * 4;
        gpu.ensure_free((padded_bytes + n * 4) as u64, "lab 7's input and output")?;
        Ok(TileData {
            n,
            padded_host: PinnedBuffer::new(gpu, padded_bytes)?,
            result_host: PinnedBuffer::new(gpu, n * 4)?,
            padded: gpu.alloc(padded_bytes)?,
            output: gpu.alloc(n * 4)?,
            reference: vec![0.0; n],
            stream: gpu.stream()?,
            timing: (gpu.timing_event()?, gpu.timing_event()?),
        })
    }

    /// Fresh random input (zero padding at both ends) on the device, and
    /// its CPU reference.
    pub fn refresh(&mut self) -> Result<()> {
        pattern::fill_f32(self.padded_host.words_mut(), pattern::fresh_seed());
        let padded = pattern::as_f32_mut(self.padded_host.words_mut());
        let len = padded.len();
        padded[..BLUR_RADIUS].fill(0.0);
        padded[len - BLUR_RADIUS..].fill(0.0);
        blur_reference(padded, &mut self.reference);
        self.stream.upload(&self.padded, &self.padded_host, len * 4)
    }

    /// The device-to-device copy of the n inputs into the output buffer
    /// (read n, write n: the same bytes as a kernel's useful traffic), ms.
    pub fn copy_ms(&self) -> Result<f64> {
        self.stream.copy_on_device(&self.output, &self.padded, self.n * 4, (&self.timing.0, &self.timing.1))
    }

    /// Poisons the output, runs `kernel` once untimed and `reps` times
    /// timed, then checks every output against the CPU reference.
    pub fn run(&mut self, kernel: &TileKernel, reps: usize) -> Result<Summary> {
        let tile = kernel.shape().tile as usize;
        if self.n % tile != 0 {
            return Err(LabError::config(format!("{} outputs are not a whole number of {tile}-output tiles", self.n)));
        }
        let tiles = (self.n / tile) as u32;
        self.stream.fill_u32(&self.output, pattern::POISON as u32)?;
        let timing = (&self.timing.0, &self.timing.1);
        kernel.run(&self.stream, &self.padded, &self.output, tiles, timing)?;
        let times = Summary::of_runs(reps, || kernel.run(&self.stream, &self.padded, &self.output, tiles, timing))?;
        self.verify(&format!("{:?} kernel, {:?}", kernel.kind(), kernel.shape()))?;
        Ok(times)
    }

    /// Every output against the reference, bit for bit.
    fn verify(&mut self, what: &str) -> Result<()> {
        self.stream.download(&mut self.result_host, &self.output, self.n * 4)?;
        let got = pattern::as_f32(self.result_host.words());
        match got.iter().zip(&self.reference).position(|(g, w)| g.to_bits() != w.to_bits()) {
            None => Ok(()),
            Some(i) => Err(LabError::wrong_data(what.to_string(), i, format!("got {}, expected {} (the CPU reference)", got[i], self.reference[i]))),
        }
    }
}

/// One kernel's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRun {
    pub name: String,
    pub resources: KernelResources,
    pub ms: Summary,
}

/// GB/s of useful traffic (n floats read, n written) in `ms`.
pub fn gbps(n: usize, ms: f64) -> f64 {
    2.0 * n as f64 * 4.0 / (ms * 1e6)
}
