//! The soft provider's intra-host path never waits in a post: an operation for a target QP
//! that is not ready yet goes through the socket, where the responder holds it until the
//! target is ready, and lands then; once the socket is quiet the direct path takes over.

use crate::support::*;
use rdmapool::fabric::*;

#[test]
fn a_post_to_a_local_peer_not_yet_ready_returns_and_lands_once_it_is() {
    if soft_only("the intra-host path") {
        return;
    }
    let (a, b) = (node_on(Transport::Local), node_on(Transport::Local));
    let cfg = config();
    let qa = a.pd.create_qp(&a.cq, &a.cq, &cfg).unwrap();
    let qb = b.pd.create_qp(&b.cq, &b.cq, &cfg).unwrap();
    let target = b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    let local = a.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // `a` is ready to send; `b` is still in RESET and only connects after the posts below
    // have returned. A post that waited for `b` (as the direct path once did, up to the
    // timeout) would complete with RetryExcErr before `b` could ever become ready.
    qa.connect(&qb.endpoint()).unwrap();
    assert_eq!(qb.state(), QpState::Reset);
    local.write_at(0, b"early write").unwrap();
    let sg = [local.sge(0, 11).unwrap()];
    qa.post_send(&[write_wr(1, target.remote_at(0).unwrap(), &sg)])
        .unwrap();
    target.write_at(100, b"from b").unwrap();
    let rd = [local.sge(200, 6).unwrap()];
    qa.post_send(&[read_wr(2, target.remote_at(100).unwrap(), &rd)])
        .unwrap();
    qb.connect(&qa.endpoint()).unwrap();
    for id in [1, 2] {
        let c = one(&a.cq);
        assert_eq!((c.wr_id, c.status), (id, WcStatus::Success), "{c:?}");
    }
    let mut got = [0u8; 11];
    target.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"early write");
    let mut back = [0u8; 6];
    local.read_at(200, &mut back).unwrap();
    assert_eq!(&back, b"from b");
    // With the socket quiet again, the next operations go direct, in order with the rest.
    for i in 0..100u64 {
        local.write_at(300, &i.to_le_bytes()).unwrap();
        let s = [local.sge(300, 8).unwrap()];
        qa.post_send(&[write_wr(
            10 + i,
            target.remote_at(8 * i as usize).unwrap(),
            &s,
        )])
        .unwrap();
        let c = one(&a.cq);
        assert_eq!((c.wr_id, c.status), (10 + i, WcStatus::Success), "{c:?}");
    }
    for i in 0..100u64 {
        let mut w = [0u8; 8];
        target.read_at(8 * i as usize, &mut w).unwrap();
        assert_eq!(u64::from_le_bytes(w), i, "word {i}");
    }
}

#[test]
fn a_list_over_several_regions_lands_every_request_and_fails_only_the_bad_one() {
    // One post, intra-host: WRITEs that alternate between two local regions and two target
    // regions (each request looks its regions up again, or reuses the last one), a READ,
    // and a request whose local key names no region after a good one of the same list
    // (a remembered region must not make a bad key good). The good requests before it
    // land; the bad one completes with an error and moves the QP to ERR, so the rest flush.
    if soft_only("the intra-host path") {
        return;
    }
    let (a, b) = (node_on(Transport::Local), node_on(Transport::Local));
    let (qa, _qb) = pair(&a, &b, &config());
    let targets = [
        b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap(),
        b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap(),
    ];
    let locals = [
        a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap(),
        a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap(),
    ];
    for (i, l) in locals.iter().enumerate() {
        l.write_at(0, &[b'a' + i as u8; 64]).unwrap();
    }
    targets[1].write_at(2048, b"read me").unwrap();
    // Request k writes 8 bytes of local k % 2 to target (k / 2) % 2 at offset 8 k.
    let sgs: Vec<[Sge; 1]> = (0..8)
        .map(|k| [locals[k % 2].sge(8 * k, 8).unwrap()])
        .collect();
    let rd = [locals[0].sge(1024, 7).unwrap()];
    let mut bad = locals[0].sge(0, 8).unwrap();
    bad.lkey ^= 0x5a5a_0000;
    let bad = [bad];
    let after = [locals[1].sge(0, 8).unwrap()];
    let mut list: Vec<SendWr<'_>> = (0..8)
        .map(|k| {
            write_wr(
                k as u64,
                targets[(k / 2) % 2].remote_at(8 * k).unwrap(),
                &sgs[k],
            )
        })
        .collect();
    list.push(read_wr(8, targets[1].remote_at(2048).unwrap(), &rd));
    list.push(write_wr(9, targets[0].remote_at(512).unwrap(), &bad));
    list.push(write_wr(10, targets[0].remote_at(520).unwrap(), &after));
    qa.post_send(&list).unwrap();
    for k in 0..8u64 {
        let c = one(&a.cq);
        assert_eq!((c.wr_id, c.status), (k, WcStatus::Success), "{c:?}");
        let mut got = [0u8; 8];
        targets[(k as usize / 2) % 2]
            .read_at(8 * k as usize, &mut got)
            .unwrap();
        assert_eq!(got, [b'a' + (k % 2) as u8; 8], "request {k}");
    }
    let c = one(&a.cq);
    assert_eq!((c.wr_id, c.status), (8, WcStatus::Success), "{c:?}");
    let mut back = [0u8; 7];
    locals[0].read_at(1024, &mut back).unwrap();
    assert_eq!(&back, b"read me");
    let c = one(&a.cq);
    assert_eq!(c.wr_id, 9);
    assert_eq!(c.status, WcStatus::LocQpOpErr, "{c:?}");
    let c = one(&a.cq);
    assert_eq!((c.wr_id, c.status), (10, WcStatus::WrFlushErr), "{c:?}");
    let mut untouched = [0u8; 16];
    targets[0].read_at(512, &mut untouched).unwrap();
    assert_eq!(
        untouched, [0u8; 16],
        "nothing of the bad request or after it landed"
    );
}
