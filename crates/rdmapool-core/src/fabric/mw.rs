//! Memory windows: a remote key that covers exactly a chosen range of a region, granted and
//! revoked through the send queue, in the style of verbs' type-2 windows.

use super::provider::MwOps;
use super::{AccessFlags, RemoteRegion};
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;

/// A type-2 memory window ([`super::Pd::alloc_mw`]).
///
/// Bind it to a range of a region that allows [`AccessFlags::MW_BIND`] with
/// [`super::Qp::post_bind_mw`]: once the bind completes, its remote key reaches exactly that
/// range, with the rights given, and only through that QP's connection. Invalidate it with
/// [`super::WrOp::LocalInvalidate`] (or drop it): the key then fails with a remote access
/// error. Unbound, its key grants nothing.
///
/// On verbs this is `ibv_alloc_mw(IBV_MW_TYPE_2)`; a device without type-2 windows makes
/// [`super::Pd::alloc_mw`] fail with [`crate::Error::Unsupported`]. The soft provider
/// implements the same semantics (bind, invalidate, QP association, access checks).
///
/// The library keeps each window's state (unbound, or bound through one QP under one key)
/// and refuses, before anything is posted and with [`crate::Error::Window`] on every
/// provider, what a device would fail or crash on: binding a bound window, binding zero
/// bytes, a region that is gone or of another PD, and a
/// [`super::WrOp::LocalInvalidate`] of a key that is not a window bound through the QP it is
/// posted on (on rxe 6.1 invalidating an unbound window dereferences NULL in the kernel).
///
/// Invalidate (or drop) a window before dropping the region it is bound to: the soft
/// provider then revokes the window with the region, but verbs devices may refuse to
/// deregister a region with bound windows (the registration then stays until they go).
///
/// Invalidate (or drop) a window before dropping the QP it was bound through: a bound
/// window holds a reference to its QP, and on rxe 6.1 destroying such a QP waits about
/// 50 s for it (the soft provider does not wait).
pub struct Mw {
    inner: Box<dyn MwOps>,
    provider: super::ProviderKind,
    /// The windows of the PD it was allocated on.
    table: Arc<WindowTable>,
}

impl Drop for Mw {
    fn drop(&mut self) {
        // Deallocating a bound window unbinds it: its key no longer names one.
        self.table.lock().forget(self.inner.rkey());
    }
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw").field("rkey", &self.rkey()).finish()
    }
}

impl Mw {
    #[doc(hidden)]
    pub fn new(
        inner: Box<dyn MwOps>,
        provider: super::ProviderKind,
        table: Arc<WindowTable>,
    ) -> Self {
        Self {
            inner,
            provider,
            table,
        }
    }

    /// The window table of the PD it belongs to.
    #[doc(hidden)]
    pub fn table(&self) -> &Arc<WindowTable> {
        &self.table
    }

    /// The provider of the device it was allocated on.
    #[doc(hidden)]
    pub fn provider(&self) -> super::ProviderKind {
        self.provider
    }

    #[doc(hidden)]
    pub fn ops(&self) -> &dyn MwOps {
        self.inner.as_ref()
    }

    /// The current remote key: after a bind, the one it returned.
    pub fn rkey(&self) -> u32 {
        self.inner.rkey()
    }
}

/// A window bound by [`super::Qp::post_bind_mw`]: what to hand the peer once the bind's
/// completion arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundWindow {
    /// The range and its new remote key.
    pub region: RemoteRegion,
    /// The rights granted.
    pub access: AccessFlags,
}

/// Why the library refused a memory-window request before posting it
/// ([`crate::Error::Window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WindowError {
    /// The window is bound (under `rkey`); a type-2 window is bound once, then invalidated.
    #[error("the window is bound under rkey {rkey:#x}; invalidate it before binding it again")]
    AlreadyBound {
        /// Its current key.
        rkey: u32,
    },
    /// A bind of zero bytes: it would grant nothing (rxe fails it with a bind error
    /// completion and moves the QP to ERR).
    #[error("a window of zero bytes grants nothing")]
    ZeroLength,
    /// The window was allocated on another PD than the QP's.
    #[error("the window belongs to another protection domain than the QP")]
    WindowOfAnotherPd,
    /// The region named by `lkey` is not registered (any more) in this context.
    #[error("lkey {lkey:#x} names no live region of this context")]
    RegionGone {
        /// The region's local key.
        lkey: u32,
    },
    /// The region belongs to another PD than the QP's (rxe 6.1 binds it anyway).
    #[error("the region (lkey {lkey:#x}) belongs to another protection domain than the QP")]
    RegionOfAnotherPd {
        /// The region's local key.
        lkey: u32,
    },
    /// A local invalidate of a key that names no window bound through this library.
    #[error("rkey {rkey:#x} names no bound window of this PD")]
    NotBound {
        /// The key.
        rkey: u32,
    },
    /// A local invalidate posted on another QP than the one the window was bound through.
    #[error("rkey {rkey:#x} was bound through QP {bound_qpn}; invalidate it there")]
    BoundThroughAnotherQp {
        /// The key.
        rkey: u32,
        /// The QP it was bound through.
        bound_qpn: u32,
    },
}

/// The bound windows of one PD: each bound key and the QP it was bound through.
#[derive(Default)]
#[doc(hidden)]
pub struct WindowTable {
    bound: Mutex<Windows>,
}

/// The table's contents, while its lock is held.
#[derive(Default)]
#[doc(hidden)]
pub struct Windows {
    by_rkey: HashMap<u32, u32>,
}

impl WindowTable {
    #[doc(hidden)]
    pub fn lock(&self) -> MutexGuard<'_, Windows> {
        self.bound.lock()
    }
}

impl Windows {
    /// Checks that `rkey` may be bound (its window is unbound).
    #[doc(hidden)]
    pub fn check_unbound(&self, rkey: u32) -> Result<(), WindowError> {
        match self.by_rkey.contains_key(&rkey) {
            true => Err(WindowError::AlreadyBound { rkey }),
            false => Ok(()),
        }
    }

    /// Records a bind posted through QP `qpn` under `rkey`.
    #[doc(hidden)]
    pub fn bound(&mut self, rkey: u32, qpn: u32) {
        self.by_rkey.insert(rkey, qpn);
    }

    /// Checks that a local invalidate of `rkey` on QP `qpn` names a window bound there.
    #[doc(hidden)]
    pub fn check_invalidate(&self, rkey: u32, qpn: u32) -> Result<(), WindowError> {
        match self.by_rkey.get(&rkey) {
            None => Err(WindowError::NotBound { rkey }),
            Some(&q) if q != qpn => Err(WindowError::BoundThroughAnotherQp { rkey, bound_qpn: q }),
            Some(_) => Ok(()),
        }
    }

    /// Forgets `rkey` (its window was invalidated or deallocated).
    #[doc(hidden)]
    pub fn forget(&mut self, rkey: u32) {
        self.by_rkey.remove(&rkey);
    }

    /// Keys of the windows bound through QP `qpn`.
    #[doc(hidden)]
    pub fn bound_through(&self, qpn: u32) -> usize {
        self.by_rkey.values().filter(|&&q| q == qpn).count()
    }
}
