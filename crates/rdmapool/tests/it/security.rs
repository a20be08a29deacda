//! Attacks on the soft provider, tried the way a peer on the network or another user on this
//! host would (docs/SECURITY.md lists them with their outcome). Each test failed before the
//! fix it names.

use crate::support::rawpeer::{status, Raw, SoftTarget};
use crate::support::*;
use rdmapool::conn::{connect, Listener, Manager};
use rdmapool::fabric::*;
use rdmapool::CoreError;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

mod isolation;
mod pool;
mod soft_nic;

/// This module, for child processes started with its `child_entry`.
const HERE: &str = module_path!();

const ALL: AccessFlags = AccessFlags::all_remote();

fn soft_node(admission: Admission) -> Node {
    let cfg = SoftConfig {
        admission,
        ..SoftConfig::from_env().unwrap()
    };
    let ctx = Context::open(cfg).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    Node { ctx, pd, cq }
}

/// A QP on `n` in RTR, bound to `peer_qpn` (a peer that never dials): what an attacker who
/// learned the endpoint tries to reach.
fn bound_qp(n: &Node, peer_ep: &Endpoint) -> Qp {
    let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
    qp.modify_to_init().unwrap();
    qp.modify_to_rtr(peer_ep).unwrap();
    qp
}

/// Run as a child (another user): says hello with the token it is given, prints the status.
#[test]
fn child_says_hello() {
    let Ok(spec) = std::env::var("RDMAPOOL_SECURITY_CHILD") else {
        return; // only meaningful as the child of the test below
    };
    let f: Vec<&str> = spec.split(' ').collect();
    let ep = Endpoint::from_hex(f[1]).unwrap();
    let t = SoftTarget::of(&ep);
    let src: u32 = f[2].parse().unwrap();
    let mut raw = if f[0] == "unix" {
        Raw::unix(&t)
    } else if let Some(ip) = f[0].strip_prefix("tcp-at:") {
        // The NIC's port, dialled at another of this host's addresses.
        let mut at = t.clone();
        at.tcp = std::net::SocketAddr::new(ip.parse().unwrap(), t.tcp.port());
        Raw::tcp(&at)
    } else {
        Raw::tcp(&t)
    };
    println!("STATUS={}", raw.hello(src, t.qpn, &t.token, None).unwrap());
}

fn hello_as_nobody(path: &str, ep: &Endpoint, src: u32) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            &test_name(module_path!(), "child_says_hello"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "RDMAPOOL_SECURITY_CHILD",
            format!("{path} {} {src}", ep.to_hex()),
        )
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let after = text
        .split("STATUS=")
        .nth(1)
        .unwrap_or_else(|| panic!("the child said nothing: {text} {out:?}"));
    after.chars().take_while(char::is_ascii_digit).collect()
}

/// A raw peer on the local socket that passed the handshake as the bound peer of a fresh QP
/// on `b` (its QP on `a` only provides the number): returns both QPs and the connection.
fn local_raw_peer(a: &Node, b: &Node) -> (Qp, Qp, Raw) {
    let peer = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
    let qb = bound_qp(b, &peer.endpoint());
    let t = SoftTarget::of(&qb.endpoint());
    let mut raw = Raw::unix(&t);
    assert_eq!(raw.hello(peer.qpn(), t.qpn, &t.token, None).unwrap(), 0);
    raw.skip_local_handshake().unwrap();
    (peer, qb, raw)
}

#[test]
fn idle_connections_on_the_cm_port_delay_nobody() {
    // Three peers connect to the CM port and say nothing; a real request behind them must
    // still be served well within one handshake timeout each.
    let server = node();
    let listener = Listener::bind(Manager::Tcp, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let client = std::thread::spawn(move || {
        let c = node();
        let cfg = config();
        connect(
            Manager::Tcp,
            addr,
            &ConnectSpec::new(&c.pd, &c.cq, &cfg)
                .private_data(b"hi")
                .timeout(WAIT),
        )
        .map(|conn| conn.qp.qpn())
    });
    let req = listener.get_request(Duration::from_secs(5)).unwrap();
    assert_eq!(req.private_data(), b"hi");
    let qp = req
        .accept(&server.pd, &server.cq, &server.cq, &config(), b"")
        .unwrap();
    client.join().unwrap().unwrap();
    drop((idle, qp));
}

/// Run as a child: connects a QP to the endpoint on its stdin, prints its own, then waits
/// to be killed.
#[test]
fn child_connects_and_waits() {
    if std::env::var("RDMAPOOL_SECURITY_PEER").is_err() {
        return; // only meaningful as the child of the test below
    }
    let n = node_on(Transport::Tcp);
    let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
    println!("EP={}", qp.endpoint().to_hex());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    qp.connect(&Endpoint::from_hex(line.trim()).unwrap())
        .unwrap();
    println!("CONNECTED");
    std::thread::sleep(Duration::from_secs(600));
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn the_passive_side_learns_that_its_peer_died() {
    if soft_only("peer death on the soft transports") {
        return;
    }
    let n = node_on(Transport::Tcp);
    let recv_buf = n.pd.alloc_mr(4096, ALL).unwrap();
    let fds_before = open_fds();
    let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &test_name(module_path!(), "child_connects_and_waits"),
        ])
        .args(["--nocapture"])
        .args(["--test-threads=1"])
        .env("RDMAPOOL_SECURITY_PEER", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = (&mut out).lines().map(|l| l.unwrap());
    let ep = lines
        .find_map(|l| l.split("EP=").nth(1).map(String::from))
        .unwrap();
    let theirs = Endpoint::from_hex(&ep).unwrap();
    qp.modify_to_init().unwrap();
    qp.modify_to_rtr(&theirs).unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "{}", qp.endpoint().to_hex()).unwrap();
    assert!(lines.any(|l| l.contains("CONNECTED")));
    qp.modify_to_rts().unwrap();
    qp.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &[recv_buf.sge(0, 64).unwrap()],
    }])
    .unwrap();
    // Nothing is in flight on our side: only the passive half can notice.
    child.kill().unwrap();
    child.wait().unwrap();
    // The test's own pipes to the child are not the library's: close them first.
    drop(lines);
    drop(out);
    drop(child.stdin.take());
    assert_eq!(qp.wait_event(WAIT), Some(QpEvent::PeerDisconnected));
    assert_eq!(qp.state(), QpState::Error);
    let c = one(&n.cq);
    assert_eq!((c.wr_id, c.status), (7, WcStatus::WrFlushErr));
    drop(qp);
    // What the connections held is released (their threads close their sockets).
    let back = (0..400).any(|_| {
        std::thread::sleep(Duration::from_millis(25));
        open_fds() <= fds_before
    });
    let list: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        back,
        "fds {} > {fds_before} after the peer died: {list:?}",
        open_fds()
    );
}

/// A small memory server (4 MiB in 256 KiB chunks, 16 clients) on the tests' listen address.
fn small_server(
    ctx: &Context,
    node: u32,
    cluster_key: Option<PreSharedKey>,
) -> rdmapool::remote::MemoryServer {
    rdmapool::remote::MemoryServer::start(
        ctx,
        rdmapool::remote::ServerConfig {
            node,
            size: 4 << 20,
            chunk_size: 256 << 10,
            clients: 16,
            listen: std::net::SocketAddr::new(listen_ip(), 0),
            cluster_key,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Connects a QP of `n` to the pool server at `addr` with the raw `hello`.
fn dial_pool(
    n: &Node,
    addr: std::net::SocketAddr,
    hello: &[u8],
) -> rdmapool::Result<rdmapool::conn::Connection> {
    connect(
        Manager::from(&n.pd),
        addr,
        &ConnectSpec::new(&n.pd, &n.cq, &config())
            .private_data(hello)
            .timeout(WAIT),
    )
}

/// `ep` with its address pointing at `to` and a host id that is not this host's, so that
/// whoever connects to it dials `to` over TCP (docs/PROTOCOL.md section 5.9).
fn endpoint_leading_to(ep: &Endpoint, to: std::net::SocketAddrV4) -> Endpoint {
    let mut b = ep.to_bytes();
    let a = &mut b[10..];
    assert_eq!(a[32], 4, "an IPv4 endpoint");
    a[..16].fill(0xEE);
    a[33..37].copy_from_slice(&to.ip().octets());
    a[37..39].copy_from_slice(&to.port().to_le_bytes());
    Endpoint::from_bytes(&b).unwrap()
}

/// A REQ on the TCP CM port (docs/PROTOCOL.md section 4), byte by byte.
fn raw_req(ep: &Endpoint, private: &[u8]) -> Vec<u8> {
    let ep = ep.to_bytes();
    let body = 2 + ep.len() + 2 + private.len();
    let mut req = b"RDCM\x01\x01".to_vec(); // magic, version 1, kind REQ
    req.extend_from_slice(&(body as u16).to_le_bytes());
    req.extend_from_slice(&(ep.len() as u16).to_le_bytes());
    req.extend_from_slice(&ep);
    req.extend_from_slice(&(private.len() as u16).to_le_bytes());
    req.extend_from_slice(private);
    req
}

/// Requests that stall their handshake at a pool server, sent from `addrs` in turn every
/// `period`: half carry an endpoint that leads to a listener that never sends the
/// challenge, half a real QP whose requester never sends the RTU. Hellos carry no proof.
struct StallAttack {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl StallAttack {
    fn start(cm: std::net::SocketAddr, addrs: &[&str], period: Duration) -> StallAttack {
        use rdmapool::remote::ClientHello;
        use socket2::{Domain, Socket, Type};
        use std::net::SocketAddr;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        // Where the crafted endpoints lead: takes connections, never says a word.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(silent_addr) = silent.local_addr().unwrap() else {
            unreachable!()
        };
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in silent.incoming() {
                held.push(s);
            }
        });
        let froms: Vec<SocketAddr> = addrs
            .iter()
            .map(|a| format!("{a}:0").parse().unwrap())
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let me = node_on(Transport::Tcp);
                let mut held = Vec::new();
                let mut qps = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let k = sent.load(Ordering::Relaxed);
                    let qp = me.pd.create_qp(&me.cq, &me.cq, &config()).unwrap();
                    qp.modify_to_init().unwrap();
                    let ep = if k % 2 == 0 {
                        endpoint_leading_to(&qp.endpoint(), silent_addr)
                    } else {
                        qp.endpoint() // real: the server connects, then waits for an RTU
                    };
                    let hello = ClientHello::new(900 + k as u64).unwrap().encode();
                    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
                    s.bind(&froms[k % froms.len()].into()).unwrap();
                    if s.connect(&cm.into()).is_ok() {
                        let mut t: TcpStream = s.into();
                        let _ = t.write_all(&raw_req(&ep, &hello));
                        held.push(t);
                        qps.push(qp);
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(period);
                }
            })
        };
        StallAttack { stop, sent, thread }
    }

    /// Waits until `n` requests went out.
    fn wait_for(&self, n: usize) {
        while self.sent.load(std::sync::atomic::Ordering::Relaxed) < n {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops it; how many requests it sent.
    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap();
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Run as a child (another user): keeps connections open on a NIC's local socket, a fresh
/// set every second for ten seconds (the NIC closes those that never say hello after 2 s),
/// and creates the file it is given once the first set is open.
#[test]
fn child_holds_connections() {
    let Ok(spec) = std::env::var("RDMAPOOL_SECURITY_HOLD") else {
        return; // only meaningful as the child of the test below
    };
    let f: Vec<&str> = spec.split(' ').collect();
    let t = SoftTarget::of(&Endpoint::from_hex(f[0]).unwrap());
    let n: usize = f[1].parse().unwrap();
    for round in 0..10 {
        let held: Vec<Raw> = (0..n).map(|_| Raw::unix(&t)).collect();
        if round == 0 {
            std::fs::write(f[2], b"held").unwrap();
        }
        std::thread::sleep(Duration::from_secs(1));
        drop(held);
    }
}

/// Asserts that `r` is `CoreError::Unprotected` and that its message says each of `says`.
fn refused_unprotected<T, E: Into<rdmapool::Error>>(r: Result<T, E>, says: &[&str]) {
    match r.map_err(Into::into) {
        Err(e @ rdmapool::Error::Core(CoreError::Unprotected { .. })) => {
            let text = e.to_string();
            for s in says {
                assert!(text.contains(s), "should say {s:?}: {text}");
            }
        }
        Err(e) => panic!("expected Unprotected, got {e}"),
        Ok(_) => panic!("started beyond loopback without a key"),
    }
}
