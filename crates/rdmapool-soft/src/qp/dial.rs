//! Opening a QP's connection: dial the peer context, say hello, and on this host take the
//! target QP's state page for the zero-copy path.

use crate::addr::{host_id, SoftAddress};
use crate::fabric::QpConfig;
use crate::io;
use crate::life::PeerLife;
use crate::proto::handshake::{
    decode_hello_ack, Challenge, Hello, HelloStatus, CHALLENGE_LEN, HELLO_ACK_LEN,
};
use crate::proto::local::LocalPath;
use crate::shm::{self, RemoteMr, RemoteQpState};
use crate::Transport;
use crate::{Error, Result};
use rustc_hash::FxHashMap as HashMap;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::Arc;
use std::time::Instant;

/// What the zero-copy path knows about a peer on this host.
pub(crate) struct LocalPeer {
    pub(crate) target_state: RemoteQpState,
    pub(crate) target_pd: u32,
    /// rkey -> the peer's mapped region, or None when it must go through the socket.
    pub(crate) maps: HashMap<u32, Option<Arc<RemoteMr>>>,
    /// When the peer's liveness is probed (the decisions, without I/O).
    pub(crate) path: LocalPath,
    /// The peer process's life page: read before every direct operation, so none posted
    /// after the process died executes on its memory.
    pub(crate) life: Option<PeerLife>,
}

/// Connects to the local socket `name` (`@name`: the abstract namespace; else a path).
fn connect_local(name: &str) -> std::io::Result<UnixStream> {
    match name.strip_prefix('@') {
        Some(abs) => UnixStream::connect_addr(&SocketAddr::from_abstract_name(abs.as_bytes())?),
        None => UnixStream::connect(name),
    }
}

/// Connects QP `src_qpn` to QP `peer_qpn` of the context at `addr` (whose token proves, with
/// `psk`, that we were given that QP's endpoint), over `transport` (the context's).
pub(crate) fn dial(
    cfg: &QpConfig,
    transport: Transport,
    psk: Option<&[u8]>,
    src_qpn: u32,
    peer_qpn: u32,
    addr: &SoftAddress,
) -> Result<(OwnedFd, Option<LocalPeer>)> {
    let same_host = addr.host_id == host_id() && !addr.local.is_empty();
    let conn_err = |peer: String, reason: String| Error::Connection { peer, reason };
    let local = match transport {
        Transport::Tcp => false,
        Transport::Local if !same_host => {
            return Err(conn_err(
                addr.tcp.to_string(),
                "transport local was asked for but the peer is on another host".into(),
            ))
        }
        Transport::Local => true,
        Transport::Auto => same_host,
    };
    let call = Call {
        src_qpn,
        peer_qpn,
        addr,
        psk,
    };
    if local {
        let refused = match connect_local(&addr.local) {
            Err(e) => Refused::Early(conn_err(addr.local.clone(), e.to_string())),
            Ok(s) => match handshake(s.into(), true, &call, cfg) {
                Ok(done) => return Ok(done),
                Err(r) => r,
            },
        };
        match refused {
            // `auto`: the local socket would not have us (not there, or full: closed
            // before its challenge): the same peer over TCP.
            Refused::Early(e) if transport == Transport::Auto => {
                tracing::debug!("local socket refused ({e}): dialling over TCP")
            }
            Refused::Early(e) | Refused::Late(e) => return Err(e),
        }
    }
    let s = TcpStream::connect_timeout(&addr.tcp, cfg.timeout)
        .map_err(|e| conn_err(addr.tcp.to_string(), e.to_string()))?;
    s.set_nodelay(true)
        .map_err(|e| conn_err(addr.tcp.to_string(), e.to_string()))?;
    handshake(s.into(), false, &call, cfg).map_err(Refused::into_error)
}

/// Who calls whom: our QP, the peer's QP at `addr`, and the key proving the call.
struct Call<'a> {
    src_qpn: u32,
    peer_qpn: u32,
    addr: &'a SoftAddress,
    psk: Option<&'a [u8]>,
}

/// Why a handshake failed: before the peer's challenge came (it closed or reset the
/// connection at once, as a NIC does when a limit is reached), or later.
enum Refused {
    Early(Error),
    Late(Error),
}

impl Refused {
    fn into_error(self) -> Error {
        match self {
            Refused::Early(e) | Refused::Late(e) => e,
        }
    }
}

/// The hello exchange on a new connection `fd` (docs/PROTOCOL.md section 5), and on the
/// local socket the state page that follows.
fn handshake(
    fd: OwnedFd,
    on_local_socket: bool,
    call: &Call,
    cfg: &QpConfig,
) -> std::result::Result<(OwnedFd, Option<LocalPeer>), Refused> {
    let addr = call.addr;
    let conn_err = |peer: String, reason: String| Error::Connection { peer, reason };
    let deadline = Instant::now() + cfg.timeout;
    let peer = || addr.tcp.to_string();
    let mut ch = [0u8; CHALLENGE_LEN];
    if let Err(e) = io::recv_exact(fd.as_raw_fd(), &mut ch, deadline) {
        let closed = matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        );
        let e = conn_err(peer(), format!("waiting for the hello challenge: {e}"));
        return Err(if closed {
            Refused::Early(e)
        } else {
            Refused::Late(e)
        });
    }
    handshake_after_challenge(fd, on_local_socket, &ch, call, deadline).map_err(Refused::Late)
}

/// The rest of [`handshake`], once the challenge `ch` has come.
fn handshake_after_challenge(
    fd: OwnedFd,
    on_local_socket: bool,
    ch: &[u8; CHALLENGE_LEN],
    call: &Call,
    deadline: Instant,
) -> Result<(OwnedFd, Option<LocalPeer>)> {
    let (addr, peer_qpn) = (call.addr, call.peer_qpn);
    let conn_err = |peer: String, reason: String| Error::Connection { peer, reason };
    let peer = || addr.tcp.to_string();
    let challenge = Challenge::decode(ch)?;
    let hello = Hello::answer(&challenge, call.src_qpn, peer_qpn, &addr.token, call.psk);
    io::send_buf(fd.as_raw_fd(), &hello.encode(), deadline)
        .map_err(|e| conn_err(peer(), format!("sending hello: {e}")))?;
    let mut ack = [0u8; HELLO_ACK_LEN];
    io::recv_exact(fd.as_raw_fd(), &mut ack, deadline)
        .map_err(|e| conn_err(peer(), format!("waiting for hello acknowledgement: {e}")))?;
    match decode_hello_ack(&ack)? {
        HelloStatus::Ok if on_local_socket => {
            let mut info = [0u8; 8];
            let fds = shm::recv_with_fds(fd.as_raw_fd(), &mut info, deadline)
                .map_err(|e| conn_err(peer(), format!("waiting for the local handshake: {e}")))?;
            let mut fds = fds.into_iter();
            let state_fd = fds
                .next()
                .ok_or_else(|| conn_err(peer(), "local handshake carried no state page".into()))?;
            // A peer without a life page (an older one, or a system without robust
            // futexes or sealing) is probed instead.
            let life = fds.next().map(PeerLife::from_fd).transpose()?;
            let local = LocalPeer {
                target_state: RemoteQpState::new(state_fd)?,
                target_pd: u32::from_le_bytes([info[0], info[1], info[2], info[3]]),
                maps: HashMap::default(),
                path: LocalPath::new(crate::clock::coarse_now()),
                life,
            };
            Ok((fd, Some(local)))
        }
        HelloStatus::Ok => Ok((fd, None)),
        refused => Err(conn_err(peer(), refused.describe(peer_qpn))),
    }
}
