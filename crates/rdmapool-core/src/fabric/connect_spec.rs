//! What the active side of a connection asks for, apart from where it connects and through
//! which manager: [`ConnectSpec`].

use super::{Cq, Pd, QpConfig};
use std::time::Duration;

/// The QP an active-side connection makes (on `pd`, with its CQs and configuration), the
/// private data it sends with the request, and how long it waits for the answer. One value
/// instead of six arguments, taken by `rdmapool::conn::connect` and by a provider's
/// [`ConnectionManager::connect`](super::provider::ConnectionManager::connect).
///
/// ```
/// # use rdmapool_core::fabric::*;
/// # fn spec(pd: &Pd, cq: &Cq, cfg: &QpConfig) {
/// let spec = ConnectSpec::new(pd, cq, cfg)
///     .private_data(b"hello")
///     .timeout(std::time::Duration::from_secs(2));
/// assert_eq!(spec.private_data, b"hello");
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct ConnectSpec<'a> {
    /// The protection domain the QP is made on.
    pub pd: &'a Pd,
    /// The CQ of its sends.
    pub send_cq: &'a Cq,
    /// The CQ of its receives.
    pub recv_cq: &'a Cq,
    /// Its configuration (depths, SGEs, READ/atomic depths).
    pub qp: &'a QpConfig,
    /// Sent with the request (at most the manager's limit: 54 bytes on RDMA CM).
    pub private_data: &'a [u8],
    /// How long the whole handshake may take.
    pub timeout: Duration,
}

impl<'a> ConnectSpec<'a> {
    /// How long a connection waits by default: 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A QP on `pd` with `cq` for both sends and receives, configured by `qp`; no private
    /// data; [`ConnectSpec::DEFAULT_TIMEOUT`].
    pub fn new(pd: &'a Pd, cq: &'a Cq, qp: &'a QpConfig) -> Self {
        Self {
            pd,
            send_cq: cq,
            recv_cq: cq,
            qp,
            private_data: &[],
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// With a receive CQ of its own.
    pub fn recv_cq(mut self, recv_cq: &'a Cq) -> Self {
        self.recv_cq = recv_cq;
        self
    }

    /// With `private_data` sent along.
    pub fn private_data(mut self, private_data: &'a [u8]) -> Self {
        self.private_data = private_data;
        self
    }

    /// Waiting up to `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}
