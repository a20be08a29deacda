//! Connection setup in the style of RDMA CM: listen, receive a request with its private
//! data, accept or reject it with private data of your own, connect.
//!
//! This is how region descriptors travel: put [`crate::fabric::RemoteRegion::to_bytes`] in the
//! private data of the accept (or the request). At most [`MAX_CONNECT_PRIVATE_DATA`] bytes
//! travel with a request and [`MAX_ACCEPT_PRIVATE_DATA`] with an accept or reject: RDMA CM's
//! limits for RC on InfiniBand (56 and 196 bytes) less the two-byte frame that says where the
//! data ends (RDMA CM pads what it delivers; docs/PROTOCOL.md has the bytes, and
//! [`encode_private_data`]/[`decode_private_data`] implement them for any transport).
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
//! use rdmapool::conn::{connect, Listener};
//! use rdmapool::fabric::*;
//! use std::time::Duration;
//! # fn main() -> rdmapool::Result<()> {
//! let (server, client) = (Context::open_soft()?, Context::open_soft()?);
//! let (spd, scq) = (server.alloc_pd()?, server.create_cq(16)?);
//! let region = spd.alloc_mr(4096, AccessFlags::all_remote())?;
//! let listener = Listener::bind(&spd, "127.0.0.1:0".parse().unwrap())?;
//! let addr = listener.local_addr();
//! let t = std::thread::spawn(move || -> rdmapool::Result<Qp> {
//!     let req = listener.get_request(Duration::from_secs(10))?;
//!     assert_eq!(req.private_data(), b"hello");
//!     req.accept(&spd, &scq, &scq, &QpConfig::default(), &region.remote_region().to_bytes())
//! });
//! let (cpd, ccq) = (client.alloc_pd()?, client.create_cq(16)?);
//! let conn = connect(&cpd, addr, &cpd, &ccq, &ccq, &QpConfig::default(), b"hello", Duration::from_secs(10))?;
//! let remote = RemoteRegion::from_bytes(&conn.private_data)?;
//! assert_eq!(remote.len, 4096);
//! let _server_qp = t.join().unwrap()?;
//! assert_eq!(conn.qp.state(), QpState::Rts);
//! # Ok(()) }
//! ```

use crate::fabric::{Cq, Endpoint, Pd, ProviderKind, Qp, QpConfig};
use crate::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Most private data a connection request carries (RDMA CM's 56 bytes less the frame).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 54;
/// Most private data an accept carries (RDMA CM's 196 bytes less the frame).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 194;
/// Most private data a reject carries (the InfiniBand CM REJ's 148 bytes less the frame).
pub const MAX_REJECT_PRIVATE_DATA: usize = 146;

/// First byte of framed private data: not ASCII, so text or a region descriptor ("RD..."),
/// sent unframed, is not mistaken for a frame.
const FRAME_MAGIC: u8 = 0xA7;

/// Frames application private data for RDMA CM: `0xA7, length (u8), data`. RDMA CM
/// delivers private data padded with zeros to a fixed size, so the length must travel with
/// it. A C peer frames its bytes the same way (docs/PROTOCOL.md).
///
/// ```
/// use rdmapool::conn::{decode_private_data, encode_private_data};
/// let framed = encode_private_data(b"hi").unwrap();
/// assert_eq!(framed, [0xA7, 2, b'h', b'i']);
/// let mut padded = framed.clone();
/// padded.resize(56, 0);                     // as RDMA CM delivers it
/// assert_eq!(decode_private_data(&padded).unwrap(), b"hi");
/// assert_eq!(decode_private_data(&[0; 56]).unwrap(), b"");  // a peer that sent nothing
/// assert!(decode_private_data(b"RDMA-unframed").is_err());
/// ```
pub fn encode_private_data(data: &[u8]) -> Result<Vec<u8>> {
    if data.len() > MAX_ACCEPT_PRIVATE_DATA {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of private data: at most {MAX_ACCEPT_PRIVATE_DATA} fit",
            data.len()
        )));
    }
    let mut v = Vec::with_capacity(data.len() + 2);
    v.push(FRAME_MAGIC);
    v.push(data.len() as u8);
    v.extend_from_slice(data);
    Ok(v)
}

/// Unframes private data made by [`encode_private_data`], as RDMA CM delivered it (zero
/// padding and all). Empty or all-zero bytes mean the peer sent none. Anything else that is
/// not a frame followed only by zeros is [`Error::BadPrivateData`], which carries the raw
/// bytes.
pub fn decode_private_data(raw: &[u8]) -> Result<&[u8]> {
    if raw.iter().all(|&b| b == 0) {
        return Ok(&[]);
    }
    let bad = |reason: String| Error::BadPrivateData {
        reason,
        raw: raw.to_vec(),
    };
    match raw {
        [FRAME_MAGIC, n, rest @ ..] if (*n as usize) <= rest.len() => {
            let (data, padding) = rest.split_at(*n as usize);
            if let Some(at) = padding.iter().position(|&b| b != 0) {
                return Err(bad(format!(
                    "{} bytes after the frame's {n} are not zero padding (byte {})",
                    padding.len(),
                    2 + *n as usize + at
                )));
            }
            Ok(data)
        }
        [FRAME_MAGIC, n, rest @ ..] => Err(bad(format!(
            "the frame says {n} bytes, {} arrived",
            rest.len()
        ))),
        _ => Err(bad(format!(
            "not framed (first byte {:#04x}, expected {FRAME_MAGIC:#04x}); the peer must send \
             0xa7, a length byte, then its data",
            raw[0]
        ))),
    }
}

/// Which connection manager carries the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    /// rdmapool's handshake over a TCP connection of its own (every provider).
    Tcp,
    /// librdmacm (verbs provider); interoperates with C peers on rdma-core.
    RdmaCm,
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

const MAGIC: [u8; 4] = *b"RDCM";
const VERSION: u8 = 1;
const REQ: u8 = 1;
const REP: u8 = 2;
const REJ: u8 = 3;
const RTU: u8 = 4;
/// Largest message body accepted on the CM port (after the 8-byte header): endpoint and
/// private data with their lengths.
const MAX_BODY: usize = 2 + Endpoint::MAX_LEN + 2 + MAX_ACCEPT_PRIVATE_DATA;

fn check_private(data: &[u8], max: usize, what: &str) -> Result<()> {
    if data.len() > max {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of private data in a {what}: at most {max} fit",
            data.len()
        )));
    }
    Ok(())
}

fn io_err(peer: SocketAddr, what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Connection {
        peer: peer.to_string(),
        reason: format!("{what}: {e}"),
    }
}

/// One handshake message: kind, endpoint (REQ/REP) and private data (REQ/REP/REJ).
struct Message {
    kind: u8,
    endpoint: Option<Endpoint>,
    private: Vec<u8>,
}

impl Message {
    fn encode(&self) -> Vec<u8> {
        let ep = self
            .endpoint
            .as_ref()
            .map(Endpoint::to_bytes)
            .unwrap_or_default();
        let body = 2 + ep.len() + 2 + self.private.len();
        let mut b = Vec::with_capacity(8 + body);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(self.kind);
        b.extend_from_slice(&(body as u16).to_le_bytes());
        b.extend_from_slice(&(ep.len() as u16).to_le_bytes());
        b.extend_from_slice(&ep);
        b.extend_from_slice(&(self.private.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.private);
        b
    }

    fn read(s: &mut TcpStream, peer: SocketAddr, deadline: Instant) -> Result<Message> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        s.set_read_timeout(Some(left))
            .map_err(io_err(peer, "setting a timeout"))?;
        let mut h = [0u8; 8];
        s.read_exact(&mut h)
            .map_err(io_err(peer, "reading a CM message"))?;
        let bad = |reason: String| Error::Malformed {
            what: "connection-manager message",
            reason,
        };
        if h[0..4] != MAGIC {
            return Err(bad("bad magic".into()));
        }
        if h[4] != VERSION {
            return Err(bad(format!(
                "version {} (this build speaks {VERSION})",
                h[4]
            )));
        }
        let body = u16::from_le_bytes([h[6], h[7]]) as usize;
        if !(4..=MAX_BODY).contains(&body) {
            return Err(bad(format!("body of {body} bytes")));
        }
        let mut b = vec![0u8; body];
        s.read_exact(&mut b)
            .map_err(io_err(peer, "reading a CM message"))?;
        let ep_len = u16::from_le_bytes([b[0], b[1]]) as usize;
        let ep_end = 2 + ep_len;
        if ep_end + 2 > body {
            return Err(bad("endpoint length past the end".into()));
        }
        let endpoint = if ep_len > 0 {
            Some(Endpoint::from_bytes(&b[2..ep_end])?)
        } else {
            None
        };
        let pd_len = u16::from_le_bytes([b[ep_end], b[ep_end + 1]]) as usize;
        if ep_end + 2 + pd_len != body {
            return Err(bad("private data length does not match".into()));
        }
        let kind = h[5];
        let max = match kind {
            REQ => MAX_CONNECT_PRIVATE_DATA,
            REP => MAX_ACCEPT_PRIVATE_DATA,
            REJ => MAX_REJECT_PRIVATE_DATA,
            RTU => 0,
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        if pd_len > max {
            return Err(bad(format!(
                "{pd_len} bytes of private data (at most {max})"
            )));
        }
        if matches!(kind, REQ | REP) != endpoint.is_some() {
            return Err(bad("endpoint missing or unexpected".into()));
        }
        Ok(Message {
            kind,
            endpoint,
            private: b[ep_end + 2..].to_vec(),
        })
    }
}

fn send(s: &mut TcpStream, peer: SocketAddr, m: &Message) -> Result<()> {
    s.write_all(&m.encode())
        .map_err(io_err(peer, "sending a CM message"))
}

/// A passive side: listens for connection requests.
pub struct Listener {
    kind: ListenerKind,
    addr: SocketAddr,
}

enum ListenerKind {
    Tcp(TcpListener),
    RdmaCm(crate::verbs::cm::CmListener),
}

impl Listener {
    /// Listens for connection requests on `addr` (port 0 picks a free one) through
    /// `manager`: [`Manager::Tcp`] listens on that TCP port; [`Manager::RdmaCm`] binds an
    /// RDMA CM id to an address of an RDMA device's netdev (it needs rdma-core and a device:
    /// otherwise a typed error says what is missing).
    pub fn bind(manager: impl Into<Manager>, addr: SocketAddr) -> Result<Self> {
        match manager.into() {
            Manager::Tcp => {
                let listener = TcpListener::bind(addr).map_err(io_err(addr, "listening"))?;
                let addr = listener.local_addr().map_err(io_err(addr, "getsockname"))?;
                Ok(Self {
                    kind: ListenerKind::Tcp(listener),
                    addr,
                })
            }
            Manager::RdmaCm => {
                let l = crate::verbs::cm::CmListener::bind(addr)?;
                let addr = l.local_addr();
                Ok(Self {
                    kind: ListenerKind::RdmaCm(l),
                    addr,
                })
            }
        }
    }

    /// The manager this listener uses.
    pub fn manager(&self) -> Manager {
        match self.kind {
            ListenerKind::Tcp(_) => Manager::Tcp,
            ListenerKind::RdmaCm(_) => Manager::RdmaCm,
        }
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits up to `timeout` for the next connection request. On the TCP CM port, peers
    /// that send garbage are dropped and waiting goes on. An RDMA CM request whose private
    /// data is not framed ([`decode_private_data`]) is rejected (the requester gets
    /// [`Error::Rejected`] saying why) and reported here as [`Error::BadPrivateData`] with
    /// the raw bytes; call again for the next request.
    pub fn get_request(&self, timeout: Duration) -> Result<ConnRequest> {
        let listener = match &self.kind {
            ListenerKind::Tcp(l) => l,
            ListenerKind::RdmaCm(l) => {
                return Ok(ConnRequest {
                    kind: RequestKind::RdmaCm(l.get_request(timeout)?),
                    timeout,
                })
            }
        };
        let deadline = Instant::now() + timeout;
        listener
            .set_nonblocking(true)
            .map_err(io_err(self.addr, "listener"))?;
        loop {
            match listener.accept() {
                Ok((mut s, peer)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_nodelay(true);
                    let msg_deadline = Instant::now() + timeout.min(Duration::from_secs(10));
                    match Message::read(&mut s, peer, msg_deadline) {
                        Ok(Message {
                            kind: REQ,
                            endpoint: Some(endpoint),
                            private,
                        }) => {
                            return Ok(ConnRequest {
                                kind: RequestKind::Tcp(TcpRequest {
                                    stream: s,
                                    peer,
                                    endpoint,
                                    private,
                                }),
                                timeout,
                            })
                        }
                        Ok(_) | Err(_) => {
                            tracing::warn!(%peer, "dropping a malformed connection request");
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::Connection {
                            peer: self.addr.to_string(),
                            reason: format!("no connection request within {timeout:?}"),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(io_err(self.addr, "accept")(e)),
            }
        }
    }
}

/// A connection request waiting for [`ConnRequest::accept`] or [`ConnRequest::reject`].
pub struct ConnRequest {
    kind: RequestKind,
    timeout: Duration,
}

enum RequestKind {
    Tcp(TcpRequest),
    RdmaCm(crate::verbs::cm::CmRequest),
}

struct TcpRequest {
    stream: TcpStream,
    peer: SocketAddr,
    endpoint: Endpoint,
    private: Vec<u8>,
}

impl ConnRequest {
    /// The requester's private data.
    pub fn private_data(&self) -> &[u8] {
        match &self.kind {
            RequestKind::Tcp(r) => &r.private,
            RequestKind::RdmaCm(r) => r.private_data(),
        }
    }

    /// The private data as it arrived: on RDMA CM with its frame and padding (56 bytes on
    /// InfiniBand RC), on the TCP CM port the same bytes as [`ConnRequest::private_data`].
    pub fn raw_private_data(&self) -> &[u8] {
        match &self.kind {
            RequestKind::Tcp(r) => &r.private,
            RequestKind::RdmaCm(r) => r.raw_private_data(),
        }
    }

    /// Creates a QP, answers with `private_data`, and returns the QP (in RTS) once the
    /// requester reports it is ready to use. Dropping the QP disconnects. On RDMA CM the
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
        check_private(private_data, MAX_ACCEPT_PRIVATE_DATA, "accept")?;
        match self.kind {
            RequestKind::RdmaCm(r) => {
                r.accept(pd, send_cq, recv_cq, cfg, private_data, self.timeout)
            }
            RequestKind::Tcp(mut r) => {
                let qp = pd.create_qp(send_cq, recv_cq, cfg)?;
                qp.modify_to_init()?;
                qp.modify_to_rtr(&r.endpoint)?;
                // Ready to send before answering: the requester's QP certainly exists now,
                // and nothing can be posted on ours until this call returns after the RTU.
                qp.modify_to_rts()?;
                let rep = Message {
                    kind: REP,
                    endpoint: Some(qp.endpoint()),
                    private: private_data.to_vec(),
                };
                send(&mut r.stream, r.peer, &rep)?;
                let rtu = Message::read(&mut r.stream, r.peer, Instant::now() + self.timeout)?;
                if rtu.kind != RTU {
                    return Err(Error::Connection {
                        peer: r.peer.to_string(),
                        reason: "the requester did not complete the handshake".into(),
                    });
                }
                Ok(qp)
            }
        }
    }

    /// Refuses the request; the requester gets [`Error::Rejected`] with `private_data`
    /// (at most [`MAX_REJECT_PRIVATE_DATA`] bytes).
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        check_private(private_data, MAX_REJECT_PRIVATE_DATA, "reject")?;
        match self.kind {
            RequestKind::RdmaCm(r) => r.reject(private_data),
            RequestKind::Tcp(mut r) => {
                let rej = Message {
                    kind: REJ,
                    endpoint: None,
                    private: private_data.to_vec(),
                };
                send(&mut r.stream, r.peer, &rej)
            }
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
/// [`Listener`] at `addr`, sending `private_data`; returns the QP (on `pd`, in RTS) with the
/// acceptor's private data. Dropping the QP disconnects.
///
/// Errors: [`Error::Rejected`] with the acceptor's reason; [`Error::BadPrivateData`] (raw
/// bytes inside) when an RDMA CM peer accepted with unframed private data, after which the
/// connection is closed; [`Error::Connection`] when the peer is unreachable or silent.
#[allow(clippy::too_many_arguments)]
pub fn connect(
    manager: impl Into<Manager>,
    addr: SocketAddr,
    pd: &Pd,
    send_cq: &Cq,
    recv_cq: &Cq,
    cfg: &QpConfig,
    private_data: &[u8],
    timeout: Duration,
) -> Result<Connection> {
    check_private(private_data, MAX_CONNECT_PRIVATE_DATA, "connection request")?;
    match manager.into() {
        Manager::Tcp => connect_tcp(addr, pd, send_cq, recv_cq, cfg, private_data, timeout),
        Manager::RdmaCm => {
            let (qp, raw) =
                crate::verbs::cm::connect(addr, pd, send_cq, recv_cq, cfg, private_data, timeout)?;
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

fn connect_tcp(
    addr: SocketAddr,
    pd: &Pd,
    send_cq: &Cq,
    recv_cq: &Cq,
    cfg: &QpConfig,
    private_data: &[u8],
    timeout: Duration,
) -> Result<Connection> {
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(io_err(addr, "connecting to the CM port"))?;
    let _ = s.set_nodelay(true);
    let qp = pd.create_qp(send_cq, recv_cq, cfg)?;
    qp.modify_to_init()?;
    let req = Message {
        kind: REQ,
        endpoint: Some(qp.endpoint()),
        private: private_data.to_vec(),
    };
    send(&mut s, addr, &req)?;
    let answer = Message::read(&mut s, addr, deadline)?;
    match answer {
        Message {
            kind: REP,
            endpoint: Some(ep),
            private,
        } => {
            qp.modify_to_rtr(&ep)?;
            qp.modify_to_rts()?;
            let rtu = Message {
                kind: RTU,
                endpoint: None,
                private: Vec::new(),
            };
            send(&mut s, addr, &rtu)?;
            Ok(Connection {
                qp,
                raw_private_data: private.clone(),
                private_data: private,
            })
        }
        Message {
            kind: REJ, private, ..
        } => Err(Error::Rejected {
            peer: addr.to_string(),
            private_data: private,
        }),
        _ => Err(Error::Malformed {
            what: "connection-manager message",
            reason: "expected an accept or a reject".into(),
        }),
    }
}
