//! Data between processes: every opcode on every path, the intra-host path without the
//! target's CPU, atomics from several processes, two hosts in network namespaces, the verbs GID.

use super::*;

#[test]
fn two_processes_every_opcode() {
    for t in transports() {
        let (mut peer, n, qp, region) = connect_to_target(t);
        let buf = n.pd.alloc_mr(REGION, ALL).unwrap();
        let data = pattern(REGION, 5);
        buf.write_at(0, &data).unwrap();
        qp.post_send(&[write_wr(
            1,
            region.at(0).unwrap(),
            &[buf.sge(0, REGION as u32).unwrap()],
        )])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        let back = n.pd.alloc_mr(REGION, ALL).unwrap();
        qp.post_send(&[read_wr(
            2,
            region.at(0).unwrap(),
            &[back.sge(0, REGION as u32).unwrap()],
        )])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        assert_eq!(contents(&back), data, "{t:?}: read back what was written");
        let word = region.at(64).unwrap();
        let before = u64::from_ne_bytes(data[64..72].try_into().unwrap());
        let sg = [buf.sge(0, 8).unwrap()];
        let faa = WrOp::FetchAdd {
            remote: word,
            add: 10,
        };
        qp.post_send(&[SendWr {
            wr_id: 3,
            op: faa,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        assert_eq!(buf.read_u64(0).unwrap(), before);
        let cas = WrOp::CompareSwap {
            remote: word,
            compare: before.wrapping_add(10),
            swap: 99,
        };
        qp.post_send(&[SendWr {
            wr_id: 4,
            op: cas,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        assert_eq!(buf.read_u64(0).unwrap(), before.wrapping_add(10));
        qp.post_send(&[read_wr(5, word, &sg)]).unwrap();
        assert!(one(&n.cq).is_ok());
        assert_eq!(buf.read_u64(0).unwrap(), 99);
        buf.write_at(0, b"over there").unwrap();
        let send = WrOp::Send { imm: Some(7) };
        qp.post_send(&[SendWr {
            wr_id: 6,
            op: send,
            sg_list: &[buf.sge(0, 10).unwrap()],
            signaled: true,
        }])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        peer.say("recv");
        assert_eq!(peer.line(), "recv 7 over there", "{t:?}");
        let seen = peer_dump(&mut peer, 0, 4096);
        assert!(
            seen[..64] == data[..64],
            "{t:?}: the target's own view before the word"
        );
        assert_eq!(
            u64::from_ne_bytes(seen[64..72].try_into().unwrap()),
            99,
            "{t:?}: the word"
        );
        assert!(
            seen[72..] == data[72..4096],
            "{t:?}: the target's own view after the word"
        );
    }
}

#[test]
fn local_path_needs_no_target_cpu() {
    if soft_only("the soft intra-host path") {
        return;
    }
    // Once the region is mapped, one-sided operations on the local path are executed by the
    // initiator alone: they keep working while the target process is frozen.
    let (mut peer, n, qp, region) = connect_to_target(Transport::Local);
    let buf = n.pd.alloc_mr(4096, ALL).unwrap();
    let sg = [buf.sge(0, 8).unwrap()];
    let faa = |add| SendWr {
        wr_id: 1,
        op: WrOp::FetchAdd {
            remote: region.at(0).unwrap(),
            add,
        },
        sg_list: &sg,
        signaled: true,
    };
    qp.post_send(&[faa(1)]).unwrap();
    assert!(one(&n.cq).is_ok());
    let start = buf.read_u64(0).unwrap();
    peer.signal(libc::SIGSTOP);
    wait_stopped(&peer);
    for i in 1..=100u64 {
        qp.post_send(&[faa(1)]).unwrap();
        assert!(one(&n.cq).is_ok(), "FAA {i} with the target frozen");
        assert_eq!(buf.read_u64(0).unwrap(), start + i);
    }
    buf.write_at(8, b"frozen!!").unwrap();
    qp.post_send(&[write_wr(
        2,
        region.at(64).unwrap(),
        &[buf.sge(8, 8).unwrap()],
    )])
    .unwrap();
    assert!(one(&n.cq).is_ok());
    peer.signal(libc::SIGCONT);
    assert_eq!(peer_dump(&mut peer, 64, 8), b"frozen!!");
}

#[test]
fn atomics_from_several_processes_and_paths_are_atomic_together() {
    // Two processes add to one word of ours, one through the zero-copy local path (its CPU
    // does the atomic on the shared page) and one over TCP (our emulated NIC does it), while
    // a QP of this process adds too. No update may be lost.
    const N: u64 = 3000;
    let n = node();
    let mr = n.pd.alloc_mr(4096, ALL).unwrap();
    let mut children = Vec::new();
    let mut qps = Vec::new();
    for t in ["local", "tcp"] {
        let mut peer = Peer::spawn(HERE, "adder", &[("T", t), ("N", &N.to_string())]);
        let ep = Endpoint::from_hex(&peer.line()).unwrap();
        // The child's path is its own (T); ours only carries its connection's requests.
        let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
        qp.connect(&ep).unwrap();
        peer.say(&format!(
            "{} {}",
            qp.endpoint().to_hex(),
            mr.remote_region().to_hex()
        ));
        children.push(peer);
        qps.push(qp);
    }
    let me = node_on(Transport::Local);
    let (qa, _qb) = pair(&me, &n, &config());
    let res = me.pd.alloc_mr(8, ALL).unwrap();
    let sg = [res.sge(0, 8).unwrap()];
    for i in 0..N {
        let op = WrOp::FetchAdd {
            remote: mr.remote_at(0).unwrap(),
            add: 1,
        };
        qa.post_send(&[SendWr {
            wr_id: i,
            op,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        assert!(one(&me.cq).is_ok());
    }
    for c in &mut children {
        assert_eq!(c.line(), "done");
    }
    assert_eq!(mr.read_u64(0).unwrap(), 3 * N);
}

#[test]
fn tcp_between_two_hosts_in_network_namespaces() {
    if soft_only("the soft TCP transport") {
        return;
    }
    let hosts = match TwoHosts::new() {
        Ok(h) => h,
        Err(why) if std::env::var("CI").is_err() => {
            eprintln!("skipped: {why}");
            return;
        }
        Err(why) => panic!("CI must be able to make network namespaces: {why}"),
    };
    const N: u64 = 500;
    let bind_a = format!("{}:0", hosts.addr_a);
    let bind_b = format!("{}:0", hosts.addr_b);
    let mut target = Peer::spawn_in(
        Some(&hosts.a),
        HERE,
        "target",
        &[("T", "tcp"), ("RDMAPOOL_SOFT_BIND", &bind_a)],
    );
    let mut adder = Peer::spawn_in(
        Some(&hosts.b),
        HERE,
        "adder",
        &[
            ("T", "tcp"),
            ("N", &N.to_string()),
            ("RDMAPOOL_SOFT_BIND", &bind_b),
        ],
    );
    let first = target.line();
    let (target_ep, region) = first.split_once(' ').unwrap();
    let target_addr = rdmapool::soft::tcp_addr(&Endpoint::from_hex(target_ep).unwrap()).unwrap();
    assert_eq!(
        target_addr.ip().to_string(),
        hosts.addr_a,
        "the target listens on its host's address"
    );
    let adder_ep = adder.line();
    adder.say(&format!("{target_ep} {region}"));
    target.say(&adder_ep);
    assert_eq!(target.line(), "ready");
    assert_eq!(adder.line(), "done");
    // The region starts zeroed; every FAA crossed the veth pair.
    let word = peer_dump(&mut target, 0, 8);
    assert_eq!(u64::from_ne_bytes(word.try_into().unwrap()), N);
}

#[test]
fn verbs_gid_index_out_of_range_is_a_typed_error() {
    if provider() != ProviderKind::Verbs {
        eprintln!("verbs only; not run on {}", provider());
        return;
    }
    let mut peer = Peer::spawn(HERE, "open-verbs", &[("RDMAPOOL_GID_INDEX", "250")]);
    let line = peer.line();
    assert!(
        line.starts_with("err ") && line.contains("out of range"),
        "{line}"
    );
    for bad in ["5000", "not-a-number"] {
        let mut peer = Peer::spawn(HERE, "open-verbs", &[("RDMAPOOL_GID_INDEX", bad)]);
        let line = peer.line();
        assert!(line.contains("out of range"), "{bad}: {line}");
    }
}
