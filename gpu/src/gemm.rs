//! The one cuBLAS call of the crate: an int8 GEMM with int32 accumulation in the "TN" layout
//! the tensor-core integer kernels are built for.

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdeviceptr;

use crate::error::GpuError;

/// `C = Aᵀ·B` on the handle's stream: A is k × m int8 (column-major, lda = k), B is k × n int8
/// (ldb = k), C is m × n int32 (ldc = m). Integer accumulation is exact while
/// k·128·128 < 2^31.
///
/// # Safety
/// `a`, `b` and `c` must be live device allocations of the handle's context holding at least
/// k·m, k·n bytes and m·n int32, not written by other work while the GEMM runs.
pub unsafe fn int8_gemm_tn(
    blas: &CudaBlas,
    (m, n, k): (usize, usize, usize),
    a: CUdeviceptr,
    b: CUdeviceptr,
    c: CUdeviceptr,
) -> Result<(), GpuError> {
    let dim = |v: usize| {
        i32::try_from(v).map_err(|_| GpuError::Shape(format!("GEMM dimension {v} exceeds i32")))
    };
    let (m, n, k) = (dim(m)?, dim(n)?, dim(k)?);
    let (alpha, beta) = (1i32, 0i32);
    // SAFETY: the caller guarantees the buffers; alpha and beta are host int32 as
    // CUBLAS_COMPUTE_32I requires in the default (host) pointer mode.
    unsafe {
        gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            (&alpha as *const i32).cast(),
            a as *const _,
            cudaDataType::CUDA_R_8I,
            k,
            b as *const _,
            cudaDataType::CUDA_R_8I,
            k,
            (&beta as *const i32).cast(),
            c as *mut _,
            cudaDataType::CUDA_R_32I,
            m,
            cublasComputeType_t::CUBLAS_COMPUTE_32I,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(GpuError::cublas("run an int8 GEMM"))
}
