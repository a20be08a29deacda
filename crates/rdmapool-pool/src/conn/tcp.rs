//! The TCP connection manager: a handshake over a TCP connection of its own (the "CM port")
//! carrying the QP endpoints both ways (REQ, REP or REJ, RTU), then bringing both QPs to RTS
//! in the order RC needs. Works with every provider.

use super::message::{io_err, send, Message, REJ, REP, REQ, RTU};
use super::pending;
use super::Connection;
use crate::fabric::{ConnectSpec, Cq, Endpoint, Pd, Qp, QpConfig};
use crate::{Error, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Listens on the CM port at `addr` (port 0 picks a free one); returns the port and the
/// address it got.
pub(super) fn listen(addr: SocketAddr) -> Result<(pending::CmPort, SocketAddr)> {
    let listener = TcpListener::bind(addr).map_err(io_err(addr, "listening"))?;
    let addr = listener.local_addr().map_err(io_err(addr, "getsockname"))?;
    Ok((pending::CmPort::new(listener, addr)?, addr))
}

/// A connection request read from the CM port, waiting for an answer.
pub(super) struct TcpRequest {
    stream: TcpStream,
    peer: SocketAddr,
    endpoint: Endpoint,
    private: Vec<u8>,
}

/// Waits up to `timeout` for the next request on the CM port. Requests are read from many
/// peers at once, each within [`pending::HANDSHAKE_TIMEOUT`]: a peer that connects and says
/// nothing delays nobody. Peers that send garbage are dropped and waiting goes on.
pub(super) fn get_request(port: &pending::CmPort, timeout: Duration) -> Result<TcpRequest> {
    let (stream, peer, endpoint, private) = port.next_request(timeout)?;
    Ok(TcpRequest {
        stream,
        peer,
        endpoint,
        private,
    })
}

impl TcpRequest {
    /// The requester's private data.
    pub(super) fn private_data(&self) -> &[u8] {
        &self.private
    }

    /// The requester's address on the CM port.
    pub(super) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Creates a QP, answers with `private_data`, and returns the QP (in RTS) once the
    /// requester reports it is ready to use.
    pub(super) fn accept(
        mut self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Qp> {
        let qp = pd.create_qp(send_cq, recv_cq, cfg)?;
        qp.modify_to_init()?;
        qp.modify_to_rtr(&self.endpoint)?;
        // Ready to send before answering: the requester's QP certainly exists now,
        // and nothing can be posted on ours until this call returns after the RTU.
        qp.modify_to_rts()?;
        let rep = Message {
            kind: REP,
            endpoint: Some(qp.endpoint()),
            private: private_data.to_vec(),
        };
        send(&mut self.stream, self.peer, &rep)?;
        let rtu = Message::read(&mut self.stream, self.peer, Instant::now() + timeout)?;
        if rtu.kind != RTU {
            return Err(Error::Core(crate::CoreError::Connection {
                peer: self.peer.to_string(),
                reason: "the requester did not complete the handshake".into(),
            }));
        }
        Ok(qp)
    }

    /// Refuses the request with `private_data`.
    pub(super) fn reject(mut self, private_data: &[u8]) -> Result<()> {
        let rej = Message {
            kind: REJ,
            endpoint: None,
            private: private_data.to_vec(),
        };
        send(&mut self.stream, self.peer, &rej)
    }
}

/// Connects to a TCP CM port at `addr`: the requester's side of the handshake.
pub(super) fn connect(addr: SocketAddr, spec: &ConnectSpec<'_>) -> Result<Connection> {
    let ConnectSpec {
        pd,
        send_cq,
        recv_cq,
        qp: cfg,
        private_data,
        timeout,
    } = *spec;
    let deadline = Instant::now() + timeout;
    // The QP first, so that the REQ follows the TCP connect at once: a listener counts a
    // connection that has sent nothing as a handshake in progress (bounded per address).
    let qp = pd.create_qp(send_cq, recv_cq, cfg)?;
    qp.modify_to_init()?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(io_err(addr, "connecting to the CM port"))?;
    let _ = s.set_nodelay(true);
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
        } => Err(Error::Core(crate::CoreError::Rejected {
            peer: addr.to_string(),
            private_data: private,
        })),
        _ => Err(Error::Core(crate::CoreError::Malformed {
            what: "connection-manager message",
            reason: "expected an accept or a reject".into(),
        })),
    }
}
