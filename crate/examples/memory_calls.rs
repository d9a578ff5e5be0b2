//! Diagnostic for lab 6: which memory calls wait for the GPU? A long kernel
//! runs on one stream while the CPU makes each call of the pipeline
//! vocabulary's memory operations; a call whose CPU time is about the
//! kernel's remaining time waited for it. Each call alone (device idle) is
//! timed too. Medians of 5, µs.
//! Run on a GPU: `cargo run --release --example memory_calls`.

use overlap_lab::gpu::{ComputeKernel, Gpu, PageableBuffer, TimelineSource};
use overlap_lab::measure::stats::Summary;

const MIB: usize = 1 << 20;

fn main() -> overlap_lab::Result<()> {
    let gpu = Gpu::open(0)?;
    println!("{}\n", gpu.fingerprint()?.describe());
    let kernel = ComputeKernel::load(&gpu)?;
    let (busy, calls) = (gpu.stream()?, gpu.stream()?);
    let n = 16 << 20;
    let (din, dout) = (gpu.alloc(4 * n)?, gpu.alloc(4 * n)?);
    for size in [MIB, 64 * MIB] {
        println!("{} MiB per call: CPU time of the call, µs (median of 5), device idle | beside a long kernel", size / MIB);
        let mut rows: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
        for _ in 0..5 {
            for beside_kernel in [false, true] {
                let mut host = PageableBuffer::new(size)?;
                let mut p = gpu.runner(TimelineSource::Events, 8, false)?;
                let (k, c) = (p.stream(&busy, "busy"), p.stream(&calls, "calls"));
                let (i, o) = (p.device(&din, "in"), p.device(&dout, "out"));
                let h = p.host(&mut host, "host");
                if beside_kernel {
                    p.compute(k, &kernel, i, 0, o, 0, n, 20000, "long kernel")?;
                }
                let x = p.alloc_async(c, size, "pool")?;
                p.free_async(c, x)?;
                let y = p.alloc(size, "device")?;
                p.free(y)?;
                let z = p.alloc_pinned(size, "pinned")?;
                p.free_pinned(z)?;
                p.pin(h)?;
                p.unpin(h)?;
                let run = p.finish()?;
                let tl = run.timeline.expect("timed");
                let kernel_us = tl.spans.iter().find(|s| s.label == "long kernel").map(|s| s.end_us - s.start_us);
                for s in tl.spans.iter().filter(|s| s.label != "long kernel") {
                    let call = s.label.split(' ').next().unwrap_or("").to_string();
                    let row = match rows.iter_mut().position(|r| r.0 == call) {
                        Some(r) => r,
                        None => {
                            rows.push((call, vec![], vec![]));
                            rows.len() - 1
                        }
                    };
                    let v = if beside_kernel { &mut rows[row].2 } else { &mut rows[row].1 };
                    v.push(s.end_us - s.start_us);
                }
                if let Some(k) = kernel_us {
                    println!("  (kernel {k:.0} µs)");
                }
            }
        }
        for (call, idle, beside) in rows {
            let m = |v: &[f64]| Summary::of(v).map_or(f64::NAN, |s| s.median);
            println!("  {call:<22} {:>10.1} | {:>10.1}", m(&idle), m(&beside));
        }
    }
    Ok(())
}
