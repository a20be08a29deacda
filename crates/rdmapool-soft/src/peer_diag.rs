//! Who owns a TCP socket of this host, asked of the kernel by the socket's addresses
//! (sock_diag over netlink): one lookup whatever the number of sockets, where reading
//! /proc/net/tcp costs a line per socket of the namespace (quadratic under a local flood).

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::SockDiagMessage;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `NETLINK_SOCK_DIAG` (linux/netlink.h).
const NETLINK_SOCK_DIAG: libc::c_int = 4;

/// The user owning the TCP socket bound at `local` and connected to `remote`. `Ok(None)`
/// when the kernel knows no such socket; `Err` when it cannot be asked (no sock_diag).
pub(crate) fn tcp_owner(local: SocketAddr, remote: SocketAddr) -> io::Result<Option<u32>> {
    let (l, r) = (local.ip().to_canonical(), remote.ip().to_canonical());
    let mapped = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
        v6 => v6,
    };
    // An IPv4 connection is either an AF_INET socket's or a dual-stack AF_INET6 socket's.
    let mut tries = vec![(AF_INET6, mapped(l), mapped(r))];
    if let (IpAddr::V4(_), IpAddr::V4(_)) = (l, r) {
        tries.insert(0, (AF_INET, l, r));
    }
    let sock = open()?;
    for (family, l, r) in tries {
        let id = SocketId {
            source_port: local.port(),
            destination_port: remote.port(),
            source_address: l,
            destination_address: r,
            interface_id: 0,
            cookie: [0xff; 8], // INET_DIAG_NOCOOKIE: match by addresses alone
        };
        if let Some(uid) = query(&sock, family, id)? {
            return Ok(Some(uid));
        }
    }
    Ok(None)
}

fn open() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One exact-match request (no dump): the socket's owner, or `None` if there is none.
fn query(sock: &OwnedFd, family: u8, socket_id: SocketId) -> io::Result<Option<u32>> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let mut msg = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id,
        })
        .into(),
    );
    msg.finalize();
    let mut out = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut out);
    // SAFETY: sending our own local buffer on our own socket (to the kernel: no address).
    let sent = unsafe { libc::send(sock.as_raw_fd(), out.as_ptr().cast(), out.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 8192];
    // SAFETY: receiving into our own local buffer of the given length.
    let got = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let answer = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[..got as usize])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match answer.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => Ok(Some(r.header.uid)),
        NetlinkPayload::Error(e) if e.code.map(|c| c.get()) == Some(-libc::ENOENT) => Ok(None),
        NetlinkPayload::Error(e) => Err(io::Error::other(format!("sock_diag: {e:?}"))),
        _ => Err(io::Error::other("sock_diag: unexpected answer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn the_kernel_names_the_owner_of_a_connection_by_its_addresses() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        let (ours, theirs) = (c.local_addr().unwrap(), c.peer_addr().unwrap());
        let uid = tcp_owner(ours, theirs).expect("sock_diag answers");
        assert_eq!(uid, Some(super::super::peer::own_uid()));
        // A socket that does not exist has no owner (and is not an error).
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(tcp_owner(nobody, theirs).unwrap(), None);
    }
}
