//! Real memory for the state-machine targets: one memfd mapping per thread (as the soft
//! provider's regions; a page-aligned heap block under Miri, which cannot make one), filled
//! with a known pattern before every run. Regions are registered over parts of it in real key
//! tables (lent memory, as `Pd::register_raw` lends it), so the access checks and copies
//! are the provider's own. After a run, every byte outside the ranges the run was allowed
//! to write must still hold the pattern.

use crate::fabric::AccessFlags;
#[cfg(not(miri))]
use crate::os::mapping::Mapping;
use crate::soft::keys::{KeyTable, MrInner, NewRegion};
use std::sync::Arc;

/// Bytes of the arena (four pages).
pub(super) const ARENA_LEN: usize = 16384;

/// An address range `(addr, len)`.
pub(super) type Range = (u64, u64);

fn pattern(i: usize) -> u8 {
    (i as u32).wrapping_mul(31).wrapping_add(7) as u8
}

/// The memory behind a thread's arena, only ever used through raw pointers.
struct Backing {
    ptr: *mut u8,
    #[cfg(not(miri))]
    _mapping: Mapping,
}

impl Backing {
    #[cfg(not(miri))]
    fn new() -> Self {
        let mapping = Mapping::new(ARENA_LEN).expect("fuzz arena: memfd mapping");
        assert!(mapping.len() >= ARENA_LEN);
        Self {
            ptr: mapping.ptr(),
            _mapping: mapping,
        }
    }

    #[cfg(miri)]
    fn new() -> Self {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::LAYOUT) };
        assert!(!ptr.is_null(), "fuzz arena: allocation");
        Self { ptr }
    }
}

#[cfg(miri)]
impl Backing {
    const LAYOUT: std::alloc::Layout = match std::alloc::Layout::from_size_align(ARENA_LEN, 4096) {
        Ok(l) => l,
        Err(_) => panic!("arena layout"),
    };
}

#[cfg(miri)]
impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, Self::LAYOUT) }
    }
}

thread_local! {
    static BACKING: Backing = Backing::new();
    static PATTERN: Vec<u8> = (0..ARENA_LEN).map(pattern).collect();
}

/// The arena of this run.
pub(super) struct Arena {
    base: u64,
}

/// Runs `f` with this thread's arena, freshly patterned.
pub(super) fn with_arena<R>(f: impl FnOnce(&Arena) -> R) -> R {
    BACKING.with(|b| {
        let arena = Arena { base: b.ptr as u64 };
        PATTERN.with(|p| {
            // SAFETY: the backing is ARENA_LEN bytes (checked where it is made), lives as
            // long as the thread, and nothing else uses it now (runs do not nest).
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), b.ptr, ARENA_LEN) }
        });
        f(&arena)
    })
}

/// Whether `[addr, addr+len)` lies inside one of `ranges`.
pub(super) fn inside(ranges: &[Range], addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    ranges.iter().any(|&(a, l)| addr >= a && end <= a + l)
}

impl Arena {
    /// The address `off` bytes into the arena.
    pub(super) fn at(&self, off: usize) -> u64 {
        assert!(off <= ARENA_LEN);
        self.base + off as u64
    }

    /// Registers `[off, off+len)` of the arena in `keys`.
    pub(super) fn register(
        &self,
        keys: &KeyTable,
        off: usize,
        len: usize,
        access: AccessFlags,
        pd_id: u32,
    ) -> Arc<MrInner> {
        assert!(off + len <= ARENA_LEN);
        keys.insert(NewRegion {
            addr: self.at(off),
            len: len as u64,
            access,
            pd_id,
            pin: None,
            mapping: None,
        })
        .expect("fuzz arena: registration")
    }

    /// Writes `bytes` at `addr`, which must lie in the arena (a driver receiving into the
    /// pieces a state machine gave it).
    pub(super) fn write(&self, addr: u64, bytes: &[u8]) {
        let len = bytes.len();
        assert!(
            inside(&[(self.base, ARENA_LEN as u64)], addr, len as u64),
            "write of {len} bytes at {addr:#x} outside the arena"
        );
        // SAFETY: inside the arena (asserted above), which is mapped for the whole thread;
        // written through a raw pointer, as a NIC writes registered memory.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, len) };
    }

    /// The driver's in-place receive: gives the front of `link` (at most `max` bytes) to
    /// `pieces`, each of which must lie in `allowed`; returns the bytes received.
    pub(super) fn receive(
        &self,
        pieces: &[(u64, usize)],
        allowed: &[Range],
        link: &[u8],
        max: usize,
    ) -> usize {
        let mut got = 0;
        let want = max.min(link.len());
        for &(addr, len) in pieces {
            assert!(
                inside(allowed, addr, len as u64),
                "receive into {addr:#x}+{len}, outside what may be written"
            );
            let n = len.min(want - got);
            self.write(addr, &link[got..got + n]);
            got += n;
        }
        got
    }

    /// Copies `len` bytes at `addr`, which must lie in the arena (a driver sending READ data).
    pub(super) fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        assert!(
            inside(&[(self.base, ARENA_LEN as u64)], addr, len as u64),
            "read of {len} bytes at {addr:#x} outside the arena"
        );
        let mut v = vec![0u8; len];
        // SAFETY: inside the arena (asserted above), mapped for the whole thread.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
        v
    }

    /// Panics if a byte outside `writable` lost its pattern.
    pub(super) fn check_untouched(&self, writable: &[Range]) {
        let now = self.read(self.base, ARENA_LEN);
        if PATTERN.with(|p| *p == now) {
            return;
        }
        for (i, &b) in now.iter().enumerate() {
            let addr = self.base + i as u64;
            if b != pattern(i) && !inside(writable, addr, 1) {
                panic!("arena byte {i} was written, outside every writable range");
            }
        }
    }
}
