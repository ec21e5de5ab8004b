//! The scan backend of the iris searches: the CPU scan, or the GPU scan of `privmatch-gpu` with
//! the CPU scan as its fallback, as the GUCs `privmatch.gpu`, `privmatch.gpu_devices` and
//! `privmatch.gpu_memory` ask ([`scan_backend`], docs/architecture.md §5). CUDA is loaded only
//! in the engine worker after it started (never in the postmaster, whose children would inherit
//! a context they cannot use), on a thread with Postgres's signals blocked ([`open_gpu`]).
//!
//! Imports: core's `iris::scan`, `privmatch-gpu`, [`crate::signals`].

use std::ffi::CString;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use privmatch_core::iris::scan::{CpuScan, ScanBackend};
use privmatch_gpu::iris::scan::{GpuConfig, GpuScan, LogSink};
use privmatch_gpu::GpuError;

use crate::signals::without_signals;

/// `privmatch.gpu`: whether the engine scans on GPUs (read when the engine starts).
pub static GPU: GucSetting<GpuMode> = GucSetting::<GpuMode>::new(GpuMode::Auto);
/// `privmatch.gpu_devices`: the CUDA ordinals to scan on, comma-separated (empty: every
/// device; read when the engine starts).
pub static GPU_DEVICES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `privmatch.gpu_memory`: MB of share limbs each GPU may hold (0: 90 % of its free memory;
/// read when the engine starts).
pub static GPU_MEMORY: GucSetting<i32> = GucSetting::<i32>::new(0);

/// The largest `privmatch.gpu_memory` (1 TiB per device, in MB): far above any device, and
/// small enough that the byte count cannot overflow.
const GPU_MEMORY_MAX_MB: i32 = 1 << 20;

/// Defines the GPU GUCs (called by the worker's registration).
pub fn register_gpu_gucs() {
    GucRegistry::define_enum_guc(
        c"privmatch.gpu",
        c"Whether the privmatch engine scans on GPUs (off, auto, on).",
        c"auto: the GPUs if they can be opened, else the CPU; on: GPUs required (the engine warns and scans on the CPU when they cannot be opened). Read when the engine starts.",
        &GPU,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"privmatch.gpu_devices",
        c"CUDA devices the privmatch engine scans on, e.g. '0,1' (empty: every device).",
        c"Read when the engine starts.",
        &GPU_DEVICES,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"privmatch.gpu_memory",
        c"Memory each GPU may hold shares in (0: 90% of its free memory).",
        c"Read when the engine starts.",
        &GPU_MEMORY,
        0,
        GPU_MEMORY_MAX_MB,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
}

/// The values of `privmatch.gpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PostgresGucEnum)]
pub enum GpuMode {
    /// Scan on the CPU; CUDA is never loaded.
    #[name = c"off"]
    Off,
    /// Scan on the GPUs where they can be opened, else on the CPU (one LOG line says why).
    #[name = c"auto"]
    Auto,
    /// The GPUs are required: if they cannot be opened the engine still starts, with a
    /// WARNING, scans on the CPU and says so in `engine_status()`.
    #[name = c"on"]
    On,
}

/// The GPU settings as the engine read them when it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSettings {
    /// `privmatch.gpu`.
    pub mode: GpuMode,
    /// `privmatch.gpu_devices`, as written.
    pub devices: String,
    /// `privmatch.gpu_memory`, MB per device (0: automatic).
    pub memory_mb: i32,
}

impl GpuSettings {
    /// The current values of the GUCs.
    pub fn current() -> Self {
        GpuSettings {
            mode: GPU.get(),
            devices: GPU_DEVICES
                .get()
                .map(|d| d.to_string_lossy().into_owned())
                .unwrap_or_default(),
            memory_mb: GPU_MEMORY.get(),
        }
    }

    /// The device configuration these settings ask for, or why they are invalid (a message
    /// naming the GUC).
    pub fn config(&self) -> Result<GpuConfig, String> {
        let memory_budget = match usize::try_from(self.memory_mb) {
            Ok(0) => None,
            Ok(mb) => Some(
                mb.checked_mul(1 << 20)
                    .ok_or_else(|| format!("privmatch.gpu_memory: {mb} MB is too large"))?,
            ),
            Err(_) => {
                return Err(format!(
                    "privmatch.gpu_memory: {} MB is negative",
                    self.memory_mb
                ))
            }
        };
        Ok(GpuConfig {
            devices: parse_gpu_devices(&self.devices)?,
            memory_budget,
        })
    }
}

/// Parses `privmatch.gpu_devices`: empty (or blanks) for every device, else CUDA ordinals
/// separated by commas, each listed once (blanks around them are allowed). Anything else is
/// an error naming the GUC: a typo must not silently pick other devices.
pub fn parse_gpu_devices(text: &str) -> Result<Vec<usize>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let invalid = || {
        format!(
            "privmatch.gpu_devices = '{}' is not a list of CUDA device numbers separated by commas (e.g. '0,1'; empty: every device)",
            text.escape_default()
        )
    };
    let mut devices = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        // `usize::from_str` accepts a leading '+': digits only, so '+1' is refused too.
        if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        let ordinal: usize = item.parse().map_err(|_| invalid())?;
        if devices.contains(&ordinal) {
            return Err(format!(
                "privmatch.gpu_devices: device {ordinal} is listed twice"
            ));
        }
        devices.push(ordinal);
    }
    Ok(devices)
}

/// How loud a line about the choice of backend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loudness {
    /// LOG: expected on a machine without a GPU.
    Log,
    /// WARNING: the GPU was asked for, or the settings are wrong.
    Warning,
}

/// The scan backend the engine runs searches with, and what `engine_status()` says about it.
pub struct ScanChoice {
    /// What the searches scan with.
    pub backend: Arc<dyn ScanBackend>,
    /// The GPU backend when it is the one in use (it may still fall back to the CPU later).
    gpu: Option<Arc<GpuScan>>,
    /// The CPU backend (alone, or the GPU's fallback).
    cpu: CpuScan,
    /// Why the CPU scans although `privmatch.gpu` allowed (auto) or required (on) a GPU.
    not_gpu: Option<String>,
    /// A line for the server log about the choice (the caller logs it on the main thread).
    pub notice: Option<(Loudness, String)>,
}

impl ScanChoice {
    /// The backend as `engine_status()` shows it (column `kernel`): its name, and why the
    /// CPU scans when a GPU was allowed, required or failed.
    pub fn describe(&self) -> String {
        if let Some(gpu) = &self.gpu {
            return match gpu.fallback_reason() {
                None => gpu.name(),
                Some(reason) => format!(
                    "{} (the GPU failed; scanning on the CPU: {reason})",
                    self.cpu.name()
                ),
            };
        }
        match &self.not_gpu {
            None => self.cpu.name(),
            Some(reason) => format!("{} ({reason})", self.cpu.name()),
        }
    }
}

/// The one function choosing the scan backend (docs/architecture.md §5): the CPU scan `cpu`
/// for `privmatch.gpu = off`, else the GPUs `open` opens with the configured devices and
/// memory, with `cpu` as their fallback; when they cannot be opened, `cpu` and the reason.
/// `open` is only called for `auto` and `on` with valid settings (it loads CUDA).
pub fn scan_backend(
    settings: &GpuSettings,
    cpu: CpuScan,
    open: impl FnOnce(&GpuConfig, CpuScan) -> Result<GpuScan, GpuError>,
) -> ScanChoice {
    let on_cpu = |not_gpu: Option<String>, notice: Option<(Loudness, String)>| ScanChoice {
        backend: Arc::new(cpu),
        gpu: None,
        cpu,
        not_gpu,
        notice,
    };
    if settings.mode == GpuMode::Off {
        return on_cpu(None, None);
    }
    let opened = settings
        .config()
        .map_err(|invalid| (Loudness::Warning, invalid))
        .and_then(|config| {
            open(&config, cpu).map_err(|e| {
                let reason = match e {
                    GpuError::Unavailable(reason) => reason,
                    other => other.to_string(),
                };
                let loudness = match settings.mode {
                    GpuMode::On => Loudness::Warning,
                    GpuMode::Auto | GpuMode::Off => Loudness::Log,
                };
                (loudness, reason)
            })
        });
    match opened {
        Ok(gpu) => {
            let gpu = Arc::new(gpu);
            ScanChoice {
                backend: Arc::clone(&gpu) as Arc<dyn ScanBackend>,
                gpu: Some(gpu),
                cpu,
                not_gpu: None,
                notice: None,
            }
        }
        Err((loudness, reason)) => {
            let (status, line) = match settings.mode {
                GpuMode::On => (
                    format!("privmatch.gpu = on, but no GPU is in use: {reason}"),
                    format!("privmatch engine: privmatch.gpu = on, but the GPU scan cannot be used ({reason}); scanning on the CPU"),
                ),
                GpuMode::Auto | GpuMode::Off => (
                    format!("GPU unavailable: {reason}"),
                    format!("privmatch engine: GPU scan unavailable ({reason}); scanning on the CPU"),
                ),
            };
            on_cpu(Some(status), Some((loudness, line)))
        }
    }
}

/// Opens the GPUs of `config` on a thread started with every signal blocked, and waits for
/// it: CUDA starts threads of its own inside the process, and they inherit the mask of the
/// thread that loads it, so Postgres's signal handlers stay on the main thread. The backend
/// logs through `log` (to the main thread's channel: only that thread calls Postgres).
pub fn open_gpu(
    config: &GpuConfig,
    cpu: CpuScan,
    log: Sender<String>,
) -> Result<GpuScan, GpuError> {
    let config = config.clone();
    let sink: LogSink = Arc::new(move |line: &str| {
        let _ = log.send(line.to_owned());
    });
    let opener = without_signals(|| {
        std::thread::Builder::new()
            .name("privmatch-gpu-open".into())
            .spawn(move || GpuScan::open(&config, cpu, sink))
    })
    .map_err(|e| GpuError::Unavailable(format!("cannot start a thread to open the GPU: {e}")))?;
    opener.join().unwrap_or_else(|_| {
        Err(GpuError::Unavailable(
            "opening the GPU panicked (a bug; see the server log)".into(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    fn settings(mode: GpuMode, devices: &str, memory_mb: i32) -> GpuSettings {
        GpuSettings {
            mode,
            devices: devices.into(),
            memory_mb,
        }
    }

    fn unavailable(_: &GpuConfig, _: CpuScan) -> Result<GpuScan, GpuError> {
        Err(GpuError::Unavailable("no device here".into()))
    }

    #[test]
    fn gpu_devices_parse_strictly() {
        assert_eq!(parse_gpu_devices(""), Ok(vec![]));
        assert_eq!(parse_gpu_devices("  "), Ok(vec![]));
        assert_eq!(parse_gpu_devices("0"), Ok(vec![0]));
        assert_eq!(parse_gpu_devices("2, 0 ,1"), Ok(vec![2, 0, 1]));
        for bad in [
            "0,",
            ",0",
            "0,,1",
            "a",
            "-1",
            "+1",
            "0;1",
            "0 1",
            "1.0",
            "gpu0",
            "99999999999999999999999",
        ] {
            let err = parse_gpu_devices(bad).expect_err(bad);
            assert!(err.starts_with("privmatch.gpu_devices"), "{bad}: {err}");
        }
        let twice = parse_gpu_devices("1,0,1").expect_err("repeat");
        assert!(twice.contains("device 1 is listed twice"), "{twice}");
    }

    #[test]
    fn gpu_memory_is_megabytes_per_device_and_zero_is_automatic() {
        let config = settings(GpuMode::Auto, "", 0).config().expect("valid");
        assert_eq!(config.memory_budget, None);
        assert!(config.devices.is_empty());
        let config = settings(GpuMode::Auto, "1", 2048).config().expect("valid");
        assert_eq!(config.memory_budget, Some(2048 << 20));
        assert_eq!(config.devices, vec![1]);
        let err = settings(GpuMode::Auto, "", -1)
            .config()
            .expect_err("negative");
        assert!(err.starts_with("privmatch.gpu_memory"), "{err}");
    }

    #[test]
    fn off_never_loads_cuda_and_scans_on_the_cpu() {
        let cpu = CpuScan::detect(2);
        let choice = scan_backend(&settings(GpuMode::Off, "junk", 0), cpu, |_, _| {
            panic!("privmatch.gpu = off must not open a GPU")
        });
        assert_eq!(choice.describe(), cpu.name());
        assert_eq!(choice.backend.name(), cpu.name());
        assert_eq!(choice.backend.parallelism(), 2);
        assert!(choice.notice.is_none());
    }

    /// Asserts that `choice` scans on `cpu`, that its status reads `status` after the CPU
    /// kernel's name, and that it logs one line of `loudness` containing `line`.
    fn assert_on_cpu(
        choice: &ScanChoice,
        cpu: CpuScan,
        status: &str,
        loudness: Loudness,
        line: &str,
    ) {
        assert_eq!(choice.backend.name(), cpu.name());
        assert_eq!(choice.describe(), format!("{} ({status})", cpu.name()));
        let (logged_as, logged) = choice.notice.as_ref().expect("a notice");
        assert_eq!(*logged_as, loudness, "{logged}");
        assert!(logged.contains(line), "{logged}");
    }

    /// Without a GPU both scan on the CPU and say why in engine_status(); `auto` logs one
    /// LOG line (expected on such a machine), `on` a WARNING (the GPU was required).
    #[test]
    fn without_a_gpu_auto_and_on_scan_on_the_cpu_and_say_why() {
        let cpu = CpuScan::detect(2);
        for (mode, status, loudness, line) in [
            (
                GpuMode::Auto,
                "GPU unavailable: no device here",
                Loudness::Log,
                "privmatch engine: GPU scan unavailable (no device here); scanning on the CPU",
            ),
            (
                GpuMode::On,
                "privmatch.gpu = on, but no GPU is in use: no device here",
                Loudness::Warning,
                "privmatch engine: privmatch.gpu = on, but the GPU scan cannot be used (no device here); scanning on the CPU",
            ),
        ] {
            let choice = scan_backend(&settings(mode, "", 0), cpu, unavailable);
            assert_on_cpu(&choice, cpu, status, loudness, line);
        }
    }

    #[test]
    fn invalid_settings_never_open_a_gpu_and_warn_naming_the_guc() {
        let cpu = CpuScan::detect(1);
        let invalid = parse_gpu_devices("0,x").expect_err("invalid");
        for (mode, status) in [
            (GpuMode::Auto, format!("GPU unavailable: {invalid}")),
            (
                GpuMode::On,
                format!("privmatch.gpu = on, but no GPU is in use: {invalid}"),
            ),
        ] {
            let choice = scan_backend(&settings(mode, "0,x", 0), cpu, |_, _| {
                panic!("invalid settings must not open a GPU")
            });
            assert_on_cpu(
                &choice,
                cpu,
                &status,
                Loudness::Warning,
                "privmatch.gpu_devices",
            );
        }
    }

    #[test]
    fn other_gpu_errors_are_reported_with_their_step() {
        let cpu = CpuScan::detect(1);
        let choice = scan_backend(&settings(GpuMode::Auto, "", 0), cpu, |_, _| {
            Err(GpuError::Nvrtc("bad arch".into()))
        });
        assert!(
            choice
                .describe()
                .contains("NVRTC could not compile the scan kernels: bad arch"),
            "{}",
            choice.describe()
        );
    }

    /// The real thing: on a machine without a GPU `auto` answers on the CPU with a reason;
    /// with one, the GPU backend's description.
    #[test]
    fn auto_with_the_real_probe_never_panics() {
        let cpu = CpuScan::detect(1);
        let (tx, _rx) = channel();
        let choice = scan_backend(&settings(GpuMode::Auto, "", 0), cpu, |config, cpu| {
            open_gpu(config, cpu, tx)
        });
        let described = choice.describe();
        eprintln!("engine scan backend (privmatch.gpu = auto): {described}");
        assert!(
            described.starts_with("gpu: ")
                || described.starts_with(&format!("{} (GPU unavailable: ", cpu.name())),
            "{described}"
        );
    }
}
