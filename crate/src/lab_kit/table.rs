//! The lab table: every lab's one name and its entry points, in one list
//! ([`crate::labs::ALL`]). The command line's lab subcommands, `overlap-lab
//! all`, the report, the recorded-data tests, the README's lab table, the
//! course's glossary and map, `overlap-lab progress` and the tests that
//! answer every exercise are derived from it, so adding a lab is its
//! folder, its notebook, its recording and one line in the table.
//!
//! A lab's recording is kept through [`Recorded`]: one JSON record
//! ([`Record`], `data/<gpu>/<lab>.json`) for every lab whose results are
//! numbers, or a folder of files for a lab whose results are files of
//! their own (lab 10's traces).

use crate::error::{LabError, Result};
use crate::gpu::Gpu;
use crate::lab_kit::headline::HeadlineFigure;
use crate::lab_kit::LabRun;
use crate::measure::fingerprint::Fingerprint;
use crate::measure::record::Record;
use crate::present::progress::ProgressMode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// How big a run of a lab is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// Every headline figure at the full sweep's sizes, with fewer points
    /// between them and fewer repeats: the default of `all`.
    Headline,
    /// Each lab's full sweep, as recorded in data/ (`all` says up front how
    /// long it takes on this GPU).
    Full,
    /// The notebooks' shorter runs.
    Quick,
    /// The smallest runs that touch every code path: for compute-sanitizer,
    /// Nsight and smoke tests, not for numbers.
    Small,
}

/// What a lab's run is told besides its settings (its `measure` gets it too).
pub struct RunContext<'a> {
    pub device: usize,
    /// The data directory: the recordings a run reads (lab 10 prices its
    /// fixes by lab 1's link rates).
    pub data: &'a Path,
    /// Where to record the results (`None`: do not record).
    pub record_to: Option<&'a Path>,
    pub progress: ProgressMode,
}

/// One lab's recording on one device, as the report sees it.
pub struct Visited {
    pub gpu: String,
    /// Where the recording comes from: its GPU, date and command.
    pub origin: String,
    pub lab: &'static str,
    /// (what, value) rows of the headline table.
    pub headline: Vec<(String, String)>,
    /// The measured numbers behind the headline rows.
    pub figures: Vec<HeadlineFigure>,
    /// The files rendered (none when only the headline was asked for).
    pub files: Vec<PathBuf>,
}

/// A word or abbreviation a lab's tables print, and what it means: the
/// lab's part of the course's glossary (`course::glossary`).
#[derive(Clone, Copy, Debug)]
pub struct Word {
    pub term: &'static str,
    pub meaning: &'static str,
}

impl Word {
    pub const fn new(term: &'static str, meaning: &'static str) -> Word {
        Word { term, meaning }
    }
}

/// What a lab's [`Lab::check_parts`] found its parts make of its fixture.
#[derive(Debug)]
pub struct PartsMade {
    /// The text its command line prints after a run.
    pub tables: String,
    /// Its headline rows.
    pub headline: Vec<(String, String)>,
    /// The measured numbers behind them.
    pub figures: Vec<HeadlineFigure>,
    /// The report's files, rendered into the folder asked for.
    pub files: Vec<PathBuf>,
    /// How many timeline charts its report draws from runs.
    pub timelines: usize,
}

/// What became of a run the table was asked to record.
#[derive(Debug)]
pub enum Kept {
    /// Written there.
    At(PathBuf),
    /// Not written, and why (a run of part of a set, recordings shown
    /// instead of a run).
    Not(String),
}

/// A lab's run as the data folder keeps it. Every lab whose results are
/// numbers is a [`Record`] (one JSON file with the fingerprint, the
/// command and the date); a lab whose results are files of their own
/// implements it for its own type.
pub trait Recorded: Sized + Sync + 'static {
    /// What the lab measured: what its tables, headline and checks read.
    type Results;
    /// A run just measured on the GPU with `fingerprint`.
    fn new(lab: &str, fingerprint: Fingerprint, results: Self::Results) -> Self;
    /// Lab `lab`'s recording in the GPU folder `dev` (`data/<gpu>/`), if
    /// it has one.
    fn load(dev: &Path, lab: &str) -> Result<Option<Self>>;
    /// Keeps it in the data folder `data`, under its GPU's folder.
    fn save(&self, data: &Path) -> Result<Kept>;
    fn results(&self) -> &Self::Results;
    /// The name of the GPU it ran on.
    fn gpu(&self) -> String;
    /// Where its numbers come from: "recorded on GPU, date by `command`".
    fn origin(&self) -> String;
    /// Whether this run measured here (not a recording shown in place of
    /// a run that could not be made: lab 10 under a sanitizer).
    fn measured_here(&self) -> bool {
        true
    }
}

impl<T: Serialize + DeserializeOwned + Sync + 'static> Recorded for Record<T> {
    type Results = T;
    fn new(lab: &str, fingerprint: Fingerprint, results: T) -> Self {
        Record::new(lab, fingerprint, results)
    }
    fn load(dev: &Path, lab: &str) -> Result<Option<Self>> {
        let path = dev.join(format!("{lab}.json"));
        if !path.is_file() {
            return Ok(None);
        }
        Record::load(&path).map(Some)
    }
    fn save(&self, data: &Path) -> Result<Kept> {
        Record::save(self, data).map(Kept::At)
    }
    fn results(&self) -> &T {
        &self.results
    }
    fn gpu(&self) -> String {
        self.fingerprint.gpu_name.clone()
    }
    fn origin(&self) -> String {
        format!("recorded on {} by `{}`", self.provenance(), self.command_line())
    }
}

/// A lab as the tools around it see it.
pub trait Lab: Sync {
    /// 1, 2, ...: its place in the course.
    fn number(&self) -> u8;
    /// The one name: the CLI subcommand, its recording in `data/<gpu>/`
    /// (`<name>.json`, or a folder `<name>/` for a lab that keeps files of
    /// its own), the headline table's section; the module is the same with
    /// `_` for `-`.
    fn name(&self) -> &'static str;
    /// What it teaches, in a line (the README's course map).
    fn teaches(&self) -> &'static str;
    /// What it needs from the labs before it: (lab number, what of it),
    /// for the course map.
    fn builds_on(&self) -> &'static [(u8, &'static str)];
    /// Its notebook, repository-relative: `notebooks/NN-<name>.ipynb`.
    fn notebook(&self) -> String {
        format!("notebooks/{:02}-{}.ipynb", self.number(), self.name())
    }
    /// Its module's path in the crate.
    fn module(&self) -> &'static str;
    /// Its own kernels of `kernels/` (compiled and checked by the tests
    /// with the pipelines' compute kernel; none for a lab that only uses that).
    fn kernels(&self) -> &'static [&'static crate::gpu::kernels::KernelSource];
    /// Its exercises, in the order of its notebook.
    fn exercises(&self) -> &'static [crate::lab_kit::progress::Exercise];
    /// The words its tables print, for the course's glossary.
    fn glossary(&self) -> &'static [Word];
    /// Every part of the lab made from its fixture (results made up for
    /// tests, no GPU): its tables, headline, figures (rendered into
    /// `out`) and timelines. A test asks it of every lab of the table.
    fn check_parts(&self, out: &Path) -> Result<PartsMade>;
    /// The subcommand `overlap-lab <name>`: the lab's settings as options.
    fn command(&self) -> clap::Command;
    /// Runs the lab on the GPU with the settings parsed from its subcommand
    /// (`None`: the preset's), prints its tables and records it if asked;
    /// returns its headline figures, or `None` where it measured nothing
    /// here (skipped within `all`, or a recording shown instead of a run).
    fn run(&self, matches: Option<&clap::ArgMatches>, preset: Preset, cx: &RunContext) -> Result<Option<Vec<HeadlineFigure>>>;
    /// Checks the settings of every preset (what `all --preset` runs),
    /// without a GPU.
    fn check_presets(&self) -> Result<()>;
    /// Loads its recording in `dev` if there is one: its headline rows, and
    /// its figures rendered into `out/<device>/` when `out` is given.
    fn visit(&self, dev: &Path, out: Option<&Path>) -> Result<Option<Visited>>;
    /// The timeline charts its report draws from the runs of
    /// `dev/<name>.json` (none where there is no such recording): what
    /// the recorded-data tests hold to one clock and their tables' order.
    fn timeline_charts(&self, dev: &Path) -> Result<Vec<crate::present::gantt::Gantt>>;
}

/// A lab's settings, as the table handles them ([`crate::lab_config!`] implements
/// it from the settings' own `default`, `quick`, `small` and `validate`).
pub trait LabConfig: clap::Args + clap::FromArgMatches + Default + Clone + Sync + 'static {
    fn headline() -> Self;
    fn quick() -> Self;
    fn small() -> Self;
    fn validate(&self) -> Result<()>;
    fn set_device(&mut self, device: usize);
    fn device(&self) -> usize;
    /// The settings of a preset.
    fn preset(p: Preset) -> Self {
        match p {
            Preset::Headline => Self::headline(),
            Preset::Full => Self::default(),
            Preset::Quick => Self::quick(),
            Preset::Small => Self::small(),
        }
    }
}

/// Implements [`LabConfig`] for a settings struct with a `device` field and
/// inherent `quick`, `small` and `validate`.
#[macro_export]
macro_rules! lab_config {
    ($t:ty) => {
        impl $crate::lab_kit::LabConfig for $t {
            fn headline() -> Self {
                <$t>::headline()
            }
            fn quick() -> Self {
                <$t>::quick()
            }
            fn small() -> Self {
                <$t>::small()
            }
            fn validate(&self) -> $crate::Result<()> {
                <$t>::validate(self)
            }
            fn set_device(&mut self, device: usize) {
                self.device = device;
            }
            fn device(&self) -> usize {
                self.device
            }
        }
    };
}

/// One entry of the table: a lab's names and the functions that make it.
/// `C` is its settings, `T` its results, `R` how its runs are kept (one
/// JSON [`Record`] unless the lab keeps files of its own).
pub struct Entry<C: 'static, T: 'static, R: 'static = Record<T>> {
    pub number: u8,
    pub name: &'static str,
    /// `module_path!()` of the lab's module (checked against the name).
    pub module: &'static str,
    pub teaches: &'static str,
    /// What it needs from the labs before it ([`Lab::builds_on`]).
    pub builds_on: &'static [(u8, &'static str)],
    /// Its own kernels of `kernels/` ([`Lab::kernels`]).
    pub kernels: &'static [&'static crate::gpu::kernels::KernelSource],
    /// Its exercises ([`Lab::exercises`]).
    pub exercises: &'static [crate::lab_kit::progress::Exercise],
    /// The words its tables print ([`Lab::glossary`]).
    pub glossary: &'static [Word],
    /// The subcommand's one-line help.
    pub about: &'static str,
    pub measure: fn(&Gpu, &C, &RunContext) -> Result<T>,
    /// What the command line prints after a run.
    pub tables: fn(&R) -> String,
    /// Renders a recording into a directory, each figure with `origin`
    /// (where the numbers come from) under its title.
    pub figures: fn(&R, &Path, &str) -> Result<Vec<PathBuf>>,
    pub headline: fn(&T) -> Vec<(String, String)>,
    /// The measured numbers behind the headline rows, each with its
    /// spread: how `all` sets a run beside the recording.
    pub headline_figures: fn(&T) -> Vec<HeadlineFigure>,
    /// The timeline charts its `figures` draw from runs, each with
    /// `origin` ([`Lab::timeline_charts`]).
    pub timelines: fn(&R, &str) -> Vec<crate::present::gantt::Gantt>,
    /// Results made up for tests with no GPU: its checker's unit tests,
    /// and [`Lab::check_parts`].
    pub fixture: fn() -> T,
}

impl<C, T, R: Recorded<Results = T>> Entry<C, T, R> {
    /// Its recording in `dev` if there is one, with where its numbers come
    /// from (the line under each figure's title).
    fn recording(&self, dev: &Path) -> Result<Option<(R, String)>> {
        Ok(R::load(dev, self.name)?.map(|rec| {
            let origin = rec.origin();
            (rec, origin)
        }))
    }
}

impl<C: LabConfig, T: Serialize + DeserializeOwned> Entry<C, T> {
    /// The lab in a notebook: run live with `cfg` when a GPU is here, else
    /// the newest recording, labelled as such.
    pub fn live_or_recorded(&self, cfg: C) -> Result<LabRun<T>> {
        LabRun::live_or_recorded(self.name, cfg.device(), |gpu| {
            cfg.validate()?;
            let data = crate::measure::record::default_data_dir();
            (self.measure)(gpu, &cfg, &RunContext { device: cfg.device(), data: &data, record_to: None, progress: ProgressMode::Lines })
        })
    }
}

impl<C: LabConfig, T: Sync + 'static, R: Recorded<Results = T>> Lab for Entry<C, T, R> {
    fn number(&self) -> u8 {
        self.number
    }
    fn name(&self) -> &'static str {
        self.name
    }
    fn teaches(&self) -> &'static str {
        self.teaches
    }
    fn builds_on(&self) -> &'static [(u8, &'static str)] {
        self.builds_on
    }
    fn module(&self) -> &'static str {
        self.module
    }
    fn kernels(&self) -> &'static [&'static crate::gpu::kernels::KernelSource] {
        self.kernels
    }
    fn exercises(&self) -> &'static [crate::lab_kit::progress::Exercise] {
        self.exercises
    }
    fn glossary(&self) -> &'static [Word] {
        self.glossary
    }
    fn check_parts(&self, out: &Path) -> Result<PartsMade> {
        let rec = R::new(self.name, crate::measure::fingerprint::Fingerprint::made_up(), (self.fixture)());
        let origin = format!("{} (made-up results)", rec.origin());
        Ok(PartsMade {
            tables: (self.tables)(&rec),
            headline: (self.headline)(rec.results()),
            figures: (self.headline_figures)(rec.results()),
            files: (self.figures)(&rec, out, &origin)?,
            timelines: (self.timelines)(&rec, &origin).len(),
        })
    }
    fn command(&self) -> clap::Command {
        // After the settings: their struct's own doc would replace the line.
        C::augment_args(clap::Command::new(self.name)).about(self.about)
    }
    fn run(&self, matches: Option<&clap::ArgMatches>, preset: Preset, cx: &RunContext) -> Result<Option<Vec<HeadlineFigure>>> {
        let mut cfg = match matches {
            Some(m) => C::from_arg_matches(m).map_err(|e| LabError::config(command_line_error(&e)))?,
            None => C::preset(preset),
        };
        cfg.set_device(cx.device);
        // Before touching the GPU: bad input fails fast.
        cfg.validate()?;
        let gpu = Gpu::open(cx.device)?;
        let fp = gpu.fingerprint()?;
        eprintln!("{}", fp.describe());
        let results = match (self.measure)(&gpu, &cfg, cx) {
            // Within `all`, a lab that cannot run here (lab 10 with no
            // PyTorch) is a line, not the end of the run.
            Err(LabError::Skipped(why)) if matches.is_none() => {
                println!("{}: skipped: {why}", self.name);
                return Ok(None);
            }
            r => r?,
        };
        let rec = R::new(self.name, fp, results);
        println!("{}", (self.tables)(&rec));
        if let Some(dir) = cx.record_to {
            match rec.save(dir)? {
                Kept::At(path) => println!("recorded: {}", crate::measure::record::display_path(&path)),
                Kept::Not(why) => println!("not recorded: {why}"),
            }
        }
        Ok(rec.measured_here().then(|| (self.headline_figures)(rec.results())))
    }
    fn check_presets(&self) -> Result<()> {
        for p in [Preset::Headline, Preset::Full, Preset::Quick, Preset::Small] {
            C::preset(p).validate().map_err(|e| LabError::config(format!("{} --preset {p:?}: {e}", self.name)))?;
        }
        Ok(())
    }
    fn visit(&self, dev: &Path, out: Option<&Path>) -> Result<Option<Visited>> {
        let Some((rec, origin)) = self.recording(dev)? else {
            return Ok(None);
        };
        let files = match out {
            Some(out) => (self.figures)(&rec, &out.join(crate::units::slug(&rec.gpu())), &origin)?,
            None => Vec::new(),
        };
        Ok(Some(Visited {
            gpu: rec.gpu(),
            origin,
            lab: self.name,
            headline: (self.headline)(rec.results()),
            figures: (self.headline_figures)(rec.results()),
            files,
        }))
    }
    fn timeline_charts(&self, dev: &Path) -> Result<Vec<crate::present::gantt::Gantt>> {
        Ok(self.recording(dev)?.map(|(rec, origin)| (self.timelines)(&rec, &origin)).unwrap_or_default())
    }
}

/// A command-line error as one line: clap's own words without its usage
/// and help lines, its tips folded in, and what a number option expects
/// where clap's parser only says why the text is no number.
pub fn command_line_error(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() == ErrorKind::ValueValidation {
        let text = |k| match e.get(k) {
            Some(ContextValue::String(s)) => Some(s.clone()),
            _ => None,
        };
        if let (Some(arg), Some(value), Some(why)) = (text(ContextKind::InvalidArg), text(ContextKind::InvalidValue), std::error::Error::source(e)) {
            let why = crate::units::number_expected(why, &value).unwrap_or_else(|| why.to_string());
            return format!("invalid value '{value}' for '{arg}': {why}");
        }
    }
    let rendered = e.render().to_string();
    let mut line = String::new();
    for l in rendered.lines().map(str::trim) {
        if l.is_empty() || l.starts_with("Usage:") || l.starts_with("For more information") {
            continue;
        }
        let l = l.strip_prefix("error: ").unwrap_or(l);
        // "[possible values: a, b]" reads as a clause of the line.
        let l = l.strip_prefix('[').and_then(|l| l.strip_suffix(']')).unwrap_or(l);
        if !line.is_empty() {
            line += if line.ends_with(':') { " " } else { "; " };
        }
        line += l.strip_prefix("tip: ").unwrap_or(l);
    }
    line
}

#[cfg(test)]
mod tests {
    use crate::labs::{find, ALL};

    #[test]
    fn one_name_per_lab_for_module_data_and_notebook() {
        for (i, lab) in ALL.iter().enumerate() {
            assert_eq!(lab.number() as usize, i + 1, "course order");
            assert_eq!(find(lab.name()).map(|l| l.number()), Some(lab.number()));
            assert!(lab.module().ends_with(&format!("::labs::{}", lab.name().replace('-', "_"))), "{} lives in {}", lab.name(), lab.module());
            assert!(lab.notebook().starts_with(&format!("notebooks/{:02}-", lab.number())), "{}", lab.notebook());
            let cmd = lab.command();
            assert_eq!(cmd.get_name(), lab.name());
            assert!(cmd.get_arguments().any(|a| a.get_id() == "repeats"), "{} takes --repeats", lab.name());
            lab.check_presets().unwrap();
        }
        assert!(find("no-such-lab").is_none());
    }

    /// Every lab of the table has every part the tools derive from its
    /// entry: its words for the glossary, exercises each with a right and
    /// a wrong example, a notebook, and a fixture from which its tables,
    /// headline, figures and timelines are all made, with no GPU.
    #[test]
    fn every_lab_has_every_part() {
        let root = crate::measure::record::repo_root();
        for lab in ALL.iter() {
            let name = lab.name();
            assert!(!lab.glossary().is_empty(), "{name}: no word for the glossary");
            assert!(!lab.exercises().is_empty(), "{name}: no exercise");
            for e in lab.exercises() {
                assert!(e.id.starts_with(&format!("{:02}-{name}", lab.number())), "{name}: exercise {} is another notebook's", e.id);
                assert!(!e.hints.is_empty() && !e.examples.mistake().is_empty(), "{name}: {} has no hints or no named mistake", e.id);
            }
            assert!(root.join(lab.notebook()).is_file(), "{name}: no {}", lab.notebook());
            let out = crate::testing::temp_dir(&format!("parts-{name}"));
            let made = lab.check_parts(&out).unwrap_or_else(|e| panic!("{name}: its fixture does not render: {e}"));
            assert!(!made.tables.trim().is_empty(), "{name}: no tables");
            assert!(!made.headline.is_empty(), "{name}: no headline row");
            assert!(!made.figures.is_empty() && made.figures.iter().all(|f| f.value.median.is_finite()), "{name}: headline figures {:?}", made.figures);
            let mut whats: Vec<&str> = made.figures.iter().map(|f| f.what.as_str()).collect();
            whats.sort();
            whats.dedup();
            assert_eq!(whats.len(), made.figures.len(), "{name}: two headline figures share a name (a run is matched to the recording by it)");
            assert!(!made.files.is_empty(), "{name}: its report draws nothing");
            for f in &made.files {
                let file = f.file_name().unwrap().to_string_lossy();
                assert!(file.starts_with(&format!("{name}-")) && f.is_file(), "{name}: report file {}", f.display());
            }
        }
    }
}
