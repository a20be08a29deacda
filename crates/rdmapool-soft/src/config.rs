//! How to open a soft context (one emulated NIC): [`SoftConfig`], and the path its QPs take
//! to their peers ([`Transport`]).

use crate::admission::Admission;
use crate::SoftError;
use std::net::SocketAddr;
use std::time::Duration;

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
    pub fn parse(s: &str) -> Result<Self, SoftError> {
        match s {
            "auto" => Ok(Self::Auto),
            "tcp" => Ok(Self::Tcp),
            "local" => Ok(Self::Local),
            _ => Err(SoftError::Setting {
                name: "transport".into(),
                value: s.into(),
                reason: "expected auto, tcp or local".into(),
            }),
        }
    }
}

/// How to open a soft context (one emulated NIC).
#[derive(Debug, Clone)]
pub struct SoftConfig {
    /// TCP listen address; loopback by default so nothing is reachable from outside.
    pub bind: SocketAddr,
    /// How long the NIC's serving loop spins at most for the next request, right after
    /// traffic, before it sleeps (it spins less after spins that found nothing, and again
    /// up to this once requests follow closely: `rdmapool_core::util::spin::AdaptiveSpin`).
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
/// use rdmapool_core::fabric::Context;
/// use rdmapool_soft::SoftConfig;
/// let ctx = Context::open(SoftConfig::default())?;
/// assert_eq!(ctx.device().name, "soft0");
/// # Ok::<(), rdmapool_core::Error>(())
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
    pub fn from_env() -> Result<Self, SoftError> {
        let bind = match std::env::var("RDMAPOOL_SOFT_BIND") {
            Ok(s) => s.parse().map_err(|e| SoftError::Setting {
                name: "RDMAPOOL_SOFT_BIND".into(),
                value: s.clone(),
                reason: format!("{e} (want ip:port)"),
            })?,
            Err(_) => Self::default().bind,
        };
        let spin = match std::env::var("RDMAPOOL_SOFT_SPIN_US") {
            Ok(s) => Duration::from_micros(s.parse().map_err(|e| SoftError::Setting {
                name: "RDMAPOOL_SOFT_SPIN_US".into(),
                value: s.clone(),
                reason: format!("{e} (want microseconds)"),
            })?),
            Err(_) => Self::default().spin,
        };
        let transport = match std::env::var("RDMAPOOL_SOFT_TRANSPORT") {
            Ok(s) if !s.trim().is_empty() => {
                Transport::parse(s.trim()).map_err(|_| SoftError::Setting {
                    name: "RDMAPOOL_SOFT_TRANSPORT".into(),
                    value: s.clone(),
                    reason: "expected auto, tcp or local".into(),
                })?
            }
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
