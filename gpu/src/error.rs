//! Why GPU work failed. Messages name the step and the CUDA error, never data.

/// A failure of the GPU path. The scan backend turns every variant but
/// [`GpuError::Interrupted`] into a fallback to the CPU scan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// No usable GPU: a library is missing, the driver refuses, or there is no device.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA error while trying to {what}: {detail}")]
    Cuda {
        /// The step that failed.
        what: &'static str,
        /// The driver's error.
        detail: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS error while trying to {what}: {detail}")]
    Cublas {
        /// The step that failed.
        what: &'static str,
        /// cuBLAS's status.
        detail: String,
    },
    /// NVRTC could not compile the kernels.
    #[error("NVRTC could not compile the scan kernels: {0}")]
    Nvrtc(String),
    /// The shares do not fit in the memory the device may use.
    #[error("the shares need {wanted} bytes on the GPU, more than its budget of {budget} bytes (privmatch.gpu_memory)")]
    Capacity {
        /// Bytes the resident copies would take.
        wanted: usize,
        /// Bytes allowed.
        budget: usize,
    },
    /// Inconsistent shapes (a bug).
    #[error("GPU scan: {0}")]
    Shape(String),
    /// The caller gave up on the scan.
    #[error("GPU scan: interrupted (the caller cancelled the search)")]
    Interrupted,
    /// GPU code panicked (a bug in privmatch or a binding); the GPU is not used again.
    #[error("GPU scan: internal error: {0}")]
    Panicked(String),
}

impl GpuError {
    /// Maps a driver error of step `what`.
    pub fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> GpuError {
        move |e| GpuError::Cuda {
            what,
            detail: e.to_string(),
        }
    }

    /// Maps a cuBLAS error of step `what`.
    pub fn cublas(
        what: &'static str,
    ) -> impl FnOnce(cudarc::cublas::result::CublasError) -> GpuError {
        move |e| GpuError::Cublas {
            what,
            detail: format!("{e:?}"),
        }
    }
}
