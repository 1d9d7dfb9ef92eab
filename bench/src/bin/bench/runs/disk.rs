//! The disk alone: what parallel O_DIRECT reads of the file give, no GPU.

use crate::data::{self, Data};
use crate::results::{Intact, Kind, Row, Sample};
use crate::session::{Bench, settle, timed};
use crate::util::Result;

/// Reader-thread counts the disk is measured with.
pub const DISK_THREADS: [usize; 4] = [1, 4, 8, 16];

/// The disk alone: parallel O_DIRECT reads of the file, 16 MiB each, into
/// aligned buffers, no GPU. One pass with each of [`DISK_THREADS`], then more
/// passes with the fastest count until it has `b.reps`; the row is that count's.
pub fn disk_direct(b: &mut Bench, data: &Data) -> Result<Row> {
    let what = "parallel O_DIRECT reads, 16 MiB each, no GPU: what the disk gives (best of 1, 4, 8, 16 threads)";
    if data.tmpfs {
        return Ok(Row::skipped("disk-direct", Kind::Disk, what, "the file is on tmpfs (RAM): no disk to measure"));
    }
    let mut row = Row::new("disk-direct", Kind::Disk, what, data.len);
    row.intact = Intact::Unchecked("disk only, nothing sent to the GPU".into());
    let r = (|| -> Result<()> {
        let mut by_threads: Vec<(usize, Vec<Sample>)> = Vec::new();
        let pass = |b: &Bench, t: usize, rep: usize, reps: usize| -> Result<std::result::Result<Sample, String>> {
            b.progress.begin(&format!("disk-direct, {t} thread(s)"), rep, reps);
            let (res, s) = timed(|| data::read_direct(&data.path, data.len, t, &b.progress))?;
            Ok(res.map(|secs| Sample { seconds: secs, cpu_seconds: s.cpu_seconds }))
        };
        for t in DISK_THREADS {
            match pass(b, t, 1, 1)? {
                Ok(s) => {
                    b.progress.note(&format!(
                        "  disk-direct, {t:>2} thread(s): {:.2} GB/s",
                        data.len as f64 / s.seconds.max(1e-12) / 1e9
                    ));
                    by_threads.push((t, vec![s]));
                }
                Err(why) => {
                    row.skipped = Some(why);
                    return Ok(());
                }
            }
        }
        let rate = |s: &Sample| data.len as f64 / s.seconds.max(1e-12) / 1e9;
        let best = by_threads
            .iter()
            .enumerate()
            .max_by(|(_, a), (_, c)| rate(&a.1[0]).total_cmp(&rate(&c.1[0])))
            .map_or(0, |(i, _)| i);
        let t = by_threads[best].0;
        while by_threads[best].1.len() < b.reps {
            let rep = by_threads[best].1.len() + 1;
            match pass(b, t, rep, b.reps)? {
                Ok(s) => by_threads[best].1.push(s),
                Err(why) => {
                    row.skipped = Some(why);
                    return Ok(());
                }
            }
        }
        let rates: Vec<String> = by_threads.iter().map(|(t, s)| format!("{t}: {:.2}", rate(&s[0]))).collect();
        row.note("GB/s by reader threads (first pass)", rates.join(", "));
        row.strategy = format!("pread(O_DIRECT), {t} thread(s), 16 MiB");
        row.note("threads", t.to_string());
        row.samples = by_threads.swap_remove(best).1;
        Ok(())
    })();
    let row = settle(row, r)?;
    b.finished(&row);
    Ok(row)
}
