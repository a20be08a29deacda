//! The soft NIC's admission: QP tokens, MACs and pre-shared keys, other users of this host,
//! probing for keys, regions that are never mapped, connection limits, its local socket.

use super::*;

#[test]
fn a_connection_without_the_qp_token_cannot_hijack_it() {
    if soft_only("the soft handshake") {
        return;
    }
    for t in [Transport::Tcp, Transport::Local] {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, qb) = pair(&a, &b, &config());
        let region = b.pd.alloc_mr(4096, ALL).unwrap();
        let target = SoftTarget::of(&qb.endpoint());
        // Guessing: the right QP number, the legitimate peer's QP number, a made-up token.
        let mut raw = match t {
            Transport::Local => Raw::unix(&target),
            _ => Raw::tcp(&target),
        };
        let st = raw.hello(qa.qpn(), target.qpn, &[0x5a; 16], None).unwrap();
        assert_eq!(st, status::AUTH_FAILED, "{t:?}");
        // The legitimate pair is untouched and still works.
        assert_eq!(qb.state(), QpState::Rts);
        let src = a.pd.alloc_mr(4096, ALL).unwrap();
        src.write_at(0, b"legit").unwrap();
        let sg = [src.sge(0, 5).unwrap()];
        qa.post_send(&[write_wr(1, region.remote_at(0).unwrap(), &sg)])
            .unwrap();
        assert!(one(&a.cq).is_ok(), "{t:?}");
        assert_eq!(&contents(&region)[..5], b"legit");
    }
}

#[test]
fn an_unknown_qp_and_a_wrong_mac_get_the_same_answer() {
    // Issue #22, finding 6: NO_SUCH_QP against AUTH_FAILED told an attacker which QP
    // numbers exist. Both are AUTH_FAILED now.
    if soft_only("the soft handshake") {
        return;
    }
    let (a, b) = (node_on(Transport::Tcp), node_on(Transport::Tcp));
    let peer = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
    let qb = bound_qp(&b, &peer.endpoint());
    let target = SoftTarget::of(&qb.endpoint());
    let existing = Raw::tcp(&target)
        .hello(peer.qpn(), target.qpn, &[0x5a; 16], None)
        .unwrap();
    let missing = Raw::tcp(&target)
        .hello(peer.qpn(), target.qpn + 7777, &[0x5a; 16], None)
        .unwrap();
    assert_eq!(existing, status::AUTH_FAILED);
    assert_eq!(missing, status::AUTH_FAILED, "an unknown QP answered apart");
}

#[test]
fn even_with_the_token_a_qp_takes_only_its_own_peer_once() {
    if soft_only("the soft handshake") {
        return;
    }
    let (a, b) = (node_on(Transport::Tcp), node_on(Transport::Tcp));
    let peer = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
    let qb = bound_qp(&b, &peer.endpoint());
    let target = SoftTarget::of(&qb.endpoint());
    // A leaked endpoint, but another source QP: refused.
    let st = Raw::tcp(&target)
        .hello(peer.qpn() + 1000, target.qpn, &target.token, None)
        .unwrap();
    assert_eq!(st, status::AUTH_FAILED);
    // The bound peer with the token: accepted (the MAC this test computes is the real one).
    let mut first = Raw::tcp(&target);
    let st = first
        .hello(peer.qpn(), target.qpn, &target.token, None)
        .unwrap();
    assert_eq!(st, status::OK);
    // A second connection, even a perfect one, is refused: an RC QP has one peer.
    let st = Raw::tcp(&target)
        .hello(peer.qpn(), target.qpn, &target.token, None)
        .unwrap();
    assert_eq!(st, status::ALREADY_CONNECTED);
}

#[test]
fn pre_shared_keys_must_match_and_never_cross_the_wire() {
    if soft_only("the soft handshake") {
        return;
    }
    let key = |b: u8| Admission {
        psk: Some(PreSharedKey::new(&[b; 32]).unwrap()),
        ..Admission::default()
    };
    let (a, b) = (soft_node(key(1)), soft_node(key(1)));
    let (qa, _qb) = pair(&a, &b, &config());
    assert_eq!(qa.state(), QpState::Rts, "same key: connected");
    for other in [key(2), Admission::default()] {
        let c = soft_node(other);
        let qc = c.pd.create_qp(&c.cq, &c.cq, &config()).unwrap();
        let qb = b.pd.create_qp(&b.cq, &b.cq, &config()).unwrap();
        qb.modify_to_init().unwrap();
        qb.modify_to_rtr(&qc.endpoint()).unwrap();
        let err = qc.connect(&qb.endpoint()).unwrap_err().to_string();
        assert!(err.contains("pre-shared keys differ"), "{err}");
    }
    // A raw peer with the token but without the key is refused too.
    let peer = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
    let qb = bound_qp(&b, &peer.endpoint());
    let t = SoftTarget::of(&qb.endpoint());
    let st = Raw::tcp(&t)
        .hello(peer.qpn(), t.qpn, &t.token, None)
        .unwrap();
    assert_eq!(st, status::AUTH_FAILED);
}

/// Issue #22, finding 5: a NIC bound to 0.0.0.0 let another user of this host in when it
/// dialled this host's own non-loopback address (only loopback sources were checked).
#[test]
fn another_user_dialling_this_hosts_own_address_is_refused_too() {
    if soft_only("the soft handshake") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: switching to user nobody needs root");
        return;
    }
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let Some(ip) = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|c| c.split('/').next())
        .map(str::to_string)
    else {
        eprintln!("skipped: this host has no non-loopback IPv4 address");
        return;
    };
    let mut cfg = SoftConfig {
        bind: "0.0.0.0:0".parse().unwrap(),
        ..SoftConfig::from_env().unwrap()
    };
    // The user check is what this test is about: no key, by the operator's choice.
    cfg.admission.allow_unauthenticated = true;
    let ctx = Context::open(cfg).unwrap();
    let b = Node {
        pd: ctx.alloc_pd().unwrap(),
        cq: ctx.create_cq(256).unwrap(),
        ctx,
    };
    let a = node_on(Transport::Tcp);
    let peer = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
    let qb = bound_qp(&b, &peer.endpoint());
    let got = hello_as_nobody(&format!("tcp-at:{ip}"), &qb.endpoint(), peer.qpn());
    assert_eq!(got, status::PEER_NOT_ALLOWED.to_string(), "dialled {ip}");
}

#[test]
fn another_user_on_this_host_is_refused_unless_allowed() {
    if soft_only("the soft handshake") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: switching to user nobody needs root");
        return;
    }
    for (admission, want) in [
        (Admission::default(), status::PEER_NOT_ALLOWED),
        (
            Admission {
                allow_users: AllowUsers::List(vec![65534]),
                ..Admission::default()
            },
            status::OK,
        ),
    ] {
        for path in ["tcp", "unix"] {
            let b = soft_node(admission.clone());
            let a = node_on(Transport::Tcp);
            let peer = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
            let qb = bound_qp(&b, &peer.endpoint());
            let got = hello_as_nobody(path, &qb.endpoint(), peer.qpn());
            assert_eq!(got, want.to_string(), "{path} {admission:?}");
        }
    }
}

#[test]
fn a_bad_rkey_in_a_map_request_ends_the_qp_so_keys_cannot_be_probed() {
    if soft_only("the intra-host MAP request") {
        return;
    }
    let (a, b) = (node_on(Transport::Local), node_on(Transport::Local));
    let region = b.pd.alloc_mr(4096, ALL).unwrap();
    // Control: the peer may map a read-write region it names correctly.
    let (_peer, _qb, mut raw) = local_raw_peer(&a, &b);
    assert_eq!(raw.map(region.rkey()).unwrap(), (5, 1), "MAP, mappable");
    // Probing: the first wrong key is a NAK (REM_ACCESS_ERR) and the QP is in ERR; after
    // that even the right key gets nothing.
    let (_peer2, qb2, mut raw) = local_raw_peer(&a, &b);
    let guess = region.rkey().wrapping_add(1);
    assert_eq!(raw.map(guess).unwrap(), (4, 10), "NAK REM_ACCESS_ERR");
    assert_eq!(qb2.state(), QpState::Error);
    let after = raw.map(region.rkey());
    assert!(
        !matches!(after, Ok((5, 1))),
        "a QP in ERR still maps: {after:?}"
    );
}

#[test]
fn a_region_that_grants_less_than_read_and_write_is_never_mapped() {
    if soft_only("the intra-host MAP request") {
        return;
    }
    let (a, b) = (node_on(Transport::Local), node_on(Transport::Local));
    for (access, mappable) in [
        (AccessFlags::REMOTE_READ, 0),
        (AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE, 0),
        (ALL, 1),
    ] {
        let region = b.pd.alloc_mr(4096, access).unwrap();
        let (_peer, _qb, mut raw) = local_raw_peer(&a, &b);
        assert_eq!(raw.map(region.rkey()).unwrap(), (5, mappable), "{access:?}");
    }
    // Through the API: a read-only region is read, and a WRITE is refused, on the local path.
    let (qa, _qb) = pair(&a, &b, &config());
    let ro = b.pd.alloc_mr(4096, AccessFlags::REMOTE_READ).unwrap();
    ro.write_at(0, b"read only").unwrap();
    let local = a.pd.alloc_mr(4096, ALL).unwrap();
    let sg = [local.sge(0, 9).unwrap()];
    qa.post_send(&[read_wr(1, ro.remote_at(0).unwrap(), &sg)])
        .unwrap();
    assert!(one(&a.cq).is_ok());
    qa.post_send(&[write_wr(2, ro.remote_at(0).unwrap(), &sg)])
        .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr);
    assert_eq!(&contents(&ro)[..9], b"read only");
}

#[test]
fn connections_beyond_the_limit_are_refused_and_slots_come_back() {
    if soft_only("the soft NIC's limits") {
        return;
    }
    let b = soft_node(Admission {
        max_connections: 3,
        ..Admission::default()
    });
    let qb = b.pd.create_qp(&b.cq, &b.cq, &config()).unwrap();
    let t = SoftTarget::of(&qb.endpoint());
    let challenged = |s: &mut TcpStream| {
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut ch = [0u8; 24];
        s.read_exact(&mut ch).is_ok()
    };
    let mut held: Vec<TcpStream> = (0..6).map(|_| TcpStream::connect(t.tcp).unwrap()).collect();
    let served = held.iter_mut().map(challenged).filter(|ok| *ok).count();
    assert_eq!(served, 3, "three admitted, three closed at once");
    held.clear();
    // The slots come back when those connections end.
    let back = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(25));
        let mut s = TcpStream::connect(t.tcp).unwrap();
        challenged(&mut s)
    });
    assert!(back, "a slot was never given back");
}

#[test]
fn a_soft_nic_leaves_no_socket_file() {
    if soft_only("the soft NIC's local socket") {
        return;
    }
    let n = node();
    let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
    let t = SoftTarget::of(&qp.endpoint());
    assert!(t.local.starts_with('@'), "an abstract socket: {}", t.local);
    let mine = format!("rdmapool-{}-", std::process::id());
    let files: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
        .collect();
    assert!(files.is_empty(), "{files:?}");
}

/// Issue #22, finding 4: another user holding this NIC's whole per-peer share of the local
/// socket keeps no one else out. User `nobody` keeps 8 connections (the share here) open on
/// the local socket, and a QP of ours then connects over `auto`. Before: all local-socket
/// connections were one peer, so ours was closed at once, and `auto` did not try TCP.
#[test]
fn another_user_holding_the_local_socket_keeps_no_one_out() {
    if soft_only("the soft NIC's limits") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: switching to user nobody needs root");
        return;
    }
    let share = 8;
    let b = soft_node(Admission {
        max_connections_per_peer: share,
        ..Admission::default()
    });
    let a = node_on(Transport::Auto);
    let qb = b.pd.create_qp(&b.cq, &b.cq, &config()).unwrap();
    let marker = std::env::temp_dir().join(format!("rdmapool-hold-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test_name(HERE, "child_holds_connections")])
        .args(["--test-threads=1"])
        .env(
            "RDMAPOOL_SECURITY_HOLD",
            format!("{} {share} {}", qb.endpoint().to_hex(), marker.display()),
        )
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the other user holds its connections", || marker.exists());
    let qa = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
    let connected = qa.connect(&qb.endpoint());
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_file(&marker);
    connected.expect("our QP was kept out by another user's connections");
}

/// `auto` dials over TCP when the peer's local socket will not have us: when nothing
/// listens there (the peer is in another network namespace of this host), and when it
/// closes the connection before its challenge (as a NIC at its connection limit does).
/// Before: the first fell back already, the second failed ("waiting for the hello
/// challenge: unexpected end of file").
#[test]
fn auto_falls_back_to_tcp_when_the_local_socket_refuses() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
    if soft_only("the soft transports") {
        return;
    }
    let closes = format!("rdmapool-closes-at-once-{}", std::process::id());
    let l =
        UnixListener::bind_addr(&UnixAddr::from_abstract_name(closes.as_bytes()).unwrap()).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            drop(c);
        }
    });
    for name in [
        "@rdmapool-nobody-listens-here".to_string(),
        format!("@{closes}"),
    ] {
        let (a, b) = (node_on(Transport::Auto), node_on(Transport::Auto));
        let (qa, qb) = (
            a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap(),
            b.pd.create_qp(&b.cq, &b.cq, &config()).unwrap(),
        );
        // b's endpoint with its local socket renamed (docs/PROTOCOL.md section 5.9).
        let mut bytes = qb.endpoint().to_bytes();
        let t = SoftTarget::of(&qb.endpoint());
        let path_at = bytes.len() - t.local.len();
        bytes.truncate(path_at - 2);
        bytes.extend_from_slice(&(name.len() as u16).to_le_bytes());
        bytes.extend_from_slice(name.as_bytes());
        let addr_len = (bytes.len() - 10) as u16;
        bytes[8..10].copy_from_slice(&addr_len.to_le_bytes());
        let moved = Endpoint::from_bytes(&bytes).unwrap();
        assert_eq!(SoftTarget::of(&moved).local, name);
        qa.connect(&moved)
            .unwrap_or_else(|e| panic!("{name}: auto did not try TCP: {e}"));
        qb.connect(&qa.endpoint()).unwrap();
        let src = a.pd.alloc_mr(64, ALL).unwrap();
        let dst = b.pd.alloc_mr(64, ALL).unwrap();
        src.write_at(0, b"over tcp").unwrap();
        qa.post_send(&[write_wr(
            1,
            dst.remote_region().at(0).unwrap(),
            &[src.sge(0, 8).unwrap()],
        )])
        .unwrap();
        assert!(one(&a.cq).is_ok(), "{name}");
        assert_eq!(&contents(&dst)[..8], b"over tcp", "{name}");
    }
}

/// Issue #22, secure by default: a soft NIC or a pool server that would listen beyond
/// loopback without a key refuses to start, saying how to set one and how to opt out; with
/// a key, or the operator's explicit opt-in, it starts. (Before: it started, with a warning
/// for the soft NIC and nothing for the pool server.)
#[test]
fn listeners_beyond_loopback_need_a_key_or_an_explicit_opt_in() {
    use rdmapool::remote::*;
    if soft_only("the soft NIC's and pool server's defaults") {
        return;
    }
    if rdmapool::fabric::unauthenticated_allowed_by_env() {
        eprintln!("skipped: RDMAPOOL_ALLOW_UNAUTHENTICATED=1 is set for this run");
        return;
    }
    let soft = |psk: Option<PreSharedKey>, allow: bool| {
        let mut cfg = SoftConfig {
            bind: "0.0.0.0:0".parse().unwrap(),
            ..SoftConfig::from_env().unwrap()
        };
        cfg.admission.psk = psk;
        cfg.admission.allow_unauthenticated = allow;
        Context::open(cfg)
    };
    let key = || Some(PreSharedKey::new(&[7; 32]).unwrap());
    refused_unprotected(
        soft(None, false),
        &[
            "soft NIC",
            "RDMAPOOL_SOFT_PSK_FILE",
            "chmod 600",
            "RDMAPOOL_ALLOW_UNAUTHENTICATED=1",
        ],
    );
    soft(key(), false).expect("with a key");
    let ctx = soft(None, true).expect("opted in");
    let server = |cluster_key: Option<PreSharedKey>, allow: bool| {
        MemoryServer::start(
            &ctx,
            ServerConfig {
                size: 4 << 20,
                chunk_size: 256 << 10,
                clients: 16,
                listen: "0.0.0.0:0".parse().unwrap(),
                cluster_key,
                allow_unauthenticated: allow,
                ..ServerConfig::default()
            },
        )
    };
    refused_unprotected(
        server(None, false),
        &[
            "pool server",
            "cluster_key",
            "RDMAPOOL_ALLOW_UNAUTHENTICATED=1",
        ],
    );
    server(key(), false).expect("with a key");
    server(None, true).expect("opted in");
    // Loopback needs neither.
    let local = node_on(Transport::Auto).ctx;
    MemoryServer::start(&local, ServerConfig::default()).expect("on loopback");
}
