//! 2 MiB-aligned memory: explicit huge pages (MAP_HUGETLB) when some are reserved,
//! otherwise transparent huge pages (aligned mapping + `madvise(MADV_HUGEPAGE)`), with a
//! report of which one was used and an optional parallel pre-touch.

use crate::{Error, Result};

/// The huge-page size this module works with.
pub const HUGE_PAGE: usize = 2 << 20;

/// What backs a [`HugeRegion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugeBacking {
    /// Reserved huge pages (hugetlbfs, `MAP_HUGETLB`).
    HugeTlb,
    /// Transparent huge pages were requested with `madvise`; the kernel may still use 4 KiB
    /// pages ([`HugeRegion::thp_bytes`] tells what it did).
    Thp,
}

/// How to allocate.
#[derive(Debug, Clone, Copy)]
pub struct HugeOptions {
    /// Try `MAP_HUGETLB` first (falls back to THP when none are reserved).
    pub try_hugetlb: bool,
    /// Touch every page up front, on this many threads (0: leave pages to fault in later).
    pub pretouch_threads: usize,
}

impl Default for HugeOptions {
    fn default() -> Self {
        Self {
            try_hugetlb: true,
            pretouch_threads: 0,
        }
    }
}

/// A 2 MiB-aligned anonymous mapping, unmapped on drop.
#[derive(Debug)]
pub struct HugeRegion {
    ptr: *mut u8,
    len: usize,
    backing: HugeBacking,
}

// SAFETY: plain anonymous memory owned by this handle; raw-pointer access only.
unsafe impl Send for HugeRegion {}
// SAFETY: as above; the handle itself has no interior state.
unsafe impl Sync for HugeRegion {}

impl HugeRegion {
    /// Allocates `len` bytes, which must be a positive multiple of 2 MiB.
    pub fn alloc(len: usize, opts: HugeOptions) -> Result<Self> {
        if len == 0 || !len.is_multiple_of(HUGE_PAGE) {
            return Err(Error::Core(crate::CoreError::BadSetting {
                name: "huge-page region length".into(),
                value: len.to_string(),
                reason: "must be a positive multiple of 2 MiB".into(),
            }));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if opts.try_hugetlb {
            // MAP_HUGE_2MB: log2(2 MiB) = 21 in the MAP_HUGE_SHIFT bits.
            let flags = anon | libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT);
            // SAFETY: a fresh anonymous mapping chosen by the kernel.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
            if p != libc::MAP_FAILED {
                let r = Self {
                    ptr: p.cast(),
                    len,
                    backing: HugeBacking::HugeTlb,
                };
                r.pretouch(opts.pretouch_threads);
                return Ok(r);
            }
        }
        // Over-allocate by one huge page, then trim to a 2 MiB boundary.
        let span = len + HUGE_PAGE;
        // SAFETY: a fresh anonymous mapping chosen by the kernel.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), span, prot, anon, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os("mmap"));
        }
        let start = p as usize;
        let aligned = (start + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
        // SAFETY: unmapping the unaligned head and the tail of our own mapping.
        unsafe {
            if aligned > start {
                libc::munmap(p, aligned - start);
            }
            let tail = start + span - (aligned + len);
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        let r = Self {
            ptr: aligned as *mut u8,
            len,
            backing: HugeBacking::Thp,
        };
        r.pretouch(opts.pretouch_threads);
        Ok(r)
    }

    fn pretouch(&self, threads: usize) {
        if threads == 0 {
            return;
        }
        let pages = self.len / HUGE_PAGE;
        let base = self.ptr as usize;
        std::thread::scope(|s| {
            for t in 0..threads.min(pages) {
                s.spawn(move || {
                    for i in (t..pages).step_by(threads) {
                        // SAFETY: one byte inside our mapping, written before anyone else
                        // (including a device) can use it.
                        unsafe { std::ptr::write_volatile((base + i * HUGE_PAGE) as *mut u8, 0) };
                    }
                });
            }
        });
    }

    /// Start (2 MiB aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (zero-length regions are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What backs it.
    pub fn backing(&self) -> HugeBacking {
        self.backing
    }

    /// Bytes of this region the kernel backs with transparent huge pages right now (from
    /// /proc/self/smaps; 0 when unknown).
    pub fn thp_bytes(&self) -> usize {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return 0;
        };
        let start = self.ptr as usize;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = a < start + self.len && b > start;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    return kb
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<usize>()
                        .unwrap_or(0)
                        * 1024;
                }
            }
        }
        0
    }
}

// SAFETY: a huge-page region is a mapping owned by the value, unmapped only on drop.
unsafe impl crate::fabric::StableBuf for HugeRegion {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.as_ptr()
    }
    fn stable_len(&self) -> usize {
        self.len()
    }
}

impl Drop for HugeRegion {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping we own; registrations on it must be dropped first
        // (their `register_raw` contract).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
