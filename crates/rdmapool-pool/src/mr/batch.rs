//! Two registration modes from the seeds on top of the [`Registrar`]:
//! * batched: many small or adjacent ranges coalesced into fewer registrations, each caller
//!   still getting a handle of its own, a [`Shared`] view ([`Registrar::register_batch`]);
//! * pre-registration: a ring of buffers registered ahead of use, refilled in the background
//!   ([`PreRegRing`]).

use super::registrar::{RegHandle, Registrar};
use crate::fabric::{AccessFlags, Mr, Raw, RegisteredMemory, Shared};
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::Arc;

impl Registrar {
    /// Registers many ranges, coalescing those that overlap or touch (after rounding to
    /// pages) into one registration each; returns one view per input, in input order (the
    /// views of one registration share it: [`Shared::region`]).
    /// Fails as a whole if any registration fails.
    ///
    /// # Safety
    /// Every range must stay mapped while any returned handle lives (the
    /// [`crate::fabric::Pd::register_raw`] contract).
    pub unsafe fn register_batch(
        &self,
        ranges: &[(*const u8, usize)],
        access: AccessFlags,
    ) -> Result<Vec<Mr<Shared>>> {
        let page = crate::util::page_size();
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        for &(p, len) in ranges {
            super::check_raw(
                p,
                len,
                "a range of a registration batch",
                "bytes of a range of a registration batch",
            )?;
        }
        order.sort_by_key(|&i| ranges[i].0 as usize);
        // Merge into page-rounded runs: (start, end, members).
        let mut runs: Vec<(usize, usize, Vec<usize>)> = Vec::new();
        for i in order {
            let (p, len) = (ranges[i].0 as usize, ranges[i].1);
            let (s, e) = (p & !(page - 1), (p + len).div_ceil(page) * page);
            match runs.last_mut() {
                Some(run) if s <= run.1 => {
                    run.1 = run.1.max(e);
                    run.2.push(i);
                }
                _ => runs.push((s, e, vec![i])),
            }
        }
        // SAFETY: each run covers only pages of the caller's ranges (contract above).
        let handles: Vec<RegHandle<Raw>> = runs
            .iter()
            .map(|r| unsafe { self.submit_raw(r.0 as *mut u8, r.1 - r.0, access) })
            .collect();
        let mut out: Vec<Option<Mr<Shared>>> = vec![None; ranges.len()];
        for (run, h) in runs.iter().zip(handles) {
            let mr = Arc::new(h.wait()?);
            for &i in &run.2 {
                let offset = ranges[i].0 as usize - mr.addr() as usize;
                out[i] = Some(Mr::share_range(&mr, offset, ranges[i].1)?);
            }
        }
        Ok(out
            .into_iter()
            .map(|m| m.expect("every range is in a run"))
            .collect())
    }
}

/// A ring of regions registered ahead of use: [`PreRegRing::take`] hands out one that is
/// ready and submits its replacement, so the registration cost is paid before it is needed.
pub struct PreRegRing<'r> {
    registrar: &'r Registrar,
    len: usize,
    access: AccessFlags,
    ring: VecDeque<RegHandle>,
}

impl<'r> PreRegRing<'r> {
    /// Submits `depth` registrations of `len` bytes (memory the regions own) right away.
    pub fn new(
        registrar: &'r Registrar,
        depth: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self> {
        if depth == 0 || len == 0 {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: if depth == 0 {
                    "depth of a pre-registration ring"
                } else {
                    "buffer length of a pre-registration ring"
                },
                value: 0,
                min: 1,
                max: usize::MAX as u64,
            }));
        }
        let ring = (0..depth).map(|_| registrar.submit(len, access)).collect();
        Ok(Self {
            registrar,
            len,
            access,
            ring,
        })
    }

    /// Registrations already complete and waiting in the ring.
    pub fn ready(&self) -> usize {
        self.ring
            .iter()
            .filter(|h| h.state() == super::RegState::Completed)
            .count()
    }

    /// The oldest registration (waiting for it if it is not done yet), and a replacement is
    /// submitted at once.
    pub fn take(&mut self) -> Result<Mr> {
        let h = self.ring.pop_front().expect("the ring is never empty");
        self.ring
            .push_back(self.registrar.submit(self.len, self.access));
        h.wait()
    }
}
