//! [`GpuScan`]: the iris scan on one or more GPUs, behind core's [`ScanBackend`] seam, with
//! the CPU scan as its fallback.
//!
//! Contract (core's `iris::scan`): the output is bit-identical to the CPU kernels'. The GPU
//! path computes exactly the arithmetic of [`super::limbs`] (pinned to the CPU kernel by its
//! tests); if any GPU step fails — a CUDA or cuBLAS error, an allocation beyond the budget, a
//! panic in the bindings — the scan is answered by the CPU backend, a line is logged, and the
//! GPU is not used again by this backend (a CUDA context after an error may be unusable, and a
//! search must never get a wrong answer). An interrupted scan is not a failure: it returns
//! [`DotError::Interrupted`] as the CPU scan would.
//!
//! With several devices the rows are sharded `row mod D` ([`super::device::Shard`]); each
//! device scans its shard on a thread of its own and the results are interleaved back into
//! physical row order. NCCL is not used: the results go to the CPU anyway (the MPC rounds after
//! the scan run there), so a device-side gather would add a hop, not remove one.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use privmatch_core::iris::dot::{DotError, DotShares, ShareMatrix};
use privmatch_core::iris::query::PreparedQuery;
use privmatch_core::iris::scan::{CpuScan, Interrupt, ScanBackend};

use super::device::{Device, DeviceInfo, QueryMatrices, Shard};
use crate::error::GpuError;
use crate::probe::probe;

/// Which GPUs to use and how much of their memory.
#[derive(Clone, Debug, Default)]
pub struct GpuConfig {
    /// CUDA ordinals; empty means every device the driver reports. An ordinal may repeat
    /// (two shards on one device), which tests use to exercise sharding on one GPU.
    pub devices: Vec<usize>,
    /// Bytes of share limbs each device may hold; `None` means 90 % of its free memory.
    pub memory_budget: Option<usize>,
}

/// Where log lines of the backend go (the engine sends them to the server log).
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// The GPU scan backend (module docs).
pub struct GpuScan {
    devices: Vec<Mutex<Device>>,
    description: String,
    cpu: CpuScan,
    /// Why the GPU is no longer used, once it failed.
    failed: Mutex<Option<String>>,
    log: LogSink,
}

impl GpuScan {
    /// Probes for CUDA and opens the configured devices; `cpu` answers if the GPU fails later.
    /// Fails with [`GpuError::Unavailable`] when there is no usable GPU.
    pub fn open(config: &GpuConfig, cpu: CpuScan, log: LogSink) -> Result<Self, GpuError> {
        let found = probe()?;
        let ordinals: Vec<usize> = if config.devices.is_empty() {
            (0..found.devices).collect()
        } else {
            config.devices.clone()
        };
        if let Some(&bad) = ordinals.iter().find(|&&o| o >= found.devices) {
            return Err(GpuError::Unavailable(format!(
                "device {bad} was asked for, but the driver reports {} device(s)",
                found.devices
            )));
        }
        let mut devices = Vec::with_capacity(ordinals.len());
        for &ordinal in &ordinals {
            let device = catch_unwind(AssertUnwindSafe(|| {
                Device::open(ordinal, config.memory_budget)
            }))
            .map_err(|p| {
                GpuError::Unavailable(format!("opening device {ordinal}: {}", panic_text(&p)))
            })?
            .map_err(|e| GpuError::Unavailable(format!("opening device {ordinal}: {e}")))?;
            devices.push(device);
        }
        let description = describe(devices.iter().map(Device::info));
        Ok(GpuScan {
            devices: devices.into_iter().map(Mutex::new).collect(),
            description,
            cpu,
            failed: Mutex::new(None),
            log,
        })
    }

    /// The devices in use.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.devices
            .iter()
            .map(|d| {
                d.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .info()
                    .clone()
            })
            .collect()
    }

    /// Why the backend fell back to the CPU, if it did.
    pub fn fallback_reason(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Bytes of share limbs held on each device.
    pub fn resident_bytes(&self) -> Vec<usize> {
        self.devices
            .iter()
            .map(|d| {
                d.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .resident_bytes()
            })
            .collect()
    }

    /// The scan on the GPUs only, without fallback (tests and benchmarks call this to see
    /// GPU errors instead of the CPU's answer).
    pub fn scan_gpu(
        &self,
        db: &ShareMatrix<'_>,
        query: &PreparedQuery,
        interrupt: &Interrupt,
    ) -> Result<DotShares, GpuError> {
        catch_unwind(AssertUnwindSafe(|| self.scan_sharded(db, query, interrupt)))
            .unwrap_or_else(|p| Err(GpuError::Panicked(panic_text(&p))))
    }

    /// Benchmark helper: times the GEMMs and combines of a scan of `db` on the first device
    /// (its copy brought up to date first), without the copy back; milliseconds per pass.
    pub fn time_kernels(
        &self,
        db: &ShareMatrix<'_>,
        query: &PreparedQuery,
        reps: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let device = self
            .devices
            .first()
            .ok_or_else(|| GpuError::Shape("no device".into()))?;
        lock(device)?.time_kernels(db, &QueryMatrices::of(query), reps)
    }

    fn scan_sharded(
        &self,
        db: &ShareMatrix<'_>,
        query: &PreparedQuery,
        interrupt: &Interrupt,
    ) -> Result<DotShares, GpuError> {
        let r = query.num_rotations();
        let n = db.len();
        let queries = QueryMatrices::of(query);
        let of = self.devices.len();
        if of == 1 {
            let mut code = touched_zeros(n * r);
            let mut mask = touched_zeros(n * r);
            lock(&self.devices[0])?.scan_shard(
                db,
                Shard::WHOLE,
                &queries,
                &mut code,
                &mut mask,
                interrupt,
            )?;
            return Ok(DotShares {
                num_rotations: r,
                num_entries: n,
                code,
                mask,
            });
        }
        let parts: Vec<Result<ShardOutput, GpuError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .devices
                .iter()
                .enumerate()
                .map(|(index, device)| {
                    let queries = &queries;
                    scope.spawn(move || {
                        let shard = Shard { index, of };
                        let local = shard.local_len(n);
                        let mut code = vec![0u16; local * r];
                        let mut mask = vec![0u16; local * r];
                        lock(device)?
                            .scan_shard(db, shard, queries, &mut code, &mut mask, interrupt)?;
                        Ok((code, mask))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|p| Err(GpuError::Panicked(panic_text(&p))))
                })
                .collect()
        });
        let mut code = touched_zeros(n * r);
        let mut mask = touched_zeros(n * r);
        for (index, part) in parts.into_iter().enumerate() {
            let (c, m) = part?;
            let shard = Shard { index, of };
            for local in 0..shard.local_len(n) {
                let row = shard.global(local);
                code[row * r..(row + 1) * r].copy_from_slice(&c[local * r..(local + 1) * r]);
                mask[row * r..(row + 1) * r].copy_from_slice(&m[local * r..(local + 1) * r]);
            }
        }
        Ok(DotShares {
            num_rotations: r,
            num_entries: n,
            code,
            mask,
        })
    }
}

impl ScanBackend for GpuScan {
    fn name(&self) -> String {
        match self.fallback_reason() {
            None => self.description.clone(),
            Some(_) => format!("{} (GPU failed; using the CPU)", self.cpu.name()),
        }
    }

    fn parallelism(&self) -> usize {
        match self.fallback_reason() {
            None => self.devices.len(),
            Some(_) => self.cpu.parallelism(),
        }
    }

    fn scan(
        &self,
        db: &ShareMatrix<'_>,
        query: &PreparedQuery,
        interrupt: &Interrupt,
    ) -> Result<DotShares, DotError> {
        if self.fallback_reason().is_none() {
            match self.scan_gpu(db, query, interrupt) {
                Ok(dots) => return Ok(dots),
                Err(GpuError::Interrupted) => return Err(DotError::Interrupted),
                Err(e) => {
                    (self.log)(&format!(
                        "privmatch GPU scan failed, falling back to the CPU scan for this and later searches: {e}"
                    ));
                    *self.failed.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(e.to_string());
                }
            }
        }
        self.cpu.scan(db, query, interrupt)
    }
}

/// `len` zeros whose pages are already mapped: the zeroed allocation is touched on several
/// threads, so that the page faults of a large result (124 MB at 1M rows and 31 rotations)
/// are taken in parallel instead of one by one on the thread that copies the results in.
fn touched_zeros(len: usize) -> Vec<u16> {
    const PAGE: usize = 2048; // u16 per 4 KiB page
    let mut v = vec![0u16; len];
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 16);
    if len >= 64 * PAGE * threads {
        let per = len.div_ceil(threads).next_multiple_of(PAGE);
        std::thread::scope(|s| {
            for part in v.chunks_mut(per) {
                s.spawn(move || {
                    for page in part.chunks_mut(PAGE) {
                        *std::hint::black_box(&mut page[0]) = 0;
                    }
                });
            }
        });
    }
    v
}

/// One shard's (code, mask) shares, in local row order.
type ShardOutput = (Vec<u16>, Vec<u16>);

/// A device's lock; a poisoned one (a panic while scanning) is a failure, not a retry.
fn lock(device: &Mutex<Device>) -> Result<std::sync::MutexGuard<'_, Device>, GpuError> {
    device
        .lock()
        .map_err(|_| GpuError::Panicked("a previous GPU scan panicked".into()))
}

/// "gpu: cuBLAS int8 on 2× NVIDIA H100 80GB HBM3 (sm_90)".
fn describe<'a>(infos: impl Iterator<Item = &'a DeviceInfo>) -> String {
    let infos: Vec<&DeviceInfo> = infos.collect();
    let mut names: Vec<String> = infos
        .iter()
        .map(|i| {
            let (major, minor) = i.compute_capability;
            format!("{} (sm_{major}{minor})", i.name)
        })
        .collect();
    names.dedup();
    format!("gpu: cuBLAS int8 on {}× {}", infos.len(), names.join(", "))
}

/// The message of a caught panic.
fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panic".into())
}
