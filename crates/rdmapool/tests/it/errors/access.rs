//! Access errors: wrong or missing keys and rights, out-of-bounds and misaligned requests,
//! deregistered regions and other PDs, local protection errors where data lands.

use super::*;
use rdmapool::CoreError;

#[test]
fn wrong_rkey_is_a_remote_access_error() {
    for t in transports() {
        for op in ["write", "read", "cas", "faa"] {
            let s = setup(t, ALL);
            let remote = RemoteAddr {
                addr: s.target.addr(),
                rkey: s.target.rkey() ^ 0x5a5a_0001,
            };
            let op_ = match op {
                "write" => write_at(remote),
                "read" => WrOp::Read { remote },
                "cas" => WrOp::CompareSwap {
                    remote,
                    compare: 0,
                    swap: 1,
                },
                _ => WrOp::FetchAdd { remote, add: 1 },
            };
            assert_eq!(s.run(op_), WcStatus::RemAccessErr, "{t:?} {op}");
            s.assert_both_in_error(op);
        }
    }
}

#[test]
fn one_byte_out_of_bounds_is_a_remote_access_error() {
    for t in transports() {
        let s = setup(t, ALL);
        // 8 bytes starting 7 bytes before the end: the last byte is outside.
        let remote = s.target.remote_at(LEN - 7).unwrap();
        assert_eq!(
            s.run(write_at(remote)),
            WcStatus::RemAccessErr,
            "{t:?} write"
        );
        s.assert_both_in_error("write past the end");
        let s = setup(t, ALL);
        let remote = RemoteAddr {
            addr: s.target.addr() - 1,
            rkey: s.target.rkey(),
        };
        assert_eq!(
            s.run(WrOp::Read { remote }),
            WcStatus::RemAccessErr,
            "{t:?} read before start"
        );
        s.assert_both_in_error("read before the start");
        let s = setup(t, ALL);
        let remote = s.target.remote_at(LEN).unwrap();
        assert_eq!(
            s.run(WrOp::FetchAdd { remote, add: 1 }),
            WcStatus::RemAccessErr,
            "{t:?} faa at end"
        );
        s.assert_both_in_error("atomic at the end");
    }
}

#[test]
fn missing_access_flag_is_a_remote_access_error() {
    let lw = AccessFlags::LOCAL_WRITE;
    for t in transports() {
        let cases: [(AccessFlags, &str); 4] = [
            (
                lw | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
                "write",
            ),
            (
                lw | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
                "read",
            ),
            (
                lw | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
                "cas",
            ),
            (
                lw | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
                "faa",
            ),
        ];
        for (access, op) in cases {
            let s = setup(t, access);
            let remote = s.target.remote_at(0).unwrap();
            let op_ = match op {
                "write" => write_at(remote),
                "read" => WrOp::Read { remote },
                "cas" => WrOp::CompareSwap {
                    remote,
                    compare: u64::from_ne_bytes(s.before[..8].try_into().unwrap()),
                    swap: 1,
                },
                _ => WrOp::FetchAdd { remote, add: 1 },
            };
            assert_eq!(
                s.run(op_),
                WcStatus::RemAccessErr,
                "{t:?} {op} without its flag"
            );
            s.assert_both_in_error(op);
        }
    }
}

#[test]
fn misaligned_atomic_is_refused_when_posted() {
    // rxe refuses it in ibv_post_send (EINVAL); both providers check it before posting, so
    // the caller gets a typed error, the QP stays usable and nothing is touched.
    for t in transports() {
        let s = setup(t, ALL);
        let sg = [s.local.sge(0, 8).unwrap()];
        for off in [1usize, 4, 7, 12] {
            let remote = s.target.remote_at(off).unwrap();
            for op in [
                WrOp::FetchAdd { remote, add: 1 },
                WrOp::CompareSwap {
                    remote,
                    compare: 0,
                    swap: 1,
                },
            ] {
                let r = s.qa.post_send(&[SendWr {
                    wr_id: 1,
                    op,
                    sg_list: &sg,
                    signaled: true,
                }]);
                assert!(
                    matches!(
                        r,
                        Err(CoreError::Misaligned {
                            what: "atomic target",
                            ..
                        })
                    ),
                    "{t:?} +{off}: {r:?}"
                );
            }
        }
        assert_eq!(s.qa.state(), QpState::Rts, "{t:?}");
        s.assert_untouched("misaligned atomics");
        let remote = s.target.remote_at(8).unwrap();
        assert_eq!(
            s.run(WrOp::FetchAdd { remote, add: 1 }),
            WcStatus::Success,
            "{t:?} still usable"
        );
    }
}

#[test]
fn deregistered_region_is_a_remote_access_error_and_stays_untouched() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
        let mut memory = vec![0x11u8; LEN];
        // SAFETY: `memory` outlives the region, which is dropped right below.
        let mr = unsafe { b.pd.register_raw(memory.as_mut_ptr(), LEN, ALL).unwrap() };
        let remote = mr.remote_at(0).unwrap();
        drop(mr);
        let local = a.pd.alloc_mr(LEN, ALL).unwrap();
        let sg = [local.sge(0, 64).unwrap()];
        qa.post_send(&[write_wr(1, remote, &sg)]).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr, "{t:?}");
        assert!(
            memory.iter().all(|&x| x == 0x11),
            "{t:?}: deregistered memory was written"
        );
    }
}

#[test]
fn region_of_another_pd_is_refused_remotely_and_locally() {
    for t in transports() {
        let s = setup(t, ALL);
        let other_pd = s.b.ctx.alloc_pd().unwrap();
        let foreign = other_pd.alloc_mr(LEN, ALL).unwrap();
        foreign.write_at(0, &s.before).unwrap();
        assert_eq!(
            s.run(write_at(foreign.remote_at(0).unwrap())),
            WcStatus::RemAccessErr,
            "{t:?} remote"
        );
        assert_eq!(contents(&foreign), s.before);

        // Locally: an lkey from another PD of the same context.
        let s = setup(t, ALL);
        let pd2 = s.a.ctx.alloc_pd().unwrap();
        let other_local = pd2.alloc_mr(LEN, ALL).unwrap();
        let sg = [other_local.sge(0, 8).unwrap()];
        let op = write_at(s.target.remote_at(0).unwrap());
        s.qa.post_send(&[SendWr {
            wr_id: 3,
            op,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        // rxe reports another PD's lkey as a local QP operation error.
        assert_eq!(one(&s.a.cq).status, WcStatus::LocQpOpErr, "{t:?} local");
        s.assert_untouched("foreign lkey");
    }
}

#[test]
fn region_deregistered_after_use_is_refused_on_every_path() {
    // The first write maps the region on the local path; after deregistration the mapping
    // must not be usable any more.
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
        let target = b.pd.alloc_mr(LEN, ALL).unwrap();
        let remote = target.remote_at(0).unwrap();
        let local = a.pd.alloc_mr(LEN, ALL).unwrap();
        let sg = [local.sge(0, 64).unwrap()];
        qa.post_send(&[write_wr(1, remote, &sg)]).unwrap();
        assert!(one(&a.cq).is_ok(), "{t:?}");
        drop(target);
        assert_eq!(b.ctx.live_regions(), 0);
        qa.post_send(&[write_wr(2, remote, &sg)]).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr, "{t:?}");
    }
}

#[test]
fn a_bad_lkey_where_data_lands_is_a_protection_error() {
    for t in transports() {
        type Case = (&'static str, fn(RemoteAddr) -> WrOp);
        let cases: [Case; 3] = [
            ("read", |remote| WrOp::Read { remote }),
            ("fetch-and-add", |remote| WrOp::FetchAdd { remote, add: 1 }),
            ("compare-and-swap", |remote| WrOp::CompareSwap {
                remote,
                compare: 0,
                swap: 1,
            }),
        ];
        for (what, make) in cases {
            let s = setup(t, ALL);
            let sg = [Sge {
                addr: s.local.addr(),
                length: 8,
                lkey: s.local.lkey() ^ 0xffff,
            }];
            s.qa.post_send(&[SendWr {
                wr_id: 5,
                op: make(s.target.remote_at(0).unwrap()),
                sg_list: &sg,
                signaled: true,
            }])
            .unwrap();
            let c = one(&s.a.cq);
            // rxe: LocProtErr where data lands (a gathering WRITE/SEND says LocQpOpErr).
            assert_eq!(c.status, WcStatus::LocProtErr, "{t:?} {what}");
            // The local key is checked where the response lands: rxe has executed the
            // atomic at the target by then; the soft provider checks before sending.
            if what == "read" || provider() == ProviderKind::Soft {
                s.assert_untouched(what);
            }
        }
    }
}

#[test]
fn bad_local_sges_get_local_errors() {
    for t in transports() {
        type Case = (&'static str, fn(&Mr) -> Sge, WcStatus);
        // The small ones are what a verbs QP sends inline (the provider copies the bytes at
        // posting): they must still be checked against the region, never read from memory
        // the region does not cover (address 8 is never mapped: a read there would crash).
        let cases: [Case; 5] = [
            (
                "small, in no memory at all",
                |m| Sge {
                    addr: 8,
                    length: 8,
                    lkey: m.lkey(),
                },
                WcStatus::LocProtErr,
            ),
            (
                "small, across the region's end",
                |m| Sge {
                    addr: m.addr() + LEN as u64 - 4,
                    length: 8,
                    lkey: m.lkey(),
                },
                WcStatus::LocProtErr,
            ),
            (
                "zero length",
                |m| Sge {
                    addr: m.addr(),
                    length: 0,
                    lkey: m.lkey(),
                },
                WcStatus::Success, // a zero-byte write, as rxe does it
            ),
            (
                "past the region",
                |m| Sge {
                    addr: m.addr() + 8,
                    length: LEN as u32,
                    lkey: m.lkey(),
                },
                WcStatus::LocProtErr,
            ),
            (
                "unknown lkey",
                |m| Sge {
                    addr: m.addr(),
                    length: 8,
                    lkey: m.lkey() ^ 0xffff,
                },
                WcStatus::LocQpOpErr, // as rxe reports a key it cannot use
            ),
        ];
        for (what, make, want) in cases {
            let s = setup(t, ALL);
            let sg = [make(&s.local)];
            let op = write_at(s.target.remote_at(0).unwrap());
            s.qa.post_send(&[SendWr {
                wr_id: 1,
                op,
                sg_list: &sg,
                signaled: true,
            }])
            .unwrap();
            let c = one(&s.a.cq);
            assert_eq!(c.status, want, "{t:?} {what}");
            let after = if want == WcStatus::Success {
                QpState::Rts
            } else {
                QpState::Error
            };
            assert_eq!(s.qa.state(), after, "{what}");
            s.assert_untouched(what);
        }
        // READ into a region without LOCAL_WRITE.
        let s = setup(t, ALL);
        let ro = s.a.pd.alloc_mr(LEN, AccessFlags::REMOTE_READ).unwrap();
        let sg = [ro.sge(0, 8).unwrap()];
        let op = WrOp::Read {
            remote: s.target.remote_at(0).unwrap(),
        };
        s.qa.post_send(&[SendWr {
            wr_id: 1,
            op,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        assert_eq!(
            one(&s.a.cq).status,
            WcStatus::LocProtErr,
            "{t:?} read into read-only"
        );
        // Atomic with a 4-byte result buffer.
        let s = setup(t, ALL);
        let sg = [s.local.sge(0, 4).unwrap()];
        let op = WrOp::FetchAdd {
            remote: s.target.remote_at(0).unwrap(),
            add: 1,
        };
        let r = s.qa.post_send(&[SendWr {
            wr_id: 1,
            op,
            sg_list: &sg,
            signaled: true,
        }]);
        assert!(
            matches!(r, Err(CoreError::BadWorkRequest { wr_id: 1, .. })),
            "{t:?} short atomic buffer: {r:?}"
        );
        s.assert_untouched("short atomic buffer");
    }
}

#[test]
fn a_receive_into_memory_it_cannot_write_is_a_local_protection_error() {
    for t in transports() {
        type Case = (&'static str, fn(&Mr) -> Sge);
        let cases: [Case; 2] = [
            ("a region without LOCAL_WRITE", |m| m.sge(0, 64).unwrap()),
            ("an unknown lkey", |m| Sge {
                lkey: m.lkey() ^ 0xffff,
                ..m.sge(0, 64).unwrap()
            }),
        ];
        for (what, make) in cases {
            let (a, b) = (node_on(t), node_on(t));
            let (qa, qb) = pair(&a, &b, &config());
            let ro = b.pd.alloc_mr(LEN, AccessFlags::REMOTE_READ).unwrap();
            let before = contents(&ro);
            let rsg = [make(&ro)];
            qb.post_recv(&[RecvWr {
                wr_id: 7,
                sg_list: &rsg,
            }])
            .unwrap();
            let src = a.pd.alloc_mr(LEN, ALL).unwrap();
            src.write_at(0, &pattern(16, 5)).unwrap();
            let sg = [src.sge(0, 16).unwrap()];
            qa.post_send(&[SendWr {
                wr_id: 8,
                op: WrOp::Send { imm: None },
                sg_list: &sg,
                signaled: true,
            }])
            .unwrap();
            let r = one(&b.cq);
            assert_eq!(
                (r.wr_id, r.opcode, r.status),
                (7, WcOpcode::Recv, unwritable_receive_status(&b)),
                "{t:?}: {what}"
            );
            let s = one(&a.cq);
            assert_eq!(s.wr_id, 8);
            assert!(!s.is_ok(), "{t:?}: {what}: the sender got {s:?}");
            assert_eq!(contents(&ro), before, "{t:?}: {what}: memory changed");
        }
    }
}
