//! privmatch-gpu: the GPU offload of a party's iris scan ([BGK+24] §4.3.2, the local dot
//! products), the only step of a search whose cost grows with the database.
//!
//! The scan becomes int8 tensor-core GEMMs through cuBLAS (`cublasGemmEx`, int8 in, int32
//! out) plus two small kernels compiled at run time with NVRTC; one copy of the party's shares
//! lives in GPU memory and follows the engine's store. CUDA is loaded at run time through
//! cudarc: this crate builds, and its tests pass (printing SKIP where a GPU is needed), on a
//! machine without a GPU or CUDA. [`probe::probe`] says whether a GPU can be used, and why not.
//!
//! Layers: [`probe`] and [`error`] are shared; [`iris`] is the modality. docs/gpu.md has the
//! design, the arithmetic and the measured figures.
//!
//! [BGK+24]: Bloemen, Kales, Sippl, Walch, "Large-Scale MPC: Scaling Private Iris Code
//! Uniqueness Checks to Millions of Users", ePrint 2024/705.

pub mod ceilings;
pub mod error;
pub mod gemm;
pub mod iris;
pub mod probe;

pub use error::GpuError;
