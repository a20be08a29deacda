//! Large regions registered as several registrations in parallel
//! ([`Registrar::register_chunked`]): a list of [`Mr`]s, and [`region_for`], which finds the
//! one a range lies in.

use super::registrar::{RegHandle, Registrar};
use crate::fabric::{AccessFlags, Mr, Raw, RegisteredMemory};
use crate::{Error, Result};

/// The region of `regions` (sorted by address, not overlapping) that holds all of
/// `[addr, addr+len)`: an object must live inside one registration, so a range that
/// straddles two regions is refused, as is one outside them all.
///
/// ```
/// use rdmapool_pool::fabric::{AccessFlags, Context, RegisteredMemory, SoftConfig};
/// use rdmapool_pool::mr::region_for;
/// # fn main() -> rdmapool_pool::Result<()> {
/// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
/// let mut regions = vec![pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?,
///                        pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?];
/// regions.sort_by_key(|m| m.addr());
/// let second = regions[1].addr() as *const u8;
/// assert_eq!(region_for(&regions, second.wrapping_add(8), 64)?.lkey(), regions[1].lkey());
/// assert!(region_for(&regions, second.wrapping_sub(8), 64).is_err());   // starts outside it
/// # Ok(()) }
/// ```
pub fn region_for<O>(regions: &[Mr<O>], addr: *const u8, len: usize) -> Result<&Mr<O>> {
    let addr = addr as u64;
    let start = regions.first().map_or(0, |m| m.addr());
    let end = regions.last().map_or(0, |m| m.addr() + m.len() as u64);
    let outside = || {
        Error::Core(crate::CoreError::OutOfRange {
            what: "registered regions",
            offset: addr.wrapping_sub(start),
            len: len as u64,
            limit: end.saturating_sub(start),
        })
    };
    // The last region starting at or before `addr`.
    let i = regions.partition_point(|m| m.addr() <= addr);
    let mr = i.checked_sub(1).map(|i| &regions[i]).ok_or_else(outside)?;
    let off = addr - mr.addr();
    let range_end = off.checked_add(len as u64).ok_or_else(outside)?;
    if off >= mr.len() as u64 && !(len == 0 && off == mr.len() as u64) {
        return Err(outside());
    }
    if range_end > mr.len() as u64 {
        // Inside the regions but across two registrations: one work request cannot name it.
        return Err(Error::Core(crate::CoreError::OutOfRange {
            what: "registration the range starts in",
            offset: off,
            len: len as u64,
            limit: mr.len() as u64,
        }));
    }
    Ok(mr)
}

impl Registrar {
    /// Registers `[addr, addr+len)` as chunks of `chunk` bytes (capped at the device's
    /// `max_mr_size` and rounded down to whole pages), all submitted at once so the workers
    /// register them in parallel; waits for all of them. The regions come back in address
    /// order ([`region_for`] finds the one holding a range).
    ///
    /// # Safety
    /// As [`Registrar::submit_raw`], for the whole range, until the returned value drops.
    pub unsafe fn register_chunked(
        &self,
        addr: *mut u8,
        len: usize,
        chunk: usize,
        max_mr_size: u64,
    ) -> Result<Vec<Mr<Raw>>> {
        let page = crate::util::page_size();
        let chunk = (chunk.min(max_mr_size.min(usize::MAX as u64) as usize) / page) * page;
        super::check_raw(
            addr,
            len,
            "memory of a chunked registration",
            "bytes of a chunked registration",
        )?;
        if chunk == 0 {
            // A chunk is at least a page, at most the device's max_mr_size.
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "chunk of a chunked registration (pages, at most max_mr_size)",
                value: 0,
                min: 1,
                max: usize::MAX as u64,
            }));
        }
        let handles: Vec<RegHandle<Raw>> = (0..len.div_ceil(chunk))
            .map(|i| {
                let n = chunk.min(len - i * chunk);
                // SAFETY: each chunk lies inside the caller's range (contract above).
                unsafe { self.submit_raw(addr.add(i * chunk), n, AccessFlags::all_remote()) }
            })
            .collect();
        handles.iter().map(RegHandle::wait).collect()
    }
}
