//! `overlap-lab report`: every figure from the recorded data, no GPU needed,
//! and one page that holds them all (`report.html`, hand-written: a page of
//! tables, inline SVG and text needs no template engine).

use crate::error::{LabError, Result};
use crate::lab_kit::table::Visited;
use crate::measure::record::display_path;
use crate::present::chart::write_text;
use std::path::{Path, PathBuf};

/// Renders every figure of every recording under `data_dir` into
/// `out_dir/<device>/` (SVG + PNG, Chrome traces, a text summary per lab),
/// then each lab's headline numbers with the GPUs side by side
/// (`out_dir/headline.md` and `.csv`) and the one page of it all
/// (`out_dir/report.html`), returning the files.
pub fn generate(data_dir: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    generate_by_lab(data_dir, out_dir).map(|(_, files)| files)
}

/// [`generate`], also telling which lab's recording on which GPU wrote
/// which figures (each [`Visited`]'s `files`).
pub fn generate_by_lab(data_dir: &Path, out_dir: &Path) -> Result<(Vec<Visited>, Vec<PathBuf>)> {
    let (visited, table) = visit(data_dir, Some(out_dir))?;
    let mut files: Vec<PathBuf> = visited.iter().flat_map(|v| v.files.iter().cloned()).collect();
    if files.is_empty() {
        // A recording is DIR/<its GPU's folder>/<lab>.json (`data/nvidia-h200/bandwidth.json`).
        return Err(LabError::MissingData { path: format!("{}/<gpu folder>/<lab>.json", display_path(data_dir)) });
    }
    let page = html(&visited, &table)?;
    files.push(write_text(out_dir.join("headline.md"), table.markdown(None))?);
    files.push(write_text(out_dir.join("headline.csv"), table.csv())?);
    files.push(write_text(out_dir.join("report.html"), page)?);
    Ok((visited, files))
}

/// Text made safe inside HTML.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The report as one self-contained page: per lab (in course order) its
/// question, its headline table with the GPUs side by side, then each
/// GPU's figures (inline SVG) and summary in columns, each under the
/// recording's origin.
fn html(visited: &[Visited], table: &Headlines) -> Result<String> {
    let mut s = String::from(concat!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>overlap-lab: the course's recordings</title>\n",
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:2400px}table{border-collapse:collapse;margin:.5em 0}",
        "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f4f4f4}",
        ".gpus{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:1.5em}",
        ".gpu svg{width:100%;height:auto;border:1px solid #eee;margin:.4em 0}.origin{color:#555;font-size:.9em}",
        "pre{font-size:.8em;overflow-x:auto;background:#fafafa;padding:.5em}</style></head><body>\n",
        "<h1>overlap-lab: the course's recordings</h1>\n",
        "<p>Every lab's headline figures, charts and summary, from the recordings in <code>data/</code> ",
        "(<code>overlap-lab report</code> writes this page), each GPU side by side.</p>\n",
    ));
    let mut gpus: Vec<&str> = Vec::new();
    for v in visited {
        if !gpus.contains(&v.gpu.as_str()) {
            gpus.push(&v.gpu);
        }
    }
    s += "<ul>";
    for lab in crate::labs::ALL {
        s += &format!("<li><a href=\"#{0}\">Lab {1}: {0}</a>: {2}</li>", lab.name(), lab.number(), escape(lab.teaches()));
    }
    s += "</ul>\n";
    for lab in crate::labs::ALL {
        s += &format!("<section class=\"lab\" id=\"{0}\"><h2>Lab {1}: {0}</h2>\n<p>{2}</p>\n", lab.name(), lab.number(), escape(lab.teaches()));
        s += "<table><tr><th>what</th>";
        for gpu in &gpus {
            s += &format!("<th>{}</th>", escape(gpu));
        }
        s += "</tr>\n";
        for (_, what, values) in table.rows.iter().filter(|r| r.0 == lab.name()) {
            s += &format!("<tr><td>{}</td>", escape(what));
            for v in values {
                s += &format!("<td>{}</td>", escape(v.as_deref().unwrap_or("-")));
            }
            s += "</tr>\n";
        }
        s += "</table>\n<div class=\"gpus\">\n";
        for v in visited.iter().filter(|v| v.lab == lab.name()) {
            // The origin's `command` in code type.
            let origin: String =
                escape(&v.origin).split('`').enumerate().map(|(i, part)| if i % 2 == 1 { format!("<code>{part}</code>") } else { part.to_string() }).collect();
            s += &format!("<div class=\"gpu\"><h3>{}</h3><p class=\"origin\">{origin}</p>\n", escape(&v.gpu));
            for f in &v.files {
                let read = |f: &Path| std::fs::read_to_string(f).map_err(|e| LabError::io(format!("reading {}", f.display()), e));
                match f.extension().and_then(|e| e.to_str()) {
                    Some("svg") => {
                        let svg = read(f)?;
                        // The markup itself, without an XML prolog if any.
                        s += svg.find("<svg").map_or("", |i| &svg[i..]);
                        s += "\n";
                    }
                    Some("txt") => s += &format!("<details><summary>summary</summary><pre>{}</pre></details>\n", escape(&read(f)?)),
                    _ => {}
                }
            }
            s += "</div>\n";
        }
        s += "</div></section>\n";
    }
    s += "</body></html>\n";
    Ok(s)
}

/// Loads every recording under `data_dir` once: renders its figures into
/// `out_dir` when given, and gathers every lab's headline numbers.
fn visit(data_dir: &Path, out_dir: Option<&Path>) -> Result<(Vec<Visited>, Headlines)> {
    let entries = std::fs::read_dir(data_dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LabError::MissingData { path: display_path(data_dir) },
        _ => LabError::io(format!("listing {}", data_dir.display()), e),
    })?;
    let mut devices: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    devices.sort();
    // Every lab's recording on every GPU, rendered over the host's cores
    // (each lab draws on its own; the order of the results is kept).
    use rayon::prelude::*;
    let n = crate::labs::ALL.len();
    let mut each = (0..devices.len() * n)
        .into_par_iter()
        .map(|i| crate::labs::ALL[i % n].visit(&devices[i / n], out_dir))
        .collect::<Result<Vec<Option<Visited>>>>()?
        .into_iter();
    let (mut visited, mut table) = (Vec::new(), Headlines::default());
    for _ in &devices {
        let labs: Vec<Visited> = each.by_ref().take(n).flatten().collect();
        if let Some(first) = labs.first() {
            let gpu = first.gpu.clone();
            let rows = labs.iter().flat_map(|v| v.headline.iter().map(|(what, value)| (v.lab.to_string(), what.clone(), value.clone()))).collect();
            table.add_gpu(&gpu, rows);
            visited.extend(labs);
        }
    }
    Ok((visited, table))
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
