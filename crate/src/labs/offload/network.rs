//! Lab 9's network as numbers, with no GPU: its shape ([`Shape`]: layers
//! and width, and the bytes each part of a pass holds), the kinds of layer
//! ([`LayerKind`]) and their weights' precision ([`Precision`]), where the
//! layers' weights sit on the GPU ([`Placement`]: resident layers and a
//! ring of slots), where each FP8 scale sits ([`fp8_slot`]), and the one
//! conversion of a budget from MiB to bytes ([`budget_bytes`]).
//!
//! May use: `error`, `units`, and `gpu::blas::WORKSPACE_BYTES` (the
//! workspace cuBLAS is given, a constant: nothing of CUDA runs here). The
//! ground floor of the lab: every other file of it may use this one.

use serde::{Deserialize, Serialize};

/// The network's shape: how many layers, and its width d (a layer's
/// weights are W1, d x 4d, and W2, 4d x d, in FP16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub layers: usize,
    pub d: usize,
}

impl Shape {
    /// One layer's weights: 8 d² halves.
    pub fn layer_bytes(&self) -> usize {
        16 * self.d * self.d
    }
    /// One layer's weights in `precision` (8 d² values; in 4 bits, two a
    /// byte and a 2-byte scale per [`INT4_GROUP`]).
    pub fn layer_bytes_in(&self, precision: Precision) -> usize {
        let values = 8 * self.d * self.d;
        match precision {
            Precision::Fp16 => 2 * values,
            Precision::Fp8 => values,
            Precision::Int4 => values / 2 + 2 * values / INT4_GROUP,
        }
    }
    /// The whole network's weights.
    pub fn network_bytes(&self) -> usize {
        self.layers * self.layer_bytes()
    }
    /// One activation buffer (batch x d halves).
    pub fn act_bytes(&self, batch: usize) -> usize {
        batch * self.d * 2
    }
    /// The hidden activations (batch x 4d halves).
    pub fn hidden_bytes(&self, batch: usize) -> usize {
        batch * self.d * 8
    }
    /// The GPU memory a pass uses: the ring, both activation buffers, the
    /// hidden activations and cuBLAS's workspace.
    pub fn gpu_bytes(&self, batch: usize, slots: usize) -> usize {
        self.placement_bytes(batch, Placement { resident: 0, ring: slots }, Precision::Fp16)
    }
    /// The GPU memory a pass of `placement` in `precision` uses: its layer
    /// buffers, the activations (the same FP16-sized buffers in FP8: a
    /// pass of either kind runs on one rig), cuBLAS's workspace, FP8's
    /// scales, and a 4-bit pass's dequantized layer.
    pub fn placement_bytes(&self, batch: usize, placement: Placement, precision: Precision) -> usize {
        placement.buffers() * self.layer_bytes_in(precision) + self.fixed_bytes(batch, precision)
    }
    /// What a pass in `precision` holds on the GPU before any layer
    /// buffer: both activation buffers, the hidden activations, cuBLAS's
    /// workspace, FP8's scales (a 4-bit pass runs the FP8 GEMMs), and in
    /// 4 bits the layer being run, dequantized into E4M3.
    pub fn fixed_bytes(&self, batch: usize, precision: Precision) -> usize {
        let (scales, dequantized) = match precision {
            Precision::Fp16 => (0, 0),
            Precision::Fp8 => (fp8_slot::bytes(self.layers), 0),
            Precision::Int4 => (fp8_slot::bytes(self.layers), self.layer_bytes_in(Precision::Fp8)),
        };
        2 * self.act_bytes(batch) + self.hidden_bytes(batch) + crate::gpu::blas::WORKSPACE_BYTES + scales + dequantized
    }
    /// FLOPs of one layer over `batch` tokens (two GEMMs of 2·batch·d·4d).
    pub fn layer_flops(&self, batch: usize) -> f64 {
        16.0 * batch as f64 * (self.d * self.d) as f64
    }
}

/// A GPU budget of `mib` MiB in bytes. Budgets are MiB everywhere in the
/// lab (the command line takes them so, the results keep them so); this is
/// where one is set against the bytes a pass holds.
pub fn budget_bytes(mib: usize) -> usize {
    mib.saturating_mul(1 << 20)
}

/// A layer's GPU work: which kernels, in which precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerKind {
    /// FP16: GEMM, the ReLU kernel, GEMM (three kernels).
    Separate,
    /// FP16: the first GEMM applies the ReLU as it writes (cuBLASLt's
    /// epilogue), then the second GEMM (two kernels).
    Fused,
    /// FP8 (E4M3) weights and activations: each GEMM scales, rounds to
    /// FP8 and finds its output's largest magnitude in its epilogue, the
    /// first with the ReLU too (two kernels).
    Fp8,
    /// 4-bit weights: each matrix dequantized into E4M3 on the GPU (a
    /// kernel of the lab's), then the FP8 layer's two GEMMs (four kernels).
    Int4,
}

impl LayerKind {
    pub fn precision(self) -> Precision {
        match self {
            LayerKind::Separate | LayerKind::Fused => Precision::Fp16,
            LayerKind::Fp8 => Precision::Fp8,
            LayerKind::Int4 => Precision::Int4,
        }
    }
    /// Whether its GEMMs are FP8's (E4M3 activations, the rig's scales).
    pub fn fp8_gemms(self) -> bool {
        matches!(self, LayerKind::Fp8 | LayerKind::Int4)
    }
    /// What a layer of it runs on the GPU, in a message's words.
    pub fn work(self) -> &'static str {
        match self {
            LayerKind::Int4 => "dequantization + GEMMs",
            _ => "GEMMs",
        }
    }
}

/// How the weights (and activations) are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    Fp16,
    /// E4M3: one byte a value, with one FP32 scale per tensor.
    Fp8,
    /// Symmetric 4-bit integers, two a byte, with an FP16 scale per
    /// [`INT4_GROUP`] values along the input dimension (`int4`'s layout),
    /// dequantized on the GPU into E4M3 for the FP8 GEMMs.
    Int4,
}

impl Precision {
    /// Its name in a table.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp16 => "FP16",
            Precision::Fp8 => "FP8",
            Precision::Int4 => "4-bit",
        }
    }
    /// What a pass in it holds on the GPU before any layer buffer, besides
    /// the batch's activations ([`Shape::fixed_bytes`]), in a message's words.
    pub fn fixed_parts(self) -> &'static str {
        match self {
            Precision::Fp16 => "cuBLAS's workspace",
            Precision::Fp8 => "cuBLAS's workspace and FP8's scales",
            Precision::Int4 => "cuBLAS's workspace, FP8's scales and one layer dequantized",
        }
    }
    /// Whether a pass in it runs FP8 activations and the rig's FP8 scales
    /// (FP8's layers, and 4-bit ones, dequantized into E4M3).
    pub fn fp8_activations(self) -> bool {
        matches!(self, Precision::Fp8 | Precision::Int4)
    }
}

/// Values one 4-bit scale covers, along the input dimension (GPTQ's usual
/// group; llama.cpp's Q4_0 covers 32).
pub const INT4_GROUP: usize = 128;

/// `resident` layers kept on the GPU for good, spread through the network
/// ([`Placement::resident_layers`]); the rest streamed through a ring of
/// `ring` slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub resident: usize,
    pub ring: usize,
}

impl Placement {
    /// The layers it keeps resident, in order, of a network of `layers`:
    /// layer i is resident where i·R mod L < R, which spreads R layers
    /// evenly over the L, layer 0 the first of them.
    pub fn resident_layers(&self, layers: usize) -> Vec<usize> {
        let r = self.resident.min(layers);
        (0..layers).filter(|&i| (i * r) % layers < r).collect()
    }
    /// Layer buffers it holds on the GPU.
    pub fn buffers(&self) -> usize {
        self.resident + self.ring
    }
    /// "R = 20 resident, ring of 3".
    pub fn label(&self) -> String {
        format!("R = {} resident, ring of {}", self.resident, self.ring)
    }
}

/// Where each FP8 scale lives in the rig's scale buffer: the input's, then
/// six per layer, then two amax slots per layer, each value in a 16-byte
/// slot of its own ([`fp8_slot::float`]: cuBLASLt reads a scale only from
/// a 16-byte-aligned address).
pub mod fp8_slot {
    /// The float index in the buffer of slot `slot`.
    pub fn float(slot: usize) -> usize {
        4 * slot
    }
    /// The buffer's bytes, with `layers` in the network.
    pub fn bytes(layers: usize) -> usize {
        16 * count(layers)
    }
    /// The input's scale.
    pub const INPUT: usize = 0;
    /// W1's scale of `layer`; +1 W2's, +2 the hidden activations', +3 its
    /// inverse, +4 the layer output's, +5 its inverse.
    pub fn layer(layer: usize) -> usize {
        1 + 6 * layer
    }
    /// The scale of `layer`'s input (the previous layer's output's).
    pub fn input_of(layer: usize) -> usize {
        if layer == 0 {
            INPUT
        } else {
            self::layer(layer - 1) + 4
        }
    }
    /// Where `layer`'s hidden amax is written (+1: its output's), with `layers` in the network.
    pub fn amax(layers: usize, layer: usize) -> usize {
        1 + 6 * layers + 2 * layer
    }
    /// Writes `v` into slot `slot` of the buffer's host side: float 4·slot,
    /// the low half of word 2·slot.
    pub fn put(words: &mut [u64], slot: usize, v: f32) {
        words[float(slot) / 2] = v.to_bits() as u64;
    }
    /// Reads slot `slot` of the buffer's host side.
    pub fn get(words: &[u64], slot: usize) -> f32 {
        f32::from_bits(words[float(slot) / 2] as u32)
    }
    /// Slots in the buffer.
    pub fn count(layers: usize) -> usize {
        1 + 8 * layers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_the_workspace_cublas_uses() {
        // With no layers and no tokens, all a pass holds on the GPU is
        // cuBLAS's workspace: the one the rig's Blas gives it, and keeps.
        let shape = Shape { layers: 4, d: 256 };
        assert_eq!(shape.gpu_bytes(0, 0), crate::gpu::blas::WORKSPACE_BYTES);
        assert_eq!(shape.fixed_bytes(64, Precision::Fp8), shape.placement_bytes(64, Placement { resident: 0, ring: 0 }, Precision::Fp8));
        assert_eq!(budget_bytes(3), 3 << 20);
        assert_eq!(budget_bytes(usize::MAX), usize::MAX, "a budget past any size saturates");
    }

    #[test]
    fn a_4_bit_layer_is_4_125_bits_a_weight_and_its_pass_holds_one_dequantized_layer() {
        let shape = Shape { layers: 96, d: 2048 };
        assert_eq!(shape.layer_bytes_in(Precision::Int4) * 8 * 1000 / (8 * 2048 * 2048), 4125);
        assert_eq!(shape.layer_bytes_in(Precision::Fp8), shape.layer_bytes() / 2);
        // The FP8 pass's scales, and the layer being run in E4M3.
        let extra = shape.fixed_bytes(1024, Precision::Int4) - shape.fixed_bytes(1024, Precision::Fp8);
        assert_eq!(extra, 8 * 2048 * 2048);
    }

    #[test]
    fn fp8_scales_sit_in_slots_of_their_own() {
        assert_eq!(fp8_slot::input_of(0), fp8_slot::INPUT);
        assert_eq!(fp8_slot::input_of(3), fp8_slot::layer(2) + 4);
        assert_eq!(fp8_slot::amax(4, 0), fp8_slot::layer(3) + 6);
        assert_eq!(fp8_slot::count(4), fp8_slot::amax(4, 3) + 2);
        // Slot 3 is float 12: the low half of word 6, 16 bytes from its neighbours.
        let mut words = vec![0u64; 8];
        fp8_slot::put(&mut words, 3, 1.5);
        assert_eq!((fp8_slot::get(&words, 3), words[6], fp8_slot::bytes(4)), (1.5, 1.5f32.to_bits() as u64, 16 * fp8_slot::count(4)));
    }
}
