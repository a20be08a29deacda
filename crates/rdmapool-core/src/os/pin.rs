//! Real page pinning: mlock with overlap-aware unpinning, and the process-wide count of
//! pinned bytes. Used by the soft provider to pin registrations; the memlock limit text is
//! shared by every provider's errors.

use crate::util::page_size;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Live pinned ranges of the whole process: (start, id) -> end, page aligned.
///
/// mlock does not count: unlocking a page unlocks it for every registration that covers it.
/// So a range is unpinned only where no other live registration still covers it.
static PINNED: Mutex<BTreeMap<(usize, u64), usize>> = Mutex::new(BTreeMap::new());
static NEXT_PIN_ID: AtomicU64 = AtomicU64::new(1);
static PINNED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes currently pinned by registrations of this process (counting overlaps once each).
pub fn pinned_bytes() -> u64 {
    PINNED_BYTES.load(Ordering::Relaxed)
}

/// A pinned, page-aligned range; unpinned on drop where nothing else covers it.
#[derive(Debug)]
#[doc(hidden)]
pub struct Pin {
    start: usize,
    end: usize,
    id: u64,
    /// Whether the pin succeeded and was added to the pinned-bytes counter.
    counted: bool,
}

fn page_bounds(addr: usize, len: usize) -> Result<(usize, usize)> {
    let page = page_size();
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .ok_or(Error::OutOfLimits {
            what: "start address of the range to pin",
            value: addr as u64,
            min: 0,
            max: usize::MAX.saturating_sub(len).saturating_sub(page - 1) as u64,
        })?;
    Ok((addr & !(page - 1), end & !(page - 1)))
}

/// The locked-memory soft limit as text, for error messages.
#[doc(hidden)]
pub fn memlock_limit_text() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return "unknown".into();
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} bytes", lim.rlim_cur)
    }
}

// A pin is never empty: it covers at least one page.
#[allow(clippy::len_without_is_empty)]
impl Pin {
    /// Pins `len` bytes at `addr` (rounded out to pages) with mlock.
    ///
    /// # Safety
    /// The range must be mapped memory of this process.
    #[doc(hidden)]
    pub unsafe fn new(addr: usize, len: usize) -> Result<Self> {
        let (start, end) = page_bounds(addr, len)?;
        let id = NEXT_PIN_ID.fetch_add(1, Ordering::Relaxed);
        // Record first so a concurrent unpin of an overlapping range keeps our pages locked.
        PINNED.lock().insert((start, id), end);
        // SAFETY: the caller promises the range is mapped; mlock only changes page state.
        if unsafe { libc::mlock(start as *const libc::c_void, end - start) } != 0 {
            let err = std::io::Error::last_os_error();
            let pin = Pin {
                start,
                end,
                id,
                counted: false,
            };
            drop(pin); // unlocks whatever part mlock managed to lock and nobody else covers
            let errno = err.raw_os_error().unwrap_or(0);
            return Err(match errno {
                libc::ENOMEM | libc::EAGAIN | libc::EPERM => Error::MemlockLimit {
                    requested: end - start,
                    limit: memlock_limit_text(),
                    errno,
                },
                _ => Error::Sys {
                    call: "mlock",
                    source: err,
                },
            });
        }
        PINNED_BYTES.fetch_add((end - start) as u64, Ordering::Relaxed);
        Ok(Pin {
            start,
            end,
            id,
            counted: true,
        })
    }

    /// Bytes this pin covers.
    #[doc(hidden)]
    pub fn len(&self) -> usize {
        self.end - self.start
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut live = PINNED.lock();
        live.remove(&(self.start, self.id));
        // Parts of [start, end) still covered by other live pins.
        let mut covered: Vec<(usize, usize)> = live
            .range(..(self.end, 0))
            .filter(|(_, &e)| e > self.start)
            .map(|(&(s, _), &e)| (s.max(self.start), e.min(self.end)))
            .collect();
        covered.sort_unstable();
        let mut cursor = self.start;
        let unlock = |from: usize, to: usize| {
            if to > from {
                // SAFETY: munlock on a range we locked; it only changes page state and
                // tolerates ranges that are no longer locked.
                unsafe { libc::munlock(from as *const libc::c_void, to - from) };
            }
        };
        for (s, e) in covered {
            unlock(cursor, s);
            cursor = cursor.max(e);
        }
        unlock(cursor, self.end);
        drop(live);
        if self.counted {
            PINNED_BYTES.fetch_sub(self.len() as u64, Ordering::Relaxed);
        }
    }
}
