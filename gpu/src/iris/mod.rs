//! The iris scan on the GPU: the int8 limb arithmetic and its CPU emulation ([`limbs`]), the
//! CUDA kernels ([`kernels`]), one device's resident shares and pipeline ([`device`]), and the
//! [`scan::GpuScan`] backend that plugs into core's scan seam.

pub mod device;
pub mod kernels;
pub mod limbs;
pub mod scan;
