//! `overlap-lab report`: every figure from the recorded data, no GPU needed.

use crate::chart::Chart;
use crate::error::{LabError, Result};
use crate::labs::bandwidth::{self, BandwidthResults};
use crate::labs::callback::{self, CallbackResults};
use crate::labs::double_buffer::{self, DoubleBufferResults};
use crate::labs::overlap::{self, OverlapResults};
use crate::record::Record;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Renders every figure of every recording under `data_dir` into
/// `out_dir/<device>/` (SVG + PNG, Chrome traces, a text summary per lab),
/// returning the files.
pub fn generate(data_dir: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(data_dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LabError::MissingData { path: data_dir.to_path_buf() },
        _ => LabError::io(format!("listing {}", data_dir.display()), e),
    })?;
    let mut devices: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    devices.sort();
    let mut files = Vec::new();
    for dev in &devices {
        files.extend(render::<BandwidthResults>(dev, bandwidth::LAB, out_dir, lab1_figures)?);
        files.extend(render::<OverlapResults>(dev, overlap::LAB, out_dir, lab2_figures)?);
        files.extend(render::<DoubleBufferResults>(dev, double_buffer::LAB, out_dir, lab3_figures)?);
        files.extend(render::<CallbackResults>(dev, callback::LAB, out_dir, lab4_figures)?);
    }
    if files.is_empty() {
        return Err(LabError::MissingData { path: data_dir.join("<device>").join("bandwidth.json") });
    }
    Ok(files)
}

/// Loads `dev/<lab>.json` if it exists and renders it into
/// `out_dir/<device slug>/` with a provenance line for every figure.
fn render<T: Serialize + DeserializeOwned>(
    dev: &Path,
    lab: &str,
    out_dir: &Path,
    figures: fn(&Record<T>, &Path, &str) -> Result<Vec<PathBuf>>,
) -> Result<Vec<PathBuf>> {
    let path = dev.join(format!("{lab}.json"));
    if !path.is_file() {
        return Ok(vec![]);
    }
    let rec = Record::<T>::load(&path)?;
    let origin = format!("recorded on {} by `{}`", rec.provenance(), rec.command.join(" "));
    figures(&rec, &out_dir.join(rec.fingerprint.slug()), &origin)
}

fn write_text(path: PathBuf, text: String) -> Result<PathBuf> {
    std::fs::write(&path, text).map_err(|e| LabError::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

/// Lab 1: bandwidth, ratio, two clocks, pinning cost, summary.
fn lab1_figures(rec: &Record<BandwidthResults>, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for fig in bandwidth::charts::all(rec, origin) {
        files.extend(fig.save(dir)?);
    }
    let text = format!(
        "{origin}\n\n{}\n{}\nBreak-even (copies until pinning pays off)\n{}",
        rec.fingerprint.describe(),
        bandwidth::model::summary_table(rec),
        bandwidth::model::break_even_table(&rec.results)
    );
    files.push(write_text(dir.join("lab1-summary.txt"), text)?);
    Ok(files)
}

/// Lab 2: heatmaps, measured vs bound, timelines (+ Chrome traces), summary.
fn lab2_figures(rec: &Record<OverlapResults>, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for order in &rec.results.config.orders {
        files.extend(overlap::charts::speedup_heatmap(rec, *order, origin).save(dir)?);
    }
    files.extend(overlap::charts::measured_vs_bound(rec, origin).save(dir)?);
    for (i, ir) in rec.results.intensities.iter().enumerate() {
        if let Some(g) = overlap::charts::timelines(rec, i, origin) {
            files.extend(g.save(dir)?);
        }
        let trace = dir.join(format!("lab2-{}-best.trace.json", ir.intensity.label()));
        ir.best_timeline.save_chrome_trace(&trace)?;
        files.push(trace);
    }
    let mut text = format!(
        "{origin}\n\n{}\ntimeline overhead: {:+.2}%\n",
        overlap::model::summary_table(&rec.results.intensities, rec.results.copy_engines),
        rec.results.timeline_overhead_pct
    );
    for ir in &rec.results.intensities {
        text += &format!("\n{} ({} FMAs per element)\n{}", ir.intensity.label(), ir.iterations, overlap::model::efficiency_table(ir, rec.results.copy_engines));
    }
    files.push(write_text(dir.join("lab2-summary.txt"), text)?);
    Ok(files)
}

/// Lab 3: the two timelines (+ Chrome traces), summary.
fn lab3_figures(rec: &Record<DoubleBufferResults>, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = double_buffer::timeline_chart(rec, origin).save(dir)?;
    for (name, t) in [("no-overlap", &rec.results.no_overlap_timeline), ("double-buffered", &rec.results.pipelined_timeline)] {
        let trace = dir.join(format!("lab3-{name}.trace.json"));
        t.save_chrome_trace(&trace)?;
        files.push(trace);
    }
    files.push(write_text(dir.join("lab3-summary.txt"), format!("{origin}\n\n{}", rec.results.summary()))?);
    Ok(files)
}

/// Lab 4: throughput and efficiency per variant, variant 1 vs 3 timelines,
/// every variant's full timeline as a Chrome trace, summary.
fn lab4_figures(rec: &Record<CallbackResults>, dir: &Path, origin: &str) -> Result<Vec<PathBuf>> {
    let mut files = callback::charts::throughput_and_efficiency(rec, origin).save(dir)?;
    if let Some(g) = callback::charts::timelines(rec, origin, 12) {
        files.extend(g.save(dir)?);
    }
    for v in &rec.results.config.variants {
        if let Some(t) = callback::charts::timeline_of(&rec.results, *v) {
            let trace = dir.join(format!("lab4-variant-{}.trace.json", v.number()));
            t.save_chrome_trace(&trace)?;
            files.push(trace);
        }
    }
    files.push(write_text(dir.join("lab4-summary.txt"), format!("{origin}\n\n{}", rec.results.table()))?);
    Ok(files)
}
