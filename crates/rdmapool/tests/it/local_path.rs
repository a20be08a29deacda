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
