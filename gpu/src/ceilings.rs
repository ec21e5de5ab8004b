//! The two ceilings a GPU benchmark is read against, measured on the device in the same run
//! (not taken from a datasheet): device-to-device copy bandwidth, and the rate of a large
//! cuBLAS int8 GEMM; and the event timing both they and the scan's kernel timing use. Used by
//! `examples/gpu_scan.rs`.

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};

use crate::error::GpuError;
use crate::gemm::int8_gemm_tn;

/// Median of `times` (milliseconds); 0 for none.
pub fn median(times: &[f32]) -> f32 {
    let mut t = times.to_vec();
    t.sort_by(f32::total_cmp);
    t.get(t.len() / 2).copied().unwrap_or(0.0)
}

/// Times `reps` runs of `work` on `stream` with device events (after one warm-up run).
fn time_on_stream(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    reps: usize,
    mut work: impl FnMut() -> Result<(), GpuError>,
) -> Result<Vec<f32>, GpuError> {
    work()?;
    stream.synchronize().map_err(GpuError::cuda("warm up"))?;
    time_with_events(ctx, stream, reps, work)
}

/// Times `reps` runs of `work`, whose device work goes to `stream`, with device events
/// recorded around each run; milliseconds per run.
pub fn time_with_events(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    reps: usize,
    mut work: impl FnMut() -> Result<(), GpuError>,
) -> Result<Vec<f32>, GpuError> {
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(GpuError::cuda("create an event"))?;
        let end = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(GpuError::cuda("create an event"))?;
        start
            .record(stream)
            .map_err(GpuError::cuda("record an event"))?;
        work()?;
        end.record(stream)
            .map_err(GpuError::cuda("record an event"))?;
        end.synchronize()
            .map_err(GpuError::cuda("wait for an event"))?;
        times.push(
            start
                .elapsed_ms(&end)
                .map_err(GpuError::cuda("read an event"))?,
        );
    }
    Ok(times)
}

/// Device-to-device copy bandwidth of device `ordinal` in bytes per second, counting bytes
/// read plus bytes written, over a copy of `bytes` bytes (median of `reps`).
pub fn copy_bandwidth(ordinal: usize, bytes: usize, reps: usize) -> Result<f64, GpuError> {
    let ctx = CudaContext::new(ordinal).map_err(GpuError::cuda("open the device"))?;
    let stream = ctx
        .new_stream()
        .map_err(GpuError::cuda("create a stream"))?;
    let src = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(GpuError::cuda("allocate"))?;
    let mut dst = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(GpuError::cuda("allocate"))?;
    let times = time_on_stream(&ctx, &stream, reps, || {
        stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(GpuError::cuda("copy"))
    })?;
    Ok(2.0 * bytes as f64 / (f64::from(median(&times)) * 1e-3))
}

/// Integer operations per second (2·m·n·k per product) of a cuBLAS int8 GEMM of
/// m × n × k (TN layout, int32 out) on device `ordinal`, on random bytes (median of `reps`).
pub fn int8_gemm_rate(
    ordinal: usize,
    (m, n, k): (usize, usize, usize),
    reps: usize,
) -> Result<f64, GpuError> {
    let ctx = CudaContext::new(ordinal).map_err(GpuError::cuda("open the device"))?;
    let stream = ctx
        .new_stream()
        .map_err(GpuError::cuda("create a stream"))?;
    let blas = CudaBlas::new(Arc::clone(&stream)).map_err(GpuError::cublas("create a handle"))?;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = |len: usize| -> Vec<i8> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 56) as u8 as i8
            })
            .collect()
    };
    let a = stream
        .clone_htod(&random(k * m))
        .map_err(GpuError::cuda("upload"))?;
    let b = stream
        .clone_htod(&random(k * n))
        .map_err(GpuError::cuda("upload"))?;
    let mut c = stream
        .alloc_zeros::<i32>(m * n)
        .map_err(GpuError::cuda("allocate"))?;
    let times = time_on_stream(&ctx, &stream, reps, || {
        let (pa, _ra) = a.device_ptr(&stream);
        let (pb, _rb) = b.device_ptr(&stream);
        let (pc, _rc) = c.device_ptr_mut(&stream);
        // SAFETY: A is k × m, B k × n, C m × n: live allocations of those sizes on this
        // context, used by nothing else.
        unsafe { int8_gemm_tn(&blas, (m, n, k), pa, pb, pc) }
    })?;
    Ok(2.0 * (m * n * k) as f64 / (f64::from(median(&times)) * 1e-3))
}
