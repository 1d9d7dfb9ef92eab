//! pinned-mem and cuda-safe: every bad input gives a clear typed error (whose
//! message says what is wrong, and what to do where there is a remedy) and
//! leaves nothing allocated, pinned, registered or locked (`VmLck`).
//!
//! Each case of the issue, and where it is tested (`CASES` below runs them all
//! again, table-driven, in `every_bad_input_is_typed_and_leaves_nothing_pinned`):
//!
//! | input                                   | result                          | tested in |
//! |-----------------------------------------|---------------------------------|-----------|
//! | zero-length (or reversed) range         | `BadRange` ("empty")            | pinned_range.rs, here |
//! | zero-length range, streamed             | `Ok`, 0 bytes (a no-op)         | pinned_stream.rs, here |
//! | range past EOF                          | `BadRange` ("past the end")     | pinned_range.rs, pinned_stream.rs, here |
//! | unaligned offsets                       | work: rounded out to pages      | pinned_range.rs, here |
//! | overlapping windows                     | `Overlap` (+ remedy)            | pinned_range.rs, here |
//! | file truncated after mapping: `pread` paths (ring slot, ring and O_DIRECT streamers) | `FileChanged` | here |
//! | file truncated after mapping: registered in place, windows, whole file | `FileChanged` (size checked before registering) | here (child) |
//! | file truncated after mapping: reading the lost pages through `MappedFile::as_bytes` | `SIGBUS` (documented, cannot be avoided) | here (child) |
//! | a directory                             | `NotAFile`                      | pinned_mapping.rs, here |
//! | an unreadable file                      | `Io { op: "open" }`, EACCES     | here (child without privileges) |
//! | an empty file                           | `EmptyFile`                     | pinned_mapping.rs, here |
//! | RLIMIT_MEMLOCK lower than the window    | `MemlockLimit` (+ remedies)     | pinned_range.rs (child), here (child) |
//! | a request over the pin budget           | `BudgetExceeded` (+ remedy)     | pinned_range.rs, pinned_ring.rs, pinned_stream.rs, here |
//! | strategy sizes whose product overflows  | `InvalidArgument` (no panic)    | here |
//! | more than 1024 threads                  | `InvalidArgument`               | here |
//! | a bad device index                      | `InvalidArgument` (the count)   | safe_api.rs, here |
//! | an allocation larger than the device    | `cudaErrorMemoryAllocation` (+ hint) | safe_api.rs (1 PiB), here (total + 1) |
//! | every number of the API at 0, 1, 2^40 and more | a typed error, or it works      | bounds.rs |
//!
//! CI and the GPU machine run as root, with `CAP_IPC_LOCK` and
//! `CAP_DAC_OVERRIDE`: the unreadable-file and memlock cases therefore run in a
//! child process (this binary again, `--exact bad_input_child`) that drops
//! them first, and are skipped with a printed reason where that fails.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wirespeed_cuda::{Device, DeviceBuffer, Stream};
use wirespeed_pinned::{
    Error, MappedFile, PinBudget, PinOptions, PinnedRange, PinnedRing, Strategy, StreamConfig, Streamer,
};
use wirespeed_tests::{Ctx, TempDir, open_mapped, start, vm_lck_kb, write_pattern_file};

const PAGE: u64 = 4096;
/// Test files: a few pages and an unaligned tail.
const LEN: usize = (1 << 20) + 4321;
/// `LEN` rounded up to pages.
const LEN_PAGES: u64 = (LEN as u64).div_ceil(PAGE) * PAGE;
/// What the truncated files keep.
const TRUNCATED: u64 = 100_000;

/// The case `bad_input_child` checks.
const CHILD_CASE: &str = "BAD_INPUT_CASE";
/// The folder `bad_input_child` makes its files in (the parent's).
const CHILD_DIR: &str = "BAD_INPUT_DIR";

// ------------------------------------------------------------------ helpers

/// Where a case makes its files: a folder of its own, or (in a child) the
/// parent's, so that the parent removes it whatever the child could do.
struct Fixture {
    dir: PathBuf,
    _own: Option<TempDir>,
}

impl Fixture {
    fn new() -> Fixture {
        match std::env::var_os(CHILD_DIR) {
            Some(d) => Fixture { dir: PathBuf::from(d), _own: None },
            None => {
                let t = TempDir::new("bad-input");
                Fixture { dir: t.path().to_path_buf(), _own: Some(t) }
            }
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A new file of `len` pattern bytes, mapped.
    fn file(&self, name: &str, len: usize) -> (Arc<MappedFile>, Vec<u8>) {
        let path = self.path(name);
        let data = write_pattern_file(&path, name.len() as u64, len);
        (open_mapped(&path).unwrap(), data)
    }

    /// A file of `LEN` bytes, mapped, then truncated to `TRUNCATED` bytes
    /// (breaking `MappedFile::open`'s contract on purpose: what is detected?).
    fn truncated(&self, name: &str) -> Arc<MappedFile> {
        let (f, _) = self.file(name, LEN);
        std::fs::OpenOptions::new().write(true).open(f.path()).unwrap().set_len(TRUNCATED).unwrap();
        assert_eq!(f.len(), LEN as u64, "the mapping still has the old length");
        f
    }
}

fn dev() -> Device {
    Device::get(0).unwrap()
}

fn streamer(strategy: Strategy, budget: &PinBudget) -> Streamer {
    Streamer::new(&[dev()], StreamConfig::new(strategy, budget.clone())).unwrap()
}

/// Copies the range to the device and back.
fn round_trip(r: &PinnedRange) -> Vec<u8> {
    let stream = Stream::new(&dev()).unwrap();
    let mut d = DeviceBuffer::<u8>::new(&dev(), r.len() as usize).unwrap();
    stream.copy_to_device(&r.source(), &mut d).unwrap().wait().unwrap();
    d.to_vec().unwrap()
}

// ------------------------------------------------------------------ the cases

/// What a case got.
#[derive(Debug)]
enum Got {
    Pinned(Error),
    Cuda(wirespeed_cuda::Error),
    /// The input is fine (the call worked); what was checked.
    Works(String),
    /// Not testable here, and why.
    Skipped(String),
}

impl From<Error> for Got {
    fn from(e: Error) -> Got {
        Got::Pinned(e)
    }
}

/// What a case must give.
#[derive(Clone, Copy)]
enum Expect {
    /// A `wirespeed_pinned::Error` of this variant (matched by the function).
    Pinned(&'static str, fn(&Error) -> bool),
    /// A `wirespeed_cuda::Error` from this call, with this CUDA code (`None`: an
    /// argument refused before CUDA).
    Cuda(&'static str, Option<u32>),
    /// It works.
    Works,
}

/// Where a case runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    Here,
    /// A child process that cannot read a `chmod 000` file (nobody, or without
    /// `CAP_DAC_OVERRIDE`/`CAP_DAC_READ_SEARCH`).
    ChildUnprivileged,
    /// A child process with `RLIMIT_MEMLOCK` at 64 KiB and without `CAP_IPC_LOCK`.
    ChildLowMemlock,
    /// A child process, because the library might fault (`SIGBUS`) in it.
    ChildMayFault,
}

struct Case {
    name: &'static str,
    /// Where else it is tested.
    also: &'static str,
    place: Place,
    expect: Expect,
    /// Substrings of the error's `Display`: what is wrong, and the remedy.
    says: &'static [&'static str],
    run: fn(&Fixture) -> Got,
}

const CASES: &[Case] = &[
    Case {
        name: "zero-length range",
        also: "pinned_range.rs",
        place: Place::Here,
        expect: Expect::Pinned("BadRange", |e| matches!(e, Error::BadRange { .. })),
        says: &["4096..4096", "empty", "nothing to pin"],
        run: |fx| {
            let (f, _) = fx.file("zero.bin", LEN);
            PinnedRange::new(&f, PAGE..PAGE, PinOptions::default(), &PinBudget::unlimited()).unwrap_err().into()
        },
    },
    Case {
        name: "zero-length range, streamed (a no-op)",
        also: "pinned_stream.rs",
        place: Place::Here,
        expect: Expect::Works,
        says: &[],
        run: |fx| {
            let (f, _) = fx.file("zero-stream.bin", LEN);
            let budget = PinBudget::new(16 << 20);
            let mut empty = DeviceBuffer::<u8>::new(&dev(), 0).unwrap();
            let r = streamer(Strategy::Auto, &budget).to_device(&f, 1000..1000, &mut empty).unwrap();
            assert_eq!((r.bytes, r.registrations, budget.used()), (0, 0, 0));
            Got::Works("0 bytes, nothing registered".into())
        },
    },
    Case {
        name: "range past EOF",
        also: "pinned_range.rs",
        place: Place::Here,
        expect: Expect::Pinned("BadRange", |e| matches!(e, Error::BadRange { .. })),
        says: &["past the end", "-byte file"],
        run: |fx| {
            let (f, _) = fx.file("past.bin", LEN);
            let r = f.len() - 10..f.len() + 10;
            PinnedRange::new(&f, r, PinOptions::default(), &PinBudget::unlimited()).unwrap_err().into()
        },
    },
    Case {
        name: "range past EOF, streamed",
        also: "pinned_stream.rs",
        place: Place::Here,
        expect: Expect::Pinned("BadRange", |e| matches!(e, Error::BadRange { .. })),
        says: &["past the end"],
        run: |fx| {
            let (f, _) = fx.file("past-stream.bin", LEN);
            let mut dst = DeviceBuffer::<u8>::new(&dev(), 100).unwrap();
            let s = streamer(Strategy::Auto, &PinBudget::new(4 << 20));
            s.to_device(&f, f.len() - 50..f.len() + 50, &mut dst).unwrap_err().into()
        },
    },
    Case {
        name: "unaligned offsets (rounded out to pages)",
        also: "pinned_range.rs",
        place: Place::Here,
        expect: Expect::Works,
        says: &[],
        run: |fx| {
            let (f, data) = fx.file("unaligned.bin", LEN);
            let budget = PinBudget::unlimited();
            let range = 1001..LEN as u64 - 333;
            let r = PinnedRange::new(&f, range.clone(), PinOptions::default(), &budget).unwrap();
            let pages = r.pinned_pages();
            assert_eq!((pages.start % PAGE, pages.end % PAGE), (0, 0));
            assert!(pages.start <= range.start && range.end <= pages.end);
            assert_eq!(round_trip(&r), &data[range.start as usize..range.end as usize]);
            drop(r);
            let mut dst = DeviceBuffer::<u8>::new(&dev(), 5000).unwrap();
            let s = streamer(Strategy::Windows { window: 8192, in_flight: 2 }, &budget);
            s.to_device(&f, 777..5777, &mut dst).unwrap();
            assert_eq!(dst.to_vec().unwrap(), &data[777..5777]);
            drop((s, dst));
            budget.release_parked(); // what the dropped streamer parked with it
            assert_eq!(budget.used(), 0);
            Got::Works(format!("bytes {range:?} pinned as pages {pages:?}, copied exactly"))
        },
    },
    Case {
        name: "overlapping windows",
        also: "pinned_range.rs",
        place: Place::Here,
        expect: Expect::Pinned("Overlap", |e| matches!(e, Error::Overlap { .. })),
        says: &["5000..10000", "0..8192", "release the other range", "disjoint pages"],
        run: |fx| {
            let (f, _) = fx.file("overlap.bin", LEN);
            let budget = PinBudget::unlimited();
            let a = PinnedRange::new(&f, 0..5000, PinOptions::default(), &budget).unwrap();
            let e = PinnedRange::new(&f, 5000..10_000, PinOptions::default(), &budget).unwrap_err();
            assert_eq!(budget.used(), 2 * PAGE, "only the first range's pages");
            drop(a);
            e.into()
        },
    },
    Case {
        name: "file truncated after mapping: pread into a ring slot",
        also: "-",
        place: Place::Here,
        expect: Expect::Pinned("FileChanged", |e| matches!(e, Error::FileChanged { .. })),
        says: &["changed while in use", "ended before byte 204096"],
        run: |fx| {
            let f = fx.truncated("trunc-slot.bin");
            let ring = PinnedRing::new(2, 8192, &PinBudget::unlimited()).unwrap();
            // Before the new end it still works.
            let ok = ring.acquire().unwrap().read_from(&f, 0, 4096).unwrap();
            drop(ok);
            let e = ring.acquire().unwrap().read_from(&f, 200_000, 4096).unwrap_err();
            assert_eq!(ring.free_slots(), 2, "the slot came back");
            e.into()
        },
    },
    Case {
        name: "file truncated after mapping: ring streamer",
        also: "-",
        place: Place::Here,
        expect: Expect::Pinned("FileChanged", |e| matches!(e, Error::FileChanged { .. })),
        // The ring copies from the mapping after checking the file's length
        // (a read of lost pages would be SIGBUS).
        says: &["changed while in use", "truncated to 100000 bytes", "is gone"],
        run: |fx| {
            let f = fx.truncated("trunc-ring.bin");
            let budget = PinBudget::new(4 << 20);
            let s = streamer(Strategy::Ring { slots: 3, slot: 64 << 10, threads: 2 }, &budget);
            let mut dst = DeviceBuffer::<u8>::new(&dev(), LEN).unwrap();
            let e = s.to_device(&f, 0..LEN as u64, &mut dst).unwrap_err();
            drop(s);
            budget.release_parked(); // what the dropped streamer parked with it
            assert_eq!(budget.used(), 0);
            e.into()
        },
    },
    Case {
        name: "file truncated after mapping: O_DIRECT streamer",
        also: "-",
        place: Place::Here,
        expect: Expect::Pinned("FileChanged", |e| matches!(e, Error::FileChanged { .. })),
        says: &["changed while in use", "size changed"],
        run: |fx| {
            let f = fx.truncated("trunc-direct.bin");
            let budget = PinBudget::new(4 << 20);
            let s = streamer(Strategy::Direct { slots: 3, slot: 64 << 10, threads: 2 }, &budget);
            let mut dst = DeviceBuffer::<u8>::new(&dev(), LEN).unwrap();
            match s.to_device(&f, 0..LEN as u64, &mut dst).unwrap_err() {
                Error::DirectUnsupported { .. } => Got::Skipped("the file system refuses O_DIRECT".into()),
                e => e.into(),
            }
        },
    },
    Case {
        name: "file truncated after mapping: registered in place",
        also: "-",
        place: Place::ChildMayFault,
        expect: Expect::Pinned("FileChanged", |e| matches!(e, Error::FileChanged { .. })),
        says: &["changed while in use", "truncated to 100000 bytes after it was mapped", "is gone"],
        run: |fx| {
            let f = fx.truncated("trunc-reg.bin");
            let budget = PinBudget::unlimited();
            // Pages the file still has: fine. Pages it lost: refused before
            // registering (a copy from them would fault).
            let kept = PinnedRange::new(&f, 0..TRUNCATED, PinOptions::default(), &budget);
            let e = PinnedRange::new(&f, 200_000..300_000, PinOptions::default(), &budget).unwrap_err();
            let kept = kept.unwrap();
            assert_eq!(round_trip(&kept), &f.as_bytes()[..TRUNCATED as usize]);
            drop(kept);
            assert_eq!(budget.used(), 0);
            e.into()
        },
    },
    Case {
        name: "file truncated after mapping: windows and whole-file streamers",
        also: "-",
        place: Place::ChildMayFault,
        expect: Expect::Pinned("FileChanged", |e| matches!(e, Error::FileChanged { .. })),
        says: &["changed while in use", "truncated to 100000 bytes after it was mapped", "is gone"],
        run: |fx| {
            let f = fx.truncated("trunc-windows.bin");
            let budget = PinBudget::new(8 << 20);
            let mut dst = DeviceBuffer::<u8>::new(&dev(), LEN).unwrap();
            let mut last = None;
            for strategy in [
                Strategy::Windows { window: 128 << 10, in_flight: 2 },
                Strategy::Hybrid { window: 128 << 10, slot: 64 << 10, threads: 1 },
                Strategy::WholeFile,
            ] {
                let s = streamer(strategy, &budget);
                let e = s.to_device(&f, 0..LEN as u64, &mut dst).unwrap_err();
                assert!(matches!(e, Error::FileChanged { .. }), "{strategy}: {e}");
                drop(s);
                budget.release_parked(); // what the dropped streamer parked with it
                assert_eq!(budget.used(), 0, "{strategy}");
                last = Some(e);
            }
            last.unwrap().into()
        },
    },
    Case {
        name: "a directory",
        also: "pinned_mapping.rs",
        place: Place::Here,
        expect: Expect::Pinned("NotAFile", |e| matches!(e, Error::NotAFile { kind: "directory", .. })),
        says: &["is a directory", "only regular files can be mapped"],
        run: |fx| open_mapped(&fx.dir).unwrap_err().into(),
    },
    Case {
        name: "a missing file",
        also: "pinned_mapping.rs",
        place: Place::Here,
        expect: Expect::Pinned(
            "Io(open, NotFound)",
            |e| matches!(e, Error::Io { op: "open", source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        ),
        says: &["open ", "missing.bin", "No such file"],
        run: |fx| open_mapped(fx.path("missing.bin")).unwrap_err().into(),
    },
    Case {
        name: "an unreadable file",
        also: "-",
        place: Place::ChildUnprivileged,
        expect: Expect::Pinned(
            "Io(open, PermissionDenied)",
            |e| matches!(e, Error::Io { op: "open", source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied),
        ),
        says: &["open ", "unreadable.bin", "Permission denied"],
        run: |fx| {
            let path = fx.path("unreadable.bin");
            if std::fs::File::open(&path).is_ok() {
                return Got::Skipped("this process can still read a chmod 000 file".into());
            }
            open_mapped(&path).unwrap_err().into()
        },
    },
    Case {
        name: "an empty file",
        also: "pinned_mapping.rs",
        place: Place::Here,
        expect: Expect::Pinned("EmptyFile", |e| matches!(e, Error::EmptyFile { .. })),
        says: &["empty.bin is empty", "nothing to map"],
        run: |fx| {
            std::fs::write(fx.path("empty.bin"), []).unwrap();
            open_mapped(fx.path("empty.bin")).unwrap_err().into()
        },
    },
    Case {
        name: "RLIMIT_MEMLOCK lower than the window",
        also: "pinned_range.rs (child)",
        place: Place::ChildLowMemlock,
        expect: Expect::Pinned("MemlockLimit", |e| {
            matches!(e, Error::MemlockLimit { limit: 65536, requested: LEN_PAGES, .. })
        }),
        says: &["RLIMIT_MEMLOCK (64 KiB", "ulimit -l", "CAP_IPC_LOCK", "smaller windows", "turn mlock off"],
        run: |fx| {
            let (f, _) = fx.file("memlock.bin", LEN);
            let budget = PinBudget::unlimited();
            let e = PinnedRange::new(&f, 0..f.len(), PinOptions::new().mlock(true), &budget).unwrap_err();
            assert_eq!(budget.used(), 0);
            e.into()
        },
    },
    Case {
        name: "RLIMIT_MEMLOCK lower than the window, streamed with mlock",
        also: "-",
        place: Place::ChildLowMemlock,
        expect: Expect::Pinned("MemlockLimit", |e| matches!(e, Error::MemlockLimit { limit: 65536, .. })),
        says: &["RLIMIT_MEMLOCK (64 KiB", "ulimit -l", "CAP_IPC_LOCK"],
        run: |fx| {
            let (f, _) = fx.file("memlock-stream.bin", LEN);
            let budget = PinBudget::new(8 << 20);
            let mut cfg = StreamConfig::new(Strategy::Windows { window: 256 << 10, in_flight: 2 }, budget.clone());
            cfg.mlock = true;
            let s = Streamer::new(&[dev()], cfg).unwrap();
            let mut dst = DeviceBuffer::<u8>::new(&dev(), LEN).unwrap();
            let e = s.to_device(&f, 0..LEN as u64, &mut dst).unwrap_err();
            drop(s);
            budget.release_parked(); // what the dropped streamer parked with it
            assert_eq!(budget.used(), 0);
            e.into()
        },
    },
    Case {
        name: "over the pin budget: a range",
        also: "pinned_range.rs",
        place: Place::Here,
        expect: Expect::Pinned("BudgetExceeded", |e| {
            matches!(e, Error::BudgetExceeded { requested: LEN_PAGES, available: 524288, limit: 524288 })
        }),
        says: &["pinning 1 MiB", "pin budget (512 KiB available of 512 KiB)", "raise the budget"],
        run: |fx| {
            let (f, _) = fx.file("budget.bin", LEN);
            // With mlock asked: refused before locking anything (VmLck is checked).
            let opts = PinOptions::new().mlock(true);
            PinnedRange::new(&f, 0..f.len(), opts, &PinBudget::new(512 << 10)).unwrap_err().into()
        },
    },
    Case {
        name: "over the pin budget: a ring",
        also: "pinned_ring.rs",
        place: Place::Here,
        expect: Expect::Pinned("BudgetExceeded", |e| matches!(e, Error::BudgetExceeded { .. })),
        says: &["pin budget", "fewer slots", "raise the budget"],
        run: |_| PinnedRing::new(9, 64 << 10, &PinBudget::new(512 << 10)).unwrap_err().into(),
    },
    Case {
        name: "over the pin budget: a streamer",
        also: "pinned_stream.rs",
        place: Place::Here,
        expect: Expect::Pinned("BudgetExceeded", |e| matches!(e, Error::BudgetExceeded { .. })),
        says: &["pin budget", "raise the budget"],
        run: |fx| {
            let (f, _) = fx.file("budget-stream.bin", LEN);
            let budget = PinBudget::new(512 << 10);
            let s = streamer(Strategy::Windows { window: 1 << 20, in_flight: 2 }, &budget);
            let mut dst = DeviceBuffer::<u8>::new(&dev(), LEN).unwrap();
            s.to_device(&f, 0..LEN as u64, &mut dst).unwrap_err().into()
        },
    },
    Case {
        name: "strategy sizes past their bounds",
        also: "",
        place: Place::Here,
        expect: Expect::Pinned("InvalidArgument", |e| matches!(e, Error::InvalidArgument { .. })),
        says: &["at most 65536 windows in flight or ring slots"],
        run: |_| {
            let strategy = Strategy::Ring { slots: usize::MAX, slot: usize::MAX, threads: 2 };
            Streamer::new(&[dev()], StreamConfig::new(strategy, PinBudget::unlimited())).unwrap_err().into()
        },
    },
    Case {
        name: "absurd thread counts",
        also: "",
        place: Place::Here,
        expect: Expect::Pinned("InvalidArgument", |e| matches!(e, Error::InvalidArgument { .. })),
        says: &["at most 1024 threads"],
        run: |_| {
            let strategy = Strategy::Ring { slots: 2, slot: 4096, threads: usize::MAX };
            Streamer::new(&[dev()], StreamConfig::new(strategy, PinBudget::unlimited())).unwrap_err().into()
        },
    },
    Case {
        name: "a bad device index",
        also: "safe_api.rs",
        place: Place::Here,
        expect: Expect::Cuda("Device::get", None),
        says: &["device 99 does not exist", "device(s) visible"],
        run: |_| Got::Cuda(Device::get(99).unwrap_err()),
    },
    Case {
        name: "an allocation larger than the device",
        also: "safe_api.rs (1 PiB)",
        place: Place::Here,
        expect: Expect::Cuda("cudaMalloc", Some(2)),
        says: &["cudaMalloc failed", "cudaErrorMemoryAllocation", "hint: out of memory"],
        run: |_| {
            let (_, total) = dev().mem_info().unwrap();
            Got::Cuda(DeviceBuffer::<u8>::new(&dev(), total + 1).unwrap_err())
        },
    },
];

fn case(name: &str) -> &'static Case {
    CASES.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case {name:?}"))
}

/// Runs `c` in this process and checks it; what it got, in words.
fn check_here(t: &Ctx, c: &Case) -> String {
    let fx = Fixture::new();
    t.assert_clean();
    let locked = vm_lck_kb();
    let got = (c.run)(&fx);
    let what = c.name;
    let shown = match (&got, c.expect) {
        (Got::Skipped(why), _) => return format!("skipped: {why}"),
        (Got::Works(how), Expect::Works) => how.clone(),
        (Got::Pinned(e), Expect::Pinned(variant, is)) => {
            assert!(is(e), "{what}: expected {variant}, got {e:?} ({e})");
            e.to_string()
        }
        (Got::Cuda(e), Expect::Cuda(call, code)) => {
            assert_eq!((e.call(), e.code()), (call, code), "{what}: {e}");
            if code.is_none() {
                assert!(matches!(e, wirespeed_cuda::Error::InvalidArgument { .. }), "{what}: {e:?}");
            }
            e.to_string()
        }
        (got, _) => panic!("{what}: unexpected {got:?}"),
    };
    for s in c.says {
        assert!(shown.contains(s), "{what}: {s:?} missing from: {shown}");
    }
    t.assert_clean();
    assert_eq!(vm_lck_kb(), locked, "{what}: VmLck changed: memory left locked");
    shown
}

use wirespeed_tests::{CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_IPC_LOCK, drop_capabilities as drop_caps};

/// Becomes a process that cannot read `chmod 000` files: nobody when root,
/// else without the DAC capabilities.
fn become_unprivileged() -> Result<String, String> {
    // SAFETY: plain system calls on this process's credentials; glibc applies
    // set*id to every thread.
    unsafe {
        if libc::geteuid() == 0 {
            let nobody = 65534;
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(nobody, nobody, nobody) != 0
                || libc::setresuid(nobody, nobody, nobody) != 0
            {
                return Err(format!("setresuid(65534): {}", std::io::Error::last_os_error()));
            }
            return Ok("root -> nobody (65534)".into());
        }
    }
    drop_caps(&[CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH]).map(|()| "without CAP_DAC_*".into())
}

/// Lowers `RLIMIT_MEMLOCK` to 64 KiB and drops `CAP_IPC_LOCK` (which exempts
/// from the limit).
fn low_memlock() -> Result<String, String> {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `cur` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut cur) } != 0 {
        return Err(format!("getrlimit: {}", std::io::Error::last_os_error()));
    }
    let new = libc::rlimit { rlim_cur: 64 << 10, rlim_max: cur.rlim_max.max(64 << 10) };
    // SAFETY: setting our own soft limit (at most the hard one).
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &new) } != 0 {
        return Err(format!("setrlimit: {}", std::io::Error::last_os_error()));
    }
    drop_caps(&[CAP_IPC_LOCK])?;
    if wirespeed_pinned::memlock_headroom().is_none_or(|h| h > 64 << 10) {
        return Err("the mlock limit does not apply to this process".into());
    }
    Ok("RLIMIT_MEMLOCK 64 KiB, no CAP_IPC_LOCK".into())
}

/// Runs `c` in a child process (this binary again), prepared for its place; what it got.
fn check_in_child(t: &Ctx, c: &Case) -> String {
    let dir = TempDir::new("bad-input-child");
    // Made here, so that the child needs no write access after dropping privileges.
    if c.place == Place::ChildUnprivileged {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("unreadable.bin");
        std::fs::write(&p, [1u8; 4096]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let dir_s = dir.path().to_str().expect("a UTF-8 temporary path");
    let r = wirespeed_tests::spawn_child("bad_input_child", &[(CHILD_CASE, c.name), (CHILD_DIR, dir_s)]);
    let (out, so, se) = (r.output, r.stdout, r.stderr);
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = out.status.signal() {
            panic!("{}: the child died of signal {sig} (7 = SIGBUS):\n{so}\n{se}", c.name);
        }
    }
    assert!(out.status.success(), "{}: child failed:\n{so}\n{se}", c.name);
    t.assert_clean();
    so.lines()
        .find_map(|l| l.split_once("BAD-INPUT-CHILD: ").map(|(_, got)| got))
        .unwrap_or_else(|| panic!("{}: the child did not run its checks:\n{so}\n{se}", c.name))
        .to_string()
}

fn check(t: &Ctx, c: &Case) -> String {
    let got = if c.place == Place::Here { check_here(t, c) } else { check_in_child(t, c) };
    eprintln!("{:<66} {got} (also in: {})", c.name, c.also);
    got
}

// ------------------------------------------------------------------ the tests

/// Runs only in the child processes started by [`check_in_child`].
#[test]
#[ignore = "runs in the child processes started by check_in_child"]
fn bad_input_child() {
    if !wirespeed_tests::is_child("bad_input_child") {
        return;
    }
    let name = std::env::var_os(CHILD_CASE).expect("the case to check");
    let t = start(); // loads the runtime before privileges go
    let c = case(name.to_str().unwrap());
    let prepared = match c.place {
        Place::ChildUnprivileged => become_unprivileged(),
        Place::ChildLowMemlock => low_memlock(),
        Place::Here | Place::ChildMayFault => Ok(String::new()),
    };
    let got = match prepared {
        Ok(how) => {
            let got = check_here(&t, c);
            if how.is_empty() { got } else { format!("{got} [{how}]") }
        }
        Err(why) => format!("skipped: {why}"),
    };
    println!("BAD-INPUT-CHILD: {got}");
}

#[test]
fn every_bad_input_is_typed_and_leaves_nothing_pinned() {
    let t = start();
    eprintln!("{:<66} what the caller sees", "input");
    for c in CASES {
        check(&t, c);
    }
}

#[test]
fn an_unreadable_file_is_a_permission_error() {
    let t = start();
    check(&t, case("an unreadable file"));
}

#[test]
fn a_truncated_file_is_file_changed_on_the_copy_paths() {
    let t = start();
    check(&t, case("file truncated after mapping: pread into a ring slot"));
    check(&t, case("file truncated after mapping: ring streamer"));
    check(&t, case("file truncated after mapping: O_DIRECT streamer"));
}

#[test]
fn a_truncated_file_is_refused_before_registering() {
    let t = start();
    check(&t, case("file truncated after mapping: registered in place"));
    check(&t, case("file truncated after mapping: windows and whole-file streamers"));
}

#[test]
fn memlock_below_the_window_when_streaming() {
    let t = start();
    check(&t, case("RLIMIT_MEMLOCK lower than the window, streamed with mlock"));
}

#[test]
fn an_allocation_larger_than_the_device() {
    let t = start();
    check(&t, case("an allocation larger than the device"));
}

/// The folder `sigbus_child` makes its file in.
const SIGBUS_DIR: &str = "BAD_INPUT_SIGBUS_DIR";

/// What cannot be made safe: the mapping's bytes are a `&[u8]`, and the kernel
/// answers a read of a page the file lost with `SIGBUS` (documented on
/// `MappedFile`). The child process dies of it; the parent survives.
#[test]
fn reading_lost_pages_through_the_mapping_is_sigbus() {
    let t = start();
    let dir = TempDir::new("bad-input-sigbus");
    let dir_s = dir.path().to_str().expect("a UTF-8 temporary path");
    let r = wirespeed_tests::spawn_child("sigbus_child", &[(SIGBUS_DIR, dir_s)]);
    let (out, so, se) = (r.output, r.stdout, r.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert!(so.contains("SIGBUS-CHILD: mapped and truncated"), "the child did not get there:\n{so}\n{se}");
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "expected death by SIGBUS: {:?}\n{so}\n{se}", out.status);
    t.assert_clean();
}

#[test]
#[ignore = "runs in a child process started by reading_lost_pages_through_the_mapping_is_sigbus"]
fn sigbus_child() {
    if !wirespeed_tests::is_child("sigbus_child") {
        return;
    }
    let dir = std::env::var_os(SIGBUS_DIR).expect("the folder to use");
    let path = Path::new(&dir).join("lost.bin");
    write_pattern_file(&path, 7, LEN);
    let f = open_mapped(&path).unwrap();
    // Breaks `MappedFile::open`'s contract on purpose, in this child process.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(TRUNCATED).unwrap();
    println!("SIGBUS-CHILD: mapped and truncated");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    let b = std::hint::black_box(f.as_bytes())[LEN - 1]; // a page past the new end
    println!("SIGBUS-CHILD: read {b} without a fault");
}
