//! `overlap-lab report`: every figure from the recorded data, no GPU needed.

use crate::error::{LabError, Result};
use crate::lab_kit::table::Visited;
use crate::measure::record::display_path;
use crate::present::chart::write_text;
use std::path::{Path, PathBuf};

/// Renders every figure of every recording under `data_dir` into
/// `out_dir/<device>/` (SVG + PNG, Chrome traces, a text summary per lab),
/// then each lab's headline numbers with the GPUs side by side
/// (`out_dir/headline.md` and `.csv`), returning the files.
pub fn generate(data_dir: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let (mut files, table) = visit(data_dir, Some(out_dir))?;
    if files.is_empty() {
        return Err(LabError::MissingData { path: display_path(&data_dir.join("<device>").join("bandwidth.json")) });
    }
    files.push(write_text(out_dir.join("headline.md"), table.markdown(None))?);
    files.push(write_text(out_dir.join("headline.csv"), table.csv())?);
    Ok(files)
}

/// Loads every recording under `data_dir` once: renders its figures into
/// `out_dir` when given, and gathers every lab's headline numbers.
fn visit(data_dir: &Path, out_dir: Option<&Path>) -> Result<(Vec<PathBuf>, Headlines)> {
    let entries = std::fs::read_dir(data_dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LabError::MissingData { path: display_path(data_dir) },
        _ => LabError::io(format!("listing {}", data_dir.display()), e),
    })?;
    let mut devices: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    devices.sort();
    let (mut files, mut table) = (Vec::new(), Headlines::default());
    for dev in &devices {
        let labs = crate::labs::ALL.iter().map(|lab| lab.visit(dev, out_dir)).collect::<Result<Vec<_>>>()?;
        let labs: Vec<Visited> = labs.into_iter().flatten().collect();
        if let Some(first) = labs.first() {
            let gpu = first.gpu.clone();
            let mut rows = Vec::new();
            for v in labs {
                files.extend(v.files);
                rows.extend(v.headline.into_iter().map(|(what, value)| (v.lab.to_string(), what, value)));
            }
            table.add_gpu(&gpu, rows);
        }
    }
    Ok((files, table))
}

/// Each lab's headline numbers with the GPUs side by side.
#[derive(Debug, Default)]
pub struct Headlines {
    /// GPU names, one column each.
    pub gpus: Vec<String>,
    /// (lab, what, value per GPU), each lab's rows together in its order.
    pub rows: Vec<(String, String, Vec<Option<String>>)>,
}

impl Headlines {
    /// From every recording under `data_dir` (no figures drawn).
    pub fn from_data(data_dir: &Path) -> Result<Headlines> {
        Ok(visit(data_dir, None)?.1)
    }

    /// Adds one GPU's column: (lab, what, value) rows.
    pub fn add_gpu(&mut self, gpu: &str, rows: Vec<(String, String, String)>) {
        let col = self.gpus.len();
        self.gpus.push(gpu.to_string());
        for row in &mut self.rows {
            row.2.push(None);
        }
        for (lab, what, value) in rows {
            match self.rows.iter_mut().find(|r| r.0 == lab && r.1 == what) {
                Some(r) => r.2[col] = Some(value),
                None => {
                    let mut values = vec![None; col + 1];
                    values[col] = Some(value);
                    // Keep each lab's rows together, in the order first seen.
                    let at = self.rows.iter().rposition(|r| r.0 == lab).map_or(self.rows.len(), |i| i + 1);
                    self.rows.insert(at, (lab, what, values));
                }
            }
        }
    }

    /// A Markdown table of every lab (with a heading), or of `lab` alone.
    pub fn markdown(&self, lab: Option<&str>) -> String {
        let mut s = String::new();
        let dashes = "---|".repeat(self.gpus.len());
        match lab {
            None => {
                s += "# Headline numbers per GPU\n\nFrom the recordings in `data/` (`overlap-lab report` writes this file; each lab's summary beside it says how every number was measured).\n\n";
                s += &format!("| lab | what | {} |\n|---|---|{dashes}\n", self.gpus.join(" | "));
            }
            Some(_) => s += &format!("| what | {} |\n|---|{dashes}\n", self.gpus.join(" | ")),
        }
        for (l, what, values) in self.rows.iter().filter(|r| lab.is_none_or(|lab| r.0 == lab)) {
            let cells = values.iter().map(|v| v.as_deref().unwrap_or("-")).collect::<Vec<_>>().join(" | ");
            s += &match lab {
                None => format!("| {l} | {what} | {cells} |\n"),
                Some(_) => format!("| {what} | {cells} |\n"),
            };
        }
        s
    }

    /// The same as CSV (for spreadsheets): lab, what, one column per GPU.
    pub fn csv(&self) -> String {
        let quote = |f: &str| if f.contains([',', '"', '\n']) { format!("\"{}\"", f.replace('"', "\"\"")) } else { f.to_string() };
        let line = |cells: Vec<String>| cells.join(",") + "\n";
        let mut s = line(["lab", "what"].iter().map(|h| h.to_string()).chain(self.gpus.iter().map(|g| quote(g))).collect());
        for (lab, what, values) in &self.rows {
            s += &line([quote(lab), quote(what)].into_iter().chain(values.iter().map(|v| quote(v.as_deref().unwrap_or("")))).collect());
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(v: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
        v.iter().map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).collect()
    }

    #[test]
    fn headlines_put_gpus_side_by_side_and_keep_each_labs_rows_together() {
        let mut t = Headlines::default();
        t.add_gpu("GPU A", rows(&[("bandwidth", "pinned", "55.1"), ("overlap", "best", "2.6x")]));
        t.add_gpu("GPU B", rows(&[("bandwidth", "pinned", "55.4"), ("bandwidth", "pageable", "9.3, H2D"), ("overlap", "best", "2.7x")]));
        let order: Vec<_> = t.rows.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
        assert_eq!(order, [("bandwidth", "pinned"), ("bandwidth", "pageable"), ("overlap", "best")]);
        let md = t.markdown(None);
        assert!(md.contains("| lab | what | GPU A | GPU B |"), "{md}");
        assert!(md.contains("| bandwidth | pageable | - | 9.3, H2D |"), "a value one GPU lacks is a dash: {md}");
        assert_eq!(t.markdown(Some("overlap")), "| what | GPU A | GPU B |\n|---|---|---|\n| best | 2.6x | 2.7x |\n");
        let csv = t.csv();
        assert!(csv.starts_with("lab,what,GPU A,GPU B\n") && csv.contains("bandwidth,pageable,,\"9.3, H2D\"\n"), "{csv}");
    }
}
