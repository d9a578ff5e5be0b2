//! Lab 9's placement under a GPU budget: which layers stay resident on the
//! GPU for good and how many slots the ring streams the rest through
//! ([`Placement`]), chosen by [`plan`] from the costs measured alone
//! through the queue model, with the reason in a line.
//!
//! The R resident layers are spread evenly through the network, the first
//! among them ([`Placement::resident_layers`]): while a resident layer
//! computes, the copy stream keeps uploading the next streamed ones, so
//! the link never waits for the ring to free a slot as it would behind a
//! block of resident layers at the start (there, only K uploads can run
//! ahead of the block, and the link idles for the rest of it).
//!
//! What the budget holds: the activations of the batch (two buffers and
//! the hidden ones), cuBLAS's workspace, and layer buffers (what a pass at
//! this batch needs; the lab's rig keeps its activation buffers at the
//! size of its largest batch, shared by every batch, and its budget check
//! is made at that one); every buffer a
//! resident layer keeps is one upload fewer per pass, every ring slot one
//! more upload the copy stream may run ahead. The planner predicts each
//! way of spending the buffers (every ring from 2 to [`MAX_RING`] slots
//! with the rest resident, or every layer resident where they all fit)
//! and takes the fastest; on a tie (within [`TIE`]) the one with more
//! resident layers, which moves fewer bytes over the link.

use super::forward::{predict, Costs, HiddenActivations, PassSetup, Streams};
pub use super::network::Placement;
use super::network::{budget_bytes, LayerKind, Precision, Shape};
use crate::error::{LabError, Result};
use crate::pipeline::machine::Machine;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// The largest ring the planner and the sweep consider: beyond a few slots
/// the copy stream is already as far ahead as it can use.
pub const MAX_RING: usize = 8;

/// Predictions closer than this share are a tie.
pub const TIE: f64 = 0.005;

/// What a budget leaves for layer buffers at a batch, computed once
/// ([`room`]) for the planner, the sweep and the checker alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub budget_mib: usize,
    pub precision: Precision,
    /// What a pass holds before any layer buffer: the activations of the
    /// batch and what [`Precision::fixed_parts`] names (cuBLAS's
    /// workspace; FP8's scales; a 4-bit pass's dequantized layer), bytes.
    pub fixed: usize,
    /// One layer buffer in `precision`, bytes.
    pub layer: usize,
    /// Layer buffers that fit beside `fixed` (at most the network's layers).
    pub buffers: usize,
}

impl Room {
    /// The budget, bytes.
    pub fn budget(&self) -> usize {
        budget_bytes(self.budget_mib)
    }
}

/// Layer buffers of `precision` that `budget_mib` MiB leave room for at
/// `batch` tokens, once the activations and cuBLAS's workspace are
/// counted; an error saying what does not fit where that is fewer than a
/// ring of 2 (and not every layer).
pub fn room(shape: Shape, batch: usize, budget_mib: usize, precision: Precision) -> Result<Room> {
    let (fixed, layer) = (shape.fixed_bytes(batch, precision), shape.layer_bytes_in(precision));
    let budget = budget_bytes(budget_mib);
    let buffers = budget.saturating_sub(fixed) / layer;
    if buffers < 2 && buffers < shape.layers {
        return Err(LabError::config(format!(
            "the activations of {batch} tokens and {} take {} of the {} budget: no room for a ring of 2 layers ({} each)",
            precision.fixed_parts(),
            Bytes(fixed as u64),
            Bytes(budget as u64),
            Bytes(layer as u64)
        )));
    }
    Ok(Room { budget_mib, precision, fixed, layer, buffers: buffers.min(shape.layers) })
}

/// The placements the planner weighs with `room` layer buffers: every ring
/// of 2 to [`MAX_RING`] slots with the other buffers resident, and every
/// layer resident where they all fit.
pub fn candidates(shape: Shape, room: usize) -> Vec<Placement> {
    let mut c = Vec::new();
    if room >= shape.layers {
        c.push(Placement { resident: shape.layers, ring: 0 });
    }
    for ring in 2..=MAX_RING.min(room) {
        let resident = (room - ring).min(shape.layers.saturating_sub(ring));
        if resident < shape.layers {
            c.push(Placement { resident, ring });
        }
    }
    c.dedup();
    c
}

/// The pass of a placement: the ring (ahead of the compute stream on a copy
/// stream at the highest priority) after the resident layers.
pub fn setup(placement: Placement, kind: LayerKind) -> PassSetup {
    PassSetup { placement, streams: Streams { copy_high: true }, hidden: HiddenActivations::Fixed, kind }
}

/// The planner's choice and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementPlan {
    pub placement: Placement,
    /// The queue model's time of a pass, ms.
    pub predicted_ms: f64,
    /// GPU memory the pass holds, bytes.
    pub gpu_bytes: usize,
    /// Why, in a line.
    pub why: String,
    /// Every placement weighed, with its predicted time (ms).
    pub weighed: Vec<(Placement, f64)>,
}

impl PlacementPlan {
    /// The queue model's time of `p`, where the planner weighed it.
    pub fn predicted(&self, p: Placement) -> Option<f64> {
        self.weighed.iter().find(|w| w.0 == p).map(|w| w.1)
    }
}

/// The fastest placement of `shape` at `batch` tokens in the budget's
/// `room` for layers of `kind`, by the queue model with `costs` (this
/// batch's, for `kind`) on `machine` (see the module docs).
pub fn plan(shape: Shape, batch: usize, room: &Room, kind: LayerKind, costs: Costs, machine: Machine) -> Result<PlacementPlan> {
    if room.precision != kind.precision() {
        return Err(LabError::config(format!("a room for {:?} layers holds no {:?} ones", room.precision, kind.precision())));
    }
    let weighed =
        candidates(shape, room.buffers).into_iter().map(|p| Ok((p, predict(shape, batch, setup(p, kind), costs, machine)?))).collect::<Result<Vec<_>>>()?;
    let fastest = weighed.iter().map(|w| w.1).fold(f64::INFINITY, f64::min);
    let &(placement, predicted_ms) = weighed
        .iter()
        .filter(|w| w.1 <= fastest * (1.0 + TIE))
        .max_by_key(|w| (w.0.resident, std::cmp::Reverse(w.0.ring)))
        .ok_or_else(|| LabError::config("no placement to weigh"))?;
    let l = shape.layers;
    let streamed = l - placement.resident;
    let (link, gpu) = (streamed as f64 * costs.h2d, l as f64 * costs.layer);
    let work = kind.work();
    let bound = if link > gpu { "the link bounds it".to_string() } else { format!("the {work} bound it") };
    let why = if streamed == 0 {
        format!("every layer fits: {l} resident, no uploads; {l} layers x {:.3} ms = {gpu:.1} ms of {work}", costs.layer)
    } else {
        format!(
            "{} layer buffers fit beside the activations: {} streams {streamed} layers ({streamed} x {:.3} ms = {link:.1} ms over the link, against {l} x {:.3} ms = {gpu:.1} ms of {work}), so {bound}; {}",
            room.buffers,
            placement.label(),
            costs.h2d,
            costs.layer,
            if link > gpu {
                "each buffer more in the ring would be one layer fewer resident, one upload more".to_string()
            } else {
                format!("a ring of {} keeps the {work} fed", placement.ring)
            }
        )
    };
    Ok(PlacementPlan { placement, predicted_ms, gpu_bytes: shape.placement_bytes(batch, placement, kind.precision()), why, weighed })
}

/// The placements a sweep measures with `room` buffers: the planner's
/// candidates, and less resident than fits (none, half) with a ring of 3,
/// to show what idle budget costs.
pub fn sweep_grid(shape: Shape, room: usize) -> Vec<Placement> {
    let mut c = candidates(shape, room);
    if room >= 3 && room < shape.layers {
        for resident in [0, (room - 3) / 2] {
            let p = Placement { resident, ring: 3 };
            if !c.contains(&p) {
                c.push(p);
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape { layers: 24, d: 256 }
    }

    #[test]
    fn the_room_counts_the_activations_and_the_workspace_and_names_what_does_not_fit() {
        let s = shape();
        let lb = s.layer_bytes();
        let fixed = s.placement_bytes(64, Placement { resident: 0, ring: 0 }, Precision::Fp16);
        // The budget in MiB that holds the activations and 5 layers, with less than a sixth to spare.
        let mib = |bytes: usize| bytes.div_ceil(1 << 20);
        let r = room(s, 64, mib(fixed + 5 * lb + 7), Precision::Fp16).unwrap();
        assert_eq!((r.buffers, r.fixed, r.layer), (5, fixed, lb));
        // FP8 layers are half the bytes: twice the buffers in the same budget (and the half one the rest holds).
        let fixed8 = s.placement_bytes(64, Placement { resident: 0, ring: 0 }, Precision::Fp8);
        let r8 = room(s, 64, r.budget_mib, Precision::Fp8).unwrap();
        assert_eq!((r8.buffers, r8.layer), ((r.budget() - fixed8) / (lb / 2), lb / 2));
        assert!(r8.buffers >= 2 * r.buffers, "{r8:?} against {r:?}");
        // 4-bit layers are about a quarter, beside one layer dequantized into E4M3 and FP8's scales.
        let r4 = room(s, 64, r.budget_mib, Precision::Int4).unwrap();
        assert_eq!((r4.fixed, r4.layer), (fixed8 + lb / 2, lb / 4 + lb / 128));
        assert_eq!(r4.buffers, ((r.budget() - r4.fixed) / r4.layer).min(s.layers));
        assert_eq!(room(s, 64, mib(fixed + 100 * lb), Precision::Fp16).unwrap().buffers, 24, "never more than the network");
        let e = room(s, 64, mib(fixed + lb), Precision::Fp16).unwrap_err().to_string();
        assert!(e.contains("no room for a ring of 2") && e.contains("64 tokens"), "{e}");
    }

    #[test]
    fn the_candidates_spend_every_buffer() {
        let c = candidates(shape(), 10);
        assert_eq!(c.first(), Some(&Placement { resident: 8, ring: 2 }));
        assert_eq!(c.last(), Some(&Placement { resident: 2, ring: 8 }));
        assert!(c.iter().all(|p| p.buffers() == 10));
        assert_eq!(candidates(shape(), 24)[0], Placement { resident: 24, ring: 0 });
        // Resident layers are spread evenly, the first layer among them.
        assert_eq!(Placement { resident: 2, ring: 2 }.resident_layers(6), [0, 3]);
        assert_eq!(Placement { resident: 3, ring: 2 }.resident_layers(8), [0, 3, 6]);
        for (r, l) in [(0, 5), (5, 5), (21, 96), (44, 96), (95, 96), (7, 10)] {
            let got = Placement { resident: r, ring: 2 }.resident_layers(l);
            assert_eq!(got.len(), r, "{r} of {l}: {got:?}");
            assert!(got.windows(2).all(|w| w[1] - w[0] <= l.div_ceil(r.max(1))), "{r} of {l} bunched: {got:?}");
        }
        let g = sweep_grid(shape(), 10);
        assert!(g.contains(&Placement { resident: 0, ring: 3 }) && g.contains(&Placement { resident: 3, ring: 3 }), "{g:?}");
    }

    #[test]
    fn the_planner_keeps_layers_resident_where_the_link_bounds_and_says_why() {
        let s = shape();
        let m = Machine::engines(2);
        let room_of = |bytes: usize| room(s, 64, bytes.div_ceil(1 << 20), Precision::Fp16).unwrap();
        let budget = room_of(s.placement_bytes(64, Placement { resident: 0, ring: 10 }, Precision::Fp16));
        // Link-bound: each resident layer saves an upload.
        let c = Costs { h2d: 1.0, h2d_pageable: 3.0, layer: 0.1 };
        let p = plan(s, 64, &budget, LayerKind::Fused, c, m).unwrap();
        assert_eq!(p.placement, Placement { resident: 8, ring: 2 });
        // 16 uploads, the first hidden under the resident layers' 0.8 ms.
        assert!((p.predicted_ms - (0.8f64.max(1.0) + 15.0 + 0.1)).abs() < 0.05, "{}", p.predicted_ms);
        assert!(p.why.contains("the link bounds it") && p.why.contains("R = 8 resident, ring of 2"), "{}", p.why);
        // Compute-bound: all placements tie at L x layer; the most resident wins the tie.
        let c = Costs { h2d: 0.1, h2d_pageable: 0.3, layer: 1.0 };
        let p = plan(s, 64, &budget, LayerKind::Fused, c, m).unwrap();
        assert_eq!(p.placement.resident, 8, "{p:?}");
        assert!(p.why.contains("the GEMMs bound it"), "{}", p.why);
        // Everything fits: all resident.
        let all = room_of(s.placement_bytes(64, Placement { resident: 24, ring: 0 }, Precision::Fp16));
        let p = plan(s, 64, &all, LayerKind::Fused, c, m).unwrap();
        assert_eq!(p.placement, Placement { resident: 24, ring: 0 });
        assert!((p.predicted_ms - 24.0).abs() < 0.05 && p.why.contains("every layer fits"), "{p:?}");
    }
}
