//! Lab 5 while it is being built (before it joins the lab table): runs
//! every experiment and prints the table.
//! Run on a GPU: `cargo run --release --example streams -- [small|quick|full] [OUT_DIR]`.

use overlap_lab::gpu::Gpu;
use overlap_lab::labs::streams::{measure, StreamsConfig};
use overlap_lab::present::progress::ProgressMode;

fn main() -> overlap_lab::Result<()> {
    let cfg = match std::env::args().nth(1).as_deref() {
        Some("small") => StreamsConfig::small(),
        Some("quick") => StreamsConfig::quick(),
        _ => StreamsConfig::default(),
    };
    let gpu = Gpu::open(cfg.device)?;
    println!("{}\n", gpu.fingerprint()?.describe());
    let r = measure::run(&gpu, &cfg, ProgressMode::Lines)?;
    println!("{}", r.table());
    if let Some(dir) = std::env::args().nth(2) {
        std::fs::create_dir_all(&dir).map_err(|e| overlap_lab::LabError::io(dir.clone(), e))?;
        let path = std::path::Path::new(&dir).join("streams.json");
        std::fs::write(&path, serde_json::to_string(&r).map_err(|e| overlap_lab::LabError::config(e.to_string()))?)
            .map_err(|e| overlap_lab::LabError::io(path.display().to_string(), e))?;
    }
    Ok(())
}
