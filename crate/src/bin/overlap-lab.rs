//! The overlap-lab command line: run the labs on a GPU, record the results,
//! regenerate every report figure from the records.

use clap::{Args, Parser, Subcommand};
use overlap_lab::gpu::{Availability, Gpu, HostMemoryKind};
use overlap_lab::labs::bandwidth::{self, BandwidthConfig, Direction};
use overlap_lab::labs::callback::{self, CallbackConfig, Variant};
use overlap_lab::labs::double_buffer::{self, DoubleBufferConfig};
use overlap_lab::labs::overlap::{self, Intensity, IssueOrder, OverlapConfig};
use overlap_lab::progress::ProgressMode;
use overlap_lab::record::{default_data_dir, Record};
use overlap_lab::{report, Bytes, LabError, Result};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "overlap-lab", version, about = "Measure how CUDA host<->device transfers work and how to hide them behind compute.", long_about = None)]
struct Cli {
    /// Directory of recorded results (default: the repository's data/, or $OVERLAP_LAB_DATA).
    #[arg(long, global = true, value_name = "DIR")]
    data: Option<PathBuf>,
    /// No progress output.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the device's fingerprint (what every record carries).
    Device {
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lab 1: pinned vs pageable bandwidth sweep, two clocks, pinning cost.
    Bandwidth(BandwidthArgs),
    /// Lab 2: chunked copy/compute overlap over N streams, against the bounds and the queue model.
    Overlap(OverlapArgs),
    /// Lab 3: double buffering (CPU producer, copy and compute streams) against no overlap.
    DoubleBuffer(DoubleBufferArgs),
    /// Lab 4: where a CPU argmin runs (host function, callback stream, worker thread, event wait) and what it costs the GPU.
    Callback(CallbackArgs),
    /// Regenerate every report figure (SVG + PNG) from recorded data; no GPU needed.
    Report {
        /// Output directory.
        #[arg(long, default_value = "target/report", value_name = "DIR")]
        out: PathBuf,
    },
    /// Run every lab on the GPU, record the results, then the report. With no
    /// GPU, say so and render the recorded data.
    All {
        #[arg(long, default_value_t = 0)]
        device: usize,
        #[arg(long, default_value = "target/report", value_name = "DIR")]
        out: PathBuf,
        /// How big each lab's run is. Only `full` is recorded and reported.
        #[arg(long, value_enum, default_value_t = Preset::Full)]
        preset: Preset,
        /// Do not write the records to the data directory.
        #[arg(long)]
        no_record: bool,
    },
}

impl Preset {
    /// One lab's configuration for this preset.
    fn pick<T>(self, full: fn() -> T, quick: fn() -> T, small: fn() -> T) -> T {
        match self {
            Preset::Full => full(),
            Preset::Quick => quick(),
            Preset::Small => small(),
        }
    }
}

/// How big a run of every lab is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Preset {
    /// Each lab's full sweep, as recorded in data/ (a few minutes).
    Full,
    /// The notebooks' shorter runs.
    Quick,
    /// The smallest runs that touch every code path: for compute-sanitizer,
    /// Nsight and smoke tests, not for numbers.
    Small,
}

#[derive(Args)]
struct BandwidthArgs {
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Smallest copy (powers of two from here), e.g. 4KiB.
    #[arg(long, default_value_t = BandwidthConfig::default().min_bytes)]
    min: Bytes,
    /// Largest copy, e.g. 1GiB.
    #[arg(long, default_value_t = BandwidthConfig::default().max_bytes)]
    max: Bytes,
    /// Host memory kinds, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = BandwidthConfig::default().kinds)]
    kinds: Vec<HostMemoryKind>,
    /// Directions, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = BandwidthConfig::default().directions)]
    directions: Vec<Direction>,
    /// Timed samples per point.
    #[arg(long, default_value_t = BandwidthConfig::default().repeats)]
    repeats: usize,
    /// Untimed samples first.
    #[arg(long, default_value_t = BandwidthConfig::default().warmup)]
    warmup: usize,
    /// Repeats of each allocation when pricing pinning (0 skips it).
    #[arg(long, default_value_t = BandwidthConfig::default().pin_cost_repeats)]
    pin_cost_repeats: usize,
    /// Do not write the record to the data directory.
    #[arg(long)]
    no_record: bool,
}

#[derive(Args)]
struct OverlapArgs {
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// f32 elements in the data set (32Mi = 128 MiB each way).
    #[arg(long, default_value_t = OverlapConfig::default().elements)]
    elements: usize,
    /// Chunk counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = OverlapConfig::default().chunks)]
    chunks: Vec<usize>,
    /// Stream counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = OverlapConfig::default().streams)]
    streams: Vec<usize>,
    /// Kernel intensities, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = OverlapConfig::default().intensities)]
    intensities: Vec<Intensity>,
    /// Issue orders, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = OverlapConfig::default().orders)]
    orders: Vec<IssueOrder>,
    #[arg(long, default_value_t = OverlapConfig::default().repeats)]
    repeats: usize,
    #[arg(long, default_value_t = OverlapConfig::default().warmup)]
    warmup: usize,
    /// Do not write the record to the data directory.
    #[arg(long)]
    no_record: bool,
}

#[derive(Args)]
struct DoubleBufferArgs {
    #[arg(long, default_value_t = 0)]
    device: usize,
    #[arg(long, default_value_t = DoubleBufferConfig::default().batches)]
    batches: usize,
    /// f32 elements per batch (2Mi = 8 MiB).
    #[arg(long, default_value_t = DoubleBufferConfig::default().batch_elements)]
    batch_elements: usize,
    /// Kernel time over copy time per batch.
    #[arg(long, default_value_t = DoubleBufferConfig::default().kernel_over_copy)]
    kernel_over_copy: f64,
    /// Kernel time at least this many times the CPU producer's per batch (0: no floor), so the GPU stays the slowest stage
    #[arg(long, default_value_t = DoubleBufferConfig::default().kernel_over_produce)]
    kernel_over_produce: f64,
    #[arg(long, default_value_t = DoubleBufferConfig::default().repeats)]
    repeats: usize,
    #[arg(long, default_value_t = DoubleBufferConfig::default().warmup)]
    warmup: usize,
    /// Do not write the record to the data directory.
    #[arg(long)]
    no_record: bool,
}

#[derive(Args)]
struct CallbackArgs {
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Key rows (scores per iteration).
    #[arg(long, default_value_t = CallbackConfig::default().rows)]
    rows: usize,
    /// f32 per key row (a multiple of 4).
    #[arg(long, default_value_t = CallbackConfig::default().dim)]
    dim: usize,
    /// Iterations (queries) per run.
    #[arg(long, default_value_t = CallbackConfig::default().iterations)]
    iterations: usize,
    /// Pinned score slots in the pool.
    #[arg(long, default_value_t = CallbackConfig::default().slots)]
    slots: usize,
    /// CPU cost per iteration over GPU time per iteration, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = CallbackConfig::default().cpu_over_gpu)]
    cpu_over_gpu: Vec<f64>,
    /// Variants, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = CallbackConfig::default().variants)]
    variants: Vec<Variant>,
    #[arg(long, default_value_t = CallbackConfig::default().repeats)]
    repeats: usize,
    #[arg(long, default_value_t = CallbackConfig::default().warmup)]
    warmup: usize,
    /// Do not write the record to the data directory.
    #[arg(long)]
    no_record: bool,
}

impl CallbackArgs {
    fn config(&self) -> CallbackConfig {
        CallbackConfig {
            device: self.device,
            rows: self.rows,
            dim: self.dim,
            iterations: self.iterations,
            slots: self.slots,
            cpu_over_gpu: self.cpu_over_gpu.clone(),
            variants: self.variants.clone(),
            warmup: self.warmup,
            repeats: self.repeats,
        }
    }
}

impl DoubleBufferArgs {
    fn config(&self) -> DoubleBufferConfig {
        DoubleBufferConfig {
            device: self.device,
            batches: self.batches,
            batch_elements: self.batch_elements,
            kernel_over_copy: self.kernel_over_copy,
            kernel_over_produce: self.kernel_over_produce,
            warmup: self.warmup,
            repeats: self.repeats,
        }
    }
}

impl OverlapArgs {
    fn config(&self) -> OverlapConfig {
        OverlapConfig {
            device: self.device,
            elements: self.elements,
            chunks: self.chunks.clone(),
            streams: self.streams.clone(),
            intensities: self.intensities.clone(),
            orders: self.orders.clone(),
            warmup: self.warmup,
            repeats: self.repeats,
            ..OverlapConfig::default()
        }
    }
}

impl BandwidthArgs {
    fn config(&self) -> BandwidthConfig {
        BandwidthConfig {
            device: self.device,
            min_bytes: self.min,
            max_bytes: self.max,
            kinds: self.kinds.clone(),
            directions: self.directions.clone(),
            warmup: self.warmup,
            repeats: self.repeats,
            pin_cost_repeats: self.pin_cost_repeats,
            ..BandwidthConfig::default()
        }
    }
}

fn progress(quiet: bool) -> ProgressMode {
    if quiet {
        ProgressMode::Quiet
    } else {
        ProgressMode::Auto
    }
}

/// Opens the device, runs a lab, prints its tables, records it if asked.
fn run_lab<T: serde::Serialize + serde::de::DeserializeOwned>(
    lab: &str,
    device: usize,
    data: Option<&PathBuf>,
    measure: impl FnOnce(&Gpu) -> Result<T>,
    tables: impl FnOnce(&Record<T>) -> String,
) -> Result<()> {
    let gpu = Gpu::open(device)?;
    let fp = gpu.fingerprint()?;
    eprintln!("{}", fp.describe());
    let rec = Record::new(lab, fp, measure(&gpu)?);
    println!("{}", tables(&rec));
    if let Some(dir) = data {
        println!("recorded: {}", overlap_lab::record::display_path(&rec.save(dir)?));
    }
    Ok(())
}

fn run_bandwidth(cfg: &BandwidthConfig, data: Option<&PathBuf>, quiet: bool) -> Result<()> {
    cfg.validate()?; // before touching the GPU: bad input fails fast
    run_lab(
        bandwidth::LAB,
        cfg.device,
        data,
        |gpu| bandwidth::measure::run(gpu, cfg, progress(quiet)),
        |rec| {
            format!(
                "{}\n{}\n{}",
                bandwidth::model::summary_table(rec),
                bandwidth::model::pin_cost_table(&rec.results),
                bandwidth::model::break_even_table(&rec.results)
            )
        },
    )
}

fn run_overlap(cfg: &OverlapConfig, data: Option<&PathBuf>, quiet: bool) -> Result<()> {
    cfg.validate()?;
    run_lab(overlap::LAB, cfg.device, data, |gpu| overlap::measure::run(gpu, cfg, progress(quiet)), |rec| rec.results.summary())
}

fn run_double_buffer(cfg: &DoubleBufferConfig, data: Option<&PathBuf>, quiet: bool) -> Result<()> {
    cfg.validate()?;
    run_lab(double_buffer::LAB, cfg.device, data, |gpu| double_buffer::measure::run(gpu, cfg, progress(quiet)), |rec| rec.results.summary())
}

fn run_callback(cfg: &CallbackConfig, data: Option<&PathBuf>, quiet: bool) -> Result<()> {
    cfg.validate()?;
    run_lab(callback::LAB, cfg.device, data, |gpu| callback::measure::run(gpu, cfg, progress(quiet)), |rec| rec.results.table())
}

fn run_report(data: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let files = report::generate(data, out)?;
    println!("report: {} files in {}", files.len(), overlap_lab::record::display_path(out));
    for f in files {
        println!("  {}", overlap_lab::record::display_path(&f));
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let data = cli.data.clone().unwrap_or_else(default_data_dir);
    match cli.command {
        Command::Device { device, json } => {
            let fp = Gpu::open(device)?.fingerprint()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&fp).expect("fingerprint serializes"));
            } else {
                println!("{}", fp.describe());
            }
        }
        Command::Bandwidth(args) => {
            let keep = (!args.no_record).then_some(&data);
            run_bandwidth(&args.config(), keep, cli.quiet)?;
        }
        Command::Overlap(args) => {
            let keep = (!args.no_record).then_some(&data);
            run_overlap(&args.config(), keep, cli.quiet)?;
        }
        Command::DoubleBuffer(args) => {
            let keep = (!args.no_record).then_some(&data);
            run_double_buffer(&args.config(), keep, cli.quiet)?;
        }
        Command::Callback(args) => {
            let keep = (!args.no_record).then_some(&data);
            run_callback(&args.config(), keep, cli.quiet)?;
        }
        Command::Report { out } => run_report(&data, &out)?,
        Command::All { device, out, preset, no_record } => {
            let avail = Availability::probe();
            if avail.is_ready() {
                // Only full runs are worth keeping: the others would replace real numbers.
                let keep = (preset == Preset::Full && !no_record).then_some(&data);
                if keep.is_none() {
                    println!(
                        "not recording: {}; no report either (`overlap-lab report` draws data/)",
                        if no_record { "--no-record" } else { "only --preset full is recorded" }
                    );
                }
                let bw = preset.pick(BandwidthConfig::default, BandwidthConfig::quick, BandwidthConfig::small);
                run_bandwidth(&BandwidthConfig { device, ..bw }, keep, cli.quiet)?;
                let ov = preset.pick(OverlapConfig::default, OverlapConfig::quick, OverlapConfig::small);
                run_overlap(&OverlapConfig { device, ..ov }, keep, cli.quiet)?;
                let db = preset.pick(DoubleBufferConfig::default, DoubleBufferConfig::quick, DoubleBufferConfig::small);
                run_double_buffer(&DoubleBufferConfig { device, ..db }, keep, cli.quiet)?;
                let cb = preset.pick(CallbackConfig::default, CallbackConfig::quick, CallbackConfig::small);
                run_callback(&CallbackConfig { device, ..cb }, keep, cli.quiet)?;
                if keep.is_some() {
                    run_report(&data, &out)?;
                }
            } else {
                println!("no GPU: {}; rendering the recorded data instead.", avail.reason());
                run_report(&data, &out)?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // `overlap-lab report | head` should stop quietly when head does, as
    // other command-line tools do, not panic on the closed pipe.
    // SAFETY: restores the default action of one signal before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("overlap-lab: error: {e}");
            match e {
                LabError::Config(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
