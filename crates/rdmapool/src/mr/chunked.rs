//! Large regions registered as several registrations in parallel
//! ([`Registrar::register_chunked`]).

use super::registrar::{RegHandle, Registrar};
use crate::fabric::{AccessFlags, Mr, RegisteredMemory, RemoteAddr, Sge};
use crate::{Error, Result};

/// A large region registered as several regions of at most one chunk each, in parallel.
#[derive(Debug)]
pub struct ChunkedMr {
    start: usize,
    chunk: usize,
    mrs: Vec<Mr>,
}

impl ChunkedMr {
    /// The registrations, in address order.
    pub fn regions(&self) -> &[Mr] {
        &self.mrs
    }

    /// Bytes per chunk (the last may be shorter).
    pub fn chunk_len(&self) -> usize {
        self.chunk
    }

    /// The registration covering `[addr, addr+len)`; an error if the range leaves the
    /// region or straddles two chunks (an object must live inside one registration).
    pub fn region_for(&self, addr: *const u8, len: usize) -> Result<&Mr> {
        let total = self.mrs.iter().map(|m| m.len() as u64).sum();
        let outside = |offset: usize| Error::OutOfRange {
            what: "chunked region",
            offset: offset as u64,
            len: len as u64,
            limit: total,
        };
        let off = (addr as usize)
            .checked_sub(self.start)
            .ok_or_else(|| outside(0))?;
        let i = off / self.chunk;
        let mr = self.mrs.get(i).ok_or_else(|| outside(off))?;
        let end = off.checked_add(len).ok_or_else(|| outside(off))?;
        if len > 0 && (end - 1) / self.chunk != i || end > i * self.chunk + mr.len() {
            // Inside the region but across two registrations: one work request cannot name it.
            return Err(Error::OutOfRange {
                what: "registration of the chunked region it starts in",
                offset: (off - i * self.chunk) as u64,
                len: len as u64,
                limit: mr.len() as u64,
            });
        }
        Ok(mr)
    }
}

impl RegisteredMemory for ChunkedMr {
    fn addr(&self) -> u64 {
        self.start as u64
    }
    fn len(&self) -> usize {
        self.mrs.iter().map(Mr::len).sum()
    }
    /// The first chunk's key; [`RegisteredMemory::sge`] picks the right one per range.
    fn lkey(&self) -> u32 {
        self.mrs[0].lkey()
    }
    /// The first chunk's key; [`RegisteredMemory::remote_at`] picks the right one.
    fn rkey(&self) -> u32 {
        self.mrs[0].rkey()
    }
    /// An SGE inside the one chunk holding `[offset, offset+len)`; an error if the range
    /// straddles two chunks.
    fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        let addr = self.start.wrapping_add(offset) as *const u8;
        let mr = self.region_for(addr, len as usize)?;
        mr.sge(self.start + offset - mr.addr() as usize, len)
    }
    fn remote_at(&self, offset: usize) -> Result<RemoteAddr> {
        crate::fabric::check_range(self.len(), offset, 0)?;
        let i = (offset / self.chunk).min(self.mrs.len() - 1);
        Ok(RemoteAddr {
            addr: (self.start + offset) as u64,
            rkey: self.mrs[i].rkey(),
        })
    }
}

impl Registrar {
    /// Registers `[addr, addr+len)` as chunks of `chunk` bytes (capped at the device's
    /// `max_mr_size` and rounded down to whole pages), all submitted at once so the workers
    /// register them in parallel; waits for all of them.
    ///
    /// # Safety
    /// As [`Registrar::submit_raw`], for the whole range, until the returned value drops.
    pub unsafe fn register_chunked(
        &self,
        addr: *mut u8,
        len: usize,
        chunk: usize,
        max_mr_size: u64,
    ) -> Result<ChunkedMr> {
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
            return Err(Error::OutOfLimits {
                what: "chunk of a chunked registration (pages, at most max_mr_size)",
                value: 0,
                min: 1,
                max: usize::MAX as u64,
            });
        }
        let handles: Vec<RegHandle> = (0..len.div_ceil(chunk))
            .map(|i| {
                let n = chunk.min(len - i * chunk);
                // SAFETY: each chunk lies inside the caller's range (contract above).
                unsafe { self.submit_raw(addr.add(i * chunk), n, AccessFlags::all_remote()) }
            })
            .collect();
        let mrs = handles
            .iter()
            .map(RegHandle::wait)
            .collect::<Result<Vec<_>>>()?;
        Ok(ChunkedMr {
            start: addr as usize,
            chunk,
            mrs,
        })
    }
}
