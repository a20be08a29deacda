//! Memory-region access flags.

bitflags::bitflags! {
    /// What a memory region allows, mirroring `ibv_access_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local device may write the region (READ targets, atomic results, RECV buffers).
        const LOCAL_WRITE = 1;
        /// Remote peers may RDMA WRITE into the region.
        const REMOTE_WRITE = 2;
        /// Remote peers may RDMA READ from the region.
        const REMOTE_READ = 4;
        /// Remote peers may perform 8-byte atomics on the region.
        const REMOTE_ATOMIC = 8;
        /// Memory windows may be bound to the region ([`crate::fabric::Mw`]).
        const MW_BIND = 16;
        /// On-demand paging: register without pinning; the device faults pages in.
        /// The soft provider then skips mlock; verbs needs a device with RC ODP support.
        const ON_DEMAND = 64;
    }
}

impl AccessFlags {
    /// Everything: local write and all remote access.
    pub const fn all_remote() -> Self {
        // Not `all()`: that would include ON_DEMAND.
        Self::LOCAL_WRITE
            .union(Self::REMOTE_WRITE)
            .union(Self::REMOTE_READ)
            .union(Self::REMOTE_ATOMIC)
    }

    /// Checks the verbs rule that remote write or atomic access requires local write.
    pub fn validate(self) -> crate::Result<()> {
        if self.intersects(Self::REMOTE_WRITE | Self::REMOTE_ATOMIC)
            && !self.contains(Self::LOCAL_WRITE)
        {
            return Err(crate::Error::BadAccess {
                access: self,
                reason: "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE",
            });
        }
        Ok(())
    }
}
