//! Interoperation with a C peer on rdma-core (scripts/c-peer/cm_peer.c, librdmacm with its
//! own QPs) through RDMA CM, following docs/PROTOCOL.md: framed private data, the region
//! descriptor, one-sided READ/WRITE both ways, and framing errors as typed errors on both
//! sides. Runs in the SoftRoCE guest (scripts/verbs-conformance.sh builds the peer and sets
//! RDMAPOOL_C_PEER); elsewhere it says why it does not run.

use crate::support::*;
use rdmapool::conn::{connect, Listener, Manager};
use rdmapool::fabric::*;
use rdmapool::CoreError;
use rdmapool::Error;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// The C peer and the RDMA netdev's address, or None (with the reason on stderr).
fn setup() -> Option<(String, IpAddr)> {
    if provider() != ProviderKind::Verbs {
        eprintln!(
            "the C peer speaks RDMA CM on rdma-core: not run on {}",
            provider()
        );
        return None;
    }
    let ip = std::env::var("RDMAPOOL_TEST_CM_IP")
        .expect("RDMAPOOL_TEST_CM_IP names the RDMA netdev's address in the verbs suite")
        .parse()
        .expect("RDMAPOOL_TEST_CM_IP is an IP address");
    let peer = std::env::var("RDMAPOOL_C_PEER")
        .expect("RDMAPOOL_C_PEER names the built scripts/c-peer/cm_peer in the verbs suite");
    Some((peer, ip))
}

/// Starts `cm_peer args..`; for a server, waits until it listens.
fn start(peer: &str, args: &[&str]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(peer)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the C peer");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    if args[0] == "server" {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "listening");
    }
    (child, out)
}

/// Waits for the peer; its exit code and the rest of what it printed.
fn finish(mut child: Child, mut out: BufReader<std::process::ChildStdout>) -> (i32, String) {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut out, &mut text).unwrap();
    let code = child.wait().unwrap().code().unwrap_or(-1);
    (code, text)
}

#[test]
fn a_rust_client_uses_a_c_servers_region_one_sidedly() {
    let Some((peer, ip)) = setup() else { return };
    let n = node();
    let (child, out) = start(&peer, &["server", &ip.to_string(), "18601", "framed"]);
    let conn = connect(
        &n.pd, // verbs: RDMA CM
        SocketAddr::new(ip, 18601),
        &ConnectSpec::new(&n.pd, &n.cq, &QpConfig::default())
            .private_data(b"from rust")
            .timeout(T),
    )
    .unwrap();
    let remote = RemoteRegion::from_bytes(&conn.private_data).unwrap();
    assert_eq!(remote.len, 4096);
    let buf = n.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    conn.qp
        .post_send(&[read_wr(
            1,
            remote.at(0).unwrap(),
            &[buf.sge(0, 12).unwrap()],
        )])
        .unwrap();
    assert!(one(&n.cq).is_ok());
    let mut got = [0u8; 12];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"hello from C");
    buf.write_at(100, b"from rust\0").unwrap();
    conn.qp
        .post_send(&[write_wr(
            2,
            remote.at(64).unwrap(),
            &[buf.sge(100, 10).unwrap()],
        )])
        .unwrap();
    assert!(one(&n.cq).is_ok());
    drop(conn); // disconnects: the C server prints what we wrote and exits
    let (code, text) = finish(child, out);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("request: from rust"), "{text}");
    assert!(text.contains("written: from rust"), "{text}");
}

#[test]
fn an_unframed_accept_from_a_c_server_is_a_typed_error_with_the_raw_bytes() {
    let Some((peer, ip)) = setup() else { return };
    let n = node();
    let (child, out) = start(&peer, &["server", &ip.to_string(), "18602", "unframed"]);
    let r = connect(
        Manager::RdmaCm,
        SocketAddr::new(ip, 18602),
        &ConnectSpec::new(&n.pd, &n.cq, &QpConfig::default())
            .private_data(b"x")
            .timeout(T),
    );
    match r {
        Err(Error::Core(CoreError::BadPrivateData { raw, .. })) => {
            // The raw region descriptor, then RDMA CM's zero padding.
            assert_eq!(&raw[..3], b"RD\x01", "{raw:?}");
            assert!(raw[24..].iter().all(|&b| b == 0));
        }
        Err(e) => panic!("expected BadPrivateData, got {e}"),
        Ok(_) => panic!("an unframed accept was taken as framed"),
    }
    let (code, text) = finish(child, out);
    assert_eq!(code, 0, "the C server saw the disconnect: {text}");
}

#[test]
fn a_c_client_is_rejected_for_unframed_data_then_served_when_framed() {
    let Some((peer, ip)) = setup() else { return };
    let n = node();
    let l = Listener::bind(&n.pd, SocketAddr::new(ip, 0)).unwrap();
    let port = l.local_addr().port().to_string();
    let region = n.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    region.write_at(0, b"hello from rust!").unwrap();
    // Unframed: the listener rejects it with a reason and tells us, with the raw bytes.
    let (child, out) = start(&peer, &["client", &ip.to_string(), &port, "unframed"]);
    match l.get_request(T) {
        Err(Error::Core(CoreError::BadPrivateData { raw, .. })) => {
            assert_eq!(&raw[..11], b"RDMA from C")
        }
        Err(e) => panic!("expected BadPrivateData, got {e}"),
        Ok(_) => panic!("an unframed request was taken as framed"),
    }
    let (code, text) = finish(child, out);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("rejected: malformed private data"), "{text}");
    // Framed: accepted with our region descriptor; the C client READs and WRITEs it.
    let (child, out) = start(&peer, &["client", &ip.to_string(), &port, "framed"]);
    let req = l.get_request(T).unwrap();
    assert_eq!(req.private_data(), b"from C");
    let qp = req
        .accept(
            &n.pd,
            &n.cq,
            &n.cq,
            &QpConfig::default(),
            &region.remote_region().to_bytes(),
        )
        .unwrap();
    // The C client's WRITE lands with no CPU on this side; wait for it to show.
    let until = std::time::Instant::now() + T;
    let mut got = [0u8; 11];
    while &got != b"C was here\0" && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
        region.read_at(32, &mut got).unwrap();
    }
    assert_eq!(&got, b"C was here\0");
    // Disconnect from this side too: rdmapool does not answer a peer's disconnect request
    // until the QP is dropped (issue #12), and the C client's synchronous rdma_disconnect
    // waits for that answer.
    drop(qp);
    let (code, text) = finish(child, out);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("read: hello from rust!"), "{text}");
}
