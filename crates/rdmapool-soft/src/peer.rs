//! Who is on the other end of an incoming connection: its address and, on this host, its
//! user (for the admission policy, `fabric::Admission`).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

/// What is known of an incoming connection's peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    /// Its IP address (None on the local socket).
    pub(crate) ip: Option<IpAddr>,
    /// Its user, when it is on this host (local socket, or TCP from a socket of this
    /// network namespace) and the kernel told us.
    pub(crate) uid: Option<u32>,
    /// Whether it is on this host.
    pub(crate) on_this_host: bool,
}

/// This process's effective user.
pub(crate) fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The peer of a connection accepted on the local (Unix) socket: `SO_PEERCRED`.
pub(crate) fn of_unix(fd: RawFd) -> PeerInfo {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a socket we own, and an out-buffer of the size we pass.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    PeerInfo {
        ip: None,
        uid: (r == 0).then_some(cred.uid),
        on_this_host: true,
    }
}

/// The peer of a TCP connection from `peer` to our `local` address. It is a process of this
/// host when it dials from a loopback address, or when its socket is in this network
/// namespace's socket table (it dialled one of this host's own addresses, loopback or not);
/// the table then names its user.
pub(crate) fn of_tcp(local: SocketAddr, peer: SocketAddr) -> PeerInfo {
    let ip = peer.ip().to_canonical();
    let loopback = ip.is_loopback();
    // The table is read only for addresses of this host: a connection from elsewhere (which
    // anyone can open before authenticating) costs no scan of it.
    let owner = (loopback || is_own_address(ip))
        .then(|| tcp_owner(peer, local))
        .flatten();
    PeerInfo {
        ip: Some(ip),
        uid: owner,
        on_this_host: loopback || owner.is_some(),
    }
}

/// Whether `ip` is one of this host's interface addresses (`getifaddrs`).
fn is_own_address(ip: IpAddr) -> bool {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated into `list`, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return false;
    }
    let mut found = false;
    let mut at = list;
    while !at.is_null() && !found {
        // SAFETY: `at` is a node of the list getifaddrs returned, not yet freed.
        let node = unsafe { &*at };
        if !node.ifa_addr.is_null() {
            // SAFETY: a non-null ifa_addr points at a sockaddr whose family says its type.
            let family = i32::from(unsafe { (*node.ifa_addr).sa_family });
            let addr = match family {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let sin = unsafe { &*node.ifa_addr.cast::<libc::sockaddr_in>() };
                    Some(IpAddr::from(
                        u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    ))
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let sin6 = unsafe { &*node.ifa_addr.cast::<libc::sockaddr_in6>() };
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            };
            found = addr.is_some_and(|a| a.to_canonical() == ip);
        }
        at = node.ifa_next;
    }
    // SAFETY: the list getifaddrs allocated, freed once, not used after.
    unsafe { libc::freeifaddrs(list) };
    found
}

/// The user owning the TCP socket bound at `local_of_peer` and connected to `remote_of_peer`:
/// asked of the kernel by the socket's addresses ([`super::peer_diag`]), or, where it cannot
/// be asked or does not know it, read from /proc/net/tcp and tcp6 (the table of this network
/// namespace, a line per socket).
fn tcp_owner(local_of_peer: SocketAddr, remote_of_peer: SocketAddr) -> Option<u32> {
    match super::peer_diag::tcp_owner(local_of_peer, remote_of_peer) {
        Ok(Some(uid)) => Some(uid),
        _ => tcp_owner_from_proc(local_of_peer, remote_of_peer),
    }
}

/// [`tcp_owner`] from /proc/net/tcp and tcp6.
fn tcp_owner_from_proc(local_of_peer: SocketAddr, remote_of_peer: SocketAddr) -> Option<u32> {
    let (want_local, want_remote) = (proc_net_addr(local_of_peer), proc_net_addr(remote_of_peer));
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
            if f.len() > 7 && same_socket(f[1], &want_local) && same_socket(f[2], &want_remote) {
                return f[7].parse().ok();
            }
        }
    }
    None
}

/// Both spellings of an address as /proc/net/tcp{,6} prints it (IPv4, and IPv4-mapped IPv6).
fn proc_net_addr(a: SocketAddr) -> [String; 2] {
    let port = format!("{:04X}", a.port());
    let v6 = |o: [u8; 16]| {
        let words: String = o
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        format!("{words}:{port}")
    };
    match a.ip().to_canonical() {
        IpAddr::V4(v4) => [
            format!("{:08X}:{port}", u32::from_ne_bytes(v4.octets())),
            v6(v4.to_ipv6_mapped().octets()),
        ],
        IpAddr::V6(ip) => [v6(ip.octets()), v6(ip.octets())],
    }
}

fn same_socket(field: &str, want: &[String; 2]) -> bool {
    want.iter().any(|w| field.eq_ignore_ascii_case(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_kernel_names_our_own_user_on_both_paths() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        let info = of_tcp(s.local_addr().unwrap(), peer);
        assert_eq!(info.uid, Some(own_uid()), "{info:?}");
        assert!(info.on_this_host);
        drop(c);
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(of_unix(a.as_raw_fd()).uid, Some(own_uid()));
    }

    /// This host's first non-loopback IPv4 address, if it has one.
    fn own_address() -> Option<IpAddr> {
        let out = std::process::Command::new("ip")
            .args(["-o", "-4", "addr", "show", "scope", "global"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let cidr = text
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)?;
        cidr.split('/').next()?.parse().ok()
    }

    #[test]
    fn a_process_of_this_host_dialling_its_own_non_loopback_address_is_on_this_host() {
        // Issue #22, finding 5: only loopback sources counted as this host, so another user
        // who dialled this host's own address passed as a remote peer, and the user check
        // was skipped.
        let Some(ip) = own_address() else {
            eprintln!("skipped: this host has no non-loopback IPv4 address");
            return;
        };
        let l = TcpListener::bind("0.0.0.0:0").unwrap();
        let c = TcpStream::connect((ip, l.local_addr().unwrap().port())).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert!(!peer.ip().is_loopback(), "{peer}");
        let info = of_tcp(s.local_addr().unwrap(), peer);
        assert!(info.on_this_host, "{info:?}");
        assert_eq!(info.uid, Some(own_uid()), "{info:?}");
        drop(c);
    }

    #[test]
    fn this_hosts_addresses_are_its_own_and_others_are_not() {
        assert!(is_own_address("127.0.0.1".parse().unwrap()));
        assert!(!is_own_address("198.51.100.77".parse().unwrap()));
        if let Some(ip) = own_address() {
            assert!(is_own_address(ip), "{ip}");
        }
    }

    #[test]
    fn an_unknown_connection_has_no_owner() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        assert_eq!(of_tcp(a, b).uid, None);
        let far: SocketAddr = "10.1.2.3:4".parse().unwrap();
        let info = of_tcp(a, far);
        assert!(!info.on_this_host && info.uid.is_none());
    }
}
