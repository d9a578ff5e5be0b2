//! Lab 7 exploration: every tile kernel over a grid of shapes and blocks
//! per SM, against the device-to-device copy ceiling, each verified.
//! `cargo run --release --example tile_sweep -- [MiB] [repeats]`
use overlap_lab::gpu::Gpu;
use overlap_lab::labs::kernel_pipeline::kernel::{TileKernel, TileKind, TileShape};
use overlap_lab::labs::kernel_pipeline::measure::{gbps, TileData};
use overlap_lab::measure::stats::Summary;

fn main() -> overlap_lab::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    // `quick`: one tile size (for compute-sanitizer).
    let quick = std::env::args().any(|a| a == "quick");
    // `only=Async` (a kind's name): that kernel alone.
    let only = std::env::args().find_map(|a| a.strip_prefix("only=").map(str::to_string));
    let mib = args.first().copied().unwrap_or(256);
    let reps = args.get(1).copied().unwrap_or(10);
    let gpu = Gpu::open(0)?;
    eprintln!("{}", gpu.fingerprint()?.describe());
    let n = mib << 18;
    let mut data = TileData::new(&gpu, n)?;
    data.refresh()?;
    let ceiling = |data: &TileData| -> overlap_lab::Result<f64> {
        data.copy_ms()?;
        Ok(gbps(n, Summary::of_runs(reps, || data.copy_ms())?.median))
    };
    let c0 = ceiling(&data)?;
    println!("ceiling (D2D copy of {mib} MiB): {c0:.0} GB/s");
    let mut configs = Vec::new();
    let tiles: &[u32] = if quick { &[2048] } else { &[2048, 4096, 8192] };
    for &tile in tiles {
        for bps in [1u32, 2, 4, 64] {
            configs.push((TileKind::Naive, TileShape { tile, threads: 256, stages: 1 }, bps));
        }
        for stages in 1..=4 {
            for bps in [1u32, 2] {
                configs.push((TileKind::Async, TileShape { tile, threads: 256, stages }, bps));
                configs.push((TileKind::Tma, TileShape { tile, threads: 256, stages }, bps));
            }
        }
        for stages in 2..=4 {
            for (threads, bps) in [(256u32, 1u32), (256, 2), (384, 1), (192, 2)] {
                configs.push((TileKind::WarpSpecialized, TileShape { tile, threads, stages }, bps));
            }
        }
    }
    println!(
        "{:<16} {:>5} {:>3} {:>2} {:>4} {:>5} {:>7} {:>6} {:>3} {:>5} {:>9} {:>7} {:>6}",
        "kernel", "tile", "st", "th", "bps", "grid", "smem", "regs", "lcl", "occ", "ms", "GB/s", "%ceil"
    );
    for (kind, shape, bps) in configs {
        if only.as_ref().is_some_and(|o| *o != format!("{kind:?}")) {
            continue;
        }
        let line = (|| -> overlap_lab::Result<String> {
            let k = TileKernel::load(&gpu, kind, shape, bps)?;
            data.refresh()?;
            data.verified(&k, &format!("{kind:?} {shape:?}"))?;
            let ms = Summary::of_runs(reps, || data.timed(&k))?;
            let r = k.resources();
            let g = gbps(n, ms.median);
            Ok(format!(
                "{:<16} {:>5} {:>3} {:>2} {:>4} {:>5} {:>7} {:>6} {:>3} {:>5.2} {:>9.4} {:>7.0} {:>5.1}%  (IQR {:.4})",
                format!("{kind:?}"),
                shape.tile,
                shape.stages,
                shape.threads / 32,
                r.blocks_per_sm,
                r.grid,
                r.dynamic_smem + r.static_smem,
                r.registers,
                r.local_bytes,
                r.occupancy,
                ms.median,
                g,
                100.0 * g / c0,
                ms.middle_spread()
            ))
        })();
        match line {
            Ok(l) => println!("{l}"),
            Err(e) => println!("{kind:?} {shape:?} bps {bps}: {e}"),
        }
    }
    println!("ceiling again: {:.0} GB/s", ceiling(&data)?);
    Ok(())
}
