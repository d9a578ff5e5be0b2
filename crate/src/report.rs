//! `overlap-lab report`: every figure from the recorded data, no GPU needed.

use crate::chart::Chart;
use crate::error::{LabError, Result};
use crate::labs::bandwidth::{self, BandwidthResults};
use crate::labs::double_buffer::{self, DoubleBufferResults};
use crate::labs::overlap::{self, OverlapResults};
use crate::record::Record;
use std::path::{Path, PathBuf};

/// Renders every figure of every recording under `data_dir` into
/// `out_dir/<device>/` (SVG + PNG, plus a text summary), returning the files.
pub fn generate(data_dir: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(data_dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LabError::MissingData { path: data_dir.to_path_buf() },
        _ => LabError::io(format!("listing {}", data_dir.display()), e),
    })?;
    let mut devices: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    devices.sort();
    let mut files = Vec::new();
    for dev in devices.iter() {
        let lab1 = dev.join(format!("{}.json", bandwidth::LAB));
        if !lab1.is_file() {
            continue;
        }
        let rec = Record::<BandwidthResults>::load(&lab1)?;
        let dir = out_dir.join(rec.fingerprint.slug());
        let origin = format!("recorded on {} by `{}`", rec.provenance(), rec.command.join(" "));
        for fig in bandwidth::charts::all(&rec, &origin) {
            files.extend(fig.save(&dir)?);
        }
        let summary = dir.join("lab1-summary.txt");
        let text = format!(
            "{origin}\n\n{}\n{}\nBreak-even (copies until pinning pays off)\n{}",
            rec.fingerprint.describe(),
            bandwidth::model::summary_table(&rec),
            bandwidth::model::break_even_table(&rec.results)
        );
        std::fs::write(&summary, text).map_err(|e| LabError::io(format!("writing {}", summary.display()), e))?;
        files.push(summary);
    }
    for dev in &devices {
        let lab2 = dev.join(format!("{}.json", overlap::LAB));
        if lab2.is_file() {
            files.extend(lab2_figures(&Record::<OverlapResults>::load(&lab2)?, out_dir)?);
        }
        let lab3 = dev.join(format!("{}.json", double_buffer::LAB));
        if lab3.is_file() {
            let rec = Record::<DoubleBufferResults>::load(&lab3)?;
            let dir = out_dir.join(rec.fingerprint.slug());
            let origin = format!("recorded on {} by `{}`", rec.provenance(), rec.command.join(" "));
            files.extend(double_buffer::timeline_chart(&rec, &origin).save(&dir)?);
            for (name, t) in [("no-overlap", &rec.results.no_overlap_timeline), ("double-buffered", &rec.results.pipelined_timeline)] {
                let trace = dir.join(format!("lab3-{name}.trace.json"));
                t.save_chrome_trace(&trace)?;
                files.push(trace);
            }
            let summary = dir.join("lab3-summary.txt");
            std::fs::write(&summary, format!("{origin}\n\n{}", rec.results.summary())).map_err(|e| LabError::io(format!("writing {}", summary.display()), e))?;
            files.push(summary);
        }
    }
    if files.is_empty() {
        return Err(LabError::MissingData { path: data_dir.join("<device>").join("bandwidth.json") });
    }
    Ok(files)
}

/// Lab 2: heatmaps, measured vs bound, timelines (+ Chrome traces), summary.
fn lab2_figures(rec: &Record<OverlapResults>, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let dir = out_dir.join(rec.fingerprint.slug());
    let origin = format!("recorded on {} by `{}`", rec.provenance(), rec.command.join(" "));
    let mut files = Vec::new();
    for order in &rec.results.config.orders {
        files.extend(overlap::charts::speedup_heatmap(rec, *order, &origin).save(&dir)?);
    }
    files.extend(overlap::charts::measured_vs_bound(rec, &origin).save(&dir)?);
    for (i, ir) in rec.results.intensities.iter().enumerate() {
        if let Some(g) = overlap::charts::timelines(rec, i, &origin) {
            files.extend(g.save(&dir)?);
        }
        let trace = dir.join(format!("lab2-{}-best.trace.json", ir.intensity.label()));
        ir.best_timeline.save_chrome_trace(&trace)?;
        files.push(trace);
    }
    let summary = dir.join("lab2-summary.txt");
    let mut text = format!(
        "{origin}\n\n{}\ntimeline overhead: {:+.2}%\n",
        overlap::model::summary_table(&rec.results.intensities, rec.results.copy_engines),
        rec.results.timeline_overhead_pct
    );
    for ir in &rec.results.intensities {
        text += &format!("\n{} ({} FMAs per element)\n{}", ir.intensity.label(), ir.iterations, overlap::model::efficiency_table(ir, rec.results.copy_engines));
    }
    std::fs::write(&summary, text).map_err(|e| LabError::io(format!("writing {}", summary.display()), e))?;
    files.push(summary);
    Ok(files)
}
