//! Diagnostic: does writing a copy's source with ordinary (cached) stores
//! just before a pinned copy slow the copy down? Prints GB/s for pinned H2D
//! and D2H at several sizes with the source/destination written either way.
//! Run on a GPU: `cargo run --release --example cache_effect`.

use overlap_lab::gpu::{CopyOp, CopyTimer, Gpu, HostBuffer, PinnedBuffer};
use overlap_lab::pattern::{self, Store};
use overlap_lab::stats::Summary;
use overlap_lab::Bytes;

fn main() -> overlap_lab::Result<()> {
    let gpu = Gpu::open(0)?;
    let max = 256usize << 20;
    let mut host = PinnedBuffer::new(&gpu, max)?;
    let dev = gpu.alloc(max)?;
    let mut timer = CopyTimer::new(&gpu, 1)?;
    println!("{:<4} {:>9} {:>14} {:>16}", "dir", "size", "cached GB/s", "streaming GB/s");
    for up in [true, false] {
        for mib in [1usize, 4, 8, 32, 64, 256] {
            let n = mib << 20;
            let mut med = Vec::new();
            for store in [Store::Cached, Store::Streaming] {
                let mut gbps = Vec::new();
                for _ in 0..12 {
                    pattern::fill_with(&mut host.words_mut()[..n / 8], pattern::fresh_seed(), store);
                    let t = if up {
                        timer.run(&mut [CopyOp::HostToDevice { src: &host, dst: &dev, bytes: n }], 1, true)?
                    } else {
                        timer.run(&mut [CopyOp::DeviceToHost { src: &dev, dst: &mut host, bytes: n }], 1, true)?
                    };
                    gbps.push(n as f64 / (t.device_ms * 1e-3) / 1e9);
                }
                med.push(Summary::of(&gbps[2..])?.median);
            }
            println!("{:<4} {:>9} {:>14.1} {:>16.1}", if up { "H2D" } else { "D2H" }, Bytes(n as u64).to_string(), med[0], med[1]);
        }
    }
    Ok(())
}
