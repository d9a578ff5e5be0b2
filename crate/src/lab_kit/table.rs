//! The lab table: every lab's one name and its entry points, in one list
//! ([`crate::labs::ALL`]). The command line's lab subcommands, `overlap-lab all`, the
//! report, the recorded-data tests and the README's lab table are derived
//! from it, so adding a lab is its module, its notebook, its recording and
//! one entry here.

use crate::error::Result;
use crate::gpu::Gpu;
use crate::lab_kit::headline::HeadlineFigure;
use crate::lab_kit::LabRun;
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

/// What a lab's run is told besides its settings.
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

/// A lab as the tools around it see it.
pub trait Lab: Sync {
    /// 1, 2, ...: its place in the course.
    fn number(&self) -> u8;
    /// The one name: the CLI subcommand, the data file `<name>.json`, the
    /// headline table's section; the module is the same with `_` for `-`.
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
    /// The subcommand `overlap-lab <name>`: the lab's settings as options.
    fn command(&self) -> clap::Command;
    /// Runs the lab on the GPU with the settings parsed from its subcommand
    /// (`None`: the preset's), prints its tables and records it if asked;
    /// returns its headline figures.
    fn run(&self, matches: Option<&clap::ArgMatches>, preset: Preset, cx: &RunContext) -> Result<Vec<HeadlineFigure>>;
    /// Checks the settings of every preset (what `all --preset` runs),
    /// without a GPU.
    fn check_presets(&self) -> Result<()>;
    /// Loads `dev/<name>.json` if there is one: its headline rows, and its
    /// figures rendered into `out/<device>/` when `out` is given.
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
pub struct Entry<C: 'static, T: 'static> {
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
    /// The subcommand's one-line help.
    pub about: &'static str,
    pub measure: fn(&Gpu, &C, ProgressMode) -> Result<T>,
    /// What the command line prints after a run.
    pub tables: fn(&Record<T>) -> String,
    /// Renders a recording into a directory, each figure with `origin`
    /// (where the numbers come from) under its title.
    pub figures: fn(&Record<T>, &Path, &str) -> Result<Vec<PathBuf>>,
    pub headline: fn(&T) -> Vec<(String, String)>,
    /// The measured numbers behind the headline rows, each with its
    /// spread: how `all` sets a run beside the recording.
    pub headline_figures: fn(&T) -> Vec<HeadlineFigure>,
    /// The timeline charts its `figures` draw from runs, each with
    /// `origin` ([`Lab::timeline_charts`]).
    pub timelines: fn(&Record<T>, &str) -> Vec<crate::present::gantt::Gantt>,
}

impl<C, T: Serialize + DeserializeOwned> Entry<C, T> {
    /// `dev/<name>.json` if there is one, with where its numbers come from
    /// (the line under each figure's title).
    fn recording(&self, dev: &Path) -> Result<Option<(Record<T>, String)>> {
        let path = dev.join(format!("{}.json", self.name));
        if !path.is_file() {
            return Ok(None);
        }
        let rec = Record::<T>::load(&path)?;
        let origin = format!("recorded on {} by `{}`", rec.provenance(), rec.command_line());
        Ok(Some((rec, origin)))
    }
}

impl<C: LabConfig, T: Serialize + DeserializeOwned> Entry<C, T> {
    /// The lab in a notebook: run live with `cfg` when a GPU is here, else
    /// the newest recording, labelled as such.
    pub fn live_or_recorded(&self, cfg: C) -> Result<LabRun<T>> {
        LabRun::live_or_recorded(self.name, cfg.device(), |gpu| {
            cfg.validate()?;
            (self.measure)(gpu, &cfg, ProgressMode::Lines)
        })
    }
}

impl<C: LabConfig, T: Serialize + DeserializeOwned + Sync + 'static> Lab for Entry<C, T> {
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
    fn command(&self) -> clap::Command {
        // After the settings: their struct's own doc would replace the line.
        C::augment_args(clap::Command::new(self.name)).about(self.about)
    }
    fn run(&self, matches: Option<&clap::ArgMatches>, preset: Preset, cx: &RunContext) -> Result<Vec<HeadlineFigure>> {
        let mut cfg = match matches {
            Some(m) => C::from_arg_matches(m).map_err(|e| crate::LabError::config(command_line_error(&e)))?,
            None => C::preset(preset),
        };
        cfg.set_device(cx.device);
        // Before touching the GPU: bad input fails fast.
        cfg.validate()?;
        let gpu = Gpu::open(cx.device)?;
        let fp = gpu.fingerprint()?;
        eprintln!("{}", fp.describe());
        let rec = Record::new(self.name, fp, (self.measure)(&gpu, &cfg, cx.progress)?);
        println!("{}", (self.tables)(&rec));
        if let Some(dir) = cx.record_to {
            println!("recorded: {}", crate::measure::record::display_path(&rec.save(dir)?));
        }
        Ok((self.headline_figures)(&rec.results))
    }
    fn check_presets(&self) -> Result<()> {
        for p in [Preset::Headline, Preset::Full, Preset::Quick, Preset::Small] {
            C::preset(p).validate().map_err(|e| crate::LabError::config(format!("{} --preset {p:?}: {e}", self.name)))?;
        }
        Ok(())
    }
    fn visit(&self, dev: &Path, out: Option<&Path>) -> Result<Option<Visited>> {
        let Some((rec, origin)) = self.recording(dev)? else {
            return Ok(None);
        };
        let files = match out {
            Some(out) => (self.figures)(&rec, &out.join(rec.fingerprint.slug()), &origin)?,
            None => Vec::new(),
        };
        Ok(Some(Visited {
            gpu: rec.fingerprint.gpu_name.clone(),
            origin,
            lab: self.name,
            headline: (self.headline)(&rec.results),
            figures: (self.headline_figures)(&rec.results),
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
}
