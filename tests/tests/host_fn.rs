//! `Stream::launch_host_fn` from safe code cannot deadlock: its closure runs on
//! a library thread, and releases its stream before it calls CUDA, so it may
//! drop the last owner of a buffer that later work on the same stream uses.
//! A closure that does not call CUDA still holds the stream's later work back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::time::Duration;
use wirespeed_cuda::{Device, DeviceBuffer, PinnedBuffer, Stream};
use wirespeed_tests::{Watchdog, pattern, start};

#[test]
fn closure_dropping_a_buffer_used_by_later_work_on_its_stream() {
    let t = start();
    let _dog = Watchdog::new(60);
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let n = 1 << 16;
    let mut buf = DeviceBuffer::<u8>::new(&d, n).unwrap();
    buf.copy_from_slice(&pattern(5, n)).unwrap();
    let buf = Arc::new(buf);
    let mut back = PinnedBuffer::<u8>::new(n).unwrap();
    let (open, gate) = channel::<()>();
    let (tx, done) = channel::<()>();
    let held = buf.clone();
    s.launch_host_fn(move || {
        let _ = gate.recv();
        // The last owner: its Drop waits for the copy queued after this
        // closure on the same stream.
        drop(held);
        let _ = tx.send(());
    })
    .unwrap();
    s.copy_to_host(&*buf, &mut back).unwrap().detach(); // after the closure
    drop(buf); // the closure now holds the last owner
    open.send(()).unwrap();
    done.recv_timeout(Duration::from_secs(30)).expect("the closure finished (it used to deadlock)");
    s.synchronize().unwrap();
    assert_eq!(back.as_slice().unwrap(), pattern(5, n));
    drop((s, back));
    t.assert_clean();
}

#[test]
fn closure_holds_later_work_back_until_it_returns() {
    let t = start();
    let _dog = Watchdog::new(60);
    let d = Device::get(0).unwrap();
    let s = Stream::new(&d).unwrap();
    let src = PinnedBuffer::from_slice(&pattern(6, 4096)).unwrap();
    let mut dst = DeviceBuffer::<u8>::zeroed(&d, 4096).unwrap();
    let returned = Arc::new(AtomicBool::new(false));
    let r = returned.clone();
    s.launch_host_fn(move || {
        std::thread::sleep(Duration::from_millis(200));
        r.store(true, Ordering::SeqCst);
    })
    .unwrap();
    let (tx, rx) = channel();
    let r = returned.clone();
    s.launch_host_fn(move || tx.send(r.load(Ordering::SeqCst)).unwrap()).unwrap();
    s.copy_to_device(&src, &mut dst).unwrap().wait().unwrap();
    assert!(returned.load(Ordering::SeqCst), "the copy after the closure waited for it");
    assert!(rx.recv().unwrap(), "the next closure ran after the first returned");
    assert_eq!(dst.to_vec().unwrap(), pattern(6, 4096));
    drop((s, src, dst));
    t.assert_clean();
}

#[test]
fn many_closures_each_dropping_buffers() {
    let t = start();
    let _dog = Watchdog::new(60);
    let d = Device::get(0).unwrap();
    let (s1, s2) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let src = PinnedBuffer::from_slice(&pattern(7, 1024)).unwrap();
    let (tx, rx) = channel();
    for i in 0..200u32 {
        let mut buf = DeviceBuffer::<u8>::new(&d, 1024).unwrap();
        let s = if i.is_multiple_of(2) { &s1 } else { &s2 };
        s.copy_to_device(&src, &mut buf).unwrap().detach();
        let buf = Arc::new(buf);
        let held = buf.clone();
        let tx = tx.clone();
        s.launch_host_fn(move || {
            drop(held);
            tx.send(()).unwrap();
        })
        .unwrap();
        let mut back = PinnedBuffer::<u8>::new(1024).unwrap();
        s.copy_to_host(&*buf, &mut back).unwrap().detach();
        drop(buf);
        if i.is_multiple_of(50) {
            assert_eq!(back.as_slice().unwrap(), pattern(7, 1024));
        }
    }
    drop(tx);
    assert_eq!(rx.iter().count(), 200);
    s1.synchronize().unwrap();
    s2.synchronize().unwrap();
    drop((s1, s2, src));
    t.assert_clean();
}
