//! One GPU's part of the scan: the party's resident share rows in limb form, kept in step with
//! the host store, and the chunked GEMM + combine + copy-back pipeline of [`super::limbs`].
//!
//! **Residency.** A [`Device`] keeps, per share matrix it has seen (per [`RowJournal`]
//! identity), one copy of its shard of the rows as int8 limbs (`[lo | hi]`, 2 bytes per u16
//! coefficient, the same bytes as the u16 shares). Before a scan it asks the journal which
//! rows changed since its copy's revision and uploads only those (appends, and rows a delete
//! moved); a copy too far behind, or of a matrix without a journal, is uploaded whole. Copies
//! of matrices not scanned for a while are dropped when room is needed, least recently used
//! first. The limb split runs on the GPU ([`super::kernels`]): the upload is the u16 bytes.
//!
//! **Sharding.** With D devices, physical row r lives on device `r mod D` at local row
//! `r div D`: appends and swap-removes touch one row on one device, and the shards stay within
//! one row of equal size.
//!
//! **Pipeline.** Rows go in chunks of [`CHUNK_ROWS`]: for each chunk, on the compute stream,
//! two int8 GEMMs (code, mask; `cublasGemmEx`, int8 in, int32 out, TN layout) and two combine
//! launches into one of two alternating u16 output buffers; on the copy stream, the previous
//! chunk's outputs go back to host memory while the GPU computes the next chunk.

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use privmatch_core::iris::dot::{DotError, ShareMatrix};
use privmatch_core::iris::journal::RowJournal;
use privmatch_core::iris::scan::Interrupt;

use super::kernels::{BLOCK_THREADS, COMBINE, SOURCE, SPLIT_ROWS};
use super::limbs::{padded_columns, Half};
use crate::ceilings::time_with_events;
use crate::error::GpuError;
use crate::gemm::int8_gemm_tn;

/// Database rows per GEMM chunk: 32,768 rows are 1.26 GB of limbs, enough to keep the GPU busy
/// between two copies back, and the int32 accumulators of a chunk stay small
/// (32,768 × 64 × 4 bytes = 8 MiB at 31 rotations).
pub const CHUNK_ROWS: usize = 32_768;

/// Rows uploaded per staging batch (75 MiB of u16 shares).
const UPLOAD_ROWS: usize = 2_048;

/// Share matrices a device keeps copies of (the engine scans two: left and right eyes).
const MAX_RESIDENTS: usize = 2;

/// Which rows of a matrix a device holds: physical rows `r` with `r mod of == index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This device's position among the scan's devices.
    pub index: usize,
    /// Number of devices the rows are spread over.
    pub of: usize,
}

impl Shard {
    /// The shard of a single device: every row.
    pub const WHOLE: Shard = Shard { index: 0, of: 1 };

    /// How many of the first `rows` physical rows this shard holds.
    pub fn local_len(&self, rows: usize) -> usize {
        if rows > self.index {
            (rows - self.index - 1) / self.of + 1
        } else {
            0
        }
    }

    /// The physical row of local row `local`.
    pub fn global(&self, local: usize) -> usize {
        local * self.of + self.index
    }

    /// The local row of physical row `row`, if this shard holds it.
    pub fn local(&self, row: usize) -> Option<usize> {
        (row % self.of == self.index).then_some(row / self.of)
    }
}

/// A device's copy of one share matrix's shard.
struct Resident {
    /// The journal of the matrix copied; `None` for a one-off matrix (never reused).
    journal: Option<u64>,
    /// The journal revision the copy reflects.
    revision: u64,
    /// Local rows held.
    rows: usize,
    /// Local rows the buffers have room for.
    capacity: usize,
    code: CudaSlice<i8>,
    mask: CudaSlice<i8>,
    /// Scan counter value when last used (for eviction).
    last_used: u64,
}

impl Resident {
    fn limbs(&self, half: Half) -> &CudaSlice<i8> {
        match half {
            Half::Code => &self.code,
            Half::Mask => &self.mask,
        }
    }
}

/// Bytes of limbs per row (code and mask), the same as the u16 share bytes.
pub const LIMB_BYTES_PER_ROW: usize = 2 * (12_800 + 6_400);

/// What one device reports about itself.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_memory: usize,
}

/// One GPU with its streams, cuBLAS handle, kernels and resident copies (module docs).
pub struct Device {
    info: DeviceInfo,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    blas: CudaBlas,
    split: CudaFunction,
    combine: CudaFunction,
    residents: Vec<Resident>,
    /// Page-locked buffers the results of two chunks (code, mask) come back through.
    pinned: Vec<PinnedHostSlice<u16>>,
    /// Recorded on the copy stream when a transfer into the matching `pinned` buffer is done.
    arrived: Vec<CudaEvent>,
    /// Most bytes of limbs this device may hold.
    budget: usize,
    scans: u64,
}

impl Device {
    /// Opens device `ordinal`: context, two streams, a cuBLAS handle on the compute stream,
    /// and the kernels compiled with NVRTC for its architecture. `budget` caps the bytes of
    /// share limbs it will hold (`None`: 90 % of the memory free now, less 1 GiB of room for
    /// cuBLAS and the per-scan buffers).
    pub fn open(ordinal: usize, budget: Option<usize>) -> Result<Self, GpuError> {
        let ctx = CudaContext::new(ordinal).map_err(GpuError::cuda("open the device"))?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(GpuError::cuda("read the device name"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(GpuError::cuda("read the compute capability"))?,
            total_memory: ctx
                .total_mem()
                .map_err(GpuError::cuda("read the memory size"))?,
        };
        let compute = ctx
            .new_stream()
            .map_err(GpuError::cuda("create a stream"))?;
        let copy = ctx
            .new_stream()
            .map_err(GpuError::cuda("create a stream"))?;
        let blas =
            CudaBlas::new(Arc::clone(&compute)).map_err(GpuError::cublas("create a handle"))?;
        let (major, minor) = info.compute_capability;
        let ptx = compile_ptx_with_opts(
            SOURCE,
            CompileOptions {
                // PTX for the device's virtual architecture; the driver compiles it for the chip.
                options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
                name: Some("privmatch_iris_scan.cu".into()),
                ..Default::default()
            },
        )
        .map_err(|e| GpuError::Nvrtc(e.to_string()))?;
        let module = ctx
            .load_module(ptx)
            .map_err(GpuError::cuda("load the kernels"))?;
        let split = module
            .load_function(SPLIT_ROWS)
            .map_err(GpuError::cuda("find the split kernel"))?;
        let combine = module
            .load_function(COMBINE)
            .map_err(GpuError::cuda("find the combine kernel"))?;
        let budget = match budget {
            Some(b) => b,
            None => {
                let (free, _) = ctx
                    .mem_get_info()
                    .map_err(GpuError::cuda("read free memory"))?;
                (free / 10 * 9).saturating_sub(1 << 30)
            }
        };
        let arrived = (0..4)
            .map(|_| ctx.new_event(None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(GpuError::cuda("create events"))?;
        Ok(Device {
            info,
            ctx,
            compute,
            copy,
            blas,
            split,
            combine,
            residents: Vec::new(),
            pinned: Vec::new(),
            arrived,
            budget,
            scans: 0,
        })
    }

    /// What the device is.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Bytes of limbs this device may hold.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes of limbs held now (all resident copies, with spare capacity).
    pub fn resident_bytes(&self) -> usize {
        self.residents
            .iter()
            .map(|r| r.capacity * LIMB_BYTES_PER_ROW)
            .sum()
    }

    /// The compute stream (for benchmarks that time work on it).
    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// The context (for benchmarks).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Brings this device's copy of `shard` of `db` up to date and returns its position in
    /// the resident list.
    fn sync(&mut self, db: &ShareMatrix<'_>, shard: Shard) -> Result<usize, GpuError> {
        self.scans += 1;
        let local_rows = shard.local_len(db.len());
        let journal = db.journal();
        let found = journal.and_then(|j| {
            self.residents
                .iter()
                .position(|r| r.journal == Some(j.id()))
        });
        // Rows to upload (local indices), or None for all of them.
        let changed = match (found, journal) {
            (Some(pos), Some(j)) => j
                .rows_changed_since(self.residents[pos].revision)
                .map(|rows| local_changes(&rows, shard, local_rows)),
            _ => None,
        };
        let pos = match found {
            Some(pos) => pos,
            None => self.make_room_and_insert(journal, local_rows)?,
        };
        self.ensure_capacity(pos, local_rows)?;
        let rows: Vec<usize> = match changed {
            Some(rows) => rows,
            None => (0..local_rows).collect(),
        };
        self.upload(pos, db, shard, &rows)?;
        let resident = &mut self.residents[pos];
        resident.rows = local_rows;
        resident.revision = journal.map_or(0, RowJournal::revision);
        resident.last_used = self.scans;
        Ok(pos)
    }

    /// Drops one-off copies, and least recently used copies while [`MAX_RESIDENTS`] are held
    /// or the new copy would not fit the budget beside them, then adds a copy for `journal`.
    fn make_room_and_insert(
        &mut self,
        journal: Option<&RowJournal>,
        local_rows: usize,
    ) -> Result<usize, GpuError> {
        self.residents.retain(|r| r.journal.is_some());
        let want = local_rows.max(1) * LIMB_BYTES_PER_ROW;
        while self.residents.len() >= MAX_RESIDENTS
            || (!self.residents.is_empty() && self.resident_bytes() + want > self.budget)
        {
            let oldest = (0..self.residents.len())
                .min_by_key(|&i| self.residents[i].last_used)
                .unwrap_or(0);
            self.residents.swap_remove(oldest);
        }
        self.check_budget(want)?;
        let (code, mask) = self.alloc_rows(local_rows)?;
        self.residents.push(Resident {
            journal: journal.map(RowJournal::id),
            revision: 0,
            rows: 0,
            capacity: local_rows.max(1),
            code,
            mask,
            last_used: self.scans,
        });
        Ok(self.residents.len() - 1)
    }

    /// Refuses when `extra` more bytes of limbs would exceed the budget.
    fn check_budget(&self, extra: usize) -> Result<(), GpuError> {
        let wanted = self.resident_bytes() + extra;
        if wanted > self.budget {
            return Err(GpuError::Capacity {
                wanted,
                budget: self.budget,
            });
        }
        Ok(())
    }

    /// Allocates limb buffers for `rows` rows (at least one), without a budget check.
    fn alloc_rows(&self, rows: usize) -> Result<(CudaSlice<i8>, CudaSlice<i8>), GpuError> {
        let rows = rows.max(1);
        let code = self
            .compute
            .alloc_zeros::<i8>(rows * Half::Code.limb_row_bytes())
            .map_err(GpuError::cuda("allocate the code limbs"))?;
        let mask = self
            .compute
            .alloc_zeros::<i8>(rows * Half::Mask.limb_row_bytes())
            .map_err(GpuError::cuda("allocate the mask limbs"))?;
        Ok((code, mask))
    }

    /// Grows copy `pos` to hold `rows` rows (by at least a quarter while the budget allows),
    /// keeping its rows. The old buffers are freed after the copy, so growing needs room for
    /// both for a moment.
    fn ensure_capacity(&mut self, pos: usize, rows: usize) -> Result<(), GpuError> {
        let current = self.residents[pos].capacity;
        if rows <= current {
            return Ok(());
        }
        let spare = self.budget.saturating_sub(self.resident_bytes()) / LIMB_BYTES_PER_ROW;
        let target = rows
            .max(current + current / 4)
            .min(current + spare)
            .max(rows);
        self.check_budget((target - current) * LIMB_BYTES_PER_ROW)?;
        let (mut code, mut mask) = self.alloc_rows(target)?;
        let old = &self.residents[pos];
        let kept = old.rows;
        if kept > 0 {
            self.compute
                .memcpy_dtod(
                    &old.code.slice(..kept * Half::Code.limb_row_bytes()),
                    &mut code.slice_mut(..kept * Half::Code.limb_row_bytes()),
                )
                .map_err(GpuError::cuda("copy the code limbs"))?;
            self.compute
                .memcpy_dtod(
                    &old.mask.slice(..kept * Half::Mask.limb_row_bytes()),
                    &mut mask.slice_mut(..kept * Half::Mask.limb_row_bytes()),
                )
                .map_err(GpuError::cuda("copy the mask limbs"))?;
        }
        let resident = &mut self.residents[pos];
        resident.code = code;
        resident.mask = mask;
        resident.capacity = target;
        Ok(())
    }

    /// Uploads local rows `rows` of `shard` of `db` into copy `pos`, split into limbs on the
    /// device. Rows are gathered into two alternating page-locked staging buffers per half
    /// (on several host threads), so the gathering of one batch overlaps the transfer and
    /// split of the previous one.
    fn upload(
        &mut self,
        pos: usize,
        db: &ShareMatrix<'_>,
        shard: Shard,
        rows: &[usize],
    ) -> Result<(), GpuError> {
        let cap = UPLOAD_ROWS.min(rows.len());
        if cap == 0 {
            return Ok(());
        }
        let mut staging = Vec::with_capacity(4);
        for _ in 0..2 {
            for half in [Half::Code, Half::Mask] {
                staging.push(Staging::new(&self.ctx, &self.compute, cap * half.coefs())?);
            }
        }
        for (b, batch) in rows.chunks(UPLOAD_ROWS).enumerate() {
            let targets: Vec<u32> = batch.iter().map(|&l| l as u32).collect();
            let targets_dev = self
                .compute
                .clone_htod(&targets)
                .map_err(GpuError::cuda("upload row numbers"))?;
            for (h, half) in [Half::Code, Half::Mask].into_iter().enumerate() {
                let k = half.coefs();
                let stage = &mut staging[2 * (b % 2) + h];
                gather_rows(half.of(db), k, shard, batch, stage.host_mut()?);
                self.compute
                    .memcpy_htod(&stage.host, &mut stage.device)
                    .map_err(GpuError::cuda("upload share rows"))?;
                let count = batch.len() as u32;
                let k32 = k as u32;
                let dst = match half {
                    Half::Code => &mut self.residents[pos].code,
                    Half::Mask => &mut self.residents[pos].mask,
                };
                let mut launch = self.compute.launch_builder(&self.split);
                launch
                    .arg(&stage.device)
                    .arg(&targets_dev)
                    .arg(&count)
                    .arg(&k32)
                    .arg(dst);
                // SAFETY: the kernel's arguments match its signature in kernels.rs
                // (u16*, u32*, u32, u32, i8*); the staging buffer holds at least count·k u16,
                // `targets_dev` count row numbers below the copy's capacity (ensure_capacity
                // ran first), and `dst` capacity rows of 2k bytes.
                unsafe { launch.launch(grid_for((batch.len() * k / 4) as u64)) }
                    .map(drop)
                    .map_err(GpuError::cuda("split share rows"))?;
            }
        }
        self.compute
            .synchronize()
            .map_err(GpuError::cuda("finish the upload"))
    }

    /// Scans this device's shard of `db` against the query matrices (code, mask), writing
    /// `R` shares per local row into `code_out` and `mask_out` (entry-major, local order).
    pub fn scan_shard(
        &mut self,
        db: &ShareMatrix<'_>,
        shard: Shard,
        queries: &QueryMatrices,
        code_out: &mut [u16],
        mask_out: &mut [u16],
        interrupt: &Interrupt,
    ) -> Result<(), GpuError> {
        let pos = self.sync(db, shard)?;
        let rows = self.residents[pos].rows;
        let r = queries.rotations;
        if code_out.len() != rows * r || mask_out.len() != rows * r {
            return Err(GpuError::Shape(format!(
                "output of {} / {} slots for {rows} rows × {r} rotations",
                code_out.len(),
                mask_out.len()
            )));
        }
        self.run_chunks(pos, queries, Some((code_out, mask_out)), interrupt)
    }

    /// Benchmark helper: brings the copy of `db` up to date, then times `reps` passes of the
    /// GEMMs and combines over all its rows with device events, without copying results
    /// back. Returns milliseconds per pass.
    pub fn time_kernels(
        &mut self,
        db: &ShareMatrix<'_>,
        queries: &QueryMatrices,
        reps: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let pos = self.sync(db, Shard::WHOLE)?;
        let (ctx, stream) = (Arc::clone(&self.ctx), Arc::clone(&self.compute));
        time_with_events(&ctx, &stream, reps, || {
            self.run_chunks(pos, queries, None, Interrupt::never())
        })
    }

    /// The chunk pipeline over copy `pos` (module docs); results go back into `outputs` when
    /// given (else they stay on the device: timing only).
    fn run_chunks(
        &mut self,
        pos: usize,
        queries: &QueryMatrices,
        mut outputs: Option<(&mut [u16], &mut [u16])>,
        interrupt: &Interrupt,
    ) -> Result<(), GpuError> {
        let r = queries.rotations;
        let rows = self.residents[pos].rows;
        let q_code = self
            .compute
            .clone_htod(&queries.code)
            .map_err(GpuError::cuda("upload the query"))?;
        let q_mask = self
            .compute
            .clone_htod(&queries.mask)
            .map_err(GpuError::cuda("upload the query"))?;
        let cols = padded_columns(r);
        let chunk = CHUNK_ROWS.min(rows.max(1));
        let mut acc = self
            .compute
            .alloc_zeros::<i32>(chunk * cols)
            .map_err(GpuError::cuda("allocate accumulators"))?;
        let mut outs = Vec::with_capacity(4);
        for _ in 0..4 {
            outs.push(
                self.compute
                    .alloc_zeros::<u16>(chunk * r.max(1))
                    .map_err(GpuError::cuda("allocate outputs"))?,
            );
        }
        let pinned_len = chunk * r.max(1);
        if self.pinned.first().is_none_or(|p| p.len() < pinned_len) {
            self.pinned.clear();
            for _ in 0..4 {
                // SAFETY: a buffer is only read (finish_copy) after a transfer filled it.
                // Not write-combined: the host reads it.
                let buffer = unsafe { self.ctx.alloc_pinned_with_flags::<u16>(pinned_len, 0) }
                    .map_err(GpuError::cuda("allocate page-locked result buffers"))?;
                self.pinned.push(buffer);
            }
        }
        let mut pending: Option<(usize, usize, usize)> = None;
        for (c, start) in (0..rows).step_by(chunk).enumerate() {
            interrupt.check()?;
            let end = (start + chunk).min(rows);
            let slot = 2 * (c % 2);
            for (h, (half, q)) in [(Half::Code, &q_code), (Half::Mask, &q_mask)]
                .into_iter()
                .enumerate()
            {
                self.gemm(pos, half, q, cols, start, end, &mut acc)?;
                self.launch_combine(&acc, cols, r, end - start, &mut outs[slot + h])?;
                if outputs.is_some() {
                    // On the copy stream, after the combine: the next chunk's GEMMs proceed.
                    self.start_copy(&outs[slot + h], slot + h, (end - start) * r)?;
                }
            }
            // The previous chunk's results are moved into place while this one computes.
            if let (Some(p), Some((code, mask))) = (pending.take(), outputs.as_mut()) {
                self.finish_copy(p, r, code, mask)?;
            }
            pending = Some((slot, start, end));
        }
        if let (Some(p), Some((code, mask))) = (pending, outputs.as_mut()) {
            self.finish_copy(p, r, code, mask)?;
        }
        self.compute
            .synchronize()
            .map_err(GpuError::cuda("finish the scan"))
    }

    /// One int8 GEMM on the compute stream: `acc (cols × rows) = Qᵀ · D[start..end]`.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        pos: usize,
        half: Half,
        query: &CudaSlice<i8>,
        cols: usize,
        start: usize,
        end: usize,
        acc: &mut CudaSlice<i32>,
    ) -> Result<(), GpuError> {
        let k = half.limb_row_bytes();
        let limbs = self.residents[pos].limbs(half);
        let rows = limbs.slice(start * k..end * k);
        let (a, _ra) = query.device_ptr(&self.compute);
        let (b, _rb) = rows.device_ptr(&self.compute);
        let (c, _rc) = acc.device_ptr_mut(&self.compute);
        // SAFETY: A is the query (k × cols), B the rows start..end (k × n), C the
        // accumulators (cols × n, room for CHUNK_ROWS columns): live allocations of this
        // context of those sizes, and the compute stream orders every other use of them.
        unsafe { int8_gemm_tn(&self.blas, (cols, end - start, k), a, b, c) }
    }

    fn launch_combine(
        &self,
        acc: &CudaSlice<i32>,
        cols: usize,
        r: usize,
        rows: usize,
        out: &mut CudaSlice<u16>,
    ) -> Result<(), GpuError> {
        let (ld, rot, n) = (cols as u32, r as u32, rows as u32);
        let mut launch = self.compute.launch_builder(&self.combine);
        launch.arg(acc).arg(&ld).arg(&rot).arg(&n).arg(out);
        // SAFETY: arguments match privmatch_combine (i32*, u32, u32, u32, u16*); `acc` holds
        // at least rows·cols int32 and `out` at least rows·r u16.
        unsafe { launch.launch(grid_for((rows * r) as u64)) }
            .map(drop)
            .map_err(GpuError::cuda("combine"))
    }

    /// Enqueues, on the copy stream, the transfer of the first `len` results of `out` into
    /// page-locked buffer `buffer`, and records `arrived[buffer]` after it.
    fn start_copy(
        &mut self,
        out: &CudaSlice<u16>,
        buffer: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        // Makes the copy stream wait for the combine that wrote `out`.
        let (src, _read) = out.device_ptr(&self.copy);
        // The host finished reading this buffer (finish_copy) before it is reused.
        let dst = self.pinned[buffer]
            .as_mut_slice()
            .map_err(GpuError::cuda("copy results back"))?;
        let dst = dst
            .get_mut(..len)
            .ok_or_else(|| GpuError::Shape(format!("result buffer shorter than {len}")))?;
        // SAFETY: `dst` is page-locked host memory of exactly `len` u16 (the driver copies
        // size_of_val(dst) bytes) and `src` a device allocation of at least `len` u16 on this
        // context; the host reads `dst` only after `arrived[buffer]`, recorded below, completes.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.copy.cu_stream()) }
            .map_err(GpuError::cuda("copy results back"))?;
        self.arrived[buffer]
            .record(&self.copy)
            .map_err(GpuError::cuda("copy results back"))
    }

    /// Waits for the transfer of chunk `(slot, start, end)` into the page-locked buffers and
    /// copies it into its place in the host outputs.
    fn finish_copy(
        &self,
        (slot, start, end): (usize, usize, usize),
        r: usize,
        code_out: &mut [u16],
        mask_out: &mut [u16],
    ) -> Result<(), GpuError> {
        let len = (end - start) * r;
        for (h, dst) in [code_out, mask_out].into_iter().enumerate() {
            self.arrived[slot + h]
                .synchronize()
                .map_err(GpuError::cuda("copy results back"))?;
            let arrived = self.pinned[slot + h]
                .as_slice()
                .map_err(GpuError::cuda("copy results back"))?;
            dst[start * r..end * r].copy_from_slice(&arrived[..len]);
        }
        Ok(())
    }
}

/// A page-locked host buffer and a device buffer of the same length, for uploads.
struct Staging {
    host: PinnedHostSlice<u16>,
    device: CudaSlice<u16>,
}

impl Staging {
    fn new(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, len: usize) -> Result<Self, GpuError> {
        // SAFETY: the buffer is written (gather_rows) before any byte of it is read; the
        // write-combined flag suits memory the host only writes and the device only reads.
        let host = unsafe { ctx.alloc_pinned::<u16>(len) }
            .map_err(GpuError::cuda("allocate page-locked staging"))?;
        let device = stream
            .alloc_zeros::<u16>(len)
            .map_err(GpuError::cuda("allocate staging"))?;
        Ok(Staging { host, device })
    }

    /// The host side, once the transfer that last read it has finished.
    fn host_mut(&mut self) -> Result<&mut [u16], GpuError> {
        self.host
            .as_mut_slice()
            .map_err(GpuError::cuda("wait for a staging buffer"))
    }
}

/// Copies local rows `batch` of `shard` (rows of `k` coefficients of `source`) into the front
/// of `out`, on up to eight threads.
fn gather_rows(source: &[u16], k: usize, shard: Shard, batch: &[usize], out: &mut [u16]) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8);
    let per = batch.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (rows, dst) in batch.chunks(per).zip(out.chunks_mut(per * k)) {
            s.spawn(move || {
                for (&local, d) in rows.iter().zip(dst.chunks_exact_mut(k)) {
                    let row = shard.global(local);
                    d.copy_from_slice(&source[row * k..(row + 1) * k]);
                }
            });
        }
    });
}

/// A stopped scan ([`Interrupt::check`]) is [`GpuError::Interrupted`].
impl From<DotError> for GpuError {
    fn from(e: DotError) -> Self {
        match e {
            DotError::Interrupted => GpuError::Interrupted,
            other => GpuError::Shape(other.to_string()),
        }
    }
}

/// The local rows of `shard` among the changed physical `rows`, below `local_rows`.
fn local_changes(rows: &[usize], shard: Shard, local_rows: usize) -> Vec<usize> {
    rows.iter()
        .filter_map(|&r| shard.local(r))
        .filter(|&l| l < local_rows)
        .collect()
}

/// A launch of enough blocks for `items` grid-stride work items (capped; the kernels loop).
fn grid_for(items: u64) -> LaunchConfig {
    let blocks = items
        .div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, 65_535 * 8) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The two query matrices of a scan (code, mask), in the layout of
/// [`super::limbs::query_matrix`].
pub struct QueryMatrices {
    /// R.
    pub rotations: usize,
    /// Code query matrix (`padded_columns(R)` columns of 25,600 bytes).
    pub code: Vec<i8>,
    /// Mask query matrix (`padded_columns(R)` columns of 12,800 bytes).
    pub mask: Vec<i8>,
}

impl QueryMatrices {
    /// The query matrices of `query`.
    pub fn of(query: &privmatch_core::iris::query::PreparedQuery) -> Self {
        use super::limbs::query_matrix;
        QueryMatrices {
            rotations: query.num_rotations(),
            code: query_matrix(&Half::Code.rotations(query), Half::Code.coefs()),
            mask: query_matrix(&Half::Mask.rotations(query), Half::Mask.coefs()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_rows() {
        for of in 1..5 {
            for rows in [0usize, 1, 2, 7, 64, 101] {
                let mut seen = vec![0; rows];
                for index in 0..of {
                    let s = Shard { index, of };
                    for l in 0..s.local_len(rows) {
                        let g = s.global(l);
                        assert!(g < rows);
                        assert_eq!(s.local(g), Some(l));
                        seen[g] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "of={of} rows={rows}");
            }
        }
    }

    #[test]
    fn local_changes_keep_this_shards_rows_below_the_length() {
        let s = Shard { index: 1, of: 2 };
        assert_eq!(local_changes(&[0, 1, 3, 4, 9], s, 3), vec![0, 1]);
    }
}
