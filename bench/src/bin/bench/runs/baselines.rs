//! The baselines, written here with cuda-safe: pageable copies, and pinned
//! memory allocated per batch.

use crate::data::Data;
use crate::rawcuda;
use crate::results::{Kind, Row};
use crate::runs::dest::{CHUNK, Dest};
use crate::session::{Bench, settle, timed};
use crate::util::{GIB, Result, pieces};
use std::time::Instant;
use wirespeed_cuda::PinnedBuffer;

/// Pageable copies straight from the file mapping, cudaMemcpy per 64 MiB chunk.
pub fn pageable(b: &mut Bench, data: &Data, dest: &mut Dest) -> Result<Row> {
    let mut row = Row::new("pageable", Kind::Stream, "cudaMemcpy straight from the mapping, 64 MiB chunks", data.len);
    row.strategy = "pageable cudaMemcpy (driver staging)".into();
    let r = (|| -> Result<()> {
        let bytes = data.bytes();
        for rep in 0..b.reps {
            dest.clear(&b.stream)?;
            b.progress.begin(&row.name, rep + 1, b.reps);
            let mut done = 0u64;
            let ((), s) = timed(|| {
                let copies: Vec<(usize, &[u8])> = pieces(data.len, CHUNK)
                    .map(|r| (dest.at(r.start), &bytes[r.start as usize..r.end as usize]))
                    .collect();
                rawcuda::copy_pageable(&mut dest.buf, copies, |n| {
                    done += n as u64;
                    b.progress.update(done, data.len);
                })
            })?;
            b.sample_done(&mut row, s, b.reps);
        }
        row.intact = dest.verify(b, bytes, Some(data.checksum))?;
        Ok(())
    })();
    let row = settle(row, r)?;
    b.finished(&row);
    Ok(row)
}

/// The anti-pattern of `pin_memory()` per batch: pinned memory allocated per
/// batch (cudaHostAlloc), filled, copied, freed.
pub fn per_batch_pinned(b: &mut Bench, data: &Data, dest: &mut Dest) -> Result<Row> {
    let mut row = Row::new(
        "per-batch-pinned",
        Kind::Stream,
        "fresh pinned buffer per 64 MiB chunk: cudaHostAlloc + memcpy + async copy + cudaFreeHost (pin_memory() per batch)",
        data.len,
    );
    row.strategy = "PinnedBuffer::new per chunk".into();
    row.peak_pinned = CHUNK.min(data.len);
    let mut alloc_seconds = Vec::new();
    let r = (|| -> Result<()> {
        let bytes = data.bytes();
        for rep in 0..b.reps {
            dest.clear(&b.stream)?;
            b.progress.begin(&row.name, rep + 1, b.reps);
            let mut alloc = 0.0;
            let ((), s) = timed(|| {
                for r in pieces(data.len, CHUNK) {
                    let src = &bytes[r.start as usize..r.end as usize];
                    let t = Instant::now();
                    let mut p = PinnedBuffer::<u8>::new(src.len())?;
                    alloc += t.elapsed().as_secs_f64();
                    p.as_mut_slice()?.copy_from_slice(src);
                    let at = dest.at(r.start);
                    b.stream.copy_to_device(&p, &mut dest.buf.slice_mut(at..at + src.len())?)?.wait()?;
                    drop(p); // cudaFreeHost
                    b.progress.update(r.end, data.len);
                }
                Ok(())
            })?;
            alloc_seconds.push(alloc);
            b.sample_done(&mut row, s, b.reps);
        }
        row.intact = dest.verify(b, bytes, Some(data.checksum))?;
        Ok(())
    })();
    if !alloc_seconds.is_empty() {
        let med = crate::util::stats(&alloc_seconds).median;
        row.note("cudaHostAlloc (+ zero fill) s/GiB", format!("{:.3}", med / (data.len as f64 / GIB as f64)));
    }
    let row = settle(row, r)?;
    b.finished(&row);
    Ok(row)
}
