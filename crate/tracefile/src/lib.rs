//! The trace files of `overlap-lab trace`: what its CUPTI injection library
//! (`overlap-lab-inject`) writes for each CUDA process ([`records`], one
//! JSON record a line, [`raw`]), and the Chrome trace in Kineto's schema
//! they become ([`kineto`]). Shared by the library, which converts its own
//! file when a process exits, and the command line, which converts what a
//! process that died left. No CUDA here, and no unsafe code.

pub mod fixture;
pub mod kineto;
pub mod raw;
pub mod records;

use std::path::Path;

/// Whether a CUDA call (by its name, without a version suffix) issues GPU
/// work: a kernel launch, a copy, a memset or a graph launch. The one list,
/// for the trace reader and the converter alike.
pub fn issues_gpu_work(call: &str) -> bool {
    [
        "cudaLaunchKernel",
        "cuLaunchKernel",
        "cudaLaunchCooperativeKernel",
        "cudaMemcpy",
        "cudaMemset",
        "cuMemcpy",
        "cuMemset",
        "cudaGraphLaunch",
        "cuGraphLaunch",
    ]
    .iter()
    .any(|p| call.starts_with(p))
}

/// Converts the raw trace file `raw_path` into the Chrome trace `out`
/// (`.json.gz` or `.json`); errors name the file.
pub fn convert_file(raw_path: &Path, out: &Path) -> Result<kineto::Summary, String> {
    let raw = raw::read(raw_path)?;
    let k = kineto::convert(&raw, &out.display().to_string());
    kineto::write(out, &k.json).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(k.summary)
}
