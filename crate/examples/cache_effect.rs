//! Diagnostic: what, besides the link, changes a pinned copy's speed?
//! For pinned H2D and D2H at several sizes, GB/s (median of 10 after 2
//! warm-up) when the host buffer is rewritten before every copy with ordinary
//! (cached) stores, rewritten with streaming stores, or written once only;
//! and streaming with the start gate off.
//! Run on a GPU: `cargo run --release --example cache_effect`.

use overlap_lab::gpu::{Gpu, HostBuffer, PinnedBuffer, TimelineSource};
use overlap_lab::measure::pattern::{self, Store};
use overlap_lab::measure::stats::Summary;
use overlap_lab::Bytes;

#[derive(Clone, Copy)]
enum Refill {
    Every(Store),
    Once,
}

fn main() -> overlap_lab::Result<()> {
    let gpu = Gpu::open(0)?;
    // Self-describing output: the machine and the command come with the numbers.
    println!("{}\ncommand: {}\n", gpu.fingerprint()?.describe(), std::env::args().collect::<Vec<_>>().join(" "));
    let max = 256usize << 20;
    let mut host = PinnedBuffer::new(&gpu, max)?;
    let dev = gpu.alloc(max)?;
    let stream = gpu.stream()?;
    let modes = [
        ("cached refill", Refill::Every(Store::Cached), true),
        ("streaming refill", Refill::Every(Store::Streaming), true),
        ("written once", Refill::Once, true),
        ("streaming, no gate", Refill::Every(Store::Streaming), false),
    ];
    print!("{:<4} {:>8}", "dir", "size");
    for (name, _, _) in &modes {
        print!(" {name:>19}");
    }
    println!("   (GB/s)");
    for up in [true, false] {
        for mib in [1usize, 8, 64, 256] {
            let n = mib << 20;
            print!("{:<4} {:>8}", if up { "H2D" } else { "D2H" }, Bytes(n as u64).to_string());
            for (_, refill, gated) in modes {
                pattern::fill(&mut host.words_mut()[..n / 8], 1);
                let mut gbps = Vec::new();
                for _ in 0..12 {
                    if let Refill::Every(store) = refill {
                        pattern::fill_with(&mut host.words_mut()[..n / 8], pattern::fresh_seed(), store);
                    }
                    // One copy through the runner, behind the start gate or not.
                    let mut p = gpu.runner(TimelineSource::Off, 0, gated)?.deferring()?;
                    let (s, h, d) = (p.stream(&stream, "copy"), p.host(&mut host, "pinned"), p.device(&dev, "device"));
                    if up {
                        p.h2d(s, d, 0, h, 0, n, "H2D")?;
                    } else {
                        p.d2h(s, h, 0, d, 0, n, "D2H")?;
                    }
                    let run = p.finish()?;
                    gbps.push(n as f64 / (run.total_ms * 1e-3) / 1e9);
                }
                print!(" {:>19.1}", Summary::of(&gbps[2..])?.median);
            }
            println!();
        }
    }
    Ok(())
}
