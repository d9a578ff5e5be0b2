//! Lab 8's name ([`LAB`]: its subcommand, its records' and its report
//! files' name) and its settings: the options of `overlap-lab multi-gpu`,
//! their presets (`default` (full), `headline`, `quick`, `small`), their
//! checks, and which of the machine's GPUs the lab runs on.
//!
//! May use: `error`, `units` (sizes that take units) and the setting of
//! NCCL's CTAs (`gpu::nccl::NcclCtas`); no other room of the lab.

use crate::error::{LabError, Result};
use serde::{Deserialize, Serialize};

/// The lab's one name.
pub const LAB: &str = "multi-gpu";

/// The lab's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct MultiGpuConfig {
    #[arg(skip)]
    pub device: usize,
    /// How many GPUs the lab runs on: --device and the ones after it
    /// (wrapping), two at least. Copies and the four-way overlap use the
    /// first two; the pipeline has a stage on each, the all-reduce a rank
    /// on each. Default: every GPU this machine has.
    #[arg(long)]
    #[serde(default)]
    pub gpus: Option<usize>,
    /// Sizes of the copies between GPUs, comma-separated, MiB if no unit
    /// is given (1,16,1GiB).
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, value_delimiter = ',', default_values_t = MultiGpuConfig::default().sizes_mib)]
    pub sizes_mib: Vec<usize>,
    /// Copies (rounds, training steps) in a long run: each is timed as the
    /// long run minus a run of one, over one fewer.
    #[arg(long, default_value_t = MultiGpuConfig::default().copies)]
    pub copies: usize,
    /// Timed runs of each measurement, after one untimed run.
    #[arg(long, default_value_t = MultiGpuConfig::default().repeats)]
    pub repeats: usize,
    /// Chunks of the copy staged through pinned host memory.
    #[arg(long, default_value_t = MultiGpuConfig::default().staging_chunks)]
    pub staging_chunks: usize,
    /// What each of the four operations of the four-way overlap moves or
    /// computes, MiB if no unit is given.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = MultiGpuConfig::default().four_way_mib)]
    pub four_way_mib: usize,
    /// The pipeline's data, MiB if no unit is given.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = MultiGpuConfig::default().pipeline_mib)]
    pub pipeline_mib: usize,
    /// How long one stage takes over all of the pipeline's data, ms (its
    /// kernel is calibrated to it; each micro-batch takes its share).
    #[arg(long, default_value_t = MultiGpuConfig::default().stage_ms)]
    pub stage_ms: f64,
    /// Micro-batch counts of the bubble sweep (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = MultiGpuConfig::default().micro_batches)]
    pub micro_batches: Vec<usize>,
    /// Gradients on each GPU, MiB if no unit is given.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = MultiGpuConfig::default().grad_mib)]
    pub grad_mib: usize,
    /// Bucket sizes of the all-reduce sweep, comma-separated, MiB if no
    /// unit is given (each divides --grad-mib).
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, value_delimiter = ',', default_values_t = MultiGpuConfig::default().buckets_mib)]
    pub buckets_mib: Vec<usize>,
    /// The backward pass's compute against its all-reduces at the largest
    /// bucket: 2 makes the kernels twice as long as the communication
    /// there. NCCL moves small buckets at a fraction of its speed on large
    /// ones, so a ratio near 1 leaves the small buckets' sums longer than
    /// their layers, and nothing could hide them.
    #[arg(long, default_value_t = MultiGpuConfig::default().compute_ratio)]
    pub compute_ratio: f64,
    /// Message sizes of the all-reduce's bus-bandwidth sweep,
    /// comma-separated, MiB if no unit is given (1,64,1GiB); PyTorch's
    /// all_reduce runs the same sizes on the same GPUs.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, value_delimiter = ',', default_values_t = MultiGpuConfig::default().all_reduce_mib)]
    #[serde(default = "MultiGpuConfig::default_all_reduce_mib")]
    pub all_reduce_mib: Vec<usize>,
    /// The SMs NCCL's kernels may take beside the layers, swept: each
    /// setting a communicator of its own ("default" for NCCL's choice, 8
    /// for at most 8 CTAs, 2-8 for 2 to 8), comma-separated.
    #[arg(long, value_name = "CTAS", value_delimiter = ',', default_values = ["default", "32", "24", "16", "12"])]
    #[serde(default = "MultiGpuConfig::default_nccl_ctas")]
    pub nccl_ctas: Vec<crate::gpu::nccl::NcclCtas>,
    /// The Python that has PyTorch, for the reference copy between the same GPUs.
    #[arg(long, default_value_t = MultiGpuConfig::default().python)]
    pub python: String,
    /// Skip PyTorch's reference copy.
    #[arg(long)]
    pub no_reference: bool,
}

impl Default for MultiGpuConfig {
    fn default() -> Self {
        MultiGpuConfig {
            device: 0,
            gpus: None,
            sizes_mib: vec![1, 4, 16, 64],
            copies: 8,
            repeats: 7,
            staging_chunks: 8,
            four_way_mib: 64,
            pipeline_mib: 64,
            stage_ms: 20.0,
            micro_batches: vec![1, 2, 4, 8, 16, 32],
            grad_mib: 512,
            buckets_mib: vec![4, 8, 16, 32, 64],
            compute_ratio: 2.0,
            all_reduce_mib: Self::default_all_reduce_mib(),
            nccl_ctas: Self::default_nccl_ctas(),
            python: "python3".into(),
            no_reference: false,
        }
    }
}

impl MultiGpuConfig {
    fn default_all_reduce_mib() -> Vec<usize> {
        vec![1, 4, 16, 64, 256, 1024]
    }
    fn default_nccl_ctas() -> Vec<crate::gpu::nccl::NcclCtas> {
        use crate::gpu::nccl::NcclCtas;
        [None, Some(32), Some(24), Some(16), Some(12)].map(|c| c.map_or(NcclCtas::Default, NcclCtas::at_most)).to_vec()
    }
    /// The headline's sizes (the largest copy) with one below, fewer
    /// repeats; the pipeline and the training schedules at the micro-batch
    /// count the headline's bubble and the charts are at (the full sweep's
    /// other counts make no headline row).
    pub fn headline() -> Self {
        let full = Self::default();
        let drawn = super::PipelineResults::drawn(&full.micro_batches);
        MultiGpuConfig { sizes_mib: vec![4, 64], repeats: 5, micro_batches: vec![drawn], ..full }
    }
    /// The notebook's run.
    pub fn quick() -> Self {
        MultiGpuConfig {
            sizes_mib: vec![4, 64],
            copies: 6,
            repeats: 5,
            four_way_mib: 32,
            pipeline_mib: 32,
            stage_ms: 10.0,
            micro_batches: vec![1, 2, 4, 8, 16],
            grad_mib: 64,
            buckets_mib: vec![4, 16, 64],
            all_reduce_mib: vec![4, 64],
            nccl_ctas: vec![crate::gpu::nccl::NcclCtas::Default, crate::gpu::nccl::NcclCtas::at_most(16)],
            ..Self::default()
        }
    }
    /// Every code path, small (for compute-sanitizer and smoke tests). The
    /// copies stay at 32 MiB: under compute-sanitizer each API call is
    /// slowed, so the gaps between runs drown a copy of a microsecond.
    pub fn small() -> Self {
        MultiGpuConfig {
            sizes_mib: vec![32],
            copies: 4,
            repeats: 2,
            staging_chunks: 2,
            four_way_mib: 2,
            pipeline_mib: 2,
            stage_ms: 2.0,
            micro_batches: vec![1, 4],
            grad_mib: 4,
            buckets_mib: vec![1, 2],
            all_reduce_mib: vec![1],
            nccl_ctas: vec![crate::gpu::nccl::NcclCtas::Default, crate::gpu::nccl::NcclCtas::at_most(2)],
            no_reference: true,
            ..Self::default()
        }
    }
    pub fn validate(&self) -> Result<()> {
        let mib = |what: &str, v: usize| {
            if v == 0 || v > 16384 {
                Err(LabError::config(format!("{what} must be 1-16384 MiB (got {v})")))
            } else {
                Ok(())
            }
        };
        if self.sizes_mib.is_empty() {
            return Err(LabError::config("--sizes-mib must list at least one size"));
        }
        for &s in &self.sizes_mib {
            mib("--sizes-mib", s)?;
        }
        mib("--four-way-mib", self.four_way_mib)?;
        mib("--pipeline-mib", self.pipeline_mib)?;
        mib("--grad-mib", self.grad_mib)?;
        if self.copies < 2 || self.copies > 1000 {
            return Err(LabError::config(format!("--copies must be 2-1000: a copy is timed as a run of that many minus a run of one (got {})", self.copies)));
        }
        if self.repeats == 0 || self.repeats > 1000 {
            return Err(LabError::config(format!("--repeats must be 1-1000 (got {})", self.repeats)));
        }
        let smallest = self.sizes_mib.iter().min().copied().unwrap_or(1) << 18;
        if self.staging_chunks == 0 || self.staging_chunks > 1024 || smallest < 2 * self.staging_chunks {
            return Err(LabError::config(format!(
                "--staging-chunks must be 1-1024 and leave at least 8 bytes a chunk of the smallest --sizes-mib (got {})",
                self.staging_chunks
            )));
        }
        if !(self.stage_ms > 0.0 && self.stage_ms <= 10_000.0) {
            return Err(LabError::config(format!("--stage-ms must be more than 0 and at most 10000 ms (got {})", self.stage_ms)));
        }
        let elements = self.pipeline_mib << 18;
        if self.micro_batches.is_empty() || self.micro_batches.iter().any(|&m| m == 0 || m > 4096 || 2 * m > elements) {
            return Err(LabError::config(format!("--micro-batches must list counts of 1-4096 (got {:?})", self.micro_batches)));
        }
        if self.buckets_mib.is_empty() || self.buckets_mib.iter().any(|&b| b == 0 || b > self.grad_mib || self.grad_mib % b != 0) {
            return Err(LabError::config(format!(
                "--buckets-mib must list bucket sizes that divide --grad-mib {} evenly (got {:?})",
                self.grad_mib, self.buckets_mib
            )));
        }
        if self.all_reduce_mib.is_empty() {
            return Err(LabError::config("--all-reduce-mib must list at least one size"));
        }
        for &m in &self.all_reduce_mib {
            mib("--all-reduce-mib", m)?;
        }
        if self.nccl_ctas.first() != Some(&crate::gpu::nccl::NcclCtas::Default) {
            return Err(LabError::config(format!(
                "--nccl-ctas must start with default (NCCL's own choice, what the other settings are compared with): got {}",
                self.nccl_ctas.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
            )));
        }
        for c in &self.nccl_ctas {
            c.check()?;
        }
        if !(0.05..=20.0).contains(&self.compute_ratio) {
            return Err(LabError::config(format!("--compute-ratio must be 0.05-20 (got {})", self.compute_ratio)));
        }
        if let Some(n) = self.gpus.filter(|&n| !(2..=64).contains(&n)) {
            return Err(LabError::config(format!(
                "--gpus must be 2-64 (got {n}): the lab runs over several GPUs; on a machine with one, leave --gpus out and it runs what one GPU can"
            )));
        }
        Ok(())
    }

    /// The lab's GPUs (ordinals) on a machine of `found` GPUs: --device and
    /// the ones after it, wrapping, --gpus of them (default: all); just
    /// --device on a machine with one.
    pub fn lab_gpus(&self, found: usize) -> Result<Vec<usize>> {
        let n = match self.gpus {
            Some(n) if n > found => {
                return Err(LabError::config(format!("--gpus {n}: this machine has {found} GPU(s)")));
            }
            Some(n) => n,
            None => found.max(1),
        };
        Ok((0..n).map(|k| (self.device + k) % found.max(1)).collect())
    }
}

crate::lab_config!(MultiGpuConfig);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_bad_settings_name_the_setting() {
        for c in [MultiGpuConfig::default(), MultiGpuConfig::quick(), MultiGpuConfig::small()] {
            c.validate().unwrap();
        }
        let bad = |f: &dyn Fn(&mut MultiGpuConfig), want: &str| {
            let mut c = MultiGpuConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        bad(&|c| c.sizes_mib = vec![], "--sizes-mib");
        bad(&|c| c.sizes_mib = vec![0], "--sizes-mib must be 1-16384");
        bad(&|c| c.copies = 1, "--copies must be 2-1000");
        bad(&|c| c.repeats = 0, "--repeats");
        bad(&|c| c.staging_chunks = 0, "--staging-chunks");
        bad(&|c| c.stage_ms = f64::NAN, "--stage-ms");
        bad(&|c| c.micro_batches = vec![0], "--micro-batches");
        bad(&|c| c.buckets_mib = vec![3], "divide --grad-mib 512");
        bad(&|c| c.buckets_mib = vec![1024], "divide --grad-mib");
        bad(&|c| c.compute_ratio = 0.0, "--compute-ratio");
        bad(&|c| c.gpus = Some(1), "--gpus must be 2-64 (got 1)");
        bad(&|c| c.nccl_ctas = vec![crate::gpu::nccl::NcclCtas::at_most(8)], "--nccl-ctas must start with default");
        bad(&|c| c.nccl_ctas = vec![crate::gpu::nccl::NcclCtas::Default, crate::gpu::nccl::NcclCtas::at_most(0)], "NCCL's max CTAs 0");
        bad(&|c| c.all_reduce_mib = vec![], "--all-reduce-mib");
        bad(&|c| c.four_way_mib = 1 << 20, "--four-way-mib");
    }

    #[test]
    fn the_command_line_takes_gpus_sizes_and_cta_settings_and_defaults_to_the_config() {
        use crate::gpu::nccl::NcclCtas;
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            c: MultiGpuConfig,
        }
        let cli = Cli::try_parse_from(["multi-gpu", "--gpus", "4", "--all-reduce-mib", "64,1GiB", "--nccl-ctas", "default,8,2-4"]).unwrap();
        assert_eq!(cli.c.gpus, Some(4));
        assert_eq!(cli.c.all_reduce_mib, [64, 1024]);
        assert_eq!(cli.c.nccl_ctas, [NcclCtas::Default, NcclCtas::at_most(8), NcclCtas::AtMost { max: 4, min: Some(2) }]);
        assert_eq!(Cli::try_parse_from(["multi-gpu"]).unwrap().c, MultiGpuConfig::default());
        assert!(Cli::try_parse_from(["multi-gpu", "--nccl-ctas", "default,0"]).is_err());
    }

    #[test]
    fn the_lab_runs_on_every_gpu_from_device_on_or_gpus_of_them() {
        let c = MultiGpuConfig::default();
        assert_eq!(c.lab_gpus(1).unwrap(), [0]);
        assert_eq!(c.lab_gpus(2).unwrap(), [0, 1]);
        assert_eq!(c.lab_gpus(4).unwrap(), [0, 1, 2, 3]);
        assert_eq!(MultiGpuConfig { device: 3, ..c.clone() }.lab_gpus(4).unwrap(), [3, 0, 1, 2], "wraps");
        assert_eq!(MultiGpuConfig { gpus: Some(2), device: 1, ..c.clone() }.lab_gpus(4).unwrap(), [1, 2]);
        let e = MultiGpuConfig { gpus: Some(4), ..c }.lab_gpus(2).unwrap_err().to_string();
        assert!(e.contains("--gpus 4: this machine has 2 GPU(s)"), "{e}");
    }
}
