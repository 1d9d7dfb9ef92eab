//! Choosing the strategy: what [`Strategy::Auto`] resolves to for a range of
//! a file with the budget as it is, and the checks of a range and of the
//! budget before anything is pinned ([`Streamer::resolve`], the public
//! answer for a page-cached file, is in `mod.rs` with the rest of the API).

use std::ops::Range;
use std::sync::Arc;

use super::Shared;
use super::cache::{State, cached, kept};
use crate::budget::PinBudget;
use crate::error::{Error, Result};
use crate::mapping::MappedFile;
use crate::strategy::{Strategy, plan};
use crate::util::cpus;

impl Shared {
    /// Pinned bytes a plan may use: what the budget has left plus what the
    /// streamer keeps (it would give those back), within the mlock headroom.
    pub(super) fn usable(&self, kept: u64) -> u64 {
        let mut avail = self.config.budget.available().saturating_add(kept);
        if self.config.mlock
            && let Some(h) = crate::memlock::memlock_headroom()
        {
            avail = avail.min(h);
        }
        avail
    }

    pub(super) fn pick(&self, st: &State, file: &Arc<MappedFile>, range: &Range<u64>) -> Result<Strategy> {
        let strategy = self.config.strategy.normalized()?;
        if strategy != Strategy::Auto {
            return Ok(strategy);
        }
        if cached(st, file, range, self.portable).is_some() {
            return Ok(Strategy::WholeFile);
        }
        let len = range.end - range.start;
        let avail = self.usable(kept(st));
        let cold = len > avail && {
            let resident = file.resident_estimate(range.clone()).unwrap_or(len);
            resident < len / 2
        };
        plan(len, avail, cpus(), cold).ok_or(Error::BudgetExceeded {
            requested: 2 * (64 << 10),
            available: avail,
            limit: self.config.budget.limit(),
        })
    }

    /// Refuses at once (allocating nothing) a strategy whose pins cannot fit
    /// in the budget even after giving back what the streamer keeps, unless
    /// the streamer holds them already (the cached registration of the range,
    /// or a ring of the strategy's shape).
    pub(super) fn check_fits(
        &self,
        st: &State,
        file: &Arc<MappedFile>,
        range: &Range<u64>,
        strategy: Strategy,
    ) -> Result<()> {
        let budget = &self.config.budget;
        let need = strategy.nominal_bytes(range.end - range.start).unwrap_or(0);
        let held = match (strategy, &st.ring) {
            (Strategy::WholeFile, _) => cached(st, file, range, self.portable).is_some(),
            (Strategy::Ring { slots, slot, .. } | Strategy::Direct { slots, slot, .. }, Some(r)) => {
                r.slots() == slots && r.slot_bytes() == slot
            }
            _ => false,
        };
        let usable = budget.available().saturating_add(kept(st));
        if !held && need > usable {
            return Err(Error::BudgetExceeded { requested: need, available: usable, limit: budget.limit() });
        }
        Ok(())
    }
}

pub(super) fn check_range(file: &MappedFile, range: &Range<u64>) -> Result<u64> {
    if range.start > range.end || range.end > file.len() {
        return Err(Error::BadRange {
            range: range.clone(),
            len: file.len(),
            reason: if range.start > range.end {
                "the range is reversed"
            } else {
                "the range runs past the end of the file"
            },
        });
    }
    Ok(range.end - range.start)
}

pub(super) fn check_budget(budget: &PinBudget, need: u64) -> Result<()> {
    let available = budget.available();
    if need > available {
        return Err(Error::BudgetExceeded { requested: need, available, limit: budget.limit() });
    }
    Ok(())
}
