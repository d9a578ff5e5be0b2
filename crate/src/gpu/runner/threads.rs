//! The OS threads that make the calls of a loop's CPU threads 1, 2, ...
//! ([`crate::pipeline::issue::Issue::issue_from`]; thread 0's are made by
//! the caller). CUDA resolves the per-thread default stream by the calling
//! thread, so which OS thread makes a call decides which stream it means.

use super::super::Gpu;
use crate::error::{LabError, Result};

/// One OS thread per CPU thread of the loop past 0, made when first used,
/// with the GPU's context current. The caller waits for each call, so the
/// threads take turns.
#[derive(Default)]
pub(super) struct CpuThreads {
    threads: Vec<rayon::ThreadPool>,
}

impl CpuThreads {
    /// Makes the OS threads up to `thread`.
    pub fn ensure(&mut self, gpu: &Gpu, thread: usize) -> Result<()> {
        while self.threads.len() < thread {
            let (n, gpu) = (self.threads.len() + 1, gpu.clone());
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(move |_| format!("overlap-lab CPU thread {n}"))
                .start_handler(move |_| {
                    // A failure shows as the context error of its first call.
                    let _ = gpu.bind();
                })
                .build()
                .map_err(|e| LabError::config(format!("could not start CPU thread {n}: {e}")))?;
            self.threads.push(pool);
        }
        Ok(())
    }
    /// Makes `call` on CPU thread `thread` and waits for it.
    pub fn run<R: Send>(&self, thread: usize, call: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        match thread {
            0 => call(),
            t => self.threads.get(t - 1).ok_or_else(|| LabError::config(format!("CPU thread {t} was never started")))?.install(call),
        }
    }
}
