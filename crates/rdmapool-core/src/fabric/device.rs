//! Device discovery: which providers exist here and what their devices can do.

use std::fmt;

/// The provider behind a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// rdmapool's software RDMA provider (pure Rust, no NIC needed).
    Soft,
    /// rdma-core verbs (real NICs and SoftRoCE).
    Verbs,
}

impl ProviderKind {
    /// The provider's name as the CLI and environment spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Soft => "soft",
            Self::Verbs => "verbs",
        }
    }

    /// Parses "soft" or "verbs".
    pub fn parse(s: &str) -> crate::Result<Self> {
        match s {
            "soft" => Ok(Self::Soft),
            "verbs" => Ok(Self::Verbs),
            _ => Err(crate::Error::BadSetting {
                name: "provider".into(),
                value: s.into(),
                reason: "expected soft or verbs".into(),
            }),
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How atomics behave, mirroring `enum ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCap {
    /// No atomics.
    None,
    /// Atomic with respect to other RDMA atomics through this device only.
    Hca,
    /// Atomic with respect to the CPU and every device (the soft provider uses CPU atomics).
    Global,
}

/// A device and its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The provider that drives it.
    pub provider: ProviderKind,
    /// The device name ("soft0", "mlx5_0", "rxe0", ...).
    pub name: String,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
    /// Largest single message in bytes.
    pub max_msg_size: u32,
    /// Most work requests one queue of a QP holds.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries in one work request.
    pub max_sge: u32,
    /// Most entries a completion queue holds.
    pub max_cqe: u32,
    /// Most memory regions at once.
    pub max_mr: u32,
    /// Atomic support.
    pub atomic_cap: AtomicCap,
    /// Whether RC regions can be registered with [`crate::fabric::AccessFlags::ON_DEMAND`].
    pub on_demand_paging: bool,
    /// The device's ports (verbs; empty for the soft provider, which has none).
    pub ports: Vec<PortInfo>,
}

/// One port of a verbs device, as `ibv_devinfo` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub num: u8,
    /// "ACTIVE", "DOWN", ...
    pub state: String,
    /// "InfiniBand" or "Ethernet" (RoCE).
    pub link_layer: String,
    /// Local identifier (InfiniBand).
    pub lid: u16,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    /// The GID index this library uses (RoCE v2 IPv4 when there is one).
    pub gid_index: u8,
    /// That GID, as colon-separated hex.
    pub gid: String,
    /// Whether that GID is a RoCE v2 GID.
    pub roce_v2: bool,
}

impl DeviceInfo {
    /// The checks every provider makes before registering: rights that fit together, a
    /// non-empty region within `max_mr_size`, and on-demand paging only where supported.
    #[doc(hidden)]
    pub fn check_registration(
        &self,
        len: usize,
        access: crate::fabric::AccessFlags,
    ) -> crate::Result<()> {
        use crate::Error;
        access.validate()?;
        if len == 0 || len as u64 > self.max_mr_size {
            return Err(Error::OutOfLimits {
                what: "region length (max_mr_size)",
                value: len as u64,
                min: 1,
                max: self.max_mr_size,
            });
        }
        if access.contains(crate::fabric::AccessFlags::ON_DEMAND) && !self.on_demand_paging {
            return Err(Error::Unsupported(format!(
                "device {} does not support on-demand paging (IBV_ACCESS_ON_DEMAND) for RC",
                self.name
            )));
        }
        Ok(())
    }
}

/// Whether a provider can be used here and, if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderStatus {
    /// The provider.
    pub provider: ProviderKind,
    /// Its devices (empty when unavailable).
    pub devices: Vec<DeviceInfo>,
    /// Why it cannot be used, when it cannot.
    pub unavailable: Option<String>,
}
