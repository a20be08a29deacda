//! Options of opening a context: each provider's own, typed, chosen by variant.
//!
//! The shared model (`QpConfig`, `Endpoint`, `DeviceInfo`) carries nothing that only one
//! provider understands; what a provider needs to know about this process's setup (the soft
//! NIC's listen address, the verbs GID) travels here.

use super::admission::Admission;
use super::ProviderKind;
use crate::{Error, Result};
use std::net::SocketAddr;
use std::time::Duration;

/// A provider's options for opening a context; the variant picks the provider.
///
/// ```
/// use rdmapool::fabric::{Context, SoftConfig};
/// let cfg = SoftConfig { spin: std::time::Duration::ZERO, ..SoftConfig::from_env().unwrap() };
/// let ctx = Context::open(cfg).unwrap();
/// assert_eq!(ctx.device().name, "soft0");
/// ```
#[derive(Debug, Clone)]
pub enum ProviderOptions {
    /// The soft provider.
    Soft(SoftConfig),
    /// rdma-core verbs.
    Verbs(VerbsConfig),
}

impl ProviderOptions {
    /// The provider these options are for.
    pub fn provider(&self) -> ProviderKind {
        match self {
            Self::Soft(_) => ProviderKind::Soft,
            Self::Verbs(_) => ProviderKind::Verbs,
        }
    }
}

impl From<SoftConfig> for ProviderOptions {
    fn from(c: SoftConfig) -> Self {
        Self::Soft(c)
    }
}

impl From<VerbsConfig> for ProviderOptions {
    fn from(c: VerbsConfig) -> Self {
        Self::Verbs(c)
    }
}

/// Which path the soft provider uses to reach a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// The intra-host path when the peer is on this host, TCP otherwise.
    #[default]
    Auto,
    /// TCP, wherever the peer is.
    Tcp,
    /// The intra-host path; connecting fails if the peer is on another host.
    Local,
}

impl Transport {
    /// Parses "auto", "tcp" or "local".
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "tcp" => Ok(Self::Tcp),
            "local" => Ok(Self::Local),
            _ => Err(Error::InvalidArgument(format!(
                "unknown transport {s:?}: expected auto, tcp or local"
            ))),
        }
    }
}

/// How to open a soft context (one emulated NIC).
#[derive(Debug, Clone)]
pub struct SoftConfig {
    /// TCP listen address; loopback by default so nothing is reachable from outside.
    pub bind: SocketAddr,
    /// How long the NIC's serving loop spins for the next request, right after traffic,
    /// before it sleeps.
    pub spin: Duration,
    /// The path this NIC's QPs take to their peers.
    pub transport: Transport,
    /// Who may connect, with what proof, and how many.
    pub admission: Admission,
}

/// Loopback on a port the system picks, 50 µs of spin, [`Transport::Auto`] and
/// [`Admission::default`]: what [`SoftConfig::from_env`] gives with none of its variables set.
///
/// ```
/// use rdmapool::fabric::{Context, SoftConfig};
/// let ctx = Context::open(SoftConfig::default())?;
/// assert_eq!(ctx.device().name, "soft0");
/// # Ok::<(), rdmapool::Error>(())
/// ```
impl Default for SoftConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            spin: Duration::from_micros(50),
            transport: Transport::Auto,
            admission: Admission::default(),
        }
    }
}

impl SoftConfig {
    /// [`SoftConfig::default`], overridden by `RDMAPOOL_SOFT_BIND`, `RDMAPOOL_SOFT_SPIN_US`,
    /// `RDMAPOOL_SOFT_TRANSPORT` (auto, tcp or local) and the variables of
    /// [`Admission::from_env`].
    pub fn from_env() -> Result<Self> {
        let bind = match std::env::var("RDMAPOOL_SOFT_BIND") {
            Ok(s) => s.parse().map_err(|e| {
                Error::InvalidArgument(format!("RDMAPOOL_SOFT_BIND={s:?}: {e} (want ip:port)"))
            })?,
            Err(_) => Self::default().bind,
        };
        let spin = match std::env::var("RDMAPOOL_SOFT_SPIN_US") {
            Ok(s) => Duration::from_micros(s.parse().map_err(|e| {
                Error::InvalidArgument(format!("RDMAPOOL_SOFT_SPIN_US={s:?}: {e}"))
            })?),
            Err(_) => Self::default().spin,
        };
        let transport = match std::env::var("RDMAPOOL_SOFT_TRANSPORT") {
            Ok(s) if !s.trim().is_empty() => Transport::parse(s.trim())
                .map_err(|e| Error::InvalidArgument(format!("RDMAPOOL_SOFT_TRANSPORT: {e}")))?,
            _ => Transport::Auto,
        };
        Ok(Self {
            bind,
            spin,
            transport,
            admission: Admission::from_env()?,
        })
    }

    /// These settings with `transport` instead.
    pub fn with_transport(self, transport: Transport) -> Self {
        Self { transport, ..self }
    }
}

/// How to open a verbs context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerbsConfig {
    /// The device ("rxe0", "mlx5_0"); the first one when `None`.
    pub device: Option<String>,
    /// The GID index to address peers with; when `None`, the RoCE v2 IPv4 GID if there is
    /// one, else the first RoCE v2 GID, else 0.
    pub gid_index: Option<u8>,
}

impl VerbsConfig {
    /// From `RDMAPOOL_DEVICE` and `RDMAPOOL_GID_INDEX` (unset or empty: the defaults).
    pub fn from_env() -> Result<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let gid_index = match var("RDMAPOOL_GID_INDEX") {
            Some(t) => Some(t.trim().parse::<u8>().map_err(|_| {
                Error::InvalidArgument(format!(
                    "RDMAPOOL_GID_INDEX={t:?} is out of range: want a GID table index, 0..=255"
                ))
            })?),
            None => None,
        };
        Ok(Self {
            device: var("RDMAPOOL_DEVICE"),
            gid_index,
        })
    }
}
