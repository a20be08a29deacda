//! Completions per CQ and per QP (`ContextMetrics::track_objects`): real WRITEs on the
//! provider under test (soft, or verbs in the SoftRoCE guest), one of them with a wrong rkey,
//! are counted on the QP and CQ they belong to, in the context's snapshot and in the
//! Prometheus text; destroyed objects leave the listing; and nothing is counted while
//! tracking is off (a switch of the context's own).

use rdmapool::fabric::*;
use rdmapool::metrics::ObjectCompletions;

fn find(list: &[ObjectCompletions], device: &str, id: u64) -> Option<Vec<(WcStatus, u64)>> {
    list.iter()
        .find(|o| o.device == device && o.id == id)
        .map(|o| o.completions.clone())
}

#[test]
fn completions_are_counted_on_their_qp_and_cq() {
    let crate::support::Node { ctx, pd, cq: _ } = crate::support::node();
    let device = ctx.device().name.clone();
    let (cq_good, cq_bad, cq_target) = (
        ctx.create_cq(64).unwrap(),
        ctx.create_cq(64).unwrap(),
        ctx.create_cq(64).unwrap(),
    );
    let cfg = crate::support::config();
    let pair = |cq: &Cq| {
        let a = pd.create_qp(cq, cq, &cfg).unwrap();
        let b = pd.create_qp(&cq_target, &cq_target, &cfg).unwrap();
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
        (a, b)
    };
    let ((good, _good_peer), (bad, _bad_peer)) = (pair(&cq_good), pair(&cq_bad));
    let target = pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    let local = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let write = |qp: &Qp, cq: &Cq, rkey_xor: u32| {
        let mut remote = target.remote_at(0).unwrap();
        remote.rkey ^= rkey_xor;
        qp.post_send(&[SendWr {
            wr_id: 1,
            op: WrOp::Write { remote, imm: None },
            sg_list: &[local.sge(0, 64).unwrap()],
            signaled: true,
        }])
        .unwrap();
        crate::support::one(cq).status
    };

    ctx.metrics().track_objects(true);
    for _ in 0..5 {
        assert_eq!(write(&good, &cq_good, 0), WcStatus::Success);
    }
    assert_eq!(write(&bad, &cq_bad, 0x5a5a), WcStatus::RemAccessErr);

    let s = ctx.metrics().snapshot();
    assert!(s.objects_tracked);
    let good_id = u64::from(good.qpn());
    let bad_id = u64::from(bad.qpn());
    assert_eq!(
        find(&s.qps, &device, good_id),
        Some(vec![(WcStatus::Success, 5)])
    );
    assert_eq!(
        find(&s.qps, &device, bad_id),
        Some(vec![(WcStatus::Success, 0), (WcStatus::RemAccessErr, 1)])
    );
    assert_eq!(
        find(&s.cqs, &device, cq_good.metrics_id()),
        Some(vec![(WcStatus::Success, 5)])
    );
    assert_eq!(
        find(&s.cqs, &device, cq_bad.metrics_id()),
        Some(vec![(WcStatus::Success, 0), (WcStatus::RemAccessErr, 1)])
    );
    // Exactly this context's objects: three CQs (the node's own was dropped with the
    // pattern that ignored it) and two pairs of QPs.
    assert_eq!((s.qps_live, s.cqs_live), (4, 3));
    let text = s.to_prometheus();
    for line in [
        format!("rdmapool_qp_completions_total{{device=\"{device}\",qp=\"{good_id}\",status=\"success\"}} 5"),
        format!("rdmapool_qp_completions_total{{device=\"{device}\",qp=\"{bad_id}\",status=\"rem_access_err\"}} 1"),
        format!(
            "rdmapool_cq_completions_total{{device=\"{device}\",cq=\"{}\",status=\"rem_access_err\"}} 1",
            cq_bad.metrics_id()
        ),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }

    // A destroyed QP and CQ leave the listing.
    let live = s.qps_live;
    drop(bad);
    let bad_cq_id = cq_bad.metrics_id();
    drop(cq_bad);
    let s = ctx.metrics().snapshot();
    assert_eq!(find(&s.qps, &device, bad_id), None);
    assert_eq!(find(&s.cqs, &device, bad_cq_id), None);
    assert_eq!(s.qps_live, live - 1);

    // Off: nothing more is counted.
    ctx.metrics().track_objects(false);
    assert_eq!(write(&good, &cq_good, 0), WcStatus::Success);
    let s = ctx.metrics().snapshot();
    assert!(!s.objects_tracked);
    assert_eq!(
        find(&s.qps, &device, good_id),
        Some(vec![(WcStatus::Success, 5)])
    );
    assert!(!s.to_prometheus().contains("rdmapool_qp_completions_total"));
}
