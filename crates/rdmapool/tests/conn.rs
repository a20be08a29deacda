//! Connection setup with private data: accept, reject, limits, and garbage on the CM port.

mod common;
use common::*;
use rdmapool::conn::{connect, Listener, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA};
use rdmapool::fabric::*;
use rdmapool::Error;
use std::io::Write;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn listener() -> Listener {
    Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap()
}

#[test]
fn region_descriptor_travels_in_accept_private_data_and_the_qps_work() {
    for t in transports() {
        let (server, client) = (node(), node());
        let region = server.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        let l = listener();
        let addr = l.local_addr();
        let desc = region.remote_region().to_bytes();
        let cfg = config(t);
        std::thread::scope(|s| {
            let srv = s.spawn(|| {
                let req = l.get_request(T).unwrap();
                assert_eq!(req.private_data(), b"client-7");
                req.accept(&server.pd, &server.cq, &server.cq, &cfg, &desc)
                    .unwrap()
            });
            let conn = connect(
                addr,
                &client.pd,
                &client.cq,
                &client.cq,
                &cfg,
                b"client-7",
                T,
            )
            .unwrap();
            let _server_qp = srv.join().unwrap();
            let remote = RemoteRegion::from_bytes(&conn.private_data).unwrap();
            let buf = client.pd.alloc_mr(64, AccessFlags::all_remote()).unwrap();
            buf.write_at(0, b"via cm").unwrap();
            conn.qp
                .post_send(&[write_wr(
                    1,
                    remote.at(8).unwrap(),
                    &[buf.sge(0, 6).unwrap()],
                )])
                .unwrap();
            assert!(one(&client.cq).is_ok(), "{t:?}");
            let mut seen = [0u8; 6];
            region.read_at(8, &mut seen).unwrap();
            assert_eq!(&seen, b"via cm");
        });
    }
}

#[test]
fn reject_reaches_the_requester_with_its_private_data() {
    let client = node();
    let l = listener();
    let addr = l.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| l.get_request(T).unwrap().reject(b"pool full").unwrap());
        match connect(
            addr,
            &client.pd,
            &client.cq,
            &client.cq,
            &QpConfig::default(),
            b"hi",
            T,
        ) {
            Err(Error::Rejected { private_data, .. }) => assert_eq!(private_data, b"pool full"),
            Err(e) => panic!("expected a reject, got {e}"),
            Ok(_) => panic!("expected a reject, got a connection"),
        }
    });
}

#[test]
fn oversized_private_data_is_refused_on_both_sides() {
    let (server, client) = (node(), node());
    let too_long = vec![1u8; MAX_CONNECT_PRIVATE_DATA + 1];
    let addr = listener().local_addr();
    let r = connect(
        addr,
        &client.pd,
        &client.cq,
        &client.cq,
        &QpConfig::default(),
        &too_long,
        T,
    );
    assert!(matches!(r, Err(Error::InvalidArgument(_))));
    let l = listener();
    let addr = l.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = l.get_request(T).unwrap();
            let big = vec![2u8; MAX_ACCEPT_PRIVATE_DATA + 1];
            let r = req.accept(
                &server.pd,
                &server.cq,
                &server.cq,
                &QpConfig::default(),
                &big,
            );
            assert!(matches!(r, Err(Error::InvalidArgument(_))));
        });
        // The request is dropped unanswered: the requester sees a closed connection.
        let r = connect(
            addr,
            &client.pd,
            &client.cq,
            &client.cq,
            &QpConfig::default(),
            b"x",
            T,
        );
        assert!(matches!(r, Err(Error::Connection { .. })), "{:?}", r.err());
    });
}

#[test]
fn garbage_on_the_cm_port_is_dropped_and_listening_goes_on() {
    let (server, client) = (node(), node());
    let l = listener();
    let addr = l.local_addr();
    // A raw peer sends junk, and another claims far too much private data.
    let mut junk = std::net::TcpStream::connect(addr).unwrap();
    junk.write_all(&[0xff; 64]).unwrap();
    let mut liar = std::net::TcpStream::connect(addr).unwrap();
    let mut m = b"RDCM\x01\x01".to_vec();
    m.extend_from_slice(&4000u16.to_le_bytes());
    liar.write_all(&m).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = l.get_request(T).unwrap();
            assert_eq!(req.private_data(), b"real");
            req.accept(
                &server.pd,
                &server.cq,
                &server.cq,
                &QpConfig::default(),
                b"ok",
            )
            .unwrap();
        });
        let c = connect(
            addr,
            &client.pd,
            &client.cq,
            &client.cq,
            &QpConfig::default(),
            b"real",
            T,
        )
        .unwrap();
        assert_eq!(c.private_data, b"ok");
    });
}

#[test]
fn waiting_for_a_request_times_out_with_an_error() {
    let l = listener();
    assert!(matches!(
        l.get_request(Duration::from_millis(50)),
        Err(Error::Connection { .. })
    ));
}

/// The address RDMA CM tests listen on: set by scripts/verbs-conformance.sh to the SoftRoCE
/// netdev's address (RDMA CM cannot route over loopback).
fn cm_ip() -> Option<std::net::IpAddr> {
    if provider() != ProviderKind::Verbs {
        eprintln!(
            "RDMA CM needs the verbs provider; not run on {}",
            provider()
        );
        return None;
    }
    let ip = std::env::var("RDMAPOOL_TEST_CM_IP").ok()?.parse().ok();
    if ip.is_none() {
        panic!("RDMAPOOL_TEST_CM_IP must name the RDMA netdev's address for the verbs suite");
    }
    ip
}

#[test]
fn rdma_cm_connects_with_private_data_both_ways_and_rejects() {
    let Some(ip) = cm_ip() else { return };
    let (server, client) = (node(), node());
    let region = server.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    let l = Listener::bind_rdma_cm(std::net::SocketAddr::new(ip, 0)).unwrap();
    let addr = l.local_addr();
    assert_ne!(addr.port(), 0);
    let desc = region.remote_region().to_bytes();
    let cfg = QpConfig::default();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let req = l.get_request(T).unwrap();
            assert_eq!(req.private_data(), b"over rdma cm");
            let qp = req
                .accept(&server.pd, &server.cq, &server.cq, &cfg, &desc)
                .unwrap();
            // A second request is refused with a reason.
            l.get_request(T).unwrap().reject(b"full").unwrap();
            qp
        });
        let conn = rdmapool::conn::connect_rdma_cm(
            addr,
            &client.pd,
            &client.cq,
            &client.cq,
            &cfg,
            b"over rdma cm",
            T,
        )
        .unwrap();
        assert_eq!(conn.qp.state(), QpState::Rts);
        let remote = RemoteRegion::from_bytes(&conn.private_data).unwrap();
        let buf = client.pd.alloc_mr(64, AccessFlags::all_remote()).unwrap();
        buf.write_at(0, b"cm!").unwrap();
        conn.qp
            .post_send(&[write_wr(
                1,
                remote.at(0).unwrap(),
                &[buf.sge(0, 3).unwrap()],
            )])
            .unwrap();
        assert!(one(&client.cq).is_ok());
        let mut seen = [0u8; 3];
        region.read_at(0, &mut seen).unwrap();
        assert_eq!(&seen, b"cm!");
        match rdmapool::conn::connect_rdma_cm(
            addr, &client.pd, &client.cq, &client.cq, &cfg, b"again", T,
        ) {
            Err(Error::Rejected { private_data, .. }) => assert_eq!(private_data, b"full"),
            Err(e) => panic!("expected a reject, got {e}"),
            Ok(_) => panic!("expected a reject"),
        }
        let _server_qp = srv.join().unwrap();
    });
}

#[test]
fn rdma_cm_reports_what_is_missing_instead_of_panicking() {
    let verbs = rdmapool::fabric::devices()
        .into_iter()
        .find(|p| p.provider == ProviderKind::Verbs)
        .unwrap();
    if verbs.unavailable.is_none() {
        eprintln!("this machine has RDMA devices; the missing-device path cannot be shown here");
        return;
    }
    let r = Listener::bind_rdma_cm("127.0.0.1:0".parse().unwrap());
    assert!(r.is_err(), "an RDMA CM listener without any RDMA device");
    let n = node();
    let r = rdmapool::conn::connect_rdma_cm(
        "127.0.0.1:9".parse().unwrap(),
        &n.pd,
        &n.cq,
        &n.cq,
        &QpConfig::default(),
        b"x",
        Duration::from_secs(2),
    );
    assert!(r.is_err());
}
