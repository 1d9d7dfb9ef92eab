//! Files, pinned ranges and the page cache.

use super::*;

impl World<'_> {
    pub(super) fn map_file(&mut self) {
        if self.files.len() >= 4 && self.rng.chance(50) {
            let i = self.rng.upto(self.files.len());
            self.note(format!("drop file {i}"));
            self.files.swap_remove(i);
            return;
        }
        if !self.files.is_empty() && self.rng.chance(25) {
            let m = &self.files[self.rng.upto(self.files.len())];
            let (path, data) = (m.path.clone(), Arc::clone(&m.data));
            self.note(format!("map {} again", path.display()));
            let file = open_mapped(&path).unwrap();
            self.files.push(Mapped { file, data, path });
            return;
        }
        let lens = [1, 4095, 4096, 4097, 12_345, 65_543, 1 << 20];
        let len = match self.rng.below(3) {
            0 => self.rng.pick(&lens),
            1 => 1 + self.rng.upto(1 << 20),
            _ => (1 << 20) + self.rng.upto(2 << 20),
        };
        self.made += 1;
        let path = self.dir.join(&format!("f{}.bin", self.made));
        let data = Arc::new(write_pattern_file(&path, self.seed * 1000 + self.made, len));
        self.note(format!("map a file of {len} bytes"));
        let file = open_mapped(&path).unwrap();
        self.files.push(Mapped { file, data, path });
    }

    pub(super) fn new_pin(&mut self) {
        let Some((file, data)) = self.file() else { return self.map_file() };
        let range = self.rng.range(file.len());
        let opts = PinOptions::new().mlock(self.rng.chance(15)).portable(self.rng.chance(20));
        let (b, budget) = self.budget();
        let how = self.rng.below(3);
        let op = format!("pin {range:?} of {} ({opts:?}, budget {b}, way {how})", file.path().display());
        self.note(op.clone());
        let made = match how {
            0 => PinnedRange::new(&file, range.clone(), opts, &budget),
            1 => PinnedRange::new_on(&self.dev, &file, range.clone(), opts, &budget),
            _ => match self.context() {
                Some(ctx) => PinnedRange::new_in(&ctx, &file, range.clone(), opts, &budget),
                None => return,
            },
        };
        let valid = range.start < range.end && range.end <= file.len();
        let r = match made {
            Ok(r) => r,
            Err(e) => {
                if !valid && !matches!(e, Error::BadRange { .. }) && !self.fired() {
                    self.fail(&format!("{op}: {e}, not BadRange"));
                }
                let ok = Allowed { bad_range: !valid, overlap: true, budget: true, memlock: opts.mlock, direct: false };
                return self.tolerate(&op, &e, ok);
            }
        };
        if !valid {
            self.fail(&format!("{op}: accepted"));
        }
        self.expect_bytes(&op, r.as_bytes(), &data[range.start as usize..range.end as usize]);
        let pages = r.pinned_pages();
        if pages.start > range.start || pages.end < range.end || r.device() != self.dev {
            self.fail(&format!("{op}: pages {pages:?}, device {:?}", r.device()));
        }
        if opts.mlock && !r.is_mlocked() {
            self.fail(&format!("{op}: not locked"));
        }
        // A range inside another live one of the same mapping shares it.
        let inside = self.pins.iter().any(|p| {
            Arc::ptr_eq(p.r.file(), &file)
                && p.r.pinned_pages().start <= pages.start
                && pages.end <= p.r.pinned_pages().end
                && (p.r.is_portable() || !opts.portable)
        });
        if inside && r.sharers() < 2 {
            self.fail(&format!("{op}: inside a live range, but not shared"));
        }
        let fresh = r.sharers() == 1;
        self.pins.push(Pin { r, data, fresh });
    }

    /// The registration context to register in: made once (none when the
    /// fault refuses it).
    pub(super) fn context(&mut self) -> Option<Arc<RegistrationContext>> {
        if self.ctxs.is_empty() {
            let made = RegistrationContext::new(&self.dev);
            self.ctxs.push(Arc::new(self.cuda("RegistrationContext::new", made)?));
        }
        self.ctxs.first().cloned()
    }

    pub(super) fn end_pin(&mut self) {
        if self.pins.is_empty() {
            return;
        }
        let Pin { r, fresh, .. } = self.pins.swap_remove(self.rng.upto(self.pins.len()));
        let read = !fresh || self.read.contains(&(Arc::as_ptr(r.file()) as usize, r.pinned_pages().start));
        match self.rng.below(10) {
            0 if self.forgot.regs.len() < 3 && !read => {
                self.note(format!("forget the range {:?}", r.range()));
                let pages = r.pinned_pages();
                let key = (Arc::as_ptr(r.file()) as usize, pages.start);
                self.forgot.regs.insert(key, (pages.end - pages.start, r.context().map(|c| c.id())));
                self.forgot.locked |= r.is_mlocked();
                // Nothing reads that mapping again: a copy from the forgotten
                // registration would leave its stream in the registration's fence.
                let file = Arc::clone(r.file());
                wirespeed_tests::forget_reachably(r);
                self.files.retain(|m| !Arc::ptr_eq(&m.file, &file));
                self.pins.retain(|p| !Arc::ptr_eq(p.r.file(), &file));
            }
            0..5 => {
                let op = format!("release the range {:?}", r.range());
                self.note(op.clone());
                if let Err(e) = r.release() {
                    self.tolerate(&op, &e, Allowed::default());
                }
            }
            _ => {
                self.note(format!("drop the range {:?}", r.range()));
                drop(r);
            }
        }
    }

    pub(super) fn copy_pin(&mut self) {
        if self.pins.is_empty() {
            return;
        }
        let i = self.rng.upto(self.pins.len());
        let len = self.pins[i].r.len() as usize;
        let a = self.rng.upto(len + 1);
        let b = a + self.rng.upto(len - a + 1);
        let op = format!("copy bytes {a}..{b} of the range {:?}", self.pins[i].r.range());
        self.note(op.clone());
        let (file, range) = (Arc::clone(self.pins[i].r.file()), self.pins[i].r.range());
        self.mark_read(&file, &range);
        let (Some(stream), Some(mut dst)) =
            (self.cuda(&op, Stream::new(&self.dev)), self.cuda(&op, DeviceBuffer::<u8>::new(&self.dev, b - a)))
        else {
            return;
        };
        let p = &self.pins[i];
        let src = p.r.slice(a..b).unwrap_or_else(|e| self.fail(&format!("{op}: {e}")));
        if self.cuda(&op, stream.copy_to_device(&src, &mut dst).and_then(|c| c.wait())).is_none() {
            return;
        }
        let start = p.r.range().start as usize;
        let want = p.data[start + a..start + b].to_vec();
        let got = self.read_back(&op, &dst);
        self.expect_bytes(&op, &got, &want);
    }

    pub(super) fn page_cache(&mut self) {
        let Some((file, _)) = self.file() else { return };
        let range = self.rng.range(file.len());
        let valid = range.start <= range.end && range.end <= file.len();
        let op = format!("page cache of {}: {range:?}", file.path().display());
        self.note(op.clone());
        let r = if self.rng.chance(30) { file.drop_page_cache() } else { file.populate(range).map(drop) };
        if let Err(e) = r {
            self.tolerate(&op, &e, Allowed { bad_range: !valid, ..Allowed::default() });
        }
    }

    /// Forgets a new device buffer now and then (it stays allocated).
    pub(super) fn forget_buffer(&mut self) {
        if self.forgot.buffers.0 > 0 {
            return;
        }
        let n = 1 + self.rng.upto(100_000);
        self.note(format!("forget a device buffer of {n} bytes"));
        if let Some(b) = self.cuda("DeviceBuffer::new", DeviceBuffer::<u8>::new(&self.dev, n)) {
            wirespeed_tests::forget_reachably(b);
            self.forgot.buffers = (1, n as u64);
        }
    }
}
