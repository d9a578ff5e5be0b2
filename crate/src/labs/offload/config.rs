//! Lab 9's settings ([`OffloadConfig`]): the network, the ring, the GPU
//! budget (MiB, as the command line takes it and the results keep it),
//! the batches and the placement sweep, with the presets and the checks
//! a run makes before it starts.
//!
//! May use: `network`, `error` and `units`. No CUDA.

use super::network::{budget_bytes, Shape};
use crate::error::{LabError, Result};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// Lab 9's settings; `overlap-lab offload` takes each as an option.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct OffloadConfig {
    #[arg(skip)]
    pub device: usize,
    /// Layers of the network (fewer where host memory cannot hold the
    /// weights' copies: the run says what it chose).
    #[arg(long, default_value_t = OffloadConfig::default().layers)]
    pub layers: usize,
    /// The network's width d (a multiple of 64).
    #[arg(long, default_value_t = OffloadConfig::default().d_model)]
    pub d_model: usize,
    /// Slots in the GPU's ring of layer buffers (the ring-of-K variants; at least 3).
    #[arg(long, default_value_t = OffloadConfig::default().ring)]
    pub ring: usize,
    /// GPU memory the lab lets itself use, MiB if no unit is given (1536,
    /// 1.5GiB): the ring and the activations of the largest batch must fit
    /// in it.
    #[arg(long, value_name = "MIB", value_parser = crate::units::mib_option, default_value_t = OffloadConfig::default().gpu_budget)]
    pub gpu_budget: usize,
    /// Batch sizes (tokens per forward pass), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = OffloadConfig::default().batches)]
    pub batches: Vec<usize>,
    /// Untimed passes first, per variant and batch size.
    #[arg(long, default_value_t = OffloadConfig::default().warmup)]
    pub warmup: usize,
    /// Timed passes per variant and batch size.
    #[arg(long, default_value_t = OffloadConfig::default().repeats)]
    pub repeats: usize,
    /// The Python with PyTorch that runs the references (empty: none).
    #[arg(long, default_value_t = OffloadConfig::default().python)]
    pub python: String,
    /// Batch sizes the placement sweep runs at, each one of --batches
    /// (default: the first, middle and last of --batches).
    #[arg(long, value_delimiter = ',')]
    #[serde(default)]
    pub sweep_batches: Vec<usize>,
    /// GPU budgets at which the sweep measures a grid of placements beside
    /// the planner's choice, comma-separated, MiB if no unit is given (it
    /// also runs the planner's choice from all-streamed to all-resident).
    #[arg(long, value_name = "MIB", value_delimiter = ',', value_parser = crate::units::mib_option, default_values_t = OffloadConfig::default().sweep_budgets)]
    #[serde(default)]
    pub sweep_budgets: Vec<usize>,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        OffloadConfig {
            device: 0,
            layers: 96,
            d_model: 2048,
            ring: 3,
            gpu_budget: 1536,
            batches: vec![1024, 2048, 4096, 8192, 16384, 24576],
            warmup: 1,
            repeats: 5,
            python: "python3".into(),
            sweep_batches: Vec::new(),
            sweep_budgets: vec![1536, 3072, 4608],
        }
    }
}

impl OffloadConfig {
    /// Every headline figure (the best pass over the pageable one at the
    /// sweep's ends) at the full run's sizes: the two ends only, fewer
    /// repeats, no PyTorch.
    pub fn headline() -> Self {
        let full = Self::default();
        let ends = vec![full.batches[0], *full.batches.last().expect("a sweep")];
        OffloadConfig { batches: ends, repeats: 3, python: String::new(), sweep_budgets: Vec::new(), ..full }
    }
    /// The notebook's live run: a narrower network (d = 1024) under a
    /// smaller budget, still four times the budget, both sides of the crossover.
    pub fn quick() -> Self {
        OffloadConfig {
            d_model: 1024,
            gpu_budget: 384,
            batches: vec![2048, 8192, 24576],
            repeats: 3,
            sweep_batches: vec![2048],
            sweep_budgets: vec![384, 768],
            ..Self::default()
        }
    }
    /// The smallest run that touches every code path: for
    /// compute-sanitizer and smoke tests, not for numbers.
    pub fn small() -> Self {
        OffloadConfig {
            layers: 4,
            d_model: 256,
            ring: 3,
            gpu_budget: 64,
            batches: vec![64, 256],
            warmup: 0,
            repeats: 1,
            python: String::new(),
            sweep_batches: vec![256],
            sweep_budgets: vec![64, 80],
            ..Self::default()
        }
    }
    /// The batches the sweep runs at: those asked for, or the first,
    /// middle and last of the batches (none where no budget is asked for).
    pub fn sweep_at(&self) -> Vec<usize> {
        if self.sweep_budgets.is_empty() {
            return Vec::new();
        }
        if !self.sweep_batches.is_empty() {
            return self.sweep_batches.clone();
        }
        let mut b = self.batches.clone();
        b.sort_unstable();
        let mut at = vec![b[0], b[b.len() / 2], b[b.len() - 1]];
        at.dedup();
        at
    }
    /// The network asked for (the run may take fewer layers: see
    /// `measure::choose_shape`).
    pub fn shape(&self) -> Shape {
        Shape { layers: self.layers, d: self.d_model }
    }
    pub fn validate(&self) -> Result<()> {
        if !(2..=10_000).contains(&self.layers) {
            return Err(LabError::config(format!("--layers must be 2-10000 (got {})", self.layers)));
        }
        if self.d_model == 0 || self.d_model % 64 != 0 || self.d_model > 16384 {
            return Err(LabError::config(format!("--d-model must be a multiple of 64, up to 16384 (got {})", self.d_model)));
        }
        if !(3..=64).contains(&self.ring) {
            return Err(LabError::config(format!("--ring must be 3-64 slots (got {}); the lab also runs a ring of 2", self.ring)));
        }
        if self.batches.is_empty() || self.batches.iter().any(|&b| b == 0 || b % 8 != 0 || b > 1 << 20) {
            return Err(LabError::config(format!("--batches must be multiples of 8, 8 to 2^20 (got {:?})", self.batches)));
        }
        if self.repeats == 0 || self.repeats > 1000 || self.warmup > 100 {
            return Err(LabError::config("--repeats must be 1-1000 and --warmup 0-100"));
        }
        if let Some(b) = self.sweep_batches.iter().find(|b| !self.batches.contains(b)) {
            return Err(LabError::config(format!("--sweep-batches: {b} is not one of --batches {:?}", self.batches)));
        }
        if self.sweep_budgets.iter().any(|&m| m == 0 || m > 1 << 24) {
            return Err(LabError::config(format!("--sweep-budgets must be 1 MiB to 16 TiB each (got {:?} MiB)", self.sweep_budgets)));
        }
        let shape = self.shape();
        let largest = *self.batches.iter().max().expect("checked non-empty");
        let need = shape.gpu_bytes(largest, self.ring);
        if need > budget_bytes(self.gpu_budget) {
            return Err(LabError::config(format!(
                "a ring of {} layers ({}) and the activations of {largest} tokens need {}, over --gpu-budget {} MiB",
                self.ring,
                Bytes((self.ring * shape.layer_bytes()) as u64),
                Bytes(need as u64),
                self.gpu_budget
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_fits_its_budget_and_bad_settings_are_named() {
        for c in [OffloadConfig::default(), OffloadConfig::headline(), OffloadConfig::quick(), OffloadConfig::small()] {
            c.validate().unwrap();
        }
        for c in [OffloadConfig::default(), OffloadConfig::quick()] {
            let shape = Shape { layers: c.layers, d: c.d_model };
            assert!(shape.network_bytes() >= 4 * (c.gpu_budget << 20), "{c:?}: the network is four times the budget");
        }
        let full = OffloadConfig::default();
        let shape = Shape { layers: full.layers, d: full.d_model };
        assert!(shape.network_bytes() as f64 >= 3.0 * (full.gpu_budget << 20) as f64, "the network is several times the budget");
        let bad = |f: &dyn Fn(&mut OffloadConfig), what: &str| {
            let mut c = OffloadConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        bad(&|c| c.gpu_budget = 256, "--gpu-budget");
        bad(&|c| c.ring = 2, "--ring");
        bad(&|c| c.d_model = 100, "--d-model");
        bad(&|c| c.batches = vec![12], "--batches");
        bad(&|c| c.batches.clear(), "--batches");
    }
}
