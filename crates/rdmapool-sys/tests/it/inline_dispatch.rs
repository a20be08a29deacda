//! The static-inline ports dispatch through the right `ops` slot with the caller's arguments.
//!
//! A fake `verbs_context` (with its embedded `ibv_context`) gets an ops table of Rust
//! `extern "C"` functions that record each call; fake QP/CQ/SRQ/PD objects point at it. No
//! library is loaded and no device is needed.
#![warn(clippy::undocumented_unsafe_blocks)]

use std::cell::RefCell;
use std::ffi::c_int;
use std::mem::{offset_of, size_of};
use std::ptr;

use rdmapool_sys::*;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    PostSend {
        qp: usize,
        wr: usize,
        bad_wr: usize,
    },
    PostRecv {
        qp: usize,
        wr: usize,
        bad_wr: usize,
    },
    PostSrqRecv {
        srq: usize,
        wr: usize,
        bad_wr: usize,
    },
    PollCq {
        cq: usize,
        num_entries: c_int,
        wc: usize,
    },
    ReqNotifyCq {
        cq: usize,
        solicited_only: c_int,
    },
    AdviseMr {
        pd: usize,
        advice: u32,
        flags: u32,
        sg_list: usize,
        num_sge: u32,
    },
}

thread_local! {
    // Each test runs on its own thread and the fakes run on the caller's thread.
    static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
}

fn record(call: Call) {
    CALLS.with(|c| c.borrow_mut().push(call));
}

fn take_calls() -> Vec<Call> {
    CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

unsafe extern "C" fn fake_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    record(Call::PostSend {
        qp: qp as usize,
        wr: wr as usize,
        bad_wr: bad_wr as usize,
    });
    11
}

unsafe extern "C" fn fake_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    record(Call::PostRecv {
        qp: qp as usize,
        wr: wr as usize,
        bad_wr: bad_wr as usize,
    });
    12
}

unsafe extern "C" fn fake_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    record(Call::PostSrqRecv {
        srq: srq as usize,
        wr: wr as usize,
        bad_wr: bad_wr as usize,
    });
    13
}

unsafe extern "C" fn fake_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    record(Call::PollCq {
        cq: cq as usize,
        num_entries,
        wc: wc as usize,
    });
    // Complete one work request, as a provider would.
    // SAFETY: the test passes room for `num_entries` >= 1 completions.
    unsafe {
        (*wc).wr_id = 0xfeed;
        (*wc).status = IBV_WC_SUCCESS;
        (*wc).opcode = IBV_WC_RDMA_WRITE;
    }
    1
}

unsafe extern "C" fn fake_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    record(Call::ReqNotifyCq {
        cq: cq as usize,
        solicited_only,
    });
    0
}

unsafe extern "C" fn fake_advise_mr(
    pd: *mut ibv_pd,
    advice: ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    record(Call::AdviseMr {
        pd: pd as usize,
        advice,
        flags,
        sg_list: sg_list as usize,
        num_sge,
    });
    0
}

/// A fake device context: a heap `verbs_context` whose embedded `ibv_context` has the fake ops.
struct FakeContext {
    vctx: *mut verbs_context,
}

impl FakeContext {
    fn new(ops: ibv_context_ops) -> Self {
        let mut v = Box::<verbs_context>::default();
        v.sz = size_of::<verbs_context>();
        v.context.ops = ops;
        v.context.abi_compat = VERBS_ABI_IS_EXTENDED;
        v.advise_mr = Some(fake_advise_mr);
        FakeContext {
            vctx: Box::into_raw(v),
        }
    }

    fn all_ops() -> Self {
        FakeContext::new(ibv_context_ops {
            post_send: Some(fake_post_send),
            post_recv: Some(fake_post_recv),
            post_srq_recv: Some(fake_post_srq_recv),
            poll_cq: Some(fake_poll_cq),
            req_notify_cq: Some(fake_req_notify_cq),
            ..Default::default()
        })
    }

    /// The embedded context, derived from the allocation's raw pointer (so code that steps
    /// back from it to the enclosing verbs_context stays in bounds).
    fn ctx(&self) -> *mut ibv_context {
        // SAFETY: `vctx` is live until drop; only a field address is computed.
        unsafe { &raw mut (*self.vctx).context }
    }

    fn set_sz(&self, sz: usize) {
        // SAFETY: `vctx` is live until drop and not otherwise borrowed.
        unsafe { (*self.vctx).sz = sz };
    }
}

impl Drop for FakeContext {
    fn drop(&mut self) {
        // SAFETY: `vctx` came from Box::into_raw in `new` and is freed once.
        drop(unsafe { Box::from_raw(self.vctx) });
    }
}

#[test]
fn post_send_dispatches_to_ops_post_send() {
    let fake = FakeContext::all_ops();
    let mut qp = ibv_qp {
        context: fake.ctx(),
        ..Default::default()
    };
    let mut wr = ibv_send_wr {
        wr_id: 7,
        opcode: IBV_WR_RDMA_WRITE,
        ..Default::default()
    };
    let mut bad: *mut ibv_send_wr = ptr::null_mut();
    // SAFETY: a fake QP on a fake context whose post_send only records its arguments.
    let rc = unsafe { ibv_post_send(&mut qp, &mut wr, &mut bad) };
    assert_eq!(rc, 11, "the op's return value is passed through");
    assert_eq!(
        take_calls(),
        [Call::PostSend {
            qp: &raw mut qp as usize,
            wr: &raw mut wr as usize,
            bad_wr: &raw mut bad as usize
        }]
    );
}

#[test]
fn post_recv_dispatches_to_ops_post_recv() {
    let fake = FakeContext::all_ops();
    let mut qp = ibv_qp {
        context: fake.ctx(),
        ..Default::default()
    };
    let mut wr = ibv_recv_wr {
        wr_id: 8,
        ..Default::default()
    };
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    // SAFETY: as above, with the fake post_recv.
    let rc = unsafe { ibv_post_recv(&mut qp, &mut wr, &mut bad) };
    assert_eq!(rc, 12);
    assert_eq!(
        take_calls(),
        [Call::PostRecv {
            qp: &raw mut qp as usize,
            wr: &raw mut wr as usize,
            bad_wr: &raw mut bad as usize
        }]
    );
}

#[test]
fn post_srq_recv_dispatches_to_ops_post_srq_recv() {
    let fake = FakeContext::all_ops();
    let mut srq = ibv_srq {
        context: fake.ctx(),
        ..Default::default()
    };
    let mut wr = ibv_recv_wr::default();
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    // SAFETY: as above, with the fake post_srq_recv.
    let rc = unsafe { ibv_post_srq_recv(&mut srq, &mut wr, &mut bad) };
    assert_eq!(rc, 13);
    assert_eq!(
        take_calls(),
        [Call::PostSrqRecv {
            srq: &raw mut srq as usize,
            wr: &raw mut wr as usize,
            bad_wr: &raw mut bad as usize
        }]
    );
}

#[test]
fn poll_cq_dispatches_to_ops_poll_cq() {
    let fake = FakeContext::all_ops();
    let mut cq = ibv_cq {
        context: fake.ctx(),
        ..Default::default()
    };
    let mut wc = [ibv_wc::default(); 4];
    // SAFETY: a fake CQ; `wc` has room for 4 completions.
    let n = unsafe { ibv_poll_cq(&mut cq, 4, wc.as_mut_ptr()) };
    assert_eq!(n, 1);
    assert_eq!(wc[0].wr_id, 0xfeed);
    assert_eq!(wc[0].status, IBV_WC_SUCCESS);
    assert_eq!(wc[0].opcode, IBV_WC_RDMA_WRITE);
    assert_eq!(
        take_calls(),
        [Call::PollCq {
            cq: &raw mut cq as usize,
            num_entries: 4,
            wc: wc.as_mut_ptr() as usize
        }]
    );
}

#[test]
fn req_notify_cq_dispatches_to_ops_req_notify_cq() {
    let fake = FakeContext::all_ops();
    let mut cq = ibv_cq {
        context: fake.ctx(),
        ..Default::default()
    };
    // SAFETY: a fake CQ.
    let rc0 = unsafe { ibv_req_notify_cq(&mut cq, 0) };
    // SAFETY: as above.
    let rc1 = unsafe { ibv_req_notify_cq(&mut cq, 1) };
    assert_eq!((rc0, rc1), (0, 0));
    let cq = &raw mut cq as usize;
    assert_eq!(
        take_calls(),
        [
            Call::ReqNotifyCq {
                cq,
                solicited_only: 0
            },
            Call::ReqNotifyCq {
                cq,
                solicited_only: 1
            }
        ]
    );
}

#[test]
fn each_port_uses_only_its_own_slot() {
    // A table with only post_recv: post_send must not land there.
    let fake = FakeContext::new(ibv_context_ops {
        post_recv: Some(fake_post_recv),
        ..Default::default()
    });
    let mut qp = ibv_qp {
        context: fake.ctx(),
        ..Default::default()
    };
    let mut cq = ibv_cq {
        context: fake.ctx(),
        ..Default::default()
    };
    let mut swr = ibv_send_wr::default();
    let mut sbad: *mut ibv_send_wr = ptr::null_mut();
    let mut wc = ibv_wc::default();
    // SAFETY: fake objects; every other slot is empty (NULL).
    unsafe {
        assert_eq!(
            ibv_post_send(&mut qp, &mut swr, &mut sbad),
            libc::EOPNOTSUPP
        );
        assert_eq!(ibv_poll_cq(&mut cq, 1, &mut wc), libc::EOPNOTSUPP);
        assert_eq!(ibv_req_notify_cq(&mut cq, 0), libc::EOPNOTSUPP);
    }
    assert!(
        sbad.is_null(),
        "an empty slot leaves bad_wr alone, like libibverbs' dummy op"
    );
    assert_eq!(take_calls(), []);
}

#[test]
fn advise_mr_goes_through_the_extended_context() {
    let fake = FakeContext::all_ops();
    let mut pd = ibv_pd {
        context: fake.ctx(),
        handle: 0,
    };
    let mut sge = ibv_sge {
        addr: 0x1000,
        length: 4096,
        lkey: 5,
    };
    // SAFETY: a fake PD on a fake extended context; one valid SGE.
    let rc = unsafe {
        ibv_advise_mr(
            &mut pd,
            IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            IBV_ADVISE_MR_FLAG_FLUSH,
            &mut sge,
            1,
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(
        take_calls(),
        [Call::AdviseMr {
            pd: &raw mut pd as usize,
            advice: IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            flags: IBV_ADVISE_MR_FLAG_FLUSH,
            sg_list: &raw mut sge as usize,
            num_sge: 1
        }]
    );

    // A provider whose verbs_context predates advise_mr: `sz` does not reach the field, so the
    // op must not be read and the call fails with EOPNOTSUPP, as verbs_get_ctx_op does in C.
    fake.set_sz(size_of::<verbs_context>() - offset_of!(verbs_context, advise_mr) - 1);
    // SAFETY: as above.
    let rc = unsafe { ibv_advise_mr(&mut pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &mut sge, 1) };
    assert_eq!(rc, libc::EOPNOTSUPP);
    assert_eq!(take_calls(), []);
}

#[test]
fn verbs_get_ctx_op_needs_the_extended_marker() {
    let fake = FakeContext::all_ops();
    // SAFETY: a live fake context.
    assert!(unsafe { verbs_get_ctx_op!(fake.ctx(), advise_mr) }.is_some());
    // SAFETY: the context is live and not otherwise borrowed.
    unsafe { (*fake.ctx()).abi_compat = ptr::null_mut() };
    // SAFETY: as above.
    assert!(unsafe { verbs_get_ctx_op!(fake.ctx(), advise_mr) }.is_none());
}
