//! Every repository path a module doc of crate/src cites (`kernels/tile_blur.cuh`,
//! `crate/reference/torch_offload.py`, `kernels/tile_*.cu`) is a file of the
//! repository: a newcomer who follows one finds it. A path with a
//! placeholder (`data/<device>/<lab>.json`) names no one file and is left
//! alone; one the crate writes at run time and git ignores
//! (`notebooks/progress.json`) is no repository file and needs none.

use overlap_lab::measure::record::repo_root;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file kinds a cited path ends in.
const EXTENSIONS: &[&str] = &["rs", "py", "json", "md", "cu", "cuh", "c", "ipynb", "toml", "sh", "txt", "csv", "yml", "yaml", "svg", "png", "html"];

/// The paths a module doc (its `//!` lines) cites: words with a `/` whose
/// last part ends in one of [`EXTENSIONS`], with what quotes or ends a
/// sentence trimmed off.
fn cited_paths(source: &str) -> Vec<String> {
    let doc: String = source.lines().filter_map(|l| l.trim_start().strip_prefix("//!")).collect::<Vec<_>>().join("\n");
    doc.split(|c: char| c.is_whitespace() || "`()[]\"',;".contains(c))
        .map(|w| w.trim_end_matches(['.', ':', '!', '?']))
        .filter(|w| w.contains('/') && !w.starts_with("//"))
        .filter(|w| w.rsplit('/').next().and_then(|name| name.rsplit_once('.')).is_some_and(|(_, ext)| EXTENSIONS.contains(&ext)))
        .map(String::from)
        .collect()
}

/// Whether `path` (from the repository's root, `*` matching within one
/// name) names at least one file there.
fn exists(root: &Path, path: &str) -> bool {
    let Some((dir, pattern)) = path.rsplit_once('/').filter(|_| path.contains('*')) else {
        return root.join(path).exists();
    };
    let Some((head, tail)) = pattern.split_once('*') else { return false };
    std::fs::read_dir(root.join(dir)).is_ok_and(|d| {
        d.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        })
    })
}

/// The files the repository's .gitignore names from its root (`/notebooks/progress.json`):
/// written at run time, never committed.
fn ignored(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join(".gitignore"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix('/'))
        .map(|l| l.trim_end_matches('/').to_string())
        .collect()
}

#[test]
fn every_path_a_module_doc_cites_is_a_file_of_the_repository() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("crate/src"), &mut files);
    files.sort();
    let ignored = ignored(&root);
    let (mut cited, mut missing) = (0, Vec::new());
    for file in &files {
        for path in cited_paths(&std::fs::read_to_string(file).unwrap()) {
            if path.contains(['<', '{']) || ignored.iter().any(|i| path == *i || path.starts_with(&format!("{i}/"))) {
                continue;
            }
            cited += 1;
            if !exists(&root, &path) {
                missing.push(format!("{} cites {path}", file.strip_prefix(&root).unwrap_or(file).display()));
            }
        }
    }
    assert!(missing.is_empty(), "module docs cite paths the repository does not have:\n{}", missing.join("\n"));
    // The scan reads the docs (kernels/, crate/reference/, notebooks/ are cited by several).
    assert!(cited >= 10, "only {cited} paths found in module docs: is the scan reading them?");
}

#[test]
fn the_scan_finds_paths_and_globs_and_skips_what_names_no_file() {
    let doc = "//! Runs `kernels/tile_*.cu` (see kernels/tile_blur.cuh), writes\n//! data/<device>/<lab>.json; copy/compute overlap, image/svg+xml.\n/// crate/reference/not_a_module_doc.py\nfn f() {}";
    assert_eq!(cited_paths(doc), ["kernels/tile_*.cu", "kernels/tile_blur.cuh", "data/<device>/<lab>.json"]);
    let root = repo_root();
    assert!(exists(&root, "kernels/tile_*.cu") && exists(&root, "kernels/tile_blur.cuh"));
    assert!(!exists(&root, "kernels/tile_*.py") && !exists(&root, "shared/notes/pitfalls.md"));
    assert!(ignored(&root).iter().any(|i| i == "notebooks/progress.json"), "{:?}", ignored(&root));
}
