//! Lab 9's variants ([`Variant`]): the forward passes the lab compares,
//! each a pass of the one vocabulary with its setup (its slots, streams,
//! hidden activations and kind of layer), the host copies of the weights
//! it reads, and its time on the queue model.
//!
//! May use: `network`, `forward` (the passes), `error` and `pipeline`.
//! No CUDA.

use super::forward::{copy_then_compute, predict_pass, ring, Costs, Forward, HiddenActivations, PassSetup, Streams, Task, Weights};
use super::network::{LayerKind, Placement, Shape};
use crate::error::Result;
use crate::pipeline::machine::Machine;
use serde::{Deserialize, Serialize};

/// The forward passes the lab compares, simplest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Pageable weights, each layer copied then computed on one stream.
    Pageable,
    /// Pinned weights, still copied then computed.
    Pinned,
    /// A ring of 2 (double buffering) on a copy stream ordered by events.
    Ring2,
    /// A ring of K with the copy stream at the highest priority.
    RingK,
    /// The ring-of-K pass captured once as a CUDA graph and launched whole.
    Graph,
    /// The ring of K with each layer's hidden activations from the
    /// stream-ordered pool instead of a buffer made up front.
    Pool,
    /// The ring of K with the ReLU in the first GEMM's epilogue: a layer
    /// of two kernels, not three.
    Fused,
    /// The planner's placement under the budget: R layers kept on the GPU
    /// (spread through the network), the rest through a ring of K, fused
    /// layers.
    Resident,
    /// FP8 weights (half the bytes a layer) in the planner's placement for
    /// FP8, each GEMM quantizing its output in its epilogue.
    Fp8,
    /// 4-bit weights (a quarter of the bytes a layer and 3%) in the
    /// planner's placement for 4 bits, each layer dequantized into E4M3
    /// on the GPU, then FP8's GEMMs.
    Int4,
}

impl Variant {
    pub const ALL: [Variant; 10] = [
        Variant::Pageable,
        Variant::Pinned,
        Variant::Ring2,
        Variant::RingK,
        Variant::Graph,
        Variant::Pool,
        Variant::Fused,
        Variant::Resident,
        Variant::Fp8,
        Variant::Int4,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Variant::Pageable => "pageable, copy then compute",
            Variant::Pinned => "pinned, copy then compute",
            Variant::Ring2 => "ring of 2, copy stream + events",
            Variant::RingK => "ring of K, high-priority copy stream",
            Variant::Graph => "ring of K as one CUDA graph",
            Variant::Pool => "ring of K, activations from the pool",
            Variant::Fused => "ring of K, ReLU in the GEMM's epilogue",
            Variant::Resident => "resident layers + ring, as planned",
            Variant::Fp8 => "FP8 weights, resident + ring, as planned",
            Variant::Int4 => "4-bit weights, resident + ring, as planned",
        }
    }
    /// Each step of the lesson: (the pass before, the pass that improves on it).
    pub const STEPS: [(Variant, Variant); 9] = [
        (Variant::Pageable, Variant::Pinned),
        (Variant::Pinned, Variant::Ring2),
        (Variant::Ring2, Variant::RingK),
        (Variant::RingK, Variant::Graph),
        (Variant::RingK, Variant::Pool),
        (Variant::RingK, Variant::Fused),
        (Variant::Fused, Variant::Resident),
        (Variant::Resident, Variant::Fp8),
        (Variant::Fp8, Variant::Int4),
    ];
    /// Its name in a few words (the gains line).
    pub fn short(self) -> &'static str {
        match self {
            Variant::Pageable => "pageable",
            Variant::Pinned => "pinned",
            Variant::Ring2 => "ring of 2",
            Variant::RingK => "ring of K",
            Variant::Graph => "graph",
            Variant::Pool => "pool",
            Variant::Fused => "fused",
            Variant::Resident => "resident",
            Variant::Fp8 => "FP8",
            Variant::Int4 => "4-bit",
        }
    }
    /// Slots of the ring it uses (`k`: the ring's size; the planned
    /// variants' come from their placement).
    pub fn slots(self, k: usize) -> usize {
        match self {
            Variant::Pageable | Variant::Pinned => 1,
            Variant::Ring2 => 2,
            _ => k,
        }
    }
    /// Whether the planner places it under the budget.
    pub fn planned(self) -> bool {
        matches!(self, Variant::Resident | Variant::Fp8 | Variant::Int4)
    }
    /// Its layers' kernels.
    pub fn kind(self) -> LayerKind {
        match self {
            Variant::Fused | Variant::Resident => LayerKind::Fused,
            Variant::Fp8 => LayerKind::Fp8,
            Variant::Int4 => LayerKind::Int4,
            _ => LayerKind::Separate,
        }
    }
    /// How its pass runs, with a ring of `k` (`planned`: the planner's
    /// placement, which the planned variants take).
    pub fn setup(self, k: usize, planned: Option<Placement>) -> PassSetup {
        let placement = match (self.planned(), planned) {
            (true, Some(p)) => p,
            _ => Placement { resident: 0, ring: self.slots(k) },
        };
        PassSetup { placement, streams: self.streams(), hidden: self.hidden_activations(), kind: self.kind() }
    }
    pub fn streams(self) -> Streams {
        Streams { copy_high: !matches!(self, Variant::Pageable | Variant::Pinned | Variant::Ring2) }
    }
    /// Where its layers' hidden activations live.
    pub fn hidden_activations(self) -> HiddenActivations {
        if self == Variant::Pool {
            HiddenActivations::Pool
        } else {
            HiddenActivations::Fixed
        }
    }
    /// Its pass.
    pub fn pass(self, f: &mut dyn Forward, t: &Task) -> Result<()> {
        match self {
            Variant::Pageable => copy_then_compute(f, t, Weights::Pageable),
            Variant::Pinned => copy_then_compute(f, t, Weights::Pinned),
            _ => ring(f, t),
        }
    }
    /// The host copies of the weights its pass reads.
    pub fn weights(self) -> &'static [Weights] {
        match self {
            Variant::Pageable => &[Weights::Pageable],
            Variant::Fp8 => &[Weights::Fp8],
            Variant::Int4 => &[Weights::Int4],
            _ => &[Weights::Pinned],
        }
    }
    /// The queue model's time of its pass over `batch` tokens of `shape`,
    /// ms (recorded on the dry run), with a ring of `ring` and the
    /// planner's placement `planned` for the planned variants.
    pub fn predicted_ms(self, shape: Shape, batch: usize, ring: usize, planned: Option<Placement>, costs: Costs, machine: Machine) -> Result<f64> {
        predict_pass(shape, batch, self.setup(ring, planned), &|f, t| self.pass(f, t), costs, machine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_model_predicts_each_variant_from_its_pass() {
        let shape = Shape { layers: 10, d: 64 };
        let c = Costs { h2d: 1.0, h2d_pageable: 3.0, layer: 0.5 };
        let m = Machine::engines(2);
        let p = |v: Variant| v.predicted_ms(shape, 64, 3, None, c, m).unwrap();
        assert!((p(Variant::Pageable) - 35.0).abs() < 1e-9, "{}", p(Variant::Pageable));
        assert!((p(Variant::Pinned) - 15.0).abs() < 1e-9);
        // The ring hides the layers under the uploads: the bound, 10 x 1 + 0.5.
        for v in [Variant::Ring2, Variant::RingK, Variant::Graph, Variant::Pool, Variant::Fused] {
            assert!((p(v) - 10.5).abs() < 1e-9, "{v:?}: {}", p(v));
        }
        // Compute-bound: 10 x 2 + 1.
        let c = Costs { layer: 2.0, ..c };
        assert!((Variant::RingK.predicted_ms(shape, 64, 3, None, c, m).unwrap() - 21.0).abs() < 1e-9);
    }
}
