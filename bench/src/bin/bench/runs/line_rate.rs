//! The line rate: a resident pinned buffer copied to the device again and
//! again, the fastest any host-to-device copy goes; every other row is set
//! against it.

use crate::checksum;
use crate::data;
use crate::results::{Intact, Kind, Row};
use crate::session::{Bench, settle, timed};
use crate::util::{Fatal, GIB, MIB, Result, fmt_bytes};
use wirespeed_cuda::{DeviceBuffer, Event, EventOptions, PinnedBuffer};

/// A resident pinned buffer copied to the device again and again with
/// cudaMemcpyAsync, timed with events: the fastest any host-to-device copy goes.
pub fn line_rate(b: &mut Bench) -> Result<Row> {
    let n = if b.opts.quick { 64 * MIB } else { 256 * MIB } as usize;
    let per_rep = if b.opts.quick { GIB } else { 4 * GIB };
    let k = (per_rep / n as u64).max(1) as usize;
    let mut row = Row::new(
        "line-rate",
        Kind::LineRate,
        &format!("resident {} pinned buffer, cudaMemcpyAsync x{k}", fmt_bytes(n as u64)),
        (n * k) as u64,
    );
    row.strategy = "cudaHostAlloc once + cudaMemcpyAsync".into();
    row.peak_pinned = n as u64;
    let reps = b.reps.max(3);
    let r = (|| -> Result<()> {
        let dev = b.gpu.device;
        let mut host = PinnedBuffer::<u8>::new(n)?;
        data::fill_pattern(host.as_mut_slice()?, 0x11, 0);
        let expected = checksum::of_host(host.as_slice()?, b.threads);
        let mut on_dev = DeviceBuffer::<u8>::new(&dev, n)?;
        let timing = EventOptions::new().timing(true).blocking_sync(true); // waiting sleeps, as the library's does
        let (start, end) = (Event::new(&dev, timing)?, Event::new(&dev, timing)?);
        b.stream.copy_to_device(&host, &mut on_dev)?.wait()?; // warm-up
        let mut engine = Vec::new();
        for rep in 0..reps {
            b.progress.begin("line-rate", rep + 1, reps);
            // Wall clock, as every other run here is timed; the events give the
            // copy engine's own time besides.
            let (ms, s) = timed(|| {
                b.stream.record(&start)?;
                for _ in 0..k {
                    b.stream.copy_to_device(&host, &mut on_dev)?.detach();
                }
                b.stream.record(&end)?;
                end.synchronize()?;
                Ok(end.elapsed_ms(&start)?)
            })?;
            engine.push(row.bytes as f64 / (f64::from(ms) / 1e3) / 1e9);
            row.samples.push(s);
            b.line_rate = row.gbps().median;
            b.progress.rep_done(&b.label(&row, &s, reps, ""), reps);
        }
        row.note("copy engine alone (event-timed) GB/s", format!("{:.2}", crate::util::stats(&engine).median));
        row.intact = Intact::compare(expected, b.readback.checksum(&on_dev, 0..n)?);
        Ok(())
    })();
    let row = settle(row, r)?;
    if !row.ok() {
        return Err(Fatal::Run(format!(
            "the line-rate run failed, so nothing can be compared with it: {}",
            row.error.as_deref().unwrap_or("?")
        )));
    }
    b.line_rate = row.gbps().median;
    b.finished(&row);
    Ok(row)
}
