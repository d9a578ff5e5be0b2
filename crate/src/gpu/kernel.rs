//! Kernels compiled at run time (NVRTC) and loaded as modules.

use super::{driver, DeviceSpan, Gpu, Stream};
use crate::error::{LabError, Result};
use crate::gpu::kernels::{self, KernelSource};
use std::ffi::c_void;

/// A loaded module holding one kernel.
pub struct Module {
    raw: driver::CUmodule,
    func: driver::CUfunction,
    gpu: Gpu,
}

// SAFETY: module and function handles may be used from any thread of the
// process (launches from several threads at once included); the module is
// only unloaded by `Drop`.
unsafe impl Send for Module {}
// SAFETY: as for Send: `&Module` only launches its function or queries it.
unsafe impl Sync for Module {}

impl Module {
    /// Compiles `k` for this device's architecture and loads it.
    pub fn load(gpu: &Gpu, k: &KernelSource) -> Result<Module> {
        Module::load_with(gpu, k, &[])
    }

    /// As [`Module::load`], compiled with the `-D` settings `defines`
    /// (`("GROUP", 128)`).
    pub fn load_with(gpu: &Gpu, k: &KernelSource, defines: &[(&str, i64)]) -> Result<Module> {
        let cc = gpu.fingerprint()?.compute_capability;
        let ptx = kernels::compile_ptx_with(k, kernels::arch_for(&cc)?, defines)?;
        Module::from_ptx(gpu, &ptx, k.entry)
    }

    /// Loads compiled PTX and finds its entry point `entry`.
    pub fn from_ptx(gpu: &Gpu, ptx: &str, entry: &str) -> Result<Module> {
        gpu.bind()?;
        let raw = driver::module_load_ptx(ptx)?;
        // SAFETY: `raw` was just loaded in the current context (bound above)
        // and is unloaded only on the error path, after this call.
        let func = match unsafe { driver::module_function(raw, entry) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: loaded above, owned here alone, unloaded once;
                // nothing of it was ever launched.
                let _ = unsafe { driver::module_unload(raw) };
                return Err(e);
            }
        };
        Ok(Module { raw, func, gpu: gpu.clone() })
    }

    /// The GPU it is loaded on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// What the driver says of its kernel: registers, static shared memory
    /// and local memory per thread.
    pub fn resources(&self) -> Result<driver::FuncResources> {
        // SAFETY: the function belongs to `self`, loaded until it drops.
        unsafe { driver::func_resources(self.func) }
    }

    /// Lets a launch ask for up to `bytes` of dynamic shared memory a block
    /// (the driver allows 48 KiB unless told more), and says how many blocks
    /// of `threads` threads with that much fit on one SM at once (0: none).
    pub fn allow_dynamic_smem(&self, bytes: u32, threads: u32) -> Result<u32> {
        self.gpu.bind()?;
        // SAFETY: the function belongs to `self`, loaded until it drops.
        unsafe {
            driver::func_set_max_dynamic_smem(self.func, bytes)?;
            driver::occupancy_blocks_per_sm(self.func, threads, bytes)
        }
    }

    /// Enqueues its kernel on `stream`: `grid` blocks of `block` threads,
    /// `dynamic_smem` bytes of dynamic shared memory each, with `args`.
    /// The launch goes to the current context's function: where a process
    /// uses several GPUs, bind this module's GPU first ([`Gpu::bind`]); a
    /// launch costs no driver call beyond `cuLaunchKernel` (it is on the
    /// timed path of every loop).
    ///
    /// # Safety
    /// `args` match the kernel's parameters in number, order and type; the
    /// kernel stays within the spans it is given (the caller checks their
    /// sizes against what it reads and writes); every span stays allocated
    /// until the stream has run the launch.
    pub unsafe fn launch<const N: usize>(&self, stream: &Stream, grid: u32, block: u32, dynamic_smem: u32, args: [KernelArg; N]) -> Result<()> {
        if stream.gpu().ordinal() != self.gpu.ordinal() {
            return Err(LabError::config(format!("a kernel loaded on GPU {} launched on a stream of GPU {}", self.gpu.ordinal(), stream.gpu().ordinal())));
        }
        // Each argument's value where the driver can read it, in the C
        // type the kernel declares (a span is its first byte's address).
        let mut values = args;
        let mut params: [*mut c_void; N] = values.each_mut().map(|v| match v {
            KernelArg::Span(span) => &mut span.ptr as *mut u64 as *mut c_void,
            KernelArg::U32(x) => x as *mut u32 as *mut c_void,
            KernelArg::I32(x) => x as *mut i32 as *mut c_void,
            KernelArg::U64(x) => x as *mut u64 as *mut c_void,
        });
        // SAFETY: the caller vouches for the arguments and the spans'
        // lifetime; the driver copies the values at launch.
        unsafe { driver::launch(self.func, grid, block, dynamic_smem, stream.raw(), &mut params) }
    }

    /// Where the module's `__device__` variable `name` lives (valid while
    /// the module is loaded).
    fn global(&self, name: &str) -> Result<DeviceSpan> {
        self.gpu.bind()?;
        // SAFETY: `self.raw` is loaded until `self` drops.
        let (ptr, bytes) = unsafe { driver::module_global(self.raw, name) }?;
        Ok(DeviceSpan { ptr, bytes })
    }

    /// Fills the module's `__device__` variable `name` with the 32-bit word
    /// `value` on `stream`, and waits (untimed set-up: a kernel's trace
    /// buffers cleared before it runs).
    pub fn fill_global(&self, stream: &Stream, name: &str, value: u32) -> Result<()> {
        let span = self.global(name)?;
        // SAFETY: the variable lives as long as the module, borrowed until
        // the fill has been waited for.
        unsafe { stream.fill_span_u32(span, value) }
    }

    /// The module's `__device__` variable `name`, all of it, as 64-bit
    /// words read back on `stream` and waited for (what a kernel left there).
    pub fn read_global(&self, stream: &Stream, name: &str) -> Result<Vec<u64>> {
        let span = self.global(name)?;
        // SAFETY: the variable lives as long as the module, borrowed until
        // the copy has been waited for.
        unsafe { stream.read_words(span) }
    }
}

/// One argument of a kernel launch, in the C type the kernel declares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A pointer (`float*`, `const float*`, …) to the span's first byte.
    Span(DeviceSpan),
    /// `unsigned int`.
    U32(u32),
    /// `int`.
    I32(i32),
    /// `unsigned long long`.
    U64(u64),
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // A launch of its function may still be queued (a launch's caller
        // keeps the memory it touches alive, not the module): wait for the
        // GPU before unloading the code it would run.
        let _ = driver::context_synchronize();
        // SAFETY: owned by `self`, unloaded only here, once, and no launch of
        // it is left (waited for above).
        let _ = unsafe { driver::module_unload(self.raw) };
    }
}

/// `kernels/compute.cu`: `out[i]` = FMA chain of `iterations` over `in[i]`,
/// loaded on one GPU or on each of several (a pipeline over GPUs launches
/// it on each stream's own GPU).
pub struct ComputeKernel {
    /// Per GPU: its module and the grid that fills it.
    loaded: Vec<(Module, u32)>,
    block: u32,
    /// How its blocks cover the data.
    pub blocks: Blocks,
}

/// How the compute kernel's blocks cover its elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Blocks {
    /// One wave: as many blocks as every SM holds at once (8 of 256
    /// threads), each striding over its share. Its blocks stay on their SMs
    /// until the kernel ends, so a kernel launched beside it waits for SMs.
    #[default]
    Resident,
    /// A block for every 256 elements: many short blocks that the GPU hands
    /// out as SMs free up, as a layer of a real network's backward pass
    /// has. A kernel on a stream of higher priority (NCCL's all-reduce)
    /// gets the next SM that frees up and runs beside it.
    Waves,
}

impl Blocks {
    /// The grid over `n` elements in blocks of `block` threads, given the
    /// grid that fills every SM once: never more blocks than elements'
    /// worth (nor than a grid holds), never none.
    pub fn grid(self, resident: u32, block: u32, n: usize) -> u32 {
        let needed = n.div_ceil(block.max(1) as usize).min(i32::MAX as usize) as u32;
        match self {
            Blocks::Resident => resident.min(needed),
            Blocks::Waves => needed,
        }
        .max(1)
    }
}

impl ComputeKernel {
    pub fn load(gpu: &Gpu) -> Result<ComputeKernel> {
        Self::load_on(std::slice::from_ref(gpu))
    }

    /// The kernel loaded on each of `gpus`.
    pub fn load_on(gpus: &[Gpu]) -> Result<ComputeKernel> {
        let loaded = gpus
            .iter()
            .map(|gpu| {
                let sms = gpu.fingerprint()?.sm_count;
                // Enough blocks to fill every SM several times; the kernel grid-strides.
                Ok((Module::load(gpu, &kernels::COMPUTE)?, sms * 8))
            })
            .collect::<Result<Vec<_>>>()?;
        if loaded.is_empty() {
            return Err(LabError::config("the compute kernel needs a GPU to load on"));
        }
        Ok(ComputeKernel { loaded, block: 256, blocks: Blocks::Resident })
    }

    /// Enqueues `out[out_at..out_at+n] = f(in[in_at..in_at+n])` (indices in
    /// f32 elements; refused where they do not fit the spans).
    ///
    /// # Safety
    /// Both spans' memory stays allocated until the stream has run the
    /// kernel (a [`super::Runner`] holds its buffers' borrows until it synchronizes).
    pub unsafe fn enqueue(&self, stream: &Stream, input: DeviceSpan, in_at: usize, output: DeviceSpan, out_at: usize, n: usize, iterations: i32) -> Result<()> {
        if n == 0 || (in_at + n) * 4 > input.bytes || (out_at + n) * 4 > output.bytes || iterations < 0 {
            return Err(LabError::config(format!(
                "compute of {n} elements at {in_at}->{out_at} does not fit buffers of {} and {} bytes (iterations {iterations})",
                input.bytes, output.bytes
            )));
        }
        // The kernel's `(const float*, float*, unsigned long long, int)`.
        let args = [
            KernelArg::Span(DeviceSpan::new(input.ptr + (in_at * 4) as u64, n * 4)),
            KernelArg::Span(DeviceSpan::new(output.ptr + (out_at * 4) as u64, n * 4)),
            KernelArg::U64(n as u64),
            KernelArg::I32(iterations),
        ];
        let gpu = stream.gpu().ordinal();
        let Some((module, grid)) = self.loaded.iter().find(|(m, _)| m.gpu.ordinal() == gpu) else {
            return Err(LabError::config(format!(
                "the compute kernel is not loaded on GPU {gpu} (a stream of GPU {gpu} launches it): load it with ComputeKernel::load_on for every GPU the pipeline uses"
            )));
        };
        let grid = self.blocks.grid(*grid, self.block, n);
        // A launch goes to the current context's function: its GPU's.
        if self.loaded.len() > 1 {
            module.gpu.bind()?;
        }
        // SAFETY: the arguments match `compute(const float*, float*,
        // unsigned long long, int)`; bounds checked above; the caller keeps
        // both spans alive until the stream has run it.
        unsafe { module.launch(stream, grid, self.block, 0, args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compute_kernels_grid_is_one_resident_wave_or_a_block_per_256_elements() {
        // 132 SMs x 8 blocks resident; 4 Mi elements need 16384 blocks of 256.
        assert_eq!(Blocks::Resident.grid(1056, 256, 1 << 22), 1056);
        assert_eq!(Blocks::Waves.grid(1056, 256, 1 << 22), 16384);
        // Fewer elements than one wave holds: no block without work.
        assert_eq!(Blocks::Resident.grid(1056, 256, 1000), 4);
        assert_eq!(Blocks::Waves.grid(1056, 256, 1000), 4);
        // Never an empty grid, never more blocks than a grid holds.
        assert_eq!(Blocks::Waves.grid(1056, 256, 0), 1);
        assert_eq!(Blocks::Waves.grid(1056, 1, usize::MAX), i32::MAX as u32);
        assert_eq!(Blocks::default(), Blocks::Resident);
    }
}
