//! Kernels compiled at run time (NVRTC) and loaded as modules.

use super::{driver, DeviceBuffer, Gpu, Stream};
use crate::error::{LabError, Result};
use crate::kernels::{self, KernelSource};
use std::ffi::c_void;

/// A loaded module holding one kernel.
pub struct Module {
    raw: driver::CUmodule,
    func: driver::CUfunction,
    gpu: Gpu,
}

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    /// Compiles `k` for this device's architecture and loads it.
    pub fn load(gpu: &Gpu, k: &KernelSource) -> Result<Module> {
        let cc = gpu.fingerprint()?.compute_capability;
        let ptx = kernels::compile_ptx(k, kernels::arch_for(&cc)?)?;
        gpu.bind()?;
        let raw = driver::module_load_ptx(&ptx)?;
        let func = match driver::module_function(raw, k.entry) {
            Ok(f) => f,
            Err(e) => {
                let _ = driver::module_unload(raw);
                return Err(e);
            }
        };
        Ok(Module { raw, func, gpu: gpu.clone() })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        let _ = driver::module_unload(self.raw);
    }
}

/// `kernels/compute.cu`: out[i] = FMA chain of `iterations` over in[i].
pub struct ComputeKernel {
    module: Module,
    grid: u32,
    block: u32,
}

impl ComputeKernel {
    pub fn load(gpu: &Gpu) -> Result<ComputeKernel> {
        let sms = gpu.fingerprint()?.sm_count;
        // Enough blocks to fill every SM several times; the kernel grid-strides.
        Ok(ComputeKernel { module: Module::load(gpu, &kernels::COMPUTE)?, grid: sms * 8, block: 256 })
    }

    /// Enqueues `out[out_at..out_at+n] = f(in[in_at..in_at+n])` (indices in
    /// f32 elements). The caller keeps both buffers alive until the stream
    /// has run it (the scope API guarantees that).
    pub(crate) fn enqueue(
        &self,
        stream: &Stream,
        input: &DeviceBuffer,
        in_at: usize,
        output: &DeviceBuffer,
        out_at: usize,
        n: usize,
        iterations: i32,
    ) -> Result<()> {
        if n == 0 || (in_at + n) * 4 > input.bytes() || (out_at + n) * 4 > output.bytes() || iterations < 0 {
            return Err(LabError::config(format!(
                "compute of {n} elements at {in_at}->{out_at} does not fit buffers of {} and {} bytes (iterations {iterations})",
                input.bytes(),
                output.bytes()
            )));
        }
        let mut src = input.ptr() + (in_at * 4) as u64;
        let mut dst = output.ptr() + (out_at * 4) as u64;
        let mut count = n as u64;
        let mut iters = iterations;
        let mut params = [
            &mut src as *mut u64 as *mut c_void,
            &mut dst as *mut u64 as *mut c_void,
            &mut count as *mut u64 as *mut c_void,
            &mut iters as *mut i32 as *mut c_void,
        ];
        let grid = self.grid.min(n.div_ceil(self.block as usize) as u32).max(1);
        // SAFETY: params match `compute(const float*, float*, unsigned long long, int)`;
        // the driver copies the values at launch; bounds checked above.
        unsafe { driver::launch(self.module.func, grid, self.block, stream.raw(), &mut params) }
    }
}
