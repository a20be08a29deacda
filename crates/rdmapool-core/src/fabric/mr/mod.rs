//! [`Mr`]: registered memory, one type whatever its origin. The owner type `O` records where
//! the memory came from and what keeps it registered and mapped ([`Alloc`], [`Raw`], a
//! [`StableBuf`] such as `Vec<u8>`, [`Shared`], or a library owner such as a pooled buffer's).

mod owner;
mod registration;

pub use owner::{Alloc, Raw, Shared, StableBuf, ViewOwner};

use super::memory::{check_range, RegisteredMemory};
use super::provider::MrOps;
use super::recorder::Recorder;
use super::AccessFlags;
use crate::{Error, Result};
use registration::Registration;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Registered memory: a range the device can reach, its keys, and its owner `O`, which says
/// where the memory came from and keeps it alive (memory the region allocated, [`Alloc`], by
/// default).
///
/// Every handle to registered memory is an `Mr`: [`super::Pd::alloc_mr`] gives `Mr<Alloc>`,
/// [`super::Pd::register`] `Mr<Vec<u8>>` (any [`StableBuf`]), [`super::Pd::register_raw`]
/// `Mr<Raw>`, [`Mr::share`] a [`Shared`] view, and the library's registrar, cache and buffer
/// pool hand out `Mr`s with owners of their own. Dropping one deregisters what it registered
/// (work requests that still name it complete with an error instead of touching freed
/// memory), then drops its owner.
///
/// The device and peers may write the memory at any time the access flags allow, so it is
/// read and written by copies ([`Mr::read_at`], [`Mr::write_at`]) or atomically
/// ([`Mr::atomic_u64`]), never through Rust references.
///
/// ```
/// use rdmapool::fabric::*;
/// use std::sync::Arc;
/// # fn main() -> rdmapool::Result<()> {
/// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
/// let mr: Mr = pd.alloc_mr(4096, AccessFlags::all_remote())?;    // Mr<Alloc>
/// mr.write_at(0, b"hello")?;
/// let reg: Mr<Vec<u8>> = pd.register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)?;
/// let shared = Arc::new(mr);
/// let view: Mr<Shared> = Mr::share_range(&shared, 1, 4)?;         // "ello", same keys
/// assert_eq!((view.addr(), view.rkey()), (shared.addr() + 1, shared.rkey()));
/// let back: Vec<u8> = reg.into_inner();                          // deregistered
/// # let _ = back; Ok(()) }
/// ```
pub struct Mr<O = Alloc> {
    /// The registration this handle made, if it made one (a view has none: its owner keeps
    /// someone else's). Declared first: dropped before `owner`, whose memory it covers.
    reg: Option<Registration>,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    owner: O,
}

impl<O> std::fmt::Debug for Mr<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("access", &self.access)
            .field("owner", &std::any::type_name::<O>())
            .finish()
    }
}

impl<O> RegisteredMemory for Mr<O> {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl<O> Mr<O> {
    /// Wraps a provider's registration, owned by this handle, with `owner`.
    pub(super) fn registered(ops: Box<dyn MrOps>, recorder: &Arc<Recorder>, owner: O) -> Self {
        let (addr, len, lkey, rkey, access) =
            (ops.addr(), ops.len(), ops.lkey(), ops.rkey(), ops.access());
        Self {
            reg: Some(Registration::new(ops, recorder)),
            addr,
            len,
            lkey,
            rkey,
            access,
            owner,
        }
    }

    /// A handle to `[addr, addr+len)` of a registration someone else made, kept alive by
    /// `owner` (a pooled buffer's slot, a cache entry).
    ///
    /// # Safety
    /// While `owner` (or any clone of it) lives, `[addr, addr+len)` must stay mapped and
    /// registered under `lkey`/`rkey` with at least `access`, and must not be reachable
    /// through a Rust reference.
    pub unsafe fn view(
        addr: u64,
        len: usize,
        lkey: u32,
        rkey: u32,
        access: AccessFlags,
        owner: O,
    ) -> Self
    where
        O: ViewOwner,
    {
        Self {
            reg: None,
            addr,
            len,
            lkey,
            rkey,
            access,
            owner,
        }
    }

    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The owner (for owners that may be shown: [`ViewOwner`]).
    pub fn owner(&self) -> &O
    where
        O: ViewOwner,
    {
        &self.owner
    }

    /// The offset of `ptr` inside the range; an error if it lies before it or past its end.
    pub fn offset_of(&self, ptr: *const u8) -> Result<usize> {
        let off = (ptr as u64).wrapping_sub(self.addr);
        if (ptr as u64) < self.addr || off > self.len as u64 {
            return Err(Error::OutOfRange {
                what: "registered memory (an address outside it)",
                offset: ptr as u64,
                len: 0,
                limit: self.addr + self.len as u64,
            });
        }
        Ok(off as usize)
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(self.len, offset, data.len())?;
        // SAFETY: the range is inside the registered region, which every `Mr` keeps mapped
        // while it lives (its registration's memory, its owner, or the raw/view contract);
        // raw copies make no Rust reference to device-shared memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr as *mut u8).add(offset),
                data.len(),
            )
        };
        Ok(())
    }

    /// Sets the `len` bytes at `offset` to zero (a memory server wipes a chunk this way
    /// before it changes hands).
    pub fn zero_at(&self, offset: usize, len: usize) -> Result<()> {
        check_range(self.len, offset, len)?;
        // SAFETY: as in `write_at`.
        unsafe { std::ptr::write_bytes((self.addr as *mut u8).add(offset), 0, len) };
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(self.len, offset, out.len())?;
        // SAFETY: as in `write_at`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr as *const u8).add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Reads the native-endian u64 at `offset` (the format RDMA atomics use).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read_at(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// An atomic view of the aligned word at `offset`, atomic with respect to RDMA atomics.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        check_range(self.len, offset, 8)?;
        let addr = self.addr + offset as u64;
        if !addr.is_multiple_of(8) {
            return Err(Error::Misaligned {
                what: "atomic word",
                addr,
            });
        }
        // SAFETY: aligned, in bounds, and mapped for as long as the borrow of `self`.
        Ok(unsafe { &*(addr as *const AtomicU64) })
    }
}

impl<O: Send + Sync + 'static> Mr<O> {
    /// A [`Shared`] view of the whole region: same range and keys, keeping `this` alive.
    /// Views of any origin have one type, so a batch of operations can mix them.
    pub fn share(this: &Arc<Self>) -> Mr<Shared> {
        let (addr, len, lkey, rkey, access) =
            (this.addr, this.len, this.lkey, this.rkey, this.access);
        // SAFETY: the owner holds `this`, which keeps its whole range registered and mapped
        // while it lives, and shows only its keys and range, never its bytes.
        unsafe { Mr::view(addr, len, lkey, rkey, access, Shared::new(this.clone())) }
    }

    /// A [`Shared`] view of `len` bytes at `offset` (checked against the region).
    pub fn share_range(this: &Arc<Self>, offset: usize, len: usize) -> Result<Mr<Shared>> {
        check_range(this.len, offset, len)?;
        let addr = this.addr + offset as u64;
        let (lkey, rkey, access) = (this.lkey, this.rkey, this.access);
        // SAFETY: as in `share`, for a sub-range of the region.
        Ok(unsafe { Mr::view(addr, len, lkey, rkey, access, Shared::new(this.clone())) })
    }

    /// This region as a [`Shared`] view (one allocation; the region drops with the last view).
    pub fn into_shared(self) -> Mr<Shared> {
        Mr::share(&Arc::new(self))
    }
}

impl<O: ViewOwner + Clone> Clone for Mr<O> {
    /// Another view of the same range (views own no registration of their own).
    fn clone(&self) -> Self {
        // SAFETY: a clone of a view's owner keeps the range as the original does
        // (the `view` contract covers clones).
        unsafe {
            Mr::view(
                self.addr,
                self.len,
                self.lkey,
                self.rkey,
                self.access,
                self.owner.clone(),
            )
        }
    }
}

impl<B: StableBuf> Mr<B> {
    /// Deregisters (waiting for operations that use the memory) and returns the buffer with
    /// whatever the device and peers wrote into it.
    pub fn into_inner(self) -> B {
        let Mr { reg, owner, .. } = self;
        drop(reg);
        owner
    }
}

impl Mr<Raw> {
    /// Pairs a registration of a buffer's bytes with the buffer (the registrar's owned
    /// submissions: it registered `buf.stable_ptr()..+stable_len()` raw).
    #[doc(hidden)]
    pub fn into_owned<B: StableBuf>(self, buf: B) -> Mr<B> {
        let Mr {
            reg,
            addr,
            len,
            lkey,
            rkey,
            access,
            owner: Raw,
        } = self;
        Mr {
            reg,
            addr,
            len,
            lkey,
            rkey,
            access,
            owner: buf,
        }
    }
}
