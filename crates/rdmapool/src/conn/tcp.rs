//! The TCP connection manager: a handshake over a TCP connection of its own (the "CM port")
//! carrying the QP endpoints both ways (REQ, REP or REJ, RTU), then bringing both QPs to RTS
//! in the order RC needs. Works with every provider.

use super::private::{MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA};
use super::Connection;
use crate::fabric::{Cq, Endpoint, Pd, Qp, QpConfig};
use crate::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = *b"RDCM";
const VERSION: u8 = 1;
const REQ: u8 = 1;
const REP: u8 = 2;
const REJ: u8 = 3;
const RTU: u8 = 4;
/// Largest message body accepted on the CM port (after the 8-byte header): endpoint and
/// private data with their lengths.
const MAX_BODY: usize = 2 + Endpoint::MAX_LEN + 2 + MAX_ACCEPT_PRIVATE_DATA;

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

/// Listens on the CM port at `addr` (port 0 picks a free one); returns the listener and the
/// address it got.
pub(super) fn listen(addr: SocketAddr) -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).map_err(io_err(addr, "listening"))?;
    let addr = listener.local_addr().map_err(io_err(addr, "getsockname"))?;
    Ok((listener, addr))
}

/// A connection request read from the CM port, waiting for an answer.
pub(super) struct TcpRequest {
    stream: TcpStream,
    peer: SocketAddr,
    endpoint: Endpoint,
    private: Vec<u8>,
}

/// Waits up to `timeout` for the next request on `listener` (bound at `addr`). Peers that
/// send garbage are dropped and waiting goes on; one that connected waits at least 2 s (at
/// most 10 s) for its request message.
pub(super) fn get_request(
    listener: &TcpListener,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpRequest> {
    let deadline = Instant::now() + timeout;
    listener
        .set_nonblocking(true)
        .map_err(io_err(addr, "listener"))?;
    loop {
        match listener.accept() {
            Ok((mut s, peer)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_nodelay(true);
                // The request follows the TCP handshake at once, but a lost segment takes a
                // retransmission (200 ms or more): at least 2 s, whatever the poll interval.
                let wait = timeout.clamp(Duration::from_secs(2), Duration::from_secs(10));
                let msg_deadline = Instant::now() + wait;
                match Message::read(&mut s, peer, msg_deadline) {
                    Ok(Message {
                        kind: REQ,
                        endpoint: Some(endpoint),
                        private,
                    }) => {
                        return Ok(TcpRequest {
                            stream: s,
                            peer,
                            endpoint,
                            private,
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
                        peer: addr.to_string(),
                        reason: format!("no connection request within {timeout:?}"),
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(io_err(addr, "accept")(e)),
        }
    }
}

impl TcpRequest {
    /// The requester's private data.
    pub(super) fn private_data(&self) -> &[u8] {
        &self.private
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
            return Err(Error::Connection {
                peer: self.peer.to_string(),
                reason: "the requester did not complete the handshake".into(),
            });
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
pub(super) fn connect(
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
