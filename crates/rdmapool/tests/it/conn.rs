//! Connection setup with private data: accept, reject, limits, and garbage on the CM port.

use crate::support::*;
use rdmapool::conn::{
    connect, Listener, Manager, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA,
    MAX_REJECT_PRIVATE_DATA,
};
use rdmapool::fabric::*;
use rdmapool::CoreError;
use rdmapool::Error;
use std::io::Write;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn listener() -> Listener {
    Listener::bind(Manager::Tcp, "127.0.0.1:0".parse().unwrap()).unwrap()
}

#[test]
fn region_descriptor_travels_in_accept_private_data_and_the_qps_work() {
    for t in transports() {
        let (server, client) = (node_on(t), node_on(t));
        let region = server.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        let l = listener();
        let addr = l.local_addr();
        let desc = region.remote_region().to_bytes();
        let cfg = config();
        std::thread::scope(|s| {
            let srv = s.spawn(|| {
                let req = l.get_request(T).unwrap();
                assert_eq!(req.private_data(), b"client-7");
                req.accept(&server.pd, &server.cq, &server.cq, &cfg, &desc)
                    .unwrap()
            });
            let conn = connect(
                Manager::Tcp,
                addr,
                &ConnectSpec::new(&client.pd, &client.cq, &cfg)
                    .private_data(b"client-7")
                    .timeout(T),
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
            Manager::Tcp,
            addr,
            &ConnectSpec::new(&client.pd, &client.cq, &QpConfig::default())
                .private_data(b"hi")
                .timeout(T),
        ) {
            Err(Error::Core(CoreError::Rejected { private_data, .. })) => {
                assert_eq!(private_data, b"pool full")
            }
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
        Manager::Tcp,
        addr,
        &ConnectSpec::new(&client.pd, &client.cq, &QpConfig::default())
            .private_data(&too_long)
            .timeout(T),
    );
    assert!(matches!(
        r,
        Err(Error::Core(CoreError::OutOfLimits { max, .. })) if max == MAX_CONNECT_PRIVATE_DATA as u64
    ));
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
            assert!(matches!(
                r,
                Err(Error::Core(CoreError::OutOfLimits { max, .. })) if max == MAX_ACCEPT_PRIVATE_DATA as u64
            ));
        });
        // The request is dropped unanswered: the requester sees a closed connection.
        let r = connect(
            Manager::Tcp,
            addr,
            &ConnectSpec::new(&client.pd, &client.cq, &QpConfig::default())
                .private_data(b"x")
                .timeout(T),
        );
        assert!(
            matches!(r, Err(Error::Core(CoreError::Connection { .. }))),
            "{:?}",
            r.err()
        );
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
            Manager::Tcp,
            addr,
            &ConnectSpec::new(&client.pd, &client.cq, &QpConfig::default())
                .private_data(b"real")
                .timeout(T),
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
        Err(Error::Core(CoreError::Connection { .. }))
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
    let l = Listener::bind(Manager::RdmaCm, std::net::SocketAddr::new(ip, 0)).unwrap();
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
        let conn = connect(
            &client.pd, // the natural manager of a verbs PD: RDMA CM
            addr,
            &ConnectSpec::new(&client.pd, &client.cq, &cfg)
                .private_data(b"over rdma cm")
                .timeout(T),
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
        match connect(
            &client.pd, // the natural manager of a verbs PD: RDMA CM
            addr,
            &ConnectSpec::new(&client.pd, &client.cq, &cfg)
                .private_data(b"again")
                .timeout(T),
        ) {
            Err(Error::Core(CoreError::Rejected { private_data, .. })) => {
                assert_eq!(private_data, b"full")
            }
            Err(e) => panic!("expected a reject, got {e}"),
            Ok(_) => panic!("expected a reject"),
        }
        let server_qp = srv.join().unwrap();
        // The client disconnects: the passive side gets RDMA CM's DISCONNECTED as an event,
        // and its QP is in ERR.
        drop(conn);
        assert_eq!(server_qp.wait_event(T), Some(QpEvent::PeerDisconnected));
        assert_eq!(server_qp.state(), QpState::Error);
    });
}

#[test]
fn rdma_cm_reports_what_is_missing_instead_of_panicking() {
    let verbs = rdmapool::devices()
        .into_iter()
        .find(|p| p.provider == ProviderKind::Verbs)
        .unwrap();
    if verbs.unavailable.is_none() {
        eprintln!("this machine has RDMA devices; the missing-device path cannot be shown here");
        return;
    }
    let r = Listener::bind(Manager::RdmaCm, "127.0.0.1:0".parse().unwrap());
    assert!(r.is_err(), "an RDMA CM listener without any RDMA device");
    let n = node();
    let r = connect(
        Manager::RdmaCm,
        "127.0.0.1:9".parse().unwrap(),
        &ConnectSpec::new(&n.pd, &n.cq, &QpConfig::default())
            .private_data(b"x")
            .timeout(Duration::from_secs(2)),
    );
    assert!(r.is_err());
}

#[test]
fn private_data_frames_are_exact_and_bad_ones_are_typed_errors() {
    use rdmapool::conn::{decode_private_data, encode_private_data};
    let desc = RemoteRegion {
        addr: 0x7f00_0000_1000,
        len: 4096,
        rkey: 0x1234,
    }
    .to_bytes();
    let framed = encode_private_data(&desc).unwrap();
    assert_eq!(&framed[..2], &[0xA7, desc.len() as u8]);
    let mut padded = framed.clone();
    padded.resize(196, 0); // as RDMA CM delivers an accept's private data
    assert_eq!(decode_private_data(&padded).unwrap(), &desc[..]);
    assert_eq!(decode_private_data(&[]).unwrap(), b"");
    assert_eq!(
        decode_private_data(&[0; 56]).unwrap(),
        b"",
        "a peer that sent nothing"
    );
    // Unframed text, a raw region descriptor, a frame longer than what came, a frame with
    // something other than zeros after it, one stray byte.
    for raw in [
        &b"RDMA region"[..],
        &desc[..],
        &[0xA7, 9, 1, 2][..],
        &[0xA7, 1, 1, 9][..],
        &[7][..],
    ] {
        match decode_private_data(raw) {
            Err(CoreError::BadPrivateData { raw: got, .. }) => assert_eq!(got, raw),
            other => panic!("{raw:?}: {other:?}"),
        }
    }
    assert!(encode_private_data(&[0; MAX_ACCEPT_PRIVATE_DATA]).is_ok());
    assert!(matches!(
        encode_private_data(&[0; MAX_ACCEPT_PRIVATE_DATA + 1]),
        Err(CoreError::OutOfLimits { .. })
    ));
}

#[test]
fn the_natural_manager_follows_the_provider_and_a_reject_fits_a_rej() {
    assert_eq!(Manager::from(ProviderKind::Soft), Manager::Tcp);
    assert_eq!(Manager::from(ProviderKind::Verbs), Manager::RdmaCm);
    let (server, client) = (node(), node());
    assert_eq!(Manager::from(&client.pd), Manager::from(provider()));
    let l = listener();
    assert_eq!(l.manager(), Manager::Tcp);
    let addr = l.local_addr();
    let dial = |data: &[u8]| {
        connect(
            Manager::Tcp,
            addr,
            &ConnectSpec::new(&client.pd, &client.cq, &QpConfig::default())
                .private_data(data)
                .timeout(T),
        )
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            // A reason longer than an InfiniBand REJ carries is refused, not cut.
            let long = vec![b'x'; MAX_REJECT_PRIVATE_DATA + 1];
            let req = l.get_request(T).unwrap();
            assert!(matches!(
                req.reject(&long),
                Err(Error::Core(CoreError::OutOfLimits { max, .. })) if max == MAX_REJECT_PRIVATE_DATA as u64
            ));
            l.get_request(T)
                .unwrap()
                .reject(&long[..MAX_REJECT_PRIVATE_DATA])
                .unwrap();
            let req = l.get_request(T).unwrap();
            assert_eq!(req.raw_private_data(), req.private_data());
            req.accept(
                &server.pd,
                &server.cq,
                &server.cq,
                &QpConfig::default(),
                b"ok",
            )
            .unwrap();
        });
        // The refused reject leaves the request unanswered: the requester sees it closed.
        assert!(matches!(
            dial(b"1"),
            Err(Error::Core(CoreError::Connection { .. }))
        ));
        match dial(b"2") {
            Err(Error::Core(CoreError::Rejected { private_data, .. })) => {
                assert_eq!(private_data.len(), MAX_REJECT_PRIVATE_DATA)
            }
            other => panic!("{:?}", other.err()),
        }
        let conn = dial(b"3").unwrap();
        assert_eq!(conn.private_data, b"ok");
        assert_eq!(conn.raw_private_data, b"ok");
    });
}

#[test]
fn rdma_cm_negotiates_read_atomic_depths_and_shows_the_raw_private_data() {
    let Some(ip) = cm_ip() else { return };
    let (server, client) = (node(), node());
    let l = Listener::bind(&server.pd, std::net::SocketAddr::new(ip, 0)).unwrap();
    assert_eq!(l.manager(), Manager::RdmaCm);
    let addr = l.local_addr();
    let region = server.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    region.write_at(0, b"read me").unwrap();
    let desc = region.remote_region().to_bytes();
    let device_max = {
        let probe = pair(&server, &client, &QpConfig::default()).0;
        probe
            .rd_atomic()
            .unwrap()
            .expect("verbs reports its depths")
            .0
    };
    assert!(device_max >= 2, "the device allows {device_max}");
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let req = l.get_request(T).unwrap();
            let raw = req.raw_private_data().to_vec();
            assert_eq!(&raw[..2], &[0xA7, 3], "framed: {raw:?}");
            assert!(
                raw.len() >= 5,
                "padded as RDMA CM delivers it: {}",
                raw.len()
            );
            let qp = req
                .accept(
                    &server.pd,
                    &server.cq,
                    &server.cq,
                    &QpConfig::default(),
                    &desc,
                )
                .unwrap();
            (qp.rd_atomic().unwrap().unwrap(), qp) // the QP stays alive for the READ
        });
        let cfg = QpConfig {
            max_rd_atomic: 1,
            ..QpConfig::default()
        };
        let conn = connect(
            &client.pd,
            addr,
            &ConnectSpec::new(&client.pd, &client.cq, &cfg)
                .private_data(b"one")
                .timeout(T),
        )
        .unwrap();
        assert_eq!(&conn.raw_private_data[..2], &[0xA7, desc.len() as u8]);
        assert_eq!(conn.private_data, desc);
        // The client offered one READ in flight each way; the server, able to do more,
        // settled on one too.
        assert_eq!(conn.qp.rd_atomic().unwrap(), Some((1, 1)));
        let (server_depths, _server_qp) = srv.join().unwrap();
        assert_eq!(server_depths, (1, 1));
        // And READs work at that depth.
        let remote = RemoteRegion::from_bytes(&conn.private_data).unwrap();
        let buf = client.pd.alloc_mr(64, AccessFlags::all_remote()).unwrap();
        conn.qp
            .post_send(&[read_wr(1, remote.at(0).unwrap(), &[buf.sge(0, 7).unwrap()])])
            .unwrap();
        assert!(one(&client.cq).is_ok());
        let mut got = [0u8; 7];
        buf.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"read me");
    });
}
