//! Streamers and their transfers.

use super::*;

impl World<'_> {
    pub(super) fn strategy(&mut self) -> Strategy {
        let r = &mut self.rng;
        let size = |r: &mut Rng| r.pick(&[4096, 65_536, 100_000, 256 << 10, 1 << 20]);
        match r.below(6) {
            0 => Strategy::Auto,
            1 => Strategy::WholeFile,
            2 => Strategy::Windows { window: size(r), in_flight: 1 + r.upto(4) },
            3 => Strategy::Ring { slots: 1 + r.upto(6), slot: size(r) + r.upto(2) * 13, threads: 1 + r.upto(3) },
            4 => Strategy::Hybrid { window: size(r), slot: size(r).min(256 << 10), threads: 1 + r.upto(2) },
            _ => Strategy::Direct { slots: 1 + r.upto(6), slot: size(r), threads: 1 + r.upto(3) },
        }
    }

    pub(super) fn new_streamer(&mut self) {
        let strategy = self.strategy();
        let (b, budget) = self.budget();
        let r = &mut self.rng;
        let (mlock, verify, second) = (r.chance(10), r.chance(20), r.chance(80));
        let streams = r.pick(&[CopyStreams::One, CopyStreams::One, CopyStreams::RingApart, CopyStreams::PerThread]);
        let reserve = r.upto(3);
        let mut cfg = StreamConfig::new(strategy, budget)
            .with_mlock(mlock)
            .with_verify(verify)
            .with_second_context(second)
            .with_copy_streams(streams)
            .with_reserve_threads(reserve);
        if r.chance(20) {
            cfg = cfg.with_progress(|done, total| assert!(done <= total, "progress {done} of {total}"));
        }
        let what = format!("{strategy} (budget {b}, mlock {mlock}, verify {verify}, {streams:?}, reserve {reserve})");
        self.note(format!("a streamer: {what}"));
        match Streamer::new(&[self.dev], cfg) {
            Ok(s) => self.streamers.push(Str { s, what, mlock, verify }),
            Err(e) => self.tolerate("Streamer::new", &e, Allowed::default()),
        }
    }

    /// What a streamer's transfer of `range` of a file of `len` bytes may fail with.
    pub(super) fn allowed(&self, k: usize, range: &Range<u64>, len: u64) -> Allowed {
        let bad_range = range.start > range.end || range.end > len;
        Allowed { bad_range, overlap: false, budget: true, memlock: self.streamers[k].mlock, direct: true }
    }

    pub(super) fn pick_streamer(&mut self) -> Option<usize> {
        if self.streamers.is_empty() {
            self.new_streamer();
        }
        (!self.streamers.is_empty()).then(|| self.rng.upto(self.streamers.len()))
    }

    pub(super) fn stream_range(&mut self) {
        let (Some(k), Some((file, data))) = (self.pick_streamer(), self.file()) else { return };
        let range = self.rng.range(file.len());
        let valid = range.start <= range.end && range.end <= file.len();
        let n = if valid { (range.end - range.start) as usize } else { 1 };
        let two = self.rng.chance(20);
        self.mark_read(&file, &range);
        if valid && n % 4 == 0 && self.rng.chance(25) {
            return self.stream_words(k, &file, &data, range);
        }
        let op = format!(
            "{}: {range:?} of {}{}",
            self.streamers[k].what,
            file.path().display(),
            ["", " twice"][usize::from(two)]
        );
        self.note(op.clone());
        let mut dsts = Vec::new();
        for _ in 0..1 + usize::from(two) {
            let Some(d) = self.cuda(&op, DeviceBuffer::<u8>::new(&self.dev, n)) else { return };
            dsts.push(d);
        }
        let s = &self.streamers[k];
        let res = if two {
            s.s.to_devices(&file, range.clone(), &mut dsts)
        } else {
            s.s.to_device(&file, range.clone(), &mut dsts[0])
        };
        let report = match res {
            Ok(r) => r,
            Err(e) => return self.tolerate(&op, &e, self.allowed(k, &range, file.len())),
        };
        if !valid || report.bytes != (n * dsts.len()) as u64 || (s.verify && report.verified != Some(true)) {
            self.fail(&format!("{op}: {report}"));
        }
        for d in &dsts {
            let got = self.read_back(&op, d);
            self.expect_bytes(&op, &got, &data[range.start as usize..range.end as usize]);
        }
    }

    /// [`World::stream_range`] into a buffer of `u32`s (of the range's bytes).
    pub(super) fn stream_words(&mut self, k: usize, file: &Arc<MappedFile>, data: &[u8], range: Range<u64>) {
        let op = format!("{}: {range:?} of {} as u32s", self.streamers[k].what, file.path().display());
        self.note(op.clone());
        let n = (range.end - range.start) as usize / 4;
        let Some(mut dst) = self.cuda(&op, DeviceBuffer::<u32>::new(&self.dev, n)) else { return };
        match self.streamers[k].s.to_device(file, range.clone(), &mut dst) {
            Ok(r) if r.bytes == 4 * n as u64 => {}
            Ok(r) => self.fail(&format!("{op}: {r}")),
            Err(e) => return self.tolerate(&op, &e, self.allowed(k, &range, file.len())),
        }
        let words = self.read_back(&op, &dst);
        let got: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        self.expect_bytes(&op, &got, &data[range.start as usize..range.end as usize]);
    }

    /// Starts a few transfers on one streamer, some back to back, and waits
    /// for, drops or forgets their handles; then checks every destination.
    pub(super) fn burst(&mut self) {
        let (Some(k), Some((file, data))) = (self.pick_streamer(), self.file()) else { return };
        let len = file.len();
        let mut ranges = Vec::new();
        let mut at = self.rng.below(len);
        for _ in 0..1 + self.rng.upto(4) {
            let r =
                if self.rng.chance(60) { at..(at + self.rng.below(len / 2 + 1)).min(len) } else { self.rng.range(len) };
            at = r.end.min(len);
            ranges.push(r);
        }
        let ways: Vec<u64> = ranges.iter().map(|_| self.rng.below(6)).collect();
        for r in &ranges {
            self.mark_read(&file, r);
        }
        let op = format!("{}: start {ranges:?} of {} ({ways:?})", self.streamers[k].what, file.path().display());
        self.note(op.clone());
        let valid = |r: &Range<u64>| r.start <= r.end && r.end <= len;
        let sizes: Vec<usize> = ranges.iter().map(|r| if valid(r) { (r.end - r.start) as usize } else { 1 }).collect();
        let Some(mine) = self.cuda(&op, Stream::new(&self.dev)) else { return };
        // Two transfers into the halves of one buffer, now and then.
        let (known, got) = if ranges.len() == 2 && self.rng.chance(50) {
            let Some(mut both) = self.cuda(&op, DeviceBuffer::<u8>::new(&self.dev, sizes[0] + sizes[1])) else {
                return;
            };
            let (a, b) = both.split_at_mut(sizes[0]).unwrap();
            let known = self.run_burst(k, &file, &ranges, &ways, vec![a, b], &mine, &op);
            let all = self.read_back(&op, &both);
            (known, vec![all[..sizes[0]].to_vec(), all[sizes[0]..].to_vec()])
        } else {
            let mut dsts = Vec::new();
            for n in &sizes {
                let Some(d) = self.cuda(&op, DeviceBuffer::<u8>::new(&self.dev, *n)) else { return };
                dsts.push(d);
            }
            let views = dsts.iter_mut().map(DeviceSliceMut::from).collect();
            let known = self.run_burst(k, &file, &ranges, &ways, views, &mine, &op);
            // Reading each destination waits for its transfer to release it
            // (they run in order).
            (known, dsts.iter().map(|d| self.read_back(&op, d)).collect())
        };
        // A call that takes the streamer waits for the end of the worker's last pass.
        let mut empty = DeviceBuffer::<u8>::new(&self.dev, 0).unwrap();
        if let Err(e) = self.streamers[k].s.to_device(&file, 0..0, &mut empty) {
            self.tolerate(&op, &e, Allowed::default());
        }
        for ((r, got), known) in ranges.iter().zip(got).zip(known) {
            // (A handle dropped or forgotten does not say whether it landed.)
            if known == Some(true) {
                self.expect_bytes(&op, &got, &data[r.start as usize..r.end as usize]);
            }
        }
    }

    /// The transfers of a burst: answers, for each, whether it landed, where
    /// its handle said (`None` where the handle was dropped or forgotten).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_burst(
        &self,
        k: usize,
        file: &Arc<MappedFile>,
        ranges: &[Range<u64>],
        ways: &[u64],
        dsts: Vec<DeviceSliceMut<'_, u8>>,
        mine: &Stream,
        op: &str,
    ) -> Vec<Option<bool>> {
        let s = &self.streamers[k].s;
        let mut handles = Vec::new();
        for ((r, d), way) in ranges.iter().zip(dsts).zip(ways) {
            let options = if *way == 5 { StartOptions::new().after(mine) } else { StartOptions::new() };
            match s.start_with(file, r.clone(), d, options) {
                Ok(t) => handles.push(Some(t)),
                Err(e) => {
                    self.tolerate(op, &e, self.allowed(k, r, file.len()));
                    handles.push(None);
                }
            }
        }
        let mut known = Vec::new();
        for ((h, way), r) in handles.into_iter().zip(ways).zip(ranges) {
            let Some(t) = h else {
                known.push(Some(false));
                continue;
            };
            let waited = match way {
                0 | 5 => Some(t.wait()),
                1 => {
                    // `then_on` fails only with the transfer (TransferFailed): `wait` says why.
                    let on = t.then_on(mine);
                    let r = t.wait();
                    match (&on, &r) {
                        (Err(e @ Error::TransferFailed { .. }), Ok(rep)) => {
                            self.fail(&format!("{op}: then_on failed ({e}) and wait did not ({rep})"));
                        }
                        (Err(Error::TransferFailed { .. }), Err(_)) => {} // `wait`'s error is checked below
                        (Err(e), _) => self.tolerate(op, e, Allowed::default()),
                        _ => {}
                    }
                    Some(r)
                }
                2 => {
                    let _ = t.wait_timeout(Duration::ZERO);
                    None
                }
                3 => {
                    wirespeed_tests::forget_reachably(t);
                    None
                }
                _ => None,
            };
            known.push(match waited {
                Some(Ok(rep)) if rep.bytes == r.end - r.start => Some(true),
                Some(Ok(rep)) => self.fail(&format!("{op}: {r:?}: {rep}")),
                Some(Err(e)) => {
                    self.tolerate(op, &e, self.allowed(k, r, file.len()));
                    Some(false)
                }
                None => None,
            });
        }
        known
    }

    pub(super) fn chunks(&mut self) {
        let (Some(k), Some((file, data))) = (self.pick_streamer(), self.file()) else { return };
        let range = self.rng.range(file.len());
        // At most about 64 chunks: each is read back.
        let fewest = (range.end.saturating_sub(range.start) / 64) as usize;
        let chunk = self.rng.pick(&[1, 4096, 65_537, 1 << 20]).max(fewest + 1 + self.rng.upto(3) * 700);
        self.mark_read(&file, &range);
        let op = format!("{}: chunks of {chunk} of {range:?} of {}", self.streamers[k].what, file.path().display());
        self.note(op.clone());
        let mut seen = Vec::new();
        let res = self.streamers[k].s.for_each_chunk(&file, range.clone(), chunk, |_, buf, off, n| {
            seen.push((off, n, buf.to_vec().map(|v| v[..n].to_vec())));
            Ok(())
        });
        match res {
            Ok(rep) if rep.bytes == range.end - range.start => {}
            Ok(rep) => self.fail(&format!("{op}: {rep}")),
            Err(e) => return self.tolerate(&op, &e, self.allowed(k, &range, file.len())),
        }
        seen.sort_by_key(|c| c.0);
        let mut at = range.start;
        for (off, n, bytes) in seen {
            if off != at || n > chunk {
                self.fail(&format!("{op}: a chunk of {n} at {off}, expected one at {at}"));
            }
            if let Some(bytes) = self.cuda(&op, bytes) {
                self.expect_bytes(&op, &bytes, &data[off as usize..off as usize + n]);
            }
            at += n as u64;
        }
        if at != range.end {
            self.fail(&format!("{op}: the chunks end at {at}"));
        }
    }

    pub(super) fn scratch(&mut self) {
        let (Some(k), Some((file, data))) = (self.pick_streamer(), self.file()) else { return };
        let range = self.rng.range(file.len());
        // At most about 64 copies around the scratch buffer.
        let fewest = (range.end.saturating_sub(range.start) / 64) as usize;
        let n = fewest + 1 + self.rng.upto(1 << 20);
        self.mark_read(&file, &range);
        let op = format!("{}: {range:?} of {} through {n} bytes", self.streamers[k].what, file.path().display());
        self.note(op.clone());
        let Some(mut scratch) = self.cuda(&op, DeviceBuffer::<u8>::new(&self.dev, n)) else { return };
        match self.streamers[k].s.to_scratch(&file, range.clone(), &mut scratch) {
            Ok(rep) if rep.bytes == range.end - range.start => {}
            Ok(rep) => self.fail(&format!("{op}: {rep}")),
            Err(e) => return self.tolerate(&op, &e, self.allowed(k, &range, file.len())),
        }
        let len = (range.end - range.start) as usize;
        if len <= n {
            // No byte written twice: the first `len` bytes are the range's.
            let got = self.read_back(&op, &scratch);
            self.expect_bytes(&op, &got[..len], &data[range.start as usize..range.end as usize]);
        }
    }

    pub(super) fn plan(&mut self) {
        let Some(k) = self.pick_streamer() else { return };
        let len = self.rng.pick(&[0, 1, 4096, 1 << 20, 1 << 30, u64::MAX]);
        let op = format!("{}: plan {len} bytes", self.streamers[k].what);
        self.note(op.clone());
        let s = &self.streamers[k].s;
        let _ = s.resolve(len);
        match self.rng.below(3) {
            0 => {
                if let Err(e) = s.prepare(len) {
                    self.tolerate(&op, &e, Allowed { budget: true, ..Allowed::default() });
                }
            }
            1 => {
                if let Err(e) = s.release_pins() {
                    self.tolerate(&op, &e, Allowed::default());
                }
            }
            _ => {
                let _ = s.kept_pinned_bytes();
            }
        }
    }

    pub(super) fn drop_streamer(&mut self) {
        if self.streamers.is_empty() {
            return;
        }
        let k = self.rng.upto(self.streamers.len());
        self.note(format!("drop the streamer {}", self.streamers[k].what));
        drop(self.streamers.swap_remove(k));
    }
}
