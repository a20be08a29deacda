//! The deterministic harness: a requester and a responder wired in memory, a fake clock, and
//! a link the test controls (deliver, drop, duplicate, reorder, fragment). No sockets, no
//! threads, no sleeping: a 4-second timeout is tested exactly, in microseconds.
//!
//! Memory is real: regions registered in real key tables (unpinned, like on-demand paging),
//! so the access checks and the copies are the ones the provider runs.

mod harness;

use super::target::RecvEntry;
use super::wire::{ReqOp, Request, Response, REQ_LEN, RESP_LEN};
use crate::fabric::{AccessFlags, QpState, RemoteAddr, WcOpcode, WcStatus, WrOp};
use harness::*;
use std::time::Duration;

fn write(p: &Pair, off: u64) -> WrOp {
    WrOp::Write {
        remote: p.remote_at(off),
        imm: None,
    }
}

fn read_op(p: &Pair, off: u64) -> WrOp {
    WrOp::Read {
        remote: p.remote_at(off),
    }
}

#[test]
fn write_then_read_round_trips_even_one_byte_at_a_time() {
    for piece in [1, 7, RESP_LEN, usize::MAX] {
        let mut p = Pair::new();
        fill(&p.local, 0, b"hello, remote memory");
        p.post(1, write(&p, 100), 0, 20);
        let op = read_op(&p, 100);
        p.post(2, op, 1000, 20);
        p.deliver_requests();
        p.deliver_responses(piece);
        assert_eq!(
            p.done(),
            [(1, WcStatus::Success), (2, WcStatus::Success)],
            "piece {piece}"
        );
        assert_eq!(read(&p.remote, 100, 20), b"hello, remote memory");
        assert_eq!(read(&p.local, 1000, 20), b"hello, remote memory");
    }
}

#[test]
fn a_read_returns_memory_as_it_was_before_a_later_write() {
    // RC order at the target: READ executes before the WRITE posted after it, even when both
    // arrive in one piece and the READ's data has not been sent yet.
    let mut p = Pair::new();
    fill(&p.remote, 0, b"old!");
    fill(&p.local, 0, b"new!");
    let op = read_op(&p, 0);
    p.post(1, op, 100, 4);
    p.post(2, write(&p, 0), 0, 4);
    let both: Vec<u8> = p.to_target.drain(..).flatten().collect();
    p.serve(&both, both.len());
    p.deliver_responses(usize::MAX);
    assert_eq!(p.done(), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(read(&p.local, 100, 4), b"old!");
    assert_eq!(read(&p.remote, 0, 4), b"new!");
}

#[test]
fn a_lost_response_times_out_exactly_at_the_deadline_and_flushes_the_rest() {
    let mut p = Pair::new();
    let sent_at = p.now;
    p.post(1, write(&p, 0), 0, 8);
    p.post(2, write(&p, 8), 8, 8);
    assert_eq!(p.req.poll_timeout(), Some(sent_at + TIMEOUT));
    p.deliver_requests();
    p.to_initiator.clear(); // both acknowledgements lost
    p.advance(TIMEOUT - Duration::from_nanos(1));
    assert!(p.done().is_empty(), "not a nanosecond early");
    assert!(!p.req.take_close());
    p.advance(Duration::from_nanos(1));
    assert_eq!(
        p.done(),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(p.req.take_close(), "the driver is told to close, once");
    assert!(!p.req.take_close());
    assert!(!p.req.accepts_work());
    assert_eq!(p.req.poll_timeout(), None);
}

#[test]
fn the_deadline_follows_the_oldest_request() {
    let mut p = Pair::new();
    p.post(1, write(&p, 0), 0, 8);
    p.advance(Duration::from_secs(3));
    p.post(2, write(&p, 8), 8, 8);
    p.deliver_requests();
    // The first answer arrives, the second is lost: the second's own deadline counts.
    p.to_initiator.pop_back();
    p.deliver_responses(usize::MAX);
    assert_eq!(p.done(), [(1, WcStatus::Success)]);
    p.advance(Duration::from_secs(3)); // 6 s after the first, 3 s after the second
    assert!(p.done().is_empty());
    p.advance(Duration::from_secs(1));
    assert_eq!(p.done(), [(2, WcStatus::RetryExcErr)]);
}

#[test]
fn a_lost_request_times_out_like_a_lost_response() {
    let mut p = Pair::new();
    p.post(1, write(&p, 0), 0, 8);
    p.to_target.clear();
    p.advance(TIMEOUT);
    assert_eq!(p.done(), [(1, WcStatus::RetryExcErr)]);
    assert_eq!(read(&p.remote, 0, 8), [0; 8], "nothing was written");
}

#[test]
fn duplicated_or_reordered_responses_break_the_connection() {
    // Duplicate: the second copy names a request that already completed.
    let mut p = Pair::new();
    p.post(1, write(&p, 0), 0, 8);
    p.post(2, write(&p, 8), 8, 8);
    p.deliver_requests();
    let first = p.to_initiator[0].clone();
    p.to_initiator.insert(1, first);
    p.deliver_responses(usize::MAX);
    assert_eq!(
        p.done(),
        [(1, WcStatus::Success), (2, WcStatus::BadRespErr)]
    );
    assert!(p.req.take_close());

    // Reordered: the first answer to arrive is not the oldest request's.
    let mut p = Pair::new();
    p.post(1, write(&p, 0), 0, 8);
    p.post(2, write(&p, 8), 8, 8);
    p.deliver_requests();
    p.to_initiator.swap(0, 1);
    p.deliver_responses(usize::MAX);
    assert_eq!(
        p.done(),
        [(1, WcStatus::BadRespErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn an_answer_nobody_asked_for_or_garbage_breaks_the_connection() {
    let mut p = Pair::new();
    p.req.handle_input(&Response::Ack { seq: 0 }.encode());
    assert!(p.req.take_close());
    let mut p = Pair::new();
    p.post(1, write(&p, 0), 0, 8);
    let mut bad = Response::Ack { seq: 0 }.encode();
    bad[0] ^= 0xff;
    p.req.handle_input(&bad);
    assert_eq!(p.done(), [(1, WcStatus::BadRespErr)]);
}

#[test]
fn remote_access_errors_refuse_and_move_the_target_to_error() {
    let mut p = Pair::new();
    p.post(1, write(&p, LEN as u64 - 4), 0, 8); // 4 bytes past the end
    p.round_trip();
    assert_eq!(p.done(), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(*p.target.state.lock(), QpState::Error);
    // Later requests on the connection are refused as a QP in ERR refuses them.
    p.post(2, write(&p, 0), 0, 8);
    p.round_trip();
    assert_eq!(p.done(), [(2, WcStatus::RetryExcErr)]);
    assert_eq!(read(&p.remote, 0, 8), [0; 8]);

    let mut p = Pair::new();
    let op = WrOp::FetchAdd {
        remote: p.remote_at(4),
        add: 1,
    };
    p.post(3, op, 0, 8);
    p.round_trip();
    assert_eq!(p.done(), [(3, WcStatus::RemInvReqErr)], "misaligned atomic");

    let mut p = Pair::new();
    let op = WrOp::Write {
        remote: RemoteAddr {
            addr: p.remote.addr,
            rkey: p.remote.rkey ^ 1,
        },
        imm: None,
    };
    p.post(4, op, 0, 8);
    p.round_trip();
    assert_eq!(p.done(), [(4, WcStatus::RemAccessErr)], "unknown rkey");
}

#[test]
fn atomics_return_the_old_value_into_local_memory() {
    let mut p = Pair::new();
    fill(&p.remote, 64, &5u64.to_ne_bytes());
    let op = WrOp::CompareSwap {
        remote: p.remote_at(64),
        compare: 5,
        swap: 9,
    };
    p.post(1, op, 0, 8);
    let op = WrOp::FetchAdd {
        remote: p.remote_at(64),
        add: 10,
    };
    p.post(2, op, 8, 8);
    p.deliver_requests();
    p.deliver_responses(3);
    assert_eq!(p.done(), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(read(&p.local, 0, 8), 5u64.to_ne_bytes());
    assert_eq!(read(&p.local, 8, 8), 9u64.to_ne_bytes());
    assert_eq!(read(&p.remote, 64, 8), 19u64.to_ne_bytes());
}

/// Posts a receive of `len` bytes at the target (its list holds its region).
fn post_recv(p: &Pair, wr_id: u64, len: usize) {
    let recv_region = region(&p.target.keys, AccessFlags::LOCAL_WRITE);
    p.target.rq.lock().push_back(RecvEntry {
        wr_id,
        local: Ok(list(&recv_region, 0, len)),
        capacity: len as u64,
    });
}

#[test]
fn a_send_waits_for_a_receive_until_the_rnr_timeout() {
    let mut p = Pair::new();
    fill(&p.local, 0, b"ping");
    p.post(1, WrOp::Send { imm: Some(7) }, 0, 4);
    p.deliver_requests();
    assert!(p.resp.is_stalled(), "no receive yet: the request waits");
    assert_eq!(p.resp.poll_timeout(), Some(p.now + RNR));
    // A receive posted in time takes it.
    p.now += RNR - Duration::from_millis(1);
    post_recv(&p, 40, 64);
    p.serve(&[], 1);
    p.deliver_responses(usize::MAX);
    assert_eq!(p.done(), [(1, WcStatus::Success)]);
    let c = p.target.completions.lock().pop().unwrap();
    assert_eq!(
        (c.wr_id, c.status, c.byte_len, c.imm),
        (40, WcStatus::Success, 4, Some(7))
    );

    // None in time: RNR retries exhausted, the payload is skipped, the next request runs.
    let mut p = Pair::new();
    p.post(1, WrOp::Send { imm: None }, 0, 4);
    p.post(2, write(&p, 0), 0, 8);
    p.deliver_requests();
    assert!(p.resp.is_stalled());
    p.now += RNR;
    p.serve(&[], usize::MAX);
    p.deliver_responses(usize::MAX);
    assert_eq!(
        p.done(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::Success)]
    );
}

#[test]
fn a_send_longer_than_the_receive_fails_both_sides() {
    let mut p = Pair::new();
    post_recv(&p, 40, 2);
    p.post(1, WrOp::Send { imm: None }, 0, 4);
    p.round_trip();
    assert_eq!(p.done(), [(1, WcStatus::RemOpErr)]);
    let c = p.target.completions.lock().pop().unwrap();
    assert_eq!(c.status, WcStatus::LocQpOpErr);
    assert_eq!(*p.target.state.lock(), QpState::Error);
}

#[test]
fn a_target_not_yet_ready_is_waited_for_then_served() {
    let mut p = Pair::new();
    *p.target.state.lock() = QpState::Init;
    p.post(1, write(&p, 0), 0, 8);
    p.deliver_requests();
    assert!(p.resp.is_stalled());
    *p.target.state.lock() = QpState::Rts;
    p.now += Duration::from_millis(5);
    p.serve(&[], 1);
    p.deliver_responses(usize::MAX);
    assert_eq!(p.done(), [(1, WcStatus::Success)]);

    // One that never gets ready is retried out after the timeout.
    let mut p = Pair::new();
    *p.target.state.lock() = QpState::Init;
    p.post(1, write(&p, 0), 0, 8);
    p.deliver_requests();
    p.now += TIMEOUT;
    p.serve(&[], 1);
    p.deliver_responses(usize::MAX);
    assert_eq!(p.done(), [(1, WcStatus::RetryExcErr)]);
}

#[test]
fn a_local_region_deregistered_under_a_read_payload_is_a_protection_error() {
    let mut p = Pair::new();
    fill(&p.remote, 0, &[7; 64]);
    let op = read_op(&p, 0);
    p.post(1, op, 0, 64);
    p.post(2, write(&p, 64), 64, 8);
    p.deliver_requests();
    let answer = p.to_initiator.pop_front().unwrap();
    // Half the payload lands, then the region goes away, then the rest arrives.
    let half = RESP_LEN + 32;
    assert_eq!(p.req.handle_input(&answer[..half]), half);
    p.init_keys.remove(&p.local);
    assert_eq!(p.req.handle_input(&answer[half..]), answer.len() - half);
    p.deliver_responses(usize::MAX);
    assert_eq!(
        p.done(),
        [(1, WcStatus::LocProtErr), (2, WcStatus::Success)],
        "the stream stays in step: the next answer is still understood"
    );
}

#[test]
fn a_malformed_request_closes_the_connection_after_answering_what_came_before() {
    let mut p = Pair::new();
    p.post(1, write(&p, 0), 0, 8);
    let mut bytes = p.to_target.pop_front().unwrap();
    let mut bad = Request {
        op: ReqOp::Write,
        seq: 1,
        remote_addr: 0,
        rkey: 0,
        len: 0,
        compare_add: 0,
        swap: 0,
        imm: None,
    }
    .encode();
    bad[7] = 1; // a reserved byte
    bytes.extend(bad);
    assert_eq!(bad.len(), REQ_LEN);
    p.serve(&bytes, usize::MAX);
    assert!(p.resp.take_failure().is_some());
    p.deliver_responses(usize::MAX);
    assert_eq!(p.done(), [(1, WcStatus::Success)]);
}

#[test]
fn write_with_immediate_consumes_a_receive_and_reports_the_length() {
    let mut p = Pair::new();
    post_recv(&p, 41, 0);
    fill(&p.local, 0, b"abcd");
    let op = WrOp::Write {
        remote: p.remote_at(8),
        imm: Some(0xfeed),
    };
    p.post(1, op, 0, 4);
    p.round_trip();
    assert_eq!(p.done(), [(1, WcStatus::Success)]);
    let c = p.target.completions.lock().pop().unwrap();
    assert_eq!(
        (c.wr_id, c.opcode, c.byte_len, c.imm),
        (41, WcOpcode::RecvRdmaWithImm, 4, Some(0xfeed))
    );
    assert_eq!(read(&p.remote, 8, 4), b"abcd");
}

#[test]
fn a_region_deregistered_under_a_write_with_immediate_still_completes_its_receive() {
    // The receive was consumed before the payload arrived; the region goes away mid-payload.
    // The requester gets the remote access error, the QP goes to ERR, and the receive is not
    // lost: it completes (flushed), as every receive of a QP in ERR does.
    let mut p = Pair::new();
    post_recv(&p, 42, 0);
    fill(&p.local, 0, &[9; 64]);
    let op = WrOp::Write {
        remote: p.remote_at(0),
        imm: Some(1),
    };
    p.post(1, op, 0, 64);
    let frame = p.to_target.pop_front().unwrap();
    let half = REQ_LEN + 16;
    p.serve(&frame[..half], usize::MAX);
    p.target.keys.remove(&p.remote);
    p.serve(&frame[half..], usize::MAX);
    p.deliver_responses(usize::MAX);
    assert_eq!(p.done(), [(1, WcStatus::RemAccessErr)]);
    let c = p
        .target
        .completions
        .lock()
        .pop()
        .expect("the receive completes");
    assert_eq!((c.wr_id, c.status), (42, WcStatus::WrFlushErr));
    assert_eq!(*p.target.state.lock(), QpState::Error);
}
