//! Is there a GPU privmatch can use? Looks for the CUDA driver, cuBLAS and NVRTC libraries
//! *before* anything calls into them (the bindings load libraries lazily and would abort the
//! process on a missing one), then asks the driver for its devices. Every negative answer is
//! a [`GpuError::Unavailable`] with the reason, never a panic.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::CudaContext;

use crate::error::GpuError;

/// The CUDA version the bindings are built for (cudarc's `cuda-13000`).
pub const CUDA_BINDINGS: &str = "13.0";

/// What the probe found: the driver's devices.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Number of CUDA devices the driver reports.
    pub devices: usize,
}

/// Probes the libraries and the driver (module docs).
pub fn probe() -> Result<Probe, GpuError> {
    // SAFETY: each check only tries to dlopen candidate library names and closes them.
    let libraries = [
        ("the CUDA driver (libcuda.so.1)", unsafe {
            cudarc::driver::sys::is_culib_present()
        }),
        ("cuBLAS (libcublas.so.13)", unsafe {
            cudarc::cublas::sys::is_culib_present()
        }),
        ("NVRTC (libnvrtc.so.13)", unsafe {
            cudarc::nvrtc::sys::is_culib_present()
        }),
    ];
    for (name, present) in libraries {
        if !present {
            return Err(GpuError::Unavailable(format!(
                "{name} is not installed or not on the library path (CUDA {CUDA_BINDINGS} libraries are needed)"
            )));
        }
    }
    let count = catch_unwind(AssertUnwindSafe(CudaContext::device_count))
        .map_err(|_| GpuError::Unavailable("the CUDA driver could not be loaded".into()))?
        .map_err(|e| GpuError::Unavailable(format!("the CUDA driver refused to start: {e}")))?;
    if count <= 0 {
        return Err(GpuError::Unavailable(
            "the CUDA driver reports no device".into(),
        ));
    }
    Ok(Probe {
        devices: count as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_never_panics_and_explains_a_refusal() {
        match probe() {
            Ok(p) => assert!(p.devices > 0),
            Err(GpuError::Unavailable(reason)) => {
                eprintln!("SKIP: no GPU here ({reason})");
                assert!(!reason.is_empty());
            }
            Err(other) => panic!("probe failed other than unavailable: {other}"),
        }
    }
}
