//! The memory `stress` registers: allocated once and reused (pooled), or new every round
//! (fresh), on 4 KiB or 2 MiB pages. Allocation includes touching every page, so that its
//! cost (the kernel zero-filling fresh pages) is timed here, not inside registration.

use crate::{Result, ToolError};
use rdmapool::fabric::StableBuf;
use rdmapool::mr::{HugeOptions, HugeRegion};
use std::time::Instant;

/// Where each round's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryMode {
    /// Allocate once, register and deregister every round.
    Pooled,
    /// Allocate (and touch) new memory every round.
    Fresh,
}

/// One thread's buffer.
pub enum Buf {
    Small(Vec<u8>),
    Huge(HugeRegion),
}

// SAFETY: both variants are heap or mmap memory owned by the value, never moved or resized
// while it lives; the pointer and length are those of that memory.
unsafe impl StableBuf for Buf {
    fn stable_ptr(&mut self) -> *mut u8 {
        match self {
            Buf::Small(v) => v.stable_ptr(),
            Buf::Huge(h) => h.stable_ptr(),
        }
    }
    fn stable_len(&self) -> usize {
        match self {
            Buf::Small(v) => v.stable_len(),
            Buf::Huge(h) => h.stable_len(),
        }
    }
}

/// The buffers of all threads, kept between rounds when pooled.
pub struct Buffers {
    mode: MemoryMode,
    huge: bool,
    len: usize,
    threads: usize,
    kept: Vec<Buf>,
}

impl Buffers {
    pub fn new(mode: MemoryMode, huge: bool, len: usize, threads: usize) -> Self {
        Self {
            mode,
            huge,
            len,
            threads,
            kept: Vec::new(),
        }
    }

    /// This round's buffers; new ones are allocated (and their time recorded in `alloc`).
    pub fn take(&mut self, alloc: &mut hdrhistogram::Histogram<u64>) -> Result<Vec<Buf>> {
        if self.mode == MemoryMode::Pooled && !self.kept.is_empty() {
            return Ok(std::mem::take(&mut self.kept));
        }
        (0..self.threads)
            .map(|_| {
                let t = Instant::now();
                let b = self.allocate()?;
                alloc.saturating_record(t.elapsed().as_nanos().max(1) as u64);
                Ok(b)
            })
            .collect()
    }

    /// Buffers back after the round (kept when pooled, freed when fresh).
    pub fn give_back(&mut self, bufs: Vec<Buf>) {
        if self.mode == MemoryMode::Pooled {
            self.kept = bufs;
        }
    }

    fn allocate(&self) -> Result<Buf> {
        if self.huge {
            let huge = 2 << 20;
            let len = self.len.div_ceil(huge) * huge;
            let opts = HugeOptions {
                try_hugetlb: true,
                pretouch_threads: 1,
            };
            return HugeRegion::alloc(len, opts)
                .map(Buf::Huge)
                .map_err(|e| ToolError::Msg(format!("--hugepages: {e}")));
        }
        let mut v = vec![0u8; self.len];
        // calloc'd pages are not there yet: touch one byte per page so the kernel's zero
        // filling happens now, in the allocation time.
        for i in (0..v.len()).step_by(4096) {
            // SAFETY: i < v.len(); a volatile write so the touch is not optimised away.
            unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 1) };
        }
        Ok(Buf::Small(v))
    }
}

/// The capability bit that lifts RLIMIT_MEMLOCK (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// Whether this process may pin memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK in effect).
fn can_lock_unlimited() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Refuses a run that would pin more than RLIMIT_MEMLOCK allows (unless CAP_IPC_LOCK).
pub fn check_memlock(bytes: usize) -> Result<()> {
    if can_lock_unlimited() {
        return Ok(());
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return Ok(());
    }
    if bytes as u64 > lim.rlim_cur {
        return Err(ToolError::Msg(format!(
            "this mix may pin up to {} but RLIMIT_MEMLOCK is {} (`ulimit -l`): lower --size, \
             --threads, --cache-size/--cache-buffers or --pool-size, or raise the limit \
             (`ulimit -l unlimited`, or run with CAP_IPC_LOCK)",
            crate::units::show(bytes),
            crate::units::show(lim.rlim_cur as usize)
        )));
    }
    Ok(())
}
