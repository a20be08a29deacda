//! The one access check of the soft NIC.
//!
//! Every path that touches memory on behalf of a work request asks here: the responder for
//! a request from the wire, the intra-host path against a peer's control page, the requester
//! for its local SGEs and the key table for memory windows. An HCA makes the same checks; the
//! order (alignment, then key, then PD, rights and bounds) gives the status rxe reports.

use crate::fabric::{AccessFlags, WcStatus};

/// What a key grants: a range, rights and the protection domain it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// First byte the key covers.
    pub base: u64,
    /// Bytes it covers.
    pub len: u64,
    /// Rights it grants.
    pub access: AccessFlags,
    /// The protection domain it belongs to.
    pub pd: u32,
}

impl Grant {
    /// Whether `[addr, addr+len)` lies inside the grant (no overflow at either end).
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let Some(limit) = self.base.checked_add(self.len) else {
            return false;
        };
        addr >= self.base && end <= limit
    }

    /// The check itself: same PD, every right in `need`, the whole range inside.
    pub fn allows(&self, pd: u32, need: AccessFlags, addr: u64, len: u64) -> bool {
        self.pd == pd && self.access.contains(need) && self.covers(addr, len)
    }
}

/// What a remote request asks for, as the target's NIC sees it.
#[derive(Debug, Clone, Copy)]
pub struct RemoteAccess {
    /// The PD of the QP the request arrived on.
    pub pd: u32,
    /// The rights it needs.
    pub need: AccessFlags,
    /// Target address and length.
    pub addr: u64,
    pub len: u64,
    /// An atomic: the address must be 8-byte aligned.
    pub atomic: bool,
}

impl RemoteAccess {
    /// The status a remote request completes with: `Ok` if `grant` (what its rkey names, or
    /// `None` for an unknown key) allows it.
    pub fn check(&self, grant: Option<Grant>) -> Result<(), WcStatus> {
        if self.atomic && !self.addr.is_multiple_of(8) {
            return Err(WcStatus::RemInvReqErr);
        }
        match grant {
            Some(g) if g.allows(self.pd, self.need, self.addr, self.len) => Ok(()),
            _ => Err(WcStatus::RemAccessErr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Grant = Grant {
        base: 0x1000,
        len: 0x100,
        access: AccessFlags::REMOTE_WRITE,
        pd: 7,
    };

    fn req(addr: u64, len: u64) -> RemoteAccess {
        RemoteAccess {
            pd: 7,
            need: AccessFlags::REMOTE_WRITE,
            addr,
            len,
            atomic: false,
        }
    }

    #[test]
    fn bounds_rights_pd_and_alignment() {
        assert_eq!(req(0x1000, 0x100).check(Some(G)), Ok(()));
        assert_eq!(
            req(0x1001, 0x100).check(Some(G)),
            Err(WcStatus::RemAccessErr)
        );
        assert_eq!(req(0xfff, 1).check(Some(G)), Err(WcStatus::RemAccessErr));
        assert_eq!(req(u64::MAX, 2).check(Some(G)), Err(WcStatus::RemAccessErr));
        assert_eq!(req(0x1000, 8).check(None), Err(WcStatus::RemAccessErr));
        let other_pd = RemoteAccess {
            pd: 8,
            ..req(0x1000, 8)
        };
        assert_eq!(other_pd.check(Some(G)), Err(WcStatus::RemAccessErr));
        let read = RemoteAccess {
            need: AccessFlags::REMOTE_READ,
            ..req(0x1000, 8)
        };
        assert_eq!(read.check(Some(G)), Err(WcStatus::RemAccessErr));
        // Misalignment is reported before anything else, even for an unknown key.
        let atomic = RemoteAccess {
            atomic: true,
            ..req(0x1004, 8)
        };
        assert_eq!(atomic.check(None), Err(WcStatus::RemInvReqErr));
        let end = Grant {
            base: u64::MAX - 7,
            len: 8,
            ..G
        };
        assert!(!end.covers(u64::MAX - 7, 8), "base+len overflows: refused");
    }
}
