//! Every opcode between two emulated NICs (two threads of one process), over TCP and over
//! the local path, with the data verified.

use crate::support::*;
use rdmapool::fabric::*;

const ALL: AccessFlags = AccessFlags::all_remote();

#[test]
fn write_then_read_back_round_trips_every_size() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
        let target = b.pd.alloc_mr(1 << 20, ALL).unwrap();
        let src = a.pd.alloc_mr(1 << 20, ALL).unwrap();
        let dst = a.pd.alloc_mr(1 << 20, ALL).unwrap();
        for (i, len) in [1usize, 8, 4095, 4096, 65537, 1 << 20]
            .into_iter()
            .enumerate()
        {
            let data = pattern(len, i as u8);
            src.write_at(0, &data).unwrap();
            let sg = [src.sge(0, len as u32).unwrap()];
            qa.post_send(&[write_wr(1, target.remote_at(0).unwrap(), &sg)])
                .unwrap();
            let c = one(&a.cq);
            assert_eq!(
                (c.status, c.opcode, c.byte_len),
                (WcStatus::Success, WcOpcode::RdmaWrite, len as u32),
                "{t:?}"
            );
            let mut seen = vec![0u8; len];
            target.read_at(0, &mut seen).unwrap();
            assert_eq!(seen, data, "{t:?} write of {len}");
            let sg = [dst.sge(0, len as u32).unwrap()];
            qa.post_send(&[read_wr(2, target.remote_at(0).unwrap(), &sg)])
                .unwrap();
            let c = one(&a.cq);
            assert_eq!(
                (c.status, c.opcode, c.wr_id),
                (WcStatus::Success, WcOpcode::RdmaRead, 2)
            );
            let mut back = vec![0u8; len];
            dst.read_at(0, &mut back).unwrap();
            assert_eq!(back, data, "{t:?} read of {len}");
        }
        assert_eq!(qa.state(), QpState::Rts);
    }
}

#[test]
fn scatter_gather_lists_gather_and_scatter_in_order() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
        let target = b.pd.alloc_mr(4096, ALL).unwrap();
        let src = a.pd.alloc_mr(4096, ALL).unwrap();
        src.write_at(0, b"AAAA").unwrap();
        src.write_at(100, b"BBBBBB").unwrap();
        src.write_at(200, b"CC").unwrap();
        let sg = [
            src.sge(0, 4).unwrap(),
            src.sge(100, 6).unwrap(),
            src.sge(200, 2).unwrap(),
        ];
        qa.post_send(&[write_wr(1, target.remote_at(10).unwrap(), &sg)])
            .unwrap();
        assert!(one(&a.cq).is_ok());
        let mut seen = [0u8; 12];
        target.read_at(10, &mut seen).unwrap();
        assert_eq!(&seen, b"AAAABBBBBBCC");
        let dst = a.pd.alloc_mr(4096, ALL).unwrap();
        let sg = [dst.sge(50, 5).unwrap(), dst.sge(3000, 7).unwrap()];
        qa.post_send(&[read_wr(2, target.remote_at(10).unwrap(), &sg)])
            .unwrap();
        assert!(one(&a.cq).is_ok());
        let (mut x, mut y) = ([0u8; 5], [0u8; 7]);
        dst.read_at(50, &mut x).unwrap();
        dst.read_at(3000, &mut y).unwrap();
        assert_eq!((&x, &y), (b"AAAAB", b"BBBBBCC"));
    }
}

#[test]
fn atomics_return_the_old_value_and_update_the_word() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
        let target = b.pd.alloc_mr(64, ALL).unwrap();
        target
            .atomic_u64(8)
            .unwrap()
            .store(40, std::sync::atomic::Ordering::SeqCst);
        let res = a.pd.alloc_mr(64, ALL).unwrap();
        let sg = [res.sge(0, 8).unwrap()];
        let remote = target.remote_at(8).unwrap();
        let ops = [
            (
                WrOp::FetchAdd { remote, add: 2 },
                40,
                42,
                WcOpcode::FetchAdd,
            ),
            (
                WrOp::CompareSwap {
                    remote,
                    compare: 1,
                    swap: 7,
                },
                42,
                42,
                WcOpcode::CompSwap,
            ),
            (
                WrOp::CompareSwap {
                    remote,
                    compare: 42,
                    swap: 7,
                },
                42,
                7,
                WcOpcode::CompSwap,
            ),
            (
                WrOp::FetchAdd {
                    remote,
                    add: u64::MAX,
                },
                7,
                6,
                WcOpcode::FetchAdd,
            ),
        ];
        for (i, (op, old, new, opcode)) in ops.into_iter().enumerate() {
            qa.post_send(&[SendWr {
                wr_id: i as u64,
                op,
                sg_list: &sg,
                signaled: true,
            }])
            .unwrap();
            let c = one(&a.cq);
            assert_eq!(
                (c.status, c.opcode, c.byte_len),
                (WcStatus::Success, opcode, 8),
                "{t:?} op {i}"
            );
            assert_eq!(res.read_u64(0).unwrap(), old, "{t:?} op {i} old value");
            assert_eq!(target.read_u64(8).unwrap(), new, "{t:?} op {i} new value");
        }
    }
}

#[test]
fn send_lands_in_posted_receive_with_immediate() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, qb) = pair(&a, &b, &config());
        let rbuf = b.pd.alloc_mr(4096, ALL).unwrap();
        let rsg = [rbuf.sge(0, 64).unwrap(), rbuf.sge(1000, 64).unwrap()];
        qb.post_recv(&[RecvWr {
            wr_id: 77,
            sg_list: &rsg,
        }])
        .unwrap();
        let sbuf = a.pd.alloc_mr(4096, ALL).unwrap();
        let msg = pattern(100, 3);
        sbuf.write_at(0, &msg).unwrap();
        let sg = [sbuf.sge(0, 100).unwrap()];
        qa.post_send(&[SendWr {
            wr_id: 5,
            op: WrOp::Send { imm: Some(0xabcd) },
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        let s = one(&a.cq);
        assert_eq!(
            (s.wr_id, s.status, s.opcode),
            (5, WcStatus::Success, WcOpcode::Send)
        );
        let r = one(&b.cq);
        assert_eq!(
            (r.wr_id, r.status, r.opcode, r.byte_len, r.imm, r.qp_num),
            (
                77,
                WcStatus::Success,
                WcOpcode::Recv,
                100,
                Some(0xabcd),
                qb.qpn()
            )
        );
        let mut first = [0u8; 64];
        let mut rest = [0u8; 36];
        rbuf.read_at(0, &mut first).unwrap();
        rbuf.read_at(1000, &mut rest).unwrap();
        assert_eq!([&first[..], &rest[..]].concat(), msg);
    }
}

#[test]
fn write_with_immediate_writes_and_consumes_a_receive() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, qb) = pair(&a, &b, &config());
        let target = b.pd.alloc_mr(4096, ALL).unwrap();
        qb.post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: &[],
        }])
        .unwrap();
        let src = a.pd.alloc_mr(4096, ALL).unwrap();
        src.write_at(0, b"immediate").unwrap();
        let sg = [src.sge(0, 9).unwrap()];
        let op = WrOp::Write {
            remote: target.remote_at(100).unwrap(),
            imm: Some(42),
        };
        qa.post_send(&[SendWr {
            wr_id: 1,
            op,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        assert!(one(&a.cq).is_ok());
        let r = one(&b.cq);
        assert_eq!(
            (r.wr_id, r.opcode, r.imm, r.byte_len),
            (9, WcOpcode::RecvRdmaWithImm, Some(42), 9)
        );
        let mut seen = [0u8; 9];
        target.read_at(100, &mut seen).unwrap();
        assert_eq!(&seen, b"immediate");
    }
}

#[test]
fn unsignaled_requests_complete_silently_and_in_order() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
        let target = b.pd.alloc_mr(4096, ALL).unwrap();
        let src = a.pd.alloc_mr(4096, ALL).unwrap();
        // 100 unsignaled writes to increasing offsets, then one signaled: RC order means
        // every earlier write is visible when the signaled one completes.
        for i in 0..100u64 {
            src.write_at(i as usize * 8, &i.to_le_bytes()).unwrap();
        }
        let sges: Vec<[Sge; 1]> = (0..101).map(|i| [src.sge(i * 8, 8).unwrap()]).collect();
        let wrs: Vec<SendWr> = (0..101)
            .map(|i| SendWr {
                wr_id: i as u64,
                op: WrOp::Write {
                    remote: target.remote_at(i * 8).unwrap(),
                    imm: None,
                },
                sg_list: &sges[i],
                signaled: i == 100,
            })
            .collect();
        qa.post_send(&wrs).unwrap();
        let c = one(&a.cq);
        assert_eq!((c.wr_id, c.status), (100, WcStatus::Success));
        for i in 0..100u64 {
            assert_eq!(target.read_u64(i as usize * 8).unwrap(), i);
        }
        assert!(a
            .cq
            .wait(1, std::time::Duration::from_millis(50))
            .unwrap()
            .is_empty());
    }
}

#[test]
fn concurrent_atomics_from_many_qps_never_lose_an_update() {
    for t in transports() {
        let b = node_on(t);
        let target = b.pd.alloc_mr(64, ALL).unwrap();
        let remote = target.remote_at(0).unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let a = node_on(t);
                    let (qa, _qb) = pair(&a, &b, &config());
                    let res = a.pd.alloc_mr(8, ALL).unwrap();
                    let sg = [res.sge(0, 8).unwrap()];
                    for i in 0..250 {
                        let op = WrOp::FetchAdd { remote, add: 1 };
                        qa.post_send(&[SendWr {
                            wr_id: i,
                            op,
                            sg_list: &sg,
                            signaled: true,
                        }])
                        .unwrap();
                        assert!(one(&a.cq).is_ok());
                    }
                });
            }
        });
        assert_eq!(target.read_u64(0).unwrap(), 1000, "{t:?}");
    }
}

#[test]
fn deregistration_returns_every_region() {
    let (a, b) = (node_on(Transport::Auto), node_on(Transport::Auto));
    let (qa, _qb) = pair(&a, &b, &config());
    {
        let target = b.pd.alloc_mr(8192, ALL).unwrap();
        let src = a.pd.alloc_mr(8192, ALL).unwrap();
        let sg = [src.sge(0, 8192).unwrap()];
        qa.post_send(&[write_wr(1, target.remote_at(0).unwrap(), &sg)])
            .unwrap();
        assert!(one(&a.cq).is_ok());
        assert_eq!((a.ctx.live_regions(), b.ctx.live_regions()), (1, 1));
    }
    assert_eq!((a.ctx.live_regions(), b.ctx.live_regions()), (0, 0));
}

/// Waits for `fd` to become readable (or `WAIT` to pass).
fn readable(fd: std::os::fd::RawFd, wait: std::time::Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, wait.as_millis() as i32) > 0 }
}

#[test]
fn an_armed_cq_signals_its_event_fd_once_per_arming() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, qb) = pair(&a, &b, &config());
        let rbuf = b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        let sbuf = a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        let fd = b.cq.event_fd();
        for round in 0..3u64 {
            qb.post_recv(&[RecvWr {
                wr_id: round,
                sg_list: &[rbuf.sge(0, 64).unwrap()],
            }])
            .unwrap();
            b.cq.req_notify().unwrap();
            let send = WrOp::Send { imm: None };
            qa.post_send(&[SendWr {
                wr_id: round,
                op: send,
                sg_list: &[sbuf.sge(0, 16).unwrap()],
                signaled: true,
            }])
            .unwrap();
            assert!(one(&a.cq).is_ok());
            assert!(readable(fd, WAIT), "{t:?} round {round}: no event");
            assert!(b.cq.ack_events().unwrap() >= 1, "{t:?}");
            let c = one(&b.cq);
            assert_eq!((c.wr_id, c.status), (round, WcStatus::Success), "{t:?}");
            // Not re-armed: nothing more to read.
            assert_eq!(b.cq.ack_events().unwrap(), 0, "{t:?}");
        }
    }
}

#[test]
fn a_list_of_small_and_large_requests_lands_in_order() {
    // Over TCP a list's small requests go out together (copied into one send) and a large
    // payload from its region, and the target answers small READs together and a large
    // READ from its region: every request still lands, and answers, in posting order.
    const LARGE: usize = 32 << 10;
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
        let target = b.pd.alloc_mr(64 << 10, ALL).unwrap();
        let src = a.pd.alloc_mr(64 << 10, ALL).unwrap();
        let dst = a.pd.alloc_mr(64 << 10, ALL).unwrap();
        let (small_a, large_b, small_c) = (pattern(100, 1), pattern(LARGE, 2), pattern(100, 3));
        src.write_at(0, &small_a).unwrap();
        src.write_at(4096, &large_b).unwrap();
        src.write_at(40_000, &small_c).unwrap();
        let at = |off: usize| target.remote_at(off).unwrap();
        let sg_a = [src.sge(0, 100).unwrap()];
        let sg_b = [src.sge(4096, LARGE as u32).unwrap()];
        let sg_c = [src.sge(40_000, 100).unwrap()];
        let sg_r1 = [dst.sge(0, 100).unwrap()];
        let sg_r2 = [dst.sge(1000, 200).unwrap()];
        let sg_r3 = [dst.sge(8192, LARGE as u32).unwrap()];
        let sg_r4 = [dst.sge(50_000, 200).unwrap()];
        let list = [
            write_wr(1, at(0), &sg_a),
            write_wr(2, at(0), &sg_b), // over the small one
            read_wr(3, at(0), &sg_r1),
            write_wr(4, at(50), &sg_c), // over the large one
            read_wr(5, at(0), &sg_r2),
            read_wr(6, at(0), &sg_r3), // a large READ between small ones
            write_wr(7, at(60), &sg_a),
            read_wr(8, at(0), &sg_r4),
        ];
        qa.post_send(&list).unwrap();
        let got = a.cq.wait(list.len(), WAIT).unwrap();
        let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, (1..=8).collect::<Vec<_>>(), "{t:?}: in posting order");
        assert!(got.iter().all(Completion::is_ok), "{t:?}: {got:?}");
        // What the target held after request 4, and after request 7.
        let mut after_4 = large_b.clone();
        after_4[50..150].copy_from_slice(&small_c);
        let mut after_7 = after_4.clone();
        after_7[60..160].copy_from_slice(&small_a);
        let read = |off: usize, len: usize| {
            let mut v = vec![0u8; len];
            dst.read_at(off, &mut v).unwrap();
            v
        };
        assert_eq!(read(0, 100), large_b[..100], "{t:?}: READ 3 after WRITE 2");
        assert_eq!(
            read(1000, 200),
            after_4[..200],
            "{t:?}: READ 5 after WRITE 4"
        );
        assert_eq!(read(8192, LARGE), after_4, "{t:?}: the large READ 6");
        assert_eq!(
            read(50_000, 200),
            after_7[..200],
            "{t:?}: READ 8 after WRITE 7"
        );
    }
}
