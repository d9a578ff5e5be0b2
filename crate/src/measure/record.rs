//! Recorded results: one JSON file per lab per device under
//! `data/<device-slug>/<lab>.json`, with schema version, fingerprint, command
//! line and date, so notebooks and figures work with no GPU and say so.

use crate::error::{LabError, Result};
use crate::measure::fingerprint::Fingerprint;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// 2: lab 1 prices first and repeated allocations apart (`PinCostPoint`).
pub const SCHEMA_VERSION: u32 = 2;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record<T> {
    pub schema_version: u32,
    pub lab: String,
    pub tool_version: String,
    pub fingerprint: Fingerprint,
    /// The command line that produced it.
    pub command: Vec<String>,
    pub created: chrono::DateTime<chrono::Utc>,
    pub results: T,
}

impl<T: Serialize + DeserializeOwned> Record<T> {
    pub fn new(lab: &str, fingerprint: Fingerprint, results: T) -> Self {
        Record {
            schema_version: SCHEMA_VERSION,
            lab: lab.to_string(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            fingerprint,
            command: user_command(&std::env::args().collect::<Vec<_>>()),
            created: chrono::Utc::now(),
            results,
        }
    }

    pub fn path_in(&self, data_dir: &Path) -> PathBuf {
        data_dir.join(self.fingerprint.slug()).join(format!("{}.json", self.lab))
    }

    /// Writes atomically (temp file then rename): a crash never leaves half a record.
    pub fn save(&self, data_dir: &Path) -> Result<PathBuf> {
        let path = self.path_in(data_dir);
        let dir = path.parent().expect("path has a parent");
        std::fs::create_dir_all(dir).map_err(|e| LabError::io(format!("creating {}", dir.display()), e))?;
        write_atomic(&path, &(serde_json::to_string_pretty(self).expect("records serialize") + "\n"))?;
        Ok(path)
    }

    pub fn load(path: &Path) -> Result<Self> {
        let value: serde_json::Value = read_json(path)?;
        let version = value.get("schema_version").and_then(|v| v.as_u64());
        if version != Some(SCHEMA_VERSION as u64) {
            return Err(LabError::BadData { path: display_path(path), reason: format!("schema version {version:?}, this tool reads {SCHEMA_VERSION}") });
        }
        serde_json::from_value(value).map_err(|e| LabError::BadData { path: display_path(path), reason: e.to_string() })
    }

    /// The command that made it, as a user would type it: `overlap-lab
    /// overlap --chunks 4`, whatever path the binary ran from and wherever
    /// the record was written (older records are shown the same way).
    pub fn command_line(&self) -> String {
        user_command(&self.command).join(" ")
    }

    /// "recorded on NVIDIA H100 80GB HBM3, 2026-11-21 14:02 UTC"
    pub fn provenance(&self) -> String {
        format!("{}, {}", self.fingerprint.gpu_name, self.created.format("%Y-%m-%d %H:%M UTC"))
    }
}

/// `args` (a process's command line) as a user would type it: the program
/// is `overlap-lab` wherever it ran from (`.gpu/overlap-lab`,
/// `target/release/overlap-lab`), and options that only say where output
/// goes (`--data`, `--out`, `--quiet`, `--no-record`) are left out, since
/// they change nothing that was measured.
pub fn user_command(args: &[String]) -> Vec<String> {
    const WHERE_ONLY_WITH_VALUE: [&str; 2] = ["--data", "--out"];
    const WHERE_ONLY_FLAGS: [&str; 3] = ["--quiet", "-q", "--no-record"];
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.iter();
    if let Some(program) = it.next() {
        let name = Path::new(program).file_name().map_or(program.clone(), |n| n.to_string_lossy().into_owned());
        out.push(if name.starts_with("overlap-lab") { "overlap-lab".to_string() } else { name });
    }
    while let Some(a) = it.next() {
        if WHERE_ONLY_WITH_VALUE.contains(&a.as_str()) {
            it.next();
        } else if !(WHERE_ONLY_FLAGS.contains(&a.as_str()) || WHERE_ONLY_WITH_VALUE.iter().any(|o| a.starts_with(&format!("{o}=")))) {
            out.push(a.clone());
        }
    }
    out
}

/// A JSON file of the data directory as `T`; errors name it as
/// [`display_path`] does (missing, unreadable, or not a `T`).
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LabError::MissingData { path: display_path(path) },
        _ => LabError::io(format!("reading {}", path.display()), e),
    })?;
    serde_json::from_str(&text).map_err(|e| LabError::BadData { path: display_path(path), reason: e.to_string() })
}

/// The repository's root (the folder holding `crate/` and `data/`).
pub fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// `path` relative to the repository when it lies inside it
/// (`data/nvidia-h200/overlap.json`), else as given: what outputs print,
/// so they name no folder of the machine that ran them.
pub fn display_path(path: &Path) -> String {
    let abs = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    abs.strip_prefix(repo_root()).map_or_else(|_| path.display().to_string(), |rel| rel.display().to_string())
}

/// Writes `text` to `path` whole or not at all: into a temporary file of
/// this process's own beside it, then renamed over it, so a reader (or a
/// crash) never meets half a file.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let name = path.file_name().map_or("file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!("{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| LabError::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| LabError::io(format!("writing {}", path.display()), e))
}

/// Where recorded data lives: `$OVERLAP_LAB_DATA`, else the repository's
/// `data/` next to this crate (works from the CLI and from notebooks).
pub fn default_data_dir() -> PathBuf {
    repo_folder("OVERLAP_LAB_DATA", "data")
}

/// A folder of the repository: `$<env>` where set, else `<folder>` next to
/// this crate, else `<folder>` here.
pub fn repo_folder(env: &str, folder: &str) -> PathBuf {
    if let Some(d) = std::env::var_os(env) {
        return PathBuf::from(d);
    }
    let beside_crate = repo_root().join(folder);
    if beside_crate.is_dir() {
        return beside_crate;
    }
    PathBuf::from(folder)
}

/// Every recording of `lab` under `data_dir`, newest first.
pub fn find_recordings<T: Serialize + DeserializeOwned>(data_dir: &Path, lab: &str) -> Result<Vec<(PathBuf, Record<T>)>> {
    let entries = std::fs::read_dir(data_dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LabError::MissingData { path: display_path(data_dir) },
        _ => LabError::io(format!("listing {}", data_dir.display()), e),
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path().join(format!("{lab}.json"));
        if path.is_file() {
            found.push((path.clone(), Record::<T>::load(&path)?));
        }
    }
    if found.is_empty() {
        return Err(LabError::MissingData { path: display_path(&data_dir.join("<device>").join(format!("{lab}.json"))) });
    }
    found.sort_by_key(|r| std::cmp::Reverse(r.1.created));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Toy {
        x: u32,
    }

    #[test]
    fn save_load_round_trip_and_newest_first() {
        let dir = crate::testing::temp_dir("record");
        let mut a = Record::new("toy", crate::testing::fingerprint(), Toy { x: 1 });
        a.created = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let pa = a.save(&dir).unwrap();
        assert!(pa.ends_with("test-gpu/toy.json"), "{}", pa.display());
        let mut fb = crate::testing::fingerprint();
        fb.gpu_name = "Other GPU".into();
        let b = Record::new("toy", fb, Toy { x: 2 });
        b.save(&dir).unwrap();
        let all = find_recordings::<Toy>(&dir, "toy").unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].1.results, Toy { x: 2 }, "newest first");
        assert_eq!(Record::<Toy>::load(&pa).unwrap().results, Toy { x: 1 });
        assert!(!dir.join("test-gpu/toy.json.tmp").exists());
    }

    #[test]
    fn commands_read_as_a_user_would_type_them() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(user_command(&args(".gpu/overlap-lab --data /root/out/data overlap")).join(" "), "overlap-lab overlap");
        assert_eq!(user_command(&args("/x/target/release/overlap-lab -q --data=/tmp/d all --out /tmp/report")).join(" "), "overlap-lab all");
        assert_eq!(user_command(&args("overlap-lab overlap --chunks 1,4 --no-record")).join(" "), "overlap-lab overlap --chunks 1,4");
        assert_eq!(user_command(&args("notebook bandwidth")).join(" "), "notebook bandwidth");
        let mut r = Record::new("toy", crate::testing::fingerprint(), Toy { x: 1 });
        r.command = args(".gpu/overlap-lab --data /root/out/data callback");
        assert_eq!(r.command_line(), "overlap-lab callback");
        assert!(!Record::new("toy", crate::testing::fingerprint(), Toy { x: 1 }).command.iter().any(|a| a == "--data"));
    }

    #[test]
    fn paths_inside_the_repository_print_relative_to_it() {
        let data = repo_root().join("data").join("nvidia-h200");
        assert_eq!(display_path(&data), "data/nvidia-h200");
        assert_eq!(display_path(Path::new("/nonexistent/x.json")), "/nonexistent/x.json");
    }

    #[test]
    fn missing_and_bad_files_are_clear_errors() {
        let dir = crate::testing::temp_dir("record-bad");
        let e = Record::<Toy>::load(&dir.join("nope.json")).unwrap_err();
        assert!(matches!(e, LabError::MissingData { .. }), "{e}");
        assert!(e.to_string().contains("overlap-lab all"));
        std::fs::write(dir.join("bad.json"), "{ not json").unwrap();
        assert!(matches!(Record::<Toy>::load(&dir.join("bad.json")).unwrap_err(), LabError::BadData { .. }));
        std::fs::write(dir.join("old.json"), r#"{"schema_version": 0}"#).unwrap();
        let e = Record::<Toy>::load(&dir.join("old.json")).unwrap_err().to_string();
        assert!(e.contains("schema version"), "{e}");
        assert!(matches!(find_recordings::<Toy>(&dir, "toy").unwrap_err(), LabError::MissingData { .. }));
        assert!(matches!(find_recordings::<Toy>(&dir.join("absent"), "toy").unwrap_err(), LabError::MissingData { .. }));
    }
}
