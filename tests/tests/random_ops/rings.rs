//! Pinned rings and their slots.

use super::*;

impl World<'_> {
    pub(super) fn new_ring(&mut self) {
        let slots = 1 + self.rng.upto(6);
        let slot = self.rng.pick(&[1, 100, 4096, 65_549, 1 << 20]);
        let (b, budget) = self.budget();
        let op = format!("a ring of {slots} x {slot} (budget {b})");
        self.note(op.clone());
        let Some(stream) = self.cuda(&op, Stream::new(&self.dev)) else { return };
        match PinnedRing::new(slots, slot, &budget) {
            Ok(ring) => self.rings.push(Ring {
                ring,
                stream,
                held: Vec::new(),
                submitted: BTreeSet::new(),
                clean: true,
                leaked: false,
            }),
            Err(e) => self.tolerate(&op, &e, Allowed { budget: true, ..Allowed::default() }),
        }
    }

    pub(super) fn ring_step(&mut self) {
        if self.rings.is_empty() {
            return self.new_ring();
        }
        let k = self.rng.upto(self.rings.len());
        let held = self.rings[k].held.len();
        match self.rng.below(10) {
            0..3 => self.acquire(k),
            3..5 if held > 0 => self.fill(k),
            5..7 if held > 0 => self.submit(k),
            7 if held > 0 => self.finish_slot(k),
            8 => {
                self.note(format!("drain ring {k}"));
                let drained = self.rings[k].ring.drain();
                if let Err(e) = drained {
                    self.tolerate("drain", &e, Allowed::default());
                }
            }
            _ if held > 0 => self.release_slot(k),
            _ => self.acquire(k),
        }
    }

    pub(super) fn acquire(&mut self, k: usize) {
        self.note(format!("acquire a slot of ring {k}"));
        match self.rings[k].ring.try_acquire() {
            Ok(Some(s)) => {
                let i = s.index();
                self.rings[k].held.push((i, Held::Free(s)));
            }
            Ok(None) => {}
            Err(e) => self.tolerate("acquire", &e, Allowed::default()),
        }
    }

    /// Fills a held free slot with bytes of a file.
    pub(super) fn fill(&mut self, k: usize) {
        let Some((file, data)) = self.file() else { return };
        let j = self.rng.upto(self.rings[k].held.len());
        let (i, held) = self.rings[k].held.swap_remove(j);
        let Held::Free(slot) = held else {
            self.rings[k].held.push((i, held));
            return;
        };
        let n = self.rng.upto(slot.capacity().min(file.len() as usize) + 1);
        let off = self.rng.below(file.len() - n as u64 + 1);
        let want = data[off as usize..off as usize + n].to_vec();
        let op = format!("fill slot {i} of ring {k} with {n} bytes at {off}");
        self.note(op.clone());
        let full = if self.rng.chance(50) { slot.copy_from(&want) } else { slot.read_from(&file, off, n) };
        match full {
            Ok(full) => {
                self.expect_bytes(&op, full.data().unwrap(), &want);
                self.rings[k].held.push((i, Held::Full(full, want)));
            }
            Err(e) => self.fail(&format!("{op}: {e}")),
        }
    }

    /// Copies a held full slot to a new device buffer.
    pub(super) fn submit(&mut self, k: usize) {
        let j = self.rng.upto(self.rings[k].held.len());
        let (i, held) = self.rings[k].held.swap_remove(j);
        let Held::Full(full, want) = held else {
            self.rings[k].held.push((i, held));
            return;
        };
        if self.rings[k].leaked {
            drop(full); // (its events were counted when the ring was leaked)
            return;
        }
        let op = format!("submit slot {i} of ring {k} ({} bytes)", want.len());
        self.note(op.clone());
        let Some(mut dst) = self.cuda(&op, DeviceBuffer::<u8>::new(&self.dev, want.len())) else { return };
        let r = &mut self.rings[k];
        r.submitted.insert(i);
        match full.copy_to_device(&r.stream, &mut dst) {
            Ok(in_flight) => r.held.push((i, Held::InFlight(in_flight, dst, want))),
            Err(e) => {
                r.clean = false;
                self.tolerate(&op, &e, Allowed::default());
            }
        }
    }

    /// Waits for a held in-flight slot and checks what it copied.
    pub(super) fn finish_slot(&mut self, k: usize) {
        let j = self.rng.upto(self.rings[k].held.len());
        let (i, held) = self.rings[k].held.swap_remove(j);
        let Held::InFlight(slot, dst, want) = held else {
            self.rings[k].held.push((i, held));
            return;
        };
        let op = format!("wait for slot {i} of ring {k}");
        self.note(op.clone());
        match slot.wait() {
            Ok(free) => self.rings[k].held.push((i, Held::Free(free))),
            Err(e) => self.tolerate(&op, &e, Allowed::default()),
        }
        let got = self.read_back(&op, &dst);
        self.expect_bytes(&op, &got, &want);
    }

    /// Drops a held slot, or now and then forgets it (the ring then stays).
    pub(super) fn release_slot(&mut self, k: usize) {
        let j = self.rng.upto(self.rings[k].held.len());
        let (i, held) = self.rings[k].held.swap_remove(j);
        if self.rng.chance(15) && self.forgot.rings.len() < 2 && self.rings[k].clean && !self.rings[k].leaked {
            self.note(format!("forget slot {i} of ring {k}"));
            let r = &self.rings[k];
            let events = r.submitted.len() as u64;
            let entry = (r.ring.slots() as u64, r.ring.pinned_bytes(), events, u64::from(events > 0));
            self.forgot.rings.push(entry);
            self.rings[k].leaked = true;
            match held {
                Held::Free(s) => wirespeed_tests::forget_reachably(s),
                Held::Full(s, _) => wirespeed_tests::forget_reachably(s),
                Held::InFlight(s, dst, _) => {
                    wirespeed_tests::forget_reachably(s);
                    drop(dst);
                }
            }
            return;
        }
        self.note(format!("drop slot {i} of ring {k}"));
        drop(held);
    }

    pub(super) fn drop_ring(&mut self) {
        if self.rings.is_empty() {
            return;
        }
        let k = self.rng.upto(self.rings.len());
        self.note(format!("drop ring {k}"));
        let mut r = self.rings.swap_remove(k);
        while !r.held.is_empty() {
            drop(r.held.swap_remove(self.rng.upto(r.held.len())));
        }
    }
}
