//! Sampled per-opcode latency (`ContextMetrics::sample_op_latency`): real WRITE, READ,
//! CAS and FAA on the soft provider land in the histogram of their opcode, and nothing is
//! timed while sampling is off (a rate of the context's own).

use rdmapool::fabric::*;
use rdmapool::metrics::{opcode_label, ContextMetrics};
use std::time::Duration;

fn count(m: &ContextMetrics, op: WcOpcode) -> u64 {
    m.snapshot()
        .op_latency
        .iter()
        .find(|(o, _)| *o == op)
        .map_or(0, |(_, l)| l.count)
}

#[test]
fn each_opcode_is_timed_when_sampled_and_not_otherwise() {
    let ctx = Context::open(SoftConfig::from_env().unwrap()).unwrap();
    let m = ctx.metrics();
    let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(64).unwrap());
    let cfg = QpConfig::default();
    let (a, b) = (
        pd.create_qp(&cq, &cq, &cfg).unwrap(),
        pd.create_qp(&cq, &cq, &cfg).unwrap(),
    );
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let target = pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    let local = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let remote = target.remote_at(0).unwrap();
    let ops = [
        (WcOpcode::RdmaWrite, WrOp::Write { remote, imm: None }, 64),
        (WcOpcode::RdmaRead, WrOp::Read { remote }, 64),
        (
            WcOpcode::CompSwap,
            WrOp::CompareSwap {
                remote,
                compare: 0,
                swap: 1,
            },
            8,
        ),
        (WcOpcode::FetchAdd, WrOp::FetchAdd { remote, add: 1 }, 8),
    ];
    let run = |n: u64| {
        for (i, (_, op, len)) in ops.iter().enumerate() {
            for k in 0..n {
                a.post_send(&[SendWr {
                    wr_id: (i as u64) << 32 | k,
                    op: *op,
                    sg_list: &[local.sge(0, *len as u32).unwrap()],
                    signaled: true,
                }])
                .unwrap();
                let c = cq.wait(1, Duration::from_secs(10)).unwrap();
                assert_eq!(c.len(), 1);
                assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
            }
        }
    };

    m.sample_op_latency(0);
    run(5);
    for (code, _, _) in &ops {
        assert_eq!(
            count(&m, *code),
            0,
            "{} timed while off",
            opcode_label(*code)
        );
    }

    m.sample_op_latency(1);
    run(20);
    for (code, _, _) in &ops {
        assert_eq!(count(&m, *code), 20, "{}", opcode_label(*code));
    }
    let s = m.snapshot();
    assert_eq!(s.op_sample_every, 1);
    let (_, write) = s
        .op_latency
        .iter()
        .find(|(o, _)| *o == WcOpcode::RdmaWrite)
        .unwrap();
    assert!(write.percentiles_us[0] > 0.0 && write.percentiles_us[0] <= write.percentiles_us[7]);
    let j: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(j["op_latency"]["fetch_add"]["count"], 20);
    assert!(s
        .to_prometheus()
        .contains("rdmapool_op_duration_seconds_count{opcode=\"comp_swap\"} 20\n"));

    // One in four: 5 of 20 per opcode (this thread's counter is shared across opcodes, so
    // 80 posts give 20 samples in all).
    m.sample_op_latency(4);
    run(20);
    let total: u64 = ops.iter().map(|(c, _, _)| count(&m, *c)).sum();
    assert_eq!(total, 80 + 20);
    m.sample_op_latency(0);
}
