//! Connection setup in the style of RDMA CM: listen, receive a request with its private
//! data, accept or reject it with private data of your own, connect.
//!
//! This is how region descriptors travel: put [`crate::fabric::RemoteRegion::to_bytes`] in the
//! private data of the accept (or the request). At most [`MAX_CONNECT_PRIVATE_DATA`] bytes
//! travel with a request, [`MAX_ACCEPT_PRIVATE_DATA`] with an accept and
//! [`MAX_REJECT_PRIVATE_DATA`] with a reject: RDMA CM's limits for RC on InfiniBand (56, 196
//! and 148 bytes, the last the CM REJ's `IB_CM_REJ_PRIVATE_DATA_SIZE`) less the two-byte
//! frame that says where the data ends (RDMA CM pads what it delivers; docs/PROTOCOL.md has
//! the bytes, and [`encode_private_data`]/[`decode_private_data`] implement them for any
//! transport). Both managers check the same limits, the TCP one included; longer private
//! data is [`CoreError::OutOfLimits`](crate::CoreError::OutOfLimits), never cut.
//!
//! ```
//! use rdmapool_pool::conn::*;
//! // RDMA CM's sizes for a request, an accept and a reject, less the frame.
//! assert_eq!(MAX_CONNECT_PRIVATE_DATA, 56 - 2);
//! assert_eq!(MAX_ACCEPT_PRIVATE_DATA, 196 - 2);
//! assert_eq!(MAX_REJECT_PRIVATE_DATA, 148 - 2);
//! ```
//!
//! One [`Listener`] and one [`connect`], over either connection [`Manager`]:
//! * [`Manager::RdmaCm`]: librdmacm (verbs provider), which resolves the address and route
//!   itself and interoperates with C peers on rdma-core; the QPs are still ours (created on
//!   the given PD and CQs), RDMA CM only says how to move them between states.
//! * [`Manager::Tcp`]: a handshake over a TCP connection of its own (the "CM port") carrying
//!   the QP endpoints both ways, then bringing both QPs to RTS in the order RC needs. It works
//!   with every provider.
//!
//! `Manager::from(provider)` (or `from(&pd)`) picks the natural one: RDMA CM on verbs, TCP on
//! soft.
//!
//! ```
//! use rdmapool_pool::conn::{connect, Listener};
//! use rdmapool_pool::fabric::*;
//! use std::time::Duration;
//! # fn main() -> rdmapool_pool::Result<()> {
//! let server = Context::open(SoftConfig::default())?;
//! let client = Context::open(SoftConfig::default())?;
//! let (spd, scq) = (server.alloc_pd()?, server.create_cq(16)?);
//! let region = spd.alloc_mr(4096, AccessFlags::all_remote())?;
//! let listener = Listener::bind(&spd, "127.0.0.1:0".parse().unwrap())?;
//! let addr = listener.local_addr();
//! let t = std::thread::spawn(move || -> rdmapool_pool::Result<Qp> {
//!     let req = listener.get_request(Duration::from_secs(10))?;
//!     assert_eq!(req.private_data(), b"hello");
//!     req.accept(&spd, &scq, &scq, &QpConfig::default(), &region.remote_region().to_bytes())
//! });
//! let (cpd, ccq) = (client.alloc_pd()?, client.create_cq(16)?);
//! let cfg = QpConfig::default();
//! let spec = ConnectSpec::new(&cpd, &ccq, &cfg).private_data(b"hello").timeout(Duration::from_secs(10));
//! let conn = connect(&cpd, addr, &spec)?;
//! let remote = RemoteRegion::from_bytes(&conn.private_data)?;
//! assert_eq!(remote.len, 4096);
//! let _server_qp = t.join().unwrap()?;
//! assert_eq!(conn.qp.state(), QpState::Rts);
//! # Ok(()) }
//! ```

mod message;
mod pending;
mod tcp;

pub use crate::fabric::private_data::{
    decode_private_data, encode_private_data, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA,
    MAX_REJECT_PRIVATE_DATA,
};

use crate::fabric::private_data::check_private;
use crate::fabric::provider::{CmListenerOps, CmRequestOps, ConnectionManager};
pub use crate::fabric::ConnectSpec;
use crate::fabric::{Cq, Pd, ProviderKind, Qp, QpConfig};
use crate::{Error, Result};
use std::net::SocketAddr;
use std::time::Duration;

/// Which connection manager carries the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    /// rdmapool's handshake over a TCP connection of its own (every provider).
    Tcp,
    /// librdmacm (verbs provider); interoperates with C peers on rdma-core.
    RdmaCm,
}

impl Manager {
    /// The provider connection manager behind a native manager (RDMA CM: the verbs
    /// provider's), reached through the provider interface; `None` for the TCP CM port.
    fn native(self) -> Result<Option<&'static dyn ConnectionManager>> {
        let kind = match self {
            Manager::Tcp => return Ok(None),
            Manager::RdmaCm => ProviderKind::Verbs,
        };
        crate::providers::find(kind)
            .connection_manager()
            .map(Some)
            .ok_or_else(|| {
                Error::Core(crate::CoreError::Unsupported(format!(
                    "the {kind} provider has no {self:?}"
                )))
            })
    }
}

impl From<ProviderKind> for Manager {
    /// The provider's natural manager: RDMA CM on verbs, TCP on soft.
    fn from(p: ProviderKind) -> Self {
        match p {
            ProviderKind::Verbs => Manager::RdmaCm,
            ProviderKind::Soft => Manager::Tcp,
        }
    }
}

impl From<&Pd> for Manager {
    /// The natural manager of the PD's provider.
    fn from(pd: &Pd) -> Self {
        pd.provider().into()
    }
}

/// A passive side: listens for connection requests.
pub struct Listener {
    kind: ListenerKind,
    addr: SocketAddr,
}

enum ListenerKind {
    Tcp(pending::CmPort),
    Native(Manager, Box<dyn CmListenerOps>),
}

impl Listener {
    /// Listens for connection requests on `addr` (port 0 picks a free one) through
    /// `manager`: [`Manager::Tcp`] listens on that TCP port; [`Manager::RdmaCm`] binds an
    /// RDMA CM id to an address of an RDMA device's netdev (it needs rdma-core and a device:
    /// otherwise a typed error says what is missing).
    pub fn bind(manager: impl Into<Manager>, addr: SocketAddr) -> Result<Self> {
        let manager = manager.into();
        match manager.native()? {
            None => {
                let (listener, addr) = tcp::listen(addr)?;
                Ok(Self {
                    kind: ListenerKind::Tcp(listener),
                    addr,
                })
            }
            Some(native) => {
                let l = native.listen(addr)?;
                let addr = l.local_addr();
                Ok(Self {
                    kind: ListenerKind::Native(manager, l),
                    addr,
                })
            }
        }
    }

    /// The manager this listener uses.
    pub fn manager(&self) -> Manager {
        match self.kind {
            ListenerKind::Tcp(_) => Manager::Tcp,
            ListenerKind::Native(m, _) => m,
        }
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits up to `timeout` for the next connection request. On the TCP CM port, peers
    /// that send garbage are dropped and waiting goes on. An RDMA CM request whose private
    /// data is not framed ([`decode_private_data`]) is rejected (the requester gets
    /// [`CoreError::Rejected`](crate::CoreError::Rejected) saying why) and reported here as [`CoreError::BadPrivateData`](crate::CoreError::BadPrivateData) with
    /// the raw bytes; call again for the next request.
    ///
    /// [`CoreError::Rejected`](crate::CoreError::Rejected): crate::CoreError::Rejected
    /// [`CoreError::BadPrivateData`](crate::CoreError::BadPrivateData): crate::CoreError::BadPrivateData
    pub fn get_request(&self, timeout: Duration) -> Result<ConnRequest> {
        let port = match &self.kind {
            ListenerKind::Tcp(p) => p,
            ListenerKind::Native(_, l) => {
                return Ok(ConnRequest {
                    kind: RequestKind::Native(l.get_request(timeout)?),
                    timeout,
                })
            }
        };
        Ok(ConnRequest {
            kind: RequestKind::Tcp(tcp::get_request(port, timeout)?),
            timeout,
        })
    }
}

/// A connection request waiting for [`ConnRequest::accept`] or [`ConnRequest::reject`].
pub struct ConnRequest {
    kind: RequestKind,
    timeout: Duration,
}

enum RequestKind {
    Tcp(tcp::TcpRequest),
    Native(Box<dyn CmRequestOps>),
}

impl ConnRequest {
    /// The requester's private data.
    pub fn private_data(&self) -> &[u8] {
        match &self.kind {
            RequestKind::Tcp(r) => r.private_data(),
            RequestKind::Native(r) => r.private_data(),
        }
    }

    /// The requester's address: its TCP address on the CM port, or RDMA CM's peer address
    /// (`None` if RDMA CM has none of IPv4 or IPv6). Servers bound handshakes per address
    /// with it.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        match &self.kind {
            RequestKind::Tcp(r) => Some(r.peer()),
            RequestKind::Native(r) => r.peer_addr(),
        }
    }

    /// The private data as it arrived: on RDMA CM with its frame and padding (56 bytes on
    /// InfiniBand RC), on the TCP CM port the same bytes as [`ConnRequest::private_data`].
    pub fn raw_private_data(&self) -> &[u8] {
        match &self.kind {
            RequestKind::Tcp(r) => r.private_data(),
            RequestKind::Native(r) => r.raw_private_data(),
        }
    }

    /// Creates a QP, answers with `private_data`, and returns the QP (in RTS) once the
    /// requester reports it is ready to use (waiting up to the longer of the
    /// [`Listener::get_request`] timeout and `cfg.timeout`). Dropping the QP disconnects. On RDMA CM the
    /// READ/atomic depths are negotiated: this side's responder resources are the lesser of
    /// the requester's initiator depth and this QP's `max_rd_atomic`, and its initiator depth
    /// the lesser of the requester's responder resources and the same bound.
    pub fn accept(
        self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
        private_data: &[u8],
    ) -> Result<Qp> {
        check_private(
            private_data,
            MAX_ACCEPT_PRIVATE_DATA,
            "bytes of private data in an accept",
        )?;
        // The requester's last message comes a round trip or two after ours (more on a lossy
        // link): not bounded by how often the caller polls for requests.
        let timeout = self.timeout.max(cfg.timeout);
        let r = match self.kind {
            RequestKind::Native(r) => r
                .accept(pd, send_cq, recv_cq, cfg, private_data, timeout)
                .map_err(Error::from),
            RequestKind::Tcp(r) => r.accept(pd, send_cq, recv_cq, cfg, private_data, timeout),
        };
        pd.recorder().record_connection(false, r.is_ok());
        r
    }

    /// Refuses the request; the requester gets [`CoreError::Rejected`](crate::CoreError::Rejected) with `private_data`
    /// (at most [`MAX_REJECT_PRIVATE_DATA`] bytes).
    ///
    /// [`CoreError::Rejected`](crate::CoreError::Rejected): crate::CoreError::Rejected
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        check_private(
            private_data,
            MAX_REJECT_PRIVATE_DATA,
            "bytes of private data in a reject",
        )?;
        match self.kind {
            RequestKind::Native(r) => Ok(r.reject(private_data)?),
            RequestKind::Tcp(r) => r.reject(private_data),
        }
    }
}

/// An established connection on the active side.
pub struct Connection {
    /// The QP, in RTS.
    pub qp: Qp,
    /// The private data the passive side accepted with.
    pub private_data: Vec<u8>,
    /// The same as it arrived: on RDMA CM with its frame and padding.
    pub raw_private_data: Vec<u8>,
}

/// Connects through `manager` (a [`Manager`], or a PD or provider for its natural one) to a
/// [`Listener`] at `addr`, with the QP, private data and timeout of `spec`
/// ([`ConnectSpec`]); returns the QP (on `spec.pd`, in RTS) with the acceptor's private
/// data. Dropping the QP disconnects.
///
/// Errors: [`CoreError::Rejected`](crate::CoreError::Rejected) with the acceptor's reason; [`CoreError::BadPrivateData`](crate::CoreError::BadPrivateData) (raw
/// bytes inside) when an RDMA CM peer accepted with unframed private data, after which the
/// connection is closed; [`CoreError::Connection`](crate::CoreError::Connection) when the peer is unreachable or silent.
///
/// [`CoreError::Rejected`](crate::CoreError::Rejected): crate::CoreError::Rejected
/// [`CoreError::BadPrivateData`](crate::CoreError::BadPrivateData): crate::CoreError::BadPrivateData
/// [`CoreError::Connection`](crate::CoreError::Connection): crate::CoreError::Connection
pub fn connect(
    manager: impl Into<Manager>,
    addr: SocketAddr,
    spec: &ConnectSpec<'_>,
) -> Result<Connection> {
    check_private(
        spec.private_data,
        MAX_CONNECT_PRIVATE_DATA,
        "bytes of private data in a connection request",
    )?;
    let r = connect_with(manager.into(), addr, spec);
    spec.pd.recorder().record_connection(true, r.is_ok());
    r
}

fn connect_with(manager: Manager, addr: SocketAddr, spec: &ConnectSpec<'_>) -> Result<Connection> {
    match manager.native()? {
        None => tcp::connect(addr, spec),
        Some(native) => {
            let (qp, raw) = native.connect(addr, spec)?;
            // On a bad frame the QP (and with it the connection) is dropped here.
            let private = decode_private_data(&raw)?.to_vec();
            Ok(Connection {
                qp,
                private_data: private,
                raw_private_data: raw,
            })
        }
    }
}
