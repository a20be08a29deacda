//! Shared helpers for the integration tests: nodes (one emulated NIC each), connected QP
//! pairs, and completion waiting.
#![allow(dead_code)]

pub mod child;
pub mod faultnet;
pub mod lan;
pub mod rawpeer;

use rdmapool::fabric::*;
use std::time::Duration;

/// The name libtest gives test `test` of the module at `module` (a `module_path!()`, whose
/// first segment is this binary's crate): what `--exact` takes to run just that test in a
/// child process.
pub fn test_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_string(),
    }
}

/// Generous: only bounds a hang, never asserts speed.
pub const WAIT: Duration = Duration::from_secs(20);

/// One node: a context with a PD and a CQ.
pub struct Node {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
}

/// The provider under test: `RDMAPOOL_TEST_PROVIDER=verbs` runs the same suite on rdma-core
/// (inside the SoftRoCE guest: scripts/softroce/), default `soft`.
pub fn provider() -> ProviderKind {
    match std::env::var("RDMAPOOL_TEST_PROVIDER") {
        Ok(p) => ProviderKind::parse(&p).expect("RDMAPOOL_TEST_PROVIDER is soft or verbs"),
        Err(_) => ProviderKind::Soft,
    }
}

/// True (with a note on stderr) when a soft-provider-only test should not run.
pub fn soft_only(what: &str) -> bool {
    if provider() != ProviderKind::Soft {
        eprintln!(
            "not run on {}: {what} is soft-provider behaviour",
            provider()
        );
        return true;
    }
    false
}

pub fn node() -> Node {
    node_on(Transport::Auto)
}

/// A node whose soft NIC takes `transport` to its peers (other providers have one path and
/// ignore it).
pub fn node_on(transport: Transport) -> Node {
    let ctx = match provider() {
        ProviderKind::Soft => {
            let cfg = SoftConfig::from_env()
                .expect("soft settings")
                .with_transport(transport);
            Context::open(cfg).expect("open soft context")
        }
        p => ProviderOptions::from_env(p, None)
            .and_then(Context::open)
            .expect("open the provider under test"),
    };
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    Node { ctx, pd, cq }
}

/// The tests' QP config: a 5 s transport timeout, or `RDMAPOOL_TEST_QP_TIMEOUT_MS` where
/// everything runs many times slower (scripts/memcheck.sh sets 60 s: under valgrind one
/// thread runs at a time, and a peer starved for 5 s would fail a request that is fine).
pub fn config() -> QpConfig {
    let timeout_ms = std::env::var("RDMAPOOL_TEST_QP_TIMEOUT_MS")
        .ok()
        .map(|v| {
            v.parse()
                .expect("RDMAPOOL_TEST_QP_TIMEOUT_MS is a number of milliseconds")
        })
        .unwrap_or(5000);
    QpConfig {
        timeout: Duration::from_millis(timeout_ms),
        rnr_timeout: Duration::from_millis(300),
        ..QpConfig::default()
    }
}

/// A QP on `a` connected to a QP on `b`.
pub fn pair(a: &Node, b: &Node, cfg: &QpConfig) -> (Qp, Qp) {
    let qa = a.pd.create_qp(&a.cq, &a.cq, cfg).unwrap();
    let qb = b.pd.create_qp(&b.cq, &b.cq, cfg).unwrap();
    qa.connect(&qb.endpoint()).unwrap();
    qb.connect(&qa.endpoint()).unwrap();
    (qa, qb)
}

/// The soft provider's two paths; other providers have one (the setting is ignored).
pub fn transports() -> Vec<Transport> {
    match provider() {
        ProviderKind::Soft => vec![Transport::Tcp, Transport::Local],
        _ => vec![Transport::Auto],
    }
}

/// Waits for exactly one completion.
pub fn one(cq: &Cq) -> Completion {
    let got = cq.wait(1, WAIT).unwrap();
    assert_eq!(got.len(), 1, "no completion within {WAIT:?}");
    got[0]
}

pub fn write_wr<'a>(wr_id: u64, remote: RemoteAddr, sg: &'a [Sge]) -> SendWr<'a> {
    SendWr {
        wr_id,
        op: WrOp::Write { remote, imm: None },
        sg_list: sg,
        signaled: true,
    }
}

pub fn read_wr<'a>(wr_id: u64, remote: RemoteAddr, sg: &'a [Sge]) -> SendWr<'a> {
    SendWr {
        wr_id,
        op: WrOp::Read { remote },
        sg_list: sg,
        signaled: true,
    }
}

/// Where servers of the tests listen: loopback on soft; the RDMA netdev's address on verbs
/// (`RDMAPOOL_TEST_CM_IP`: RDMA CM cannot route over loopback).
pub fn listen_ip() -> std::net::IpAddr {
    match provider() {
        ProviderKind::Soft => std::net::Ipv4Addr::LOCALHOST.into(),
        _ => std::env::var("RDMAPOOL_TEST_CM_IP")
            .expect("RDMAPOOL_TEST_CM_IP names the RDMA netdev's address in the verbs suite")
            .parse()
            .expect("an IP address"),
    }
}

/// Polls `f` until it holds, failing after [`WAIT`] with `what`.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Calls `start` until it succeeds (a server restarted where one just stopped may find its
/// port not yet free), failing after [`WAIT`] with `what`.
pub fn start_again<T, E: std::fmt::Display>(
    what: &str,
    mut start: impl FnMut() -> Result<T, E>,
) -> T {
    let until = std::time::Instant::now() + WAIT;
    loop {
        match start() {
            Ok(t) => return t,
            Err(e) if std::time::Instant::now() < until => {
                eprintln!("{what}: {e}; again");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn contents(mr: &Mr) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    mr.read_at(0, &mut v).unwrap();
    v
}

/// This test process's key file (32 random bytes as hex text, mode 0600, under Cargo's target tmp
/// directory), made on first use: soft NICs and pool servers listening beyond loopback
/// start only with keys, so the multi-host tests' children get this one
/// ([`key_env`]).
pub fn test_key_file() -> &'static str {
    use std::os::unix::fs::OpenOptionsExt;
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let path = format!(
            "{}/rdmapool-test-{}.key",
            env!("CARGO_TARGET_TMPDIR"),
            std::process::id()
        );
        let mut key = [0u8; 32];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut key)
            .unwrap();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        // As hex text: the bytes a key file holds are trimmed of whitespace.
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        std::io::Write::write_all(&mut f, hex.as_bytes()).unwrap();
        path
    })
}

/// The key in [`test_key_file`], as the soft NIC uses it (a raw peer's hello MAC needs it).
pub fn test_key_bytes() -> Vec<u8> {
    std::fs::read_to_string(test_key_file())
        .unwrap()
        .trim()
        .as_bytes()
        .to_vec()
}

/// The environment that gives a child the test's keys: the soft NIC's pre-shared key and
/// the pool's cluster key (read back with [`pool_key_from_env`]).
pub fn key_env() -> [(&'static str, &'static str); 2] {
    let path = test_key_file();
    [
        ("RDMAPOOL_SOFT_PSK_FILE", path),
        ("RDMAPOOL_POOL_KEY_FILE", path),
    ]
}

/// The pool cluster key named by `RDMAPOOL_POOL_KEY_FILE`, if set.
pub fn pool_key_from_env() -> Option<rdmapool::fabric::PreSharedKey> {
    std::env::var("RDMAPOOL_POOL_KEY_FILE")
        .ok()
        .map(|p| rdmapool::fabric::PreSharedKey::from_file(&p).unwrap())
}
