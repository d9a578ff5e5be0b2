//! Lab 7: pipelining inside a kernel. Streams keep the GPU fed; inside one
//! kernel, loading tile N+1 from device memory while computing tile N keeps
//! each SM busy. Five kernels of `kernels/` (naive tiled, asynchronous
//! copies with 1 to 4 stages, warp-specialized, the TMA) over one workload,
//! each against the device-memory ceiling measured in the same run.
//!
//! May use what every lab may (see `labs`).

pub mod measure;
