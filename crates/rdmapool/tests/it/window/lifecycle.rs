//! A window over time: rebinding after an invalidate, and what is refused before posting
//! (invalidating an unbound window, binds the library can check).

use super::*;

#[test]
fn a_window_binds_again_after_an_invalidate_under_a_new_key() {
    // On verbs the library used to leave `ibv_mw.rkey` at its first key, so rxe refused the
    // second bind (MwBindErr, QP in ERR).
    for t in transports() {
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        let first = s.bind(&mw, 0, 512, RW);
        invalidate(&s.qb, 11, first.rkey).unwrap();
        let c = one(&s.b.cq);
        assert_eq!(
            (c.opcode, c.status),
            (WcOpcode::LocalInv, WcStatus::Success),
            "{t:?}"
        );
        let w = s.bind(&mw, 1024, 256, RW);
        assert_ne!(w.rkey, first.rkey, "{t:?}: a new bind gets a new key");
        s.local.write_at(0, b"rebound!").unwrap();
        assert_eq!(s.write(w.at(8).unwrap(), 8), WcStatus::Success, "{t:?}");
        let mut got = [0u8; 8];
        s.region.read_at(1024 + 8, &mut got).unwrap();
        assert_eq!(&got, b"rebound!", "{t:?}");
        // The first key stays dead (this moves the QPs to ERR).
        assert_eq!(
            s.read(first.at(0).unwrap(), 8),
            WcStatus::RemAccessErr,
            "{t:?}"
        );
    }
}

#[test]
fn invalidating_a_window_that_is_not_bound_is_refused_before_posting() {
    // rxe 6.1 dereferences NULL in the kernel (rxe_invalidate_mw) for a never-bound window;
    // the library knows which windows are bound and refuses the rest on every provider.
    for t in transports() {
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        assert_eq!(
            window_error(invalidate(&s.qb, 1, mw.rkey())),
            WindowError::NotBound { rkey: mw.rkey() },
            "{t:?}: never bound"
        );
        // A region's key is no window either.
        assert!(matches!(
            window_error(invalidate(&s.qb, 1, s.region.rkey())),
            WindowError::NotBound { .. }
        ));
        // Bound through qb: not through another QP of the same PD.
        let w = s.bind(&mw, 0, 64, RW);
        let (_qa2, qb2) = pair(&s.a, &s.b, &config());
        assert_eq!(
            window_error(invalidate(&qb2, 2, w.rkey)),
            WindowError::BoundThroughAnotherQp {
                rkey: w.rkey,
                bound_qpn: s.qb.qpn()
            },
            "{t:?}"
        );
        // Once, then never again.
        invalidate(&s.qb, 3, w.rkey).unwrap();
        assert_eq!(one(&s.b.cq).status, WcStatus::Success, "{t:?}");
        assert_eq!(
            window_error(invalidate(&s.qb, 4, w.rkey)),
            WindowError::NotBound { rkey: w.rkey },
            "{t:?}: invalidated twice"
        );
        // Nothing was posted for the refused ones: the QPs still work.
        assert_eq!(s.qb.state(), QpState::Rts, "{t:?}");
        assert!(s
            .b
            .cq
            .wait(1, std::time::Duration::from_millis(50))
            .unwrap()
            .is_empty());
        let w = s.bind(&mw, 0, 64, RW);
        assert_eq!(s.read(w.at(0).unwrap(), 8), WcStatus::Success, "{t:?}");
    }
}

#[test]
fn binds_the_library_can_check_are_refused_before_posting_on_every_provider() {
    for t in transports() {
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        // Zero bytes: rxe fails it with MwBindErr (and ERR); refused here instead.
        assert_eq!(
            window_error(s.qb.post_bind_mw(1, &mw, &s.region, 0, 0, RW, true)),
            WindowError::ZeroLength,
            "{t:?}"
        );
        // A region of another PD: rxe 6.1 binds it; the IB spec and soft refuse it.
        let other_pd = s.b.ctx.alloc_pd().unwrap();
        let foreign = other_pd.alloc_mr(4096, BIND).unwrap();
        assert!(
            matches!(
                window_error(s.qb.post_bind_mw(2, &mw, &foreign, 0, 64, RW, true)),
                WindowError::RegionOfAnotherPd { .. }
            ),
            "{t:?}"
        );
        // A window of another PD.
        let foreign_mw = other_pd.alloc_mw().unwrap();
        assert_eq!(
            window_error(s.qb.post_bind_mw(3, &foreign_mw, &s.region, 0, 64, RW, true)),
            WindowError::WindowOfAnotherPd,
            "{t:?}"
        );
        // A deregistered region's keys (through a RegisteredMemory that outlived it).
        let doomed = s.b.pd.alloc_mr(4096, BIND).unwrap();
        let stale = StaleKeys {
            addr: doomed.addr(),
            len: doomed.len(),
            lkey: doomed.lkey(),
            rkey: doomed.rkey(),
        };
        drop(doomed);
        assert_eq!(
            window_error(s.qb.post_bind_mw(4, &mw, &stale, 0, 64, RW, true)),
            WindowError::RegionGone { lkey: stale.lkey },
            "{t:?}"
        );
        // A bound window: a type-2 window binds once until it is invalidated.
        let w = s.bind(&mw, 0, 64, RW);
        assert_eq!(
            window_error(s.qb.post_bind_mw(5, &mw, &s.region, 64, 64, RW, true)),
            WindowError::AlreadyBound { rkey: w.rkey },
            "{t:?}"
        );
        // None of these was posted: the QP is fine and the window works.
        assert_eq!(s.qb.state(), QpState::Rts, "{t:?}");
        assert!(s
            .b
            .cq
            .wait(1, std::time::Duration::from_millis(50))
            .unwrap()
            .is_empty());
        assert_eq!(s.read(w.at(0).unwrap(), 8), WcStatus::Success, "{t:?}");
    }
}
