//! Every bad access gets the status an HCA gives, leaves target memory unchanged, and moves
//! the QPs to the error state as RC requires.

use crate::support::*;
use rdmapool::fabric::*;
use rdmapool::CoreError;

mod access;
mod queues;

const ALL: AccessFlags = AccessFlags::all_remote();
const LEN: usize = 4096;

/// A connected pair plus a patterned target region on `b`, with the given rights.
struct Setup {
    a: Node,
    b: Node,
    qa: Qp,
    qb: Qp,
    target: Mr,
    local: Mr,
    before: Vec<u8>,
}

fn setup(t: Transport, access: AccessFlags) -> Setup {
    let (a, b) = (node_on(t), node_on(t));
    let (qa, qb) = pair(&a, &b, &config());
    let target = b.pd.alloc_mr(LEN, access).unwrap();
    let before = pattern(LEN, 9);
    target.write_at(0, &before).unwrap();
    let local = a.pd.alloc_mr(LEN, ALL).unwrap();
    local.write_at(0, &pattern(LEN, 200)).unwrap();
    Setup {
        a,
        b,
        qa,
        qb,
        target,
        local,
        before,
    }
}

impl Setup {
    /// Posts `op` on 8 bytes of the local region and returns its completion status.
    fn run(&self, op: WrOp) -> WcStatus {
        let sg = [self.local.sge(0, 8).unwrap()];
        self.qa
            .post_send(&[SendWr {
                wr_id: 1,
                op,
                sg_list: &sg,
                signaled: true,
            }])
            .unwrap();
        one(&self.a.cq).status
    }

    fn assert_untouched(&self, what: &str) {
        assert_eq!(
            contents(&self.target),
            self.before,
            "{what}: target memory changed"
        );
    }

    /// After a fatal error both QPs are in ERR and later work is flushed.
    fn assert_both_in_error(&self, what: &str) {
        assert_eq!(self.qa.state(), QpState::Error, "{what}: requester state");
        // The responder moves to ERR as it answers; give its thread a moment.
        let until = std::time::Instant::now() + WAIT;
        while self.qb.state() != QpState::Error && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(self.qb.state(), QpState::Error, "{what}: responder state");
        assert_eq!(
            self.run(WrOp::Write {
                remote: self.target.remote_at(0).unwrap(),
                imm: None
            }),
            WcStatus::WrFlushErr
        );
        self.assert_untouched(what);
    }
}

fn write_at(remote: RemoteAddr) -> WrOp {
    WrOp::Write { remote, imm: None }
}

#[test]
fn invalid_requests_are_typed_errors_not_completions() {
    let (a, b) = (node_on(Transport::Auto), node_on(Transport::Auto));
    let cfg = QpConfig {
        max_send_wr: 2,
        max_sge: 2,
        ..config()
    };
    let qa = a.pd.create_qp(&a.cq, &a.cq, &cfg).unwrap();
    let local = a.pd.alloc_mr(LEN, ALL).unwrap();
    let sg = [local.sge(0, 8).unwrap()];
    let op = write_at(local.remote_at(0).unwrap());
    let wr = SendWr {
        wr_id: 1,
        op,
        sg_list: &sg,
        signaled: true,
    };
    assert!(matches!(
        qa.post_send(&[wr]),
        Err(CoreError::InvalidQpState {
            state: QpState::Reset,
            ..
        })
    ));
    assert!(matches!(
        qa.modify_to_rts(),
        Err(CoreError::InvalidQpState { .. })
    ));
    let qb = b.pd.create_qp(&b.cq, &b.cq, &cfg).unwrap();
    qa.connect(&qb.endpoint()).unwrap();
    qb.connect(&qa.endpoint()).unwrap();
    let three = [sg[0], sg[0], sg[0]];
    let wide = SendWr {
        sg_list: &three,
        ..wr
    };
    assert!(matches!(
        qa.post_send(&[wide]),
        Err(CoreError::OutOfLimits {
            what: "SGEs in a work request",
            value: 3,
            ..
        })
    ));
    // Garbage endpoints are refused with a typed error.
    assert!(matches!(
        Endpoint::from_bytes(&[1, 2, 3]),
        Err(CoreError::Malformed { .. })
    ));
    let mut ep = qb.endpoint().to_bytes();
    ep.truncate(ep.len() - 3);
    assert!(Endpoint::from_bytes(&ep).is_err());
}

#[test]
fn bad_registrations_are_refused() {
    let n = node();
    assert!(matches!(
        n.pd.alloc_mr(0, ALL),
        Err(CoreError::OutOfLimits {
            value: 0,
            min: 1,
            ..
        })
    ));
    assert!(matches!(
        n.pd.alloc_mr(64, AccessFlags::REMOTE_WRITE),
        Err(CoreError::BadAccess { .. })
    ));
    assert!(matches!(
        n.pd.alloc_mr(64, AccessFlags::REMOTE_ATOMIC),
        Err(CoreError::BadAccess { .. })
    ));
    // SAFETY: a null pointer is refused before anything touches it.
    let null = unsafe { n.pd.register_raw(std::ptr::null_mut(), 64, ALL) };
    assert!(
        matches!(null, Err(CoreError::NullAddress { .. })),
        "{null:?}"
    );
    assert!(matches!(
        n.ctx.create_cq(0),
        Err(CoreError::OutOfLimits {
            what: "CQ depth",
            value: 0,
            ..
        })
    ));
    let max = n.ctx.device().max_mr_size;
    if max < usize::MAX as u64 {
        let too_big = n.pd.alloc_mr(max as usize + 1, ALL);
        assert!(
            matches!(too_big, Err(CoreError::OutOfLimits { max: m, .. }) if m == max),
            "{too_big:?}"
        );
    }
    let mr = n.pd.alloc_mr(64, ALL).unwrap();
    assert!(mr.sge(60, 8).is_err());
    assert!(mr.write_at(usize::MAX, b"x").is_err());
    assert!(mr.atomic_u64(4).is_err());
    assert_eq!(n.ctx.live_regions(), 1);
}

#[test]
fn on_demand_paging_works_where_the_device_has_it_and_says_so_where_not() {
    let n = node();
    let odp = AccessFlags::all_remote() | AccessFlags::ON_DEMAND;
    match n.pd.alloc_mr(LEN, odp) {
        Ok(mr) => {
            assert!(
                n.ctx.device().on_demand_paging,
                "registered ODP on a device without it"
            );
            mr.write_at(0, b"odp").unwrap();
        }
        Err(CoreError::Unsupported(msg)) => {
            assert!(!n.ctx.device().on_demand_paging, "{msg}");
            assert!(msg.contains("on-demand paging"), "{msg}");
        }
        Err(e) => panic!("unexpected error for an ODP registration: {e}"),
    }
}

#[test]
fn unknown_device_names_are_refused_with_the_list() {
    let r = ProviderOptions::from_env(provider(), Some("no-such-device")).and_then(Context::open);
    match r {
        Err(CoreError::NoSuchDevice { name, known, .. }) => {
            assert_eq!(name, "no-such-device");
            assert!(!known.is_empty() || provider() == ProviderKind::Verbs);
        }
        Err(e) => panic!("expected NoSuchDevice, got {e}"),
        Ok(_) => panic!("opened a device that does not exist"),
    }
}

/// Sets a netdev down for a test and always brings it back up.
struct LinkDown(String);

impl LinkDown {
    fn new(netdev: &str) -> Self {
        let ok = std::process::Command::new("ip")
            .args(["link", "set", netdev, "down"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "could not set {netdev} down");
        LinkDown(netdev.to_string())
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "set", &self.0, "up"])
            .status();
        // Wait for the RDMA port to come back so later tests find it ACTIVE.
        for _ in 0..500 {
            let ports = rdmapool::devices();
            let up = ports
                .iter()
                .flat_map(|p| &p.devices)
                .flat_map(|d| &d.ports)
                .all(|p| p.state == "ACTIVE");
            if up {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[test]
fn a_port_that_is_down_is_named_in_the_error() {
    let Ok(netdev) = std::env::var("SOFTROCE_NETDEV") else {
        eprintln!("needs the SoftRoCE guest (SOFTROCE_NETDEV); not run here");
        return;
    };
    if provider() != ProviderKind::Verbs {
        return;
    }
    let n = node();
    let qp = n.pd.create_qp(&n.cq, &n.cq, &QpConfig::default()).unwrap();
    let _down = LinkDown::new(&netdev);
    let port_down = || {
        let providers = rdmapool::devices();
        let state = providers
            .iter()
            .filter(|p| p.provider == ProviderKind::Verbs)
            .flat_map(|p| &p.devices)
            .flat_map(|d| &d.ports)
            .map(|p| p.state.clone())
            .next();
        state.is_some_and(|s| s != "ACTIVE")
    };
    for _ in 0..500 {
        if port_down() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(port_down(), "the RDMA port did not follow its link down");
    match qp.modify_to_init() {
        Err(CoreError::PortDown { port, state, .. }) => {
            assert!(port == 1 && state != "ACTIVE", "port {port} is {state}")
        }
        other => panic!("expected a port error, got {other:?}"),
    }
}

/// Posts one 8-byte WRITE per id in `ids`, `signaled` as given, as one list.
fn post_writes(qp: &Qp, target: &Mr, local: &Mr, ids: &[(u64, bool)]) -> Result<(), CoreError> {
    let sg = [local.sge(0, 8).unwrap()];
    let wrs: Vec<_> = ids
        .iter()
        .map(|&(wr_id, signaled)| SendWr {
            wr_id,
            op: write_at(target.remote_at(0).unwrap()),
            sg_list: &sg,
            signaled,
        })
        .collect();
    qp.post_send(&wrs)
}

fn is_send_queue_full(r: Result<(), CoreError>) -> bool {
    matches!(r, Err(CoreError::QueueFull { queue: "send", .. }))
}

/// Long enough for requests to finish on any provider (it only gives a provider that frees
/// entries early the chance to do so; nothing is asserted about time).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// What a receive whose buffer cannot be written completes with: a local protection error
/// in the IB spec (and on mlx5, and the soft provider); rxe on Linux 6.1 says local QP
/// operation error. Asserted both ways, so an rxe that changes shows up here.
fn unwritable_receive_status(node: &Node) -> WcStatus {
    if node.ctx.device().name.starts_with("rxe") {
        WcStatus::LocQpOpErr
    } else {
        WcStatus::LocProtErr
    }
}

#[test]
fn the_verbs_device_is_chosen_by_rdmapool_device() {
    if let Ok(expect) = std::env::var("RDMAPOOL_TEST_EXPECT_DEVICE") {
        // The child: RDMAPOOL_DEVICE is set for it.
        match ProviderOptions::from_env(ProviderKind::Verbs, None).and_then(Context::open) {
            Ok(ctx) => assert_eq!(ctx.device().name, expect),
            Err(CoreError::NoSuchDevice { name, .. }) => {
                assert!(expect.is_empty(), "{name}");
                assert_eq!(name, "no-such-device");
            }
            Err(e) => panic!("{e}"),
        }
        return;
    }
    if provider() != ProviderKind::Verbs {
        eprintln!(
            "not run on {}: RDMAPOOL_DEVICE picks a verbs device",
            provider()
        );
        return;
    }
    let dev = node().ctx.device().name.clone();
    for (env, expect) in [(dev.as_str(), dev.as_str()), ("no-such-device", "")] {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &test_name(
                    module_path!(),
                    "the_verbs_device_is_chosen_by_rdmapool_device",
                ),
                "--test-threads=1",
            ])
            .env("RDMAPOOL_DEVICE", env)
            .env("RDMAPOOL_TEST_EXPECT_DEVICE", expect)
            .status()
            .unwrap();
        assert!(status.success(), "RDMAPOOL_DEVICE={env}");
    }
}
