//! Memory windows: a remote key that covers exactly a chosen range of a region, granted and
//! revoked through the send queue, in the style of verbs' type-2 windows.

use super::provider::MwOps;
use super::{AccessFlags, RemoteRegion};

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
/// Invalidate (or drop) a window before dropping the region it is bound to: the soft
/// provider then revokes the window with the region, but verbs devices may refuse to
/// deregister a region with bound windows (the registration then stays until they go).
pub struct Mw {
    inner: Box<dyn MwOps>,
    provider: super::ProviderKind,
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw").field("rkey", &self.rkey()).finish()
    }
}

impl Mw {
    pub(crate) fn new(inner: Box<dyn MwOps>, provider: super::ProviderKind) -> Self {
        Self { inner, provider }
    }

    /// The provider of the device it was allocated on.
    pub(crate) fn provider(&self) -> super::ProviderKind {
        self.provider
    }

    pub(crate) fn ops(&self) -> &dyn MwOps {
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
