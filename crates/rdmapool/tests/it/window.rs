//! Memory windows (type 2): a key that covers exactly the bound range with the bound rights,
//! only through the QP it was bound on, and nothing once invalidated; on every provider.

use crate::support::*;
use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::fabric::*;
use rdmapool::CoreError;
use rdmapool::Error;

mod lifecycle;

/// What an access outside a window (inside its region) completes with. The IB spec, mlx5
/// and the soft provider refuse it; rxe on Linux 6.1 checks a window's accesses against its
/// region's bounds only, so there it succeeds. Asserted both ways, so a kernel that starts
/// enforcing window bounds shows up here.
fn outside_the_window() -> WcStatus {
    match provider() {
        ProviderKind::Soft => WcStatus::RemAccessErr,
        _ => WcStatus::Success,
    }
}

const BIND: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);
const RW: AccessFlags = AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE);

/// `a` accesses memory of `b`; windows are bound on `qb` (the QP `a`'s requests arrive on).
struct Setup {
    a: Node,
    b: Node,
    qa: Qp,
    qb: Qp,
    region: Mr,
    local: Mr,
}

fn setup(t: Transport) -> Setup {
    let (a, b) = (node_on(t), node_on(t));
    let (qa, qb) = pair(&a, &b, &config());
    let region = b.pd.alloc_mr(1 << 16, BIND).unwrap();
    region.write_at(0, &pattern(1 << 16, 3)).unwrap();
    let local = a.pd.alloc_mr(1 << 16, AccessFlags::all_remote()).unwrap();
    Setup {
        a,
        b,
        qa,
        qb,
        region,
        local,
    }
}

impl Setup {
    /// Binds `mw` to `len` bytes at `offset` of the region and waits for the bind.
    fn bind(&self, mw: &Mw, offset: usize, len: usize, access: AccessFlags) -> RemoteRegion {
        let w = self
            .qb
            .post_bind_mw(9, mw, &self.region, offset, len, access, true)
            .unwrap();
        let c = one(&self.b.cq);
        assert_eq!(
            (c.wr_id, c.opcode, c.status),
            (9, WcOpcode::BindMw, WcStatus::Success)
        );
        assert_eq!(w.region.rkey, mw.rkey());
        w.region
    }

    /// READs `len` bytes at `remote` into the local region; the completion status.
    fn read(&self, remote: RemoteAddr, len: u32) -> WcStatus {
        self.qa
            .post_send(&[read_wr(1, remote, &[self.local.sge(0, len).unwrap()])])
            .unwrap();
        one(&self.a.cq).status
    }

    fn write(&self, remote: RemoteAddr, len: u32) -> WcStatus {
        self.qa
            .post_send(&[write_wr(2, remote, &[self.local.sge(0, len).unwrap()])])
            .unwrap();
        one(&self.a.cq).status
    }
}

#[test]
fn a_window_reaches_exactly_its_range_with_its_rights() {
    for t in transports() {
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        let w = s.bind(&mw, 4096, 256, RW);
        assert_eq!((w.addr, w.len), (s.region.addr() + 4096, 256));
        // Inside: READ sees the region's bytes, WRITE changes them.
        assert_eq!(s.read(w.at(0).unwrap(), 256), WcStatus::Success, "{t:?}");
        let mut got = vec![0u8; 256];
        s.local.read_at(0, &mut got).unwrap();
        assert!(got == pattern(1 << 16, 3)[4096..4352], "{t:?}");
        s.local.write_at(0, b"via the window").unwrap();
        assert_eq!(s.write(w.at(100).unwrap(), 14), WcStatus::Success, "{t:?}");
        let mut got = [0u8; 14];
        s.region.read_at(4196, &mut got).unwrap();
        assert_eq!(&got, b"via the window");
        // One byte past the window: refused, and nothing outside it changes.
        let before = contents(&s.region);
        let status = s.write(w.at(250).unwrap(), 8);
        assert_eq!(status, outside_the_window(), "{t:?}");
        if status != WcStatus::Success {
            assert!(contents(&s.region) == before, "{t:?}: memory changed");
        }
    }
}

#[test]
fn what_a_window_does_not_grant_is_a_remote_access_error() {
    for t in transports() {
        // WRITE through a read-only window.
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        let w = s.bind(&mw, 0, 4096, AccessFlags::REMOTE_READ);
        let before = contents(&s.region);
        assert_eq!(
            s.write(w.at(0).unwrap(), 8),
            WcStatus::RemAccessErr,
            "{t:?}"
        );
        assert!(contents(&s.region) == before);
        // READ before the window's start.
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        let w = s.bind(&mw, 8192, 64, RW);
        let below = RemoteAddr {
            addr: w.addr - 8,
            rkey: w.rkey,
        };
        assert_eq!(s.read(below, 8), outside_the_window(), "{t:?}");
        // An unbound window's key.
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        let unbound = RemoteAddr {
            addr: s.region.addr(),
            rkey: mw.rkey(),
        };
        assert_eq!(s.read(unbound, 8), WcStatus::RemAccessErr, "{t:?}");
        // The region's own key: it grants no remote access, only windows do.
        let s = setup(t);
        assert_eq!(
            s.read(s.region.remote_at(0).unwrap(), 8),
            WcStatus::RemAccessErr,
            "{t:?}"
        );
    }
}

#[test]
fn an_invalidated_window_grants_nothing() {
    for t in transports() {
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        let w = s.bind(&mw, 0, 512, RW);
        assert_eq!(s.read(w.at(0).unwrap(), 8), WcStatus::Success, "{t:?}");
        s.qb.post_send(&[SendWr {
            wr_id: 11,
            op: WrOp::LocalInvalidate { rkey: w.rkey },
            sg_list: &[],
            signaled: true,
        }])
        .unwrap();
        let c = one(&s.b.cq);
        assert_eq!(
            (c.wr_id, c.opcode, c.status),
            (11, WcOpcode::LocalInv, WcStatus::Success)
        );
        assert_eq!(s.read(w.at(0).unwrap(), 8), WcStatus::RemAccessErr, "{t:?}");
    }
}

#[test]
fn a_window_binds_only_where_the_region_allows_it() {
    for t in transports() {
        let s = setup(t);
        let plain = s.b.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mw = s.b.pd.alloc_mw().unwrap();
        s.qb.post_bind_mw(5, &mw, &plain, 0, 64, AccessFlags::REMOTE_READ, true)
            .unwrap();
        let c = one(&s.b.cq);
        assert_eq!((c.wr_id, c.opcode), (5, WcOpcode::BindMw), "{t:?}");
        assert_eq!(
            c.status,
            WcStatus::MwBindErr,
            "{t:?}: no MW_BIND on the region"
        );
        // Local rights the window cannot grant are refused before posting.
        let s = setup(t);
        let mw = s.b.pd.alloc_mw().unwrap();
        assert!(s
            .qb
            .post_bind_mw(6, &mw, &s.region, 0, 64, AccessFlags::LOCAL_WRITE, true)
            .is_err());
        assert!(s
            .qb
            .post_bind_mw(
                6,
                &mw,
                &s.region,
                65_000,
                1024,
                AccessFlags::REMOTE_READ,
                true
            )
            .is_err());
    }
}

#[test]
fn a_window_is_reached_only_through_the_qp_it_was_bound_on() {
    for t in transports() {
        let s = setup(t);
        let (qa2, _qb2) = pair(&s.a, &s.b, &config());
        let mw = s.b.pd.alloc_mw().unwrap();
        let w = s.bind(&mw, 0, 4096, RW);
        // Through its own QP pair: fine. Through another connection of the same PD: refused.
        assert_eq!(s.read(w.at(0).unwrap(), 8), WcStatus::Success, "{t:?}");
        qa2.post_send(&[read_wr(3, w.at(0).unwrap(), &[s.local.sge(0, 8).unwrap()])])
            .unwrap();
        assert_eq!(one(&s.a.cq).status, WcStatus::RemAccessErr, "{t:?}");
    }
}

#[test]
fn a_pooled_buffer_is_exported_through_a_window_covering_exactly_it() {
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, qb) = pair(&a, &b, &config());
        let pool = BufferPool::new(b.pd.clone(), PoolConfig::default()).unwrap();
        let buf = pool.alloc(4096).unwrap();
        let neighbour = pool.alloc(4096).unwrap();
        neighbour.write_at(0, b"not yours").unwrap();
        buf.write_at(0, b"exported").unwrap();
        let mw = b.pd.alloc_mw().unwrap();
        let w = qb
            .post_bind_mw(1, &mw, &buf, 0, buf.len(), RW, true)
            .unwrap();
        assert!(one(&b.cq).is_ok());
        assert_eq!((w.region.addr, w.region.len), (buf.addr(), 4096));
        let local = a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        qa.post_send(&[read_wr(
            2,
            w.region.at(0).unwrap(),
            &[local.sge(0, 8).unwrap()],
        )])
        .unwrap();
        assert!(one(&a.cq).is_ok());
        let mut got = [0u8; 8];
        local.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"exported");
        // The neighbour, one buffer further in the same chunk, is out of reach.
        let next_door = RemoteAddr {
            addr: neighbour.addr(),
            rkey: w.region.rkey,
        };
        qa.post_send(&[read_wr(3, next_door, &[local.sge(0, 8).unwrap()])])
            .unwrap();
        assert_eq!(one(&a.cq).status, outside_the_window(), "{t:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_api_binds_and_invalidates_windows() {
    use rdmapool::cq::{Engine, EngineConfig, Progress};
    use std::sync::Arc;
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let engine = Engine::new(
            vec![b.ctx.create_cq(1024).unwrap()],
            EngineConfig {
                progress: Progress::BusyPoll,
                ..EngineConfig::default()
            },
        )
        .unwrap();
        let qb = engine.create_qp(&b.pd, &config()).unwrap();
        let qa = a.pd.create_qp(&a.cq, &a.cq, &config()).unwrap();
        qa.connect(&qb.qp().endpoint()).unwrap();
        qb.connect(&qa.endpoint()).unwrap();
        let pool = BufferPool::new(b.pd.clone(), PoolConfig::default()).unwrap();
        let buf = pool.alloc(1024).unwrap();
        buf.write_at(0, b"async window").unwrap();
        let mw = Arc::new(b.pd.alloc_mw().unwrap());
        let (r, binding) = qb
            .bind_window(mw, &buf, 0, buf.len(), AccessFlags::REMOTE_READ)
            .await;
        r.unwrap();
        let region = binding.region();
        assert_eq!((region.addr, region.len), (buf.addr(), 1024));
        let local = a.pd.alloc_mr(64, AccessFlags::all_remote()).unwrap();
        qa.post_send(&[read_wr(
            1,
            region.at(0).unwrap(),
            &[local.sge(0, 12).unwrap()],
        )])
        .unwrap();
        assert!(one(&a.cq).is_ok(), "{t:?}");
        let mut got = [0u8; 12];
        local.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"async window");
        let (r, ()) = qb.invalidate(region.rkey).await;
        r.unwrap();
        qa.post_send(&[read_wr(
            2,
            region.at(0).unwrap(),
            &[local.sge(0, 12).unwrap()],
        )])
        .unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr, "{t:?}");
        // Binding local rights is refused before posting, and the window comes back.
        let mw = Arc::new(b.pd.alloc_mw().unwrap());
        let (r, binding) = qb
            .bind_window(mw, &buf, 0, 64, AccessFlags::LOCAL_WRITE)
            .await;
        assert!(
            matches!(r, Err(Error::Core(CoreError::BadAccess { .. }))),
            "{r:?}"
        );
        assert_eq!(Arc::strong_count(&binding.mw), 1);
    }
}

#[test]
fn deregistering_a_region_revokes_its_windows_on_soft() {
    if soft_only("deregistering a region under a bound window") {
        return;
    }
    for t in transports() {
        let s = setup(t);
        let doomed = s.b.pd.alloc_mr(4096, BIND).unwrap();
        let mw = s.b.pd.alloc_mw().unwrap();
        let w =
            s.qb.post_bind_mw(9, &mw, &doomed, 0, 64, RW, true)
                .unwrap()
                .region;
        assert!(one(&s.b.cq).is_ok());
        assert_eq!(s.read(w.at(0).unwrap(), 8), WcStatus::Success, "{t:?}");
        drop(doomed);
        assert_eq!(s.read(w.at(0).unwrap(), 8), WcStatus::RemAccessErr, "{t:?}");
    }
}

/// A local invalidate of `rkey` on `qp`.
fn invalidate(qp: &Qp, wr_id: u64, rkey: u32) -> Result<(), CoreError> {
    qp.post_send(&[SendWr {
        wr_id,
        op: WrOp::LocalInvalidate { rkey },
        sg_list: &[],
        signaled: true,
    }])
}

fn window_error(r: Result<impl std::fmt::Debug, CoreError>) -> WindowError {
    match r {
        Err(CoreError::Window(e)) => e,
        other => panic!("expected a window error, got {other:?}"),
    }
}

/// Keys of a registration, kept after it is gone (what a buggy caller could hand in).
struct StaleKeys {
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
}

impl RegisteredMemory for StaleKeys {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
}
