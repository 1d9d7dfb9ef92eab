//! Shared harness of the integration suite.
//!
//! Each test binary picks its runtime once, at its first [`start`]:
//!
//! * `CUDA_REQUIRED=1` (set by `.gpu/run.sh` on the GPU machine): the real
//!   runtime, and it must see a device, or the test **fails**.
//! * otherwise the real runtime when one loads and sees a device, else the
//!   emulated runtime built by `cuda-sys` (CI, laptops).
//!
//! Binaries that test the emulator's own features (fault injection, delays)
//! use [`start_emulated`], which always loads the emulator, on any machine.
//!
//! Tests in one binary run one at a time (a lock): the emulator's resource
//! counters are process-wide, and [`Ctx::assert_clean`] checks that a test left
//! nothing allocated, pinned, registered or created.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use wirespeed_cuda_sys::emulator::{Controls, Counters};

/// Which runtime this test binary uses.
#[derive(Debug, Clone)]
pub struct Env {
    /// True for the real CUDA runtime.
    pub real: bool,
    /// The emulator's controls when it is the emulator.
    pub emu: Option<Controls>,
    /// The library loaded.
    pub path: String,
}

static ENV: OnceLock<Env> = OnceLock::new();
static LOCK: Mutex<()> = Mutex::new(());

fn required() -> bool {
    std::env::var("CUDA_REQUIRED").is_ok_and(|v| v == "1")
}

fn pick(force_emulator: bool) -> Env {
    if !force_emulator {
        // SAFETY: no explicit path: the environment and the standard names
        // are the machine's CUDA configuration.
        match unsafe { wirespeed_cuda_sys::Runtime::search(None) } {
            Ok(rt) => {
                let mut n = 0;
                // SAFETY: `n` is a valid place for the count.
                let code = unsafe { (rt.api().cudaGetDeviceCount)(&mut n) };
                if code.0 == 0 && n > 0 {
                    // SAFETY: the library the search above loaded as a CUDA runtime.
                    unsafe { wirespeed_cuda_sys::set_runtime_path(rt.path()) }
                        .expect("runtime chosen before first use");
                    return Env { real: true, emu: None, path: rt.path().to_string() };
                }
                assert!(
                    !required(),
                    "CUDA_REQUIRED=1 but {} reports {} ({} devices)",
                    rt.path(),
                    rt.error_name(code),
                    n
                );
            }
            Err(e) => assert!(!required(), "CUDA_REQUIRED=1 but no CUDA runtime loads: {e}"),
        }
    }
    let path = wirespeed_cuda_sys::emulator::library_path().expect("the emulated runtime is embedded");
    wirespeed_cuda_sys::emulator::install().expect("runtime chosen before first use");
    let emu = wirespeed_cuda_sys::emulator::controls().expect("emulator controls");
    Env { real: false, emu: Some(emu), path }
}

/// One test's context: holds the binary's test lock; see [`start`].
pub struct Ctx {
    /// The runtime in use.
    pub env: &'static Env,
    _guard: MutexGuard<'static, ()>,
}

fn begin(force_emulator: bool) -> Ctx {
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let env = ENV.get_or_init(|| pick(force_emulator));
    assert!(!force_emulator || !env.real, "start_emulated() after start() chose the real runtime in this binary");
    if let Some(emu) = &env.emu {
        emu.reset();
        emu.set_delay_us(0);
    }
    Ctx { env, _guard: guard }
}

/// Starts a test on this binary's runtime (real GPU or emulator; see the crate docs).
pub fn start() -> Ctx {
    begin(false)
}

/// Starts a test that needs the emulator's controls (faults, delays, counters).
pub fn start_emulated() -> Ctx {
    begin(true)
}

impl Ctx {
    /// True on the emulator.
    pub fn emulated(&self) -> bool {
        !self.env.real
    }

    /// The emulator's controls (panics on the real runtime: use only after
    /// [`start_emulated`] or when [`Ctx::emulated`]).
    pub fn emu(&self) -> &Controls {
        self.env.emu.as_ref().expect("emulator controls on the emulated runtime")
    }

    /// The emulator's counters, or `None` on the real runtime.
    pub fn counters(&self) -> Option<Counters> {
        self.env.emu.as_ref().map(|e| e.counters())
    }

    /// Asserts that no allocation, pinned block, registration, stream or event
    /// is live (on the emulator; on a GPU there is nothing to count).
    #[track_caller]
    pub fn assert_clean(&self) {
        if let Some(c) = self.counters() {
            assert!(c.is_clean(), "resources left behind: {c:?}");
        }
    }

    /// Sets the emulator's delay per stream operation (no-op on a GPU).
    pub fn set_delay_us(&self, us: u32) {
        if let Some(e) = &self.env.emu {
            e.set_delay_us(us);
        }
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if let Some(e) = &self.env.emu {
            e.reset();
            e.set_delay_us(0);
        }
    }
}

/// A temporary folder removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Makes a new, empty temporary folder.
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("wire-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic test bytes: byte `i` of a stream seeded by `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `pattern(seed, len)` to a new file at `path`.
pub fn write_pattern_file(path: &Path, seed: u64, len: usize) -> Vec<u8> {
    let data = pattern(seed, len);
    std::fs::write(path, &data).expect("write test file");
    data
}

/// Maps a test file ([`wirespeed_pinned::MappedFile::open`], whose contract is that
/// nothing writes or truncates the file while it is mapped).
///
/// The suite's files are private to the test that writes them. A few tests
/// break the contract on purpose, to check what the library detects when a
/// caller does (`FileChanged`), or that it crashes as documented (`SIGBUS`, in
/// a child process); each says so where it changes a mapped file.
///
/// # Errors
/// As `MappedFile::open`.
pub fn open_mapped(path: impl AsRef<Path>) -> wirespeed_pinned::Result<std::sync::Arc<wirespeed_pinned::MappedFile>> {
    // SAFETY: see above: the file is the calling test's own; where a test
    // changes it while mapped, that is the point of the test.
    unsafe { wirespeed_pinned::MappedFile::open(path) }
}

/// Aborts the process if the test holding it hangs for `secs` seconds (the
/// suite must never hang on an error path); dropping it ends the watch.
pub struct Watchdog(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Watchdog {
    /// Starts watching the calling test.
    pub fn new(secs: u64) -> Watchdog {
        use std::sync::atomic::{AtomicBool, Ordering};
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let name = std::thread::current().name().unwrap_or("?").to_string();
        std::thread::spawn(move || {
            for _ in 0..secs * 10 {
                std::thread::sleep(std::time::Duration::from_millis(100));
                if d.load(Ordering::Acquire) {
                    return;
                }
            }
            eprintln!("test {name} hung for {secs} s");
            std::process::abort();
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Leaks `value` as [`std::mem::forget`] does (it is never dropped, and
/// whatever it holds is never released), but keeps the address of the box it
/// is moved into in a process-wide list, so that LeakSanitizer counts what it
/// holds as reachable and still reports every other leak. For tests that
/// forget handles on purpose among other operations (`tests/random_ops`).
pub fn forget_reachably<T>(value: T) {
    static KEPT: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let kept = Box::into_raw(Box::new(value)) as usize;
    KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(kept);
}

/// `VmLck` of this process, in KiB (0 where `/proc` does not say).
pub fn vm_lck_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmLck:"))
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

// ------------------------------------------------------------------ tests in child processes

/// The environment variable that tells a child process which test it runs.
const CHILD_VAR: &str = "WIRESPEED_TESTS_CHILD";

/// What a test run in a child process did, from [`spawn_child`].
pub struct ChildRun {
    /// The child's exit status and raw output.
    pub output: std::process::Output,
    /// Its standard output, as text.
    pub stdout: String,
    /// Its standard error, as text.
    pub stderr: String,
}

/// Runs the `#[ignore]`d test `name` of the current test binary alone in a
/// child process (`--exact --ignored --nocapture --test-threads=1`), with
/// `env` added to the environment, where [`is_child`]`(name)` is true.
/// Returns what it did, failure and death by a signal included; [`run_child`]
/// also checks that it passed.
pub fn spawn_child(name: &str, env: &[(&str, &str)]) -> ChildRun {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"]);
    let output = cmd.envs(env.iter().copied()).env(CHILD_VAR, name).output().expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    ChildRun { output, stdout, stderr }
}

/// [`spawn_child`], then asserts that the child succeeded and said
/// [`child_ran`] (proof that it ran its body, not an early return).
///
/// For what must not happen in the test process: another emulator
/// configuration, a lower rlimit, dropped privileges, a deliberate leak or
/// crash. The child is an `#[ignore]`d test of the same binary that returns
/// at once unless [`is_child`] says this process was started to run it, and
/// ends with [`child_ran`]:
///
/// ```no_run
/// // #[test]
/// fn with_two_devices() {
///     wirespeed_tests::run_child("child_two_devices", &[("CUDA_EMU_DEVICES", "2")]);
/// }
///
/// // #[test]
/// // #[ignore = "runs in a child process started by with_two_devices"]
/// fn child_two_devices() {
///     if !wirespeed_tests::is_child("child_two_devices") {
///         return;
///     }
///     // ... what needs two emulated devices ...
///     wirespeed_tests::child_ran("child_two_devices");
/// }
/// # with_two_devices();
/// # child_two_devices();
/// ```
#[track_caller]
pub fn run_child(name: &str, env: &[(&str, &str)]) -> ChildRun {
    let r = spawn_child(name, env);
    assert!(r.output.status.success(), "child {name} failed:\n{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(&ran_marker(name)), "child {name} did not run its body:\n{}\n{}", r.stdout, r.stderr);
    r
}

/// Whether this process is the child started to run test `name`; a child
/// test returns at once when it is not.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD_VAR).is_ok_and(|v| v == name)
}

/// Says, on standard output, that child `name` ran its body to the end: what
/// [`run_child`] looks for.
pub fn child_ran(name: &str) {
    println!("{}", ran_marker(name));
}

fn ran_marker(name: &str) -> String {
    format!("child {name} ran")
}

/// `CAP_DAC_OVERRIDE`: bypass file permission checks.
pub const CAP_DAC_OVERRIDE: u32 = 1;
/// `CAP_DAC_READ_SEARCH`: bypass read and search permission checks.
pub const CAP_DAC_READ_SEARCH: u32 = 2;
/// `CAP_IPC_LOCK`: lock memory beyond `RLIMIT_MEMLOCK`.
pub const CAP_IPC_LOCK: u32 = 14;

/// Drops `caps` from the calling thread's capability sets (threads it starts
/// later inherit that). For child processes that must meet a limit root is
/// exempt from (CI runs as root).
///
/// # Errors
/// The `capget`/`capset` error.
pub fn drop_capabilities(caps: &[u32]) -> Result<(), String> {
    /// Linux capability header and data (version 3).
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = CapHeader { version: 0x2008_0522, pid: 0 };
    let mut d = [CapData::default(); 2];
    // SAFETY: a valid header and two data structs, as capget(2) version 3 wants.
    if unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut CapHeader, d.as_mut_ptr()) } != 0 {
        return Err(format!("capget: {}", std::io::Error::last_os_error()));
    }
    for &c in caps {
        let (i, bit) = ((c / 32) as usize, 1 << (c % 32));
        d[i].effective &= !bit;
        d[i].permitted &= !bit;
        d[i].inheritable &= !bit;
    }
    // SAFETY: as above; this only lowers the calling thread's capabilities.
    if unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut CapHeader, d.as_ptr()) } != 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Keeps panics that a test provokes on purpose out of a passing run's output:
/// installs (once per process) a panic hook that stays silent for a payload
/// containing `"(expected in this test)"` and hands every other panic to the
/// default hook, backtrace and all.
pub fn quiet_expected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let p = info.payload();
            let msg = p.downcast_ref::<&str>().copied().or_else(|| p.downcast_ref::<String>().map(String::as_str));
            if !msg.is_some_and(|m| m.contains("(expected in this test)")) {
                default(info);
            }
        }));
    });
}

/// The Rust examples of the READMEs, compiled as doc-tests of this crate so
/// that a README cannot drift from the API.
#[doc = include_str!("../../README.md")]
#[doc = include_str!("../../cuda-sys/README.md")]
#[doc = include_str!("../../cuda-safe/README.md")]
#[doc = include_str!("../../pinned-mem/README.md")]
pub mod readme_examples {}

/// Anonymous pages holding a copy of some bytes, optionally made read-only: host
/// memory the tests register in place (`HostMemory`), unmapped on drop.
/// Registrations whose Drop fails leak their memory by design; with this type
/// that is a mapping, not a heap block (LeakSanitizer stays quiet about leaks
/// the tests make on purpose).
#[derive(Debug)]
pub struct Pages {
    ptr: *mut u8,
    len: usize,
}
// SAFETY: the mapping is owned by the value.
unsafe impl Send for Pages {}
// SAFETY: shared access only reads it.
unsafe impl Sync for Pages {}
impl Pages {
    /// Fresh pages holding `data` (writable).
    pub fn new(data: &[u8]) -> Pages {
        Pages::with(data, false)
    }

    /// Fresh pages holding `data`, then `mprotect`-ed read-only when asked.
    pub fn with(data: &[u8], read_only: bool) -> Pages {
        let len = data.len();
        let (prot, flags) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        // SAFETY: a fresh anonymous mapping; checked below.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: `len` writable bytes, disjoint from `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.cast::<u8>(), len) };
        // SAFETY: our own mapping.
        assert!(!read_only || unsafe { libc::mprotect(ptr, len, libc::PROT_READ) } == 0);
        Pages { ptr: ptr.cast(), len }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` readable bytes, mapped while `self` lives, written only in `with`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
// SAFETY: the mapping stays at the same address until Drop; only read while registered.
unsafe impl wirespeed_cuda::HostMemory for Pages {
    fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}
impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Holds `stream` with a host function until the returned sender is used or
/// dropped: work queued on it provably does not run before then (on the
/// emulated runtime and on a GPU alike).
pub fn hold(stream: &wirespeed_cuda::Stream) -> std::sync::mpsc::Sender<()> {
    let (open, held) = std::sync::mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = held.recv();
        })
        .expect("a host function on the stream");
    open
}
