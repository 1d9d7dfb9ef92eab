// What a crate outside the workspace writes instead of a struct literal: every
// field of every option struct set through its constructor or builder method.
use std::time::Duration;
use wirespeed_cuda::{EventOptions, LaunchConfig, PinnedFlags, RegisterFlags, StreamOptions};
use wirespeed_pinned::{CopyStreams, PinBudget, PinOptions, StartOptions, StreamConfig, Strategy};

fn main() {
    let pin = PinOptions::new().mlock(true).portable(true).mapped(true);
    assert!(pin.mlock && pin.portable && pin.mapped);
    assert_eq!(PinOptions::default(), PinOptions::new());

    let cfg = StreamConfig::new(Strategy::Auto, PinBudget::unlimited())
        .with_strategy(Strategy::WholeFile)
        .with_budget(PinBudget::new(1 << 30))
        .with_mlock(true)
        .with_verify(true)
        .with_progress(|_, _| {})
        .with_second_context(false)
        .with_copy_streams(CopyStreams::RingApart)
        .with_reserve_threads(0)
        .with_reserve_room(0.5)
        .with_read_ahead(Duration::from_millis(5));
    assert_eq!(cfg.strategy, Strategy::WholeFile);
    assert_eq!(cfg.budget.limit(), 1 << 30);
    assert!(cfg.mlock && cfg.verify && cfg.progress.is_some() && !cfg.second_context);
    assert_eq!(cfg.copy_streams, CopyStreams::RingApart);
    assert_eq!((cfg.reserve_threads, cfg.reserve_room, cfg.read_ahead), (0, 0.5, Duration::from_millis(5)));
    let mut cfg = cfg;
    cfg.verify = false; // a field may still be assigned
    assert!(!cfg.verify);
    let _start = StartOptions::new();
    let _start = StartOptions::default();

    let ev = EventOptions::new().timing(true).blocking_sync(true);
    assert!(ev.timing && ev.blocking_sync);
    let st = StreamOptions::new().non_blocking(true).priority(-1);
    assert!(st.non_blocking && st.priority == -1);
    let pf = PinnedFlags::new().portable(true).mapped(true).write_combined(true);
    assert!(pf.portable && pf.mapped && pf.write_combined);
    let rf = RegisterFlags::new().portable(true).mapped(true).read_only(true);
    assert!(rf.portable && rf.mapped && rf.read_only);
    let lc = LaunchConfig::new([2, 1, 1], [64, 1, 1]).grid([4, 2, 1]).block([32, 2, 1]).shared_bytes(256);
    assert_eq!((lc.grid, lc.block, lc.shared_bytes), ([4, 2, 1], [32, 2, 1], 256));
}
