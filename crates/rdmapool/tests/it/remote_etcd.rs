//! Cluster membership on a real etcd (feature `etcd`): each test starts `etcd` on loopback
//! with a temporary data dir and stops it. Servers and clients are real (soft provider over
//! loopback). Without an `etcd` binary the tests say so and pass, unless
//! `RDMAPOOL_TEST_ETCD_REQUIRED` is set (CI sets it, and installs Debian's `etcd-server`).

use crate::support::*;
use rdmapool::fabric::*;
use rdmapool::remote::*;
use rdmapool::Error;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One etcd member on loopback, killed (and its data dir removed) on drop.
struct Etcd {
    child: Child,
    dir: PathBuf,
    url: String,
    /// How to reach it when it serves TLS (the CA and a client certificate it accepts).
    tls: Option<EtcdTls>,
}

/// Certificates for an etcd on TLS, made by the test: a CA, a server certificate for
/// 127.0.0.1 and a client certificate, both signed by the CA; and a second CA etcd does not
/// know. Subjects carry no common name (etcd 3.4's gateway refuses a client certificate with
/// one when authentication is on).
struct Pki {
    ca: PathBuf,
    other_ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    fn new(dir: &std::path::Path) -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair,
        };
        use std::os::unix::fs::PermissionsExt;
        let ca_params = |name: &str| {
            let mut p = CertificateParams::default();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name = DistinguishedName::new();
            p.distinguished_name.push(DnType::CommonName, name);
            p
        };
        let write = |name: &str, pem: String, private: bool| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            if private {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
            path
        };
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params("rdmapool test CA").self_signed(&ca_key).unwrap();
        let other_key = KeyPair::generate().unwrap();
        let other = ca_params("another CA").self_signed(&other_key).unwrap();
        let leaf = |ip: bool| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::default();
            p.distinguished_name = DistinguishedName::new();
            if ip {
                p.subject_alt_names = vec![rcgen::SanType::IpAddress(Ipv4Addr::LOCALHOST.into())];
            }
            (
                p.signed_by(&key, &ca, &ca_key).unwrap().pem(),
                key.serialize_pem(),
            )
        };
        let (server_cert, server_key) = leaf(true);
        let (client_cert, client_key) = leaf(false);
        Pki {
            ca: write("ca.pem", ca.pem(), false),
            other_ca: write("other-ca.pem", other.pem(), false),
            server_cert: write("server.pem", server_cert, false),
            server_key: write("server.key", server_key, true),
            client_cert: write("client.pem", client_cert, false),
            client_key: write("client.key", client_key, true),
        }
    }

    /// TLS settings of a client etcd accepts.
    fn client(&self) -> EtcdTls {
        EtcdTls {
            ca_file: Some(self.ca.clone()),
            cert_file: Some(self.client_cert.clone()),
            key_file: Some(self.client_key.clone()),
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Etcd {
    /// Starts etcd, or says why it cannot (the caller skips, or fails when required).
    fn start(name: &str) -> Option<Etcd> {
        Self::launch(name, |_| (vec![], None))
    }

    /// Starts etcd serving TLS only (its client port on https, client certificates
    /// required), with simple tokens that expire after `token_ttl_s` of disuse; returns it
    /// with its certificates.
    fn start_tls(name: &str, token_ttl_s: u32) -> Option<(Etcd, Pki)> {
        let mut pki = None;
        let etcd = Self::launch(name, |dir| {
            let p = pki.get_or_insert_with(|| Pki::new(dir));
            let args = vec![
                format!("--cert-file={}", p.server_cert.display()),
                format!("--key-file={}", p.server_key.display()),
                format!("--trusted-ca-file={}", p.ca.display()),
                "--client-cert-auth".into(),
                format!("--auth-token-ttl={token_ttl_s}"),
            ];
            (args, Some(p.client()))
        })?;
        Some((etcd, pki.expect("made at launch")))
    }

    /// Starts etcd with the extra arguments and client TLS `setup` gives for its dir.
    fn launch(
        name: &str,
        mut setup: impl FnMut(&std::path::Path) -> (Vec<String>, Option<EtcdTls>),
    ) -> Option<Etcd> {
        let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let dir = std::env::temp_dir().join(format!(
            "rdmapool-etcd-{}-{name}-{}",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (extra, tls) = setup(&dir);
        let scheme = if tls.is_some() { "https" } else { "http" };
        for attempt in 0..3 {
            let (client, peer) = (free_port(), free_port());
            let url = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = std::fs::File::create(dir.join("etcd.log")).expect("log file");
            let spawned = Command::new(&bin)
                .arg("--name=test")
                .arg(format!("--data-dir={}", dir.join("data").display()))
                .arg(format!("--listen-client-urls={url}"))
                .arg(format!("--advertise-client-urls={url}"))
                .arg(format!("--listen-peer-urls={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .arg(format!("--initial-cluster=test={peer_url}"))
                .arg("--log-level=error")
                .args(&extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn();
            let child = match spawned {
                Ok(c) => c,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return skip_or_fail(&format!("cannot run {bin:?}: {e}"));
                }
            };
            let mut etcd = Etcd {
                child,
                dir: dir.clone(),
                url,
                tls: tls.clone(),
            };
            let until = Instant::now() + Duration::from_secs(15);
            let probe = EtcdMembership::new(&etcd.config("/probe")).expect("config");
            while Instant::now() < until {
                if probe.members().is_ok() {
                    return Some(etcd);
                }
                if let Ok(Some(status)) = etcd.child.try_wait() {
                    eprintln!("etcd exited with {status} (attempt {attempt}; ports taken?)");
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let log = std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default();
            eprintln!("etcd did not come up; its log:\n{log}");
            // Keep the dir for the next attempt: drop only the process.
            let _ = etcd.child.kill();
            let _ = etcd.child.wait();
            let _ = std::fs::remove_dir_all(dir.join("data"));
            std::mem::forget(etcd);
        }
        let _ = std::fs::remove_dir_all(&dir);
        skip_or_fail("etcd did not start")
    }

    fn config(&self, prefix: &str) -> EtcdConfig {
        let mut cfg = EtcdConfig::new(vec![self.url.clone()], prefix);
        cfg.ttl = Duration::from_secs(2);
        cfg.watch_idle = Duration::from_millis(250);
        cfg.tls = self.tls.clone();
        cfg
    }

    /// Turns etcd's authentication on, with user `root` (password `root_password`), as
    /// `etcdctl user add`, `user grant-role` and `auth enable` do, on the JSON gateway.
    fn enable_auth(&self, root_password: &str) {
        let tls = self.tls.as_ref().expect("auth is tested over TLS");
        let pem = |p: &PathBuf| std::fs::read(p).unwrap();
        let ca = ureq::tls::Certificate::from_pem(&pem(tls.ca_file.as_ref().unwrap())).unwrap();
        let cert = ureq::tls::Certificate::from_pem(&pem(tls.cert_file.as_ref().unwrap())).unwrap();
        let key = ureq::tls::PrivateKey::from_pem(&pem(tls.key_file.as_ref().unwrap())).unwrap();
        let agent = ureq::Agent::config_builder()
            .tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::new_with_certs(&[ca]))
                    .client_cert(Some(ureq::tls::ClientCert::new_with_certs(&[cert], key)))
                    .build(),
            )
            .build()
            .new_agent();
        for (path, body) in [
            (
                "user/add",
                serde_json::json!({ "name": "root", "password": root_password }),
            ),
            (
                "user/grant",
                serde_json::json!({ "user": "root", "role": "root" }),
            ),
            ("enable", serde_json::json!({})),
        ] {
            agent
                .post(&format!("{}/v3/auth/{path}", self.url))
                .send_json(&body)
                .unwrap_or_else(|e| panic!("etcd auth {path}: {e}"));
        }
    }
}

fn skip_or_fail(why: &str) -> Option<Etcd> {
    if std::env::var_os("RDMAPOOL_TEST_ETCD_REQUIRED").is_some() {
        panic!("{why} (RDMAPOOL_TEST_ETCD_REQUIRED is set)");
    }
    eprintln!("skipped: {why} (install Debian's etcd-server, or set ETCD_BIN)");
    None
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server(node: u32) -> MemoryServer {
    server_at(node, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
}

fn server_at(node: u32, listen: SocketAddr) -> MemoryServer {
    server_with(node, listen, None)
}

fn server_with(node: u32, listen: SocketAddr, cluster_key: Option<PreSharedKey>) -> MemoryServer {
    let ctx = node_on(Transport::Auto).ctx;
    MemoryServer::start(
        &ctx,
        ServerConfig {
            node,
            size: 8 << 20,
            chunk_size: 256 << 10,
            clients: 64,
            lease: Duration::from_secs(2),
            listen,
            cluster_key,
            ..ServerConfig::default()
        },
    )
    .expect("server starts")
}

/// A server, registered in etcd.
fn registered(cfg: &EtcdConfig, node: u32) -> (MemoryServer, EtcdRegistration) {
    let s = server(node);
    let r = EtcdRegistration::register(cfg, node, s.addr()).expect("registers");
    (s, r)
}

fn client(members: &EtcdMembership, id: u64, placement: Box<dyn Placement>) -> Arc<PoolClient> {
    let n = node();
    let mut cfg = ClientConfig::new(id);
    cfg.placement = placement;
    Arc::new(PoolClient::connect(&n.ctx, &n.pd, members, cfg).expect("client connects"))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "never happened: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    t.elapsed()
}

fn node_ids(c: &PoolClient) -> Vec<u32> {
    c.nodes().iter().map(|n| n.node).collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[test]
fn a_following_client_connects_to_servers_that_register_later_and_allocates_there() {
    let Some(etcd) = Etcd::start("join") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-join");
    let (s1, _r1) = registered(&cfg, 1);
    let members = EtcdMembership::new(&cfg).unwrap();
    assert_eq!(
        members
            .members()
            .unwrap()
            .iter()
            .map(|m| m.node)
            .collect::<Vec<_>>(),
        vec![1]
    );
    // Least-used placement: a server that joins (nothing used) takes the next allocation.
    let c = client(&members, 11, Box::new(LeastUsed));
    let follower = members.follow(c.clone()).unwrap();
    assert_eq!(follower.nodes(), vec![1]);
    let first = c.block_on(c.alloc(64, None)).unwrap();
    assert_eq!(first.node, 1);

    // A second client that is told of each server directly: what connecting costs without
    // etcd in the way.
    let direct = {
        let n = node();
        let first = StaticMembership::new(vec![s1.addr()]);
        PoolClient::connect(&n.ctx, &n.pd, &first, ClientConfig::new(12)).unwrap()
    };
    let buf = Arc::new(c.pd().alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap());
    let mut servers = Vec::new();
    let mut growth = Vec::new();
    for node in 2..=6u32 {
        let t0 = Instant::now();
        let s = server(node);
        let started = t0.elapsed();
        let r = EtcdRegistration::register(&cfg, node, s.addr()).unwrap();
        let registered = t0.elapsed();
        wait_until("the client connects to the new server", || {
            node_ids(&c).contains(&node) && follower.nodes().contains(&node)
        });
        let connected = t0.elapsed();
        let p = c.block_on(c.alloc(64, None)).unwrap();
        let allocated = t0.elapsed();
        assert_eq!(
            p.node, node,
            "least-used placement picks the empty newcomer"
        );
        let t1 = Instant::now();
        direct.add_server(s.addr()).unwrap();
        let add_server = t1.elapsed();
        eprintln!(
            "growth, node {node}: server up {:.1} ms, registered {:.1} ms, client connected \
             {:.1} ms, first allocation on it {:.1} ms (from the server's start); a direct \
             add_server takes {:.1} ms",
            ms(started),
            ms(registered),
            ms(connected),
            ms(allocated),
            ms(add_server)
        );
        growth.push((allocated, allocated - registered));
        // The memory is real: write and read it back.
        buf.write_at(0, &node.to_le_bytes()).unwrap();
        let (w, b) = c.block_on(c.write(p, 0, buf.clone(), 0, 4));
        w.unwrap();
        let (rd, b) = c.block_on(c.read(p, 0, b, 8, 4));
        rd.unwrap();
        let mut got = [0u8; 4];
        b.read_at(8, &mut got).unwrap();
        assert_eq!(u32::from_le_bytes(got), node);
        servers.push((s, r));
    }
    growth.sort();
    let (total, after_reg) = growth[growth.len() / 2];
    eprintln!(
        "growth (median of {}): {:.1} ms from server start to first allocation on it, {:.1} ms \
         of it after the registration was in etcd",
        growth.len(),
        ms(total),
        ms(after_reg)
    );
    assert_eq!(follower.nodes(), vec![1, 2, 3, 4, 5, 6]);
    let st = follower.stats();
    assert_eq!((st.joined, st.left), (5, 0));
    assert!(st.watches >= 1);
    drop(follower);
    drop(c);
    drop(direct);
    // Dropping a registration revokes its lease: the key goes at once.
    let (_s6, r6) = servers.pop().unwrap();
    drop(r6);
    let ids: Vec<u32> = members.members().unwrap().iter().map(|m| m.node).collect();
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
}

#[test]
fn a_crashed_servers_key_expires_and_clients_stop_trying_it() {
    let Some(etcd) = Etcd::start("crash") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-crash");
    let (_s1, _r1) = registered(&cfg, 1);
    let (s2, r2) = registered(&cfg, 2);
    let (_s3, _r3) = registered(&cfg, 3);
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 21, Box::new(RoundRobin::default()));
    let follower = members.follow(c.clone()).unwrap();
    assert_eq!(follower.nodes(), vec![1, 2, 3]);
    let ptrs: Vec<RemotePtr> = (0..30)
        .map(|_| c.block_on(c.alloc(128, None)).unwrap())
        .collect();
    let on2: Vec<RemotePtr> = ptrs.iter().filter(|p| p.node == 2).copied().collect();
    assert!(!on2.is_empty());

    // Crash server 2: it stops renewing its lease without revoking it, and goes away.
    let t0 = Instant::now();
    r2.abandon();
    drop(s2);
    assert!(
        members.members().unwrap().iter().any(|m| m.node == 2),
        "a crash does not remove the key at once"
    );
    let gone_from_etcd = wait_until("the dead server's key expires", || {
        !members.members().unwrap().iter().any(|m| m.node == 2)
    });
    wait_until("the client drops the dead server", || {
        !follower.nodes().contains(&2) && !node_ids(&c).contains(&2)
    });
    let dropped = t0.elapsed();
    eprintln!(
        "crash: key gone from etcd {:.0} ms after the crash (TTL {:?}), client dropped the \
         server at {:.0} ms",
        ms(gone_from_etcd),
        cfg.ttl,
        ms(dropped)
    );
    assert!(
        gone_from_etcd >= cfg.ttl / 3,
        "the key went by lease expiry, not at once"
    );
    assert_eq!(follower.stats().left, 1);

    // Its pointers fail with NodeDown; new allocations go to the others.
    let buf = Arc::new(c.pd().alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap());
    for p in &on2 {
        let (r, _) = c.block_on(c.read(*p, 0, buf.clone(), 0, 8));
        assert!(matches!(r, Err(Error::NodeDown { node: 2, .. })), "{r:?}");
    }
    for _ in 0..30 {
        let p = c.block_on(c.alloc(128, None)).unwrap();
        assert_ne!(p.node, 2);
    }
    for p in ptrs.iter().filter(|p| p.node != 2) {
        c.block_on(c.free(*p)).unwrap();
    }

    // A replacement registering as node 2 is picked up again.
    let (_s2b, _r2b) = registered(&cfg, 2);
    wait_until(
        "the replacement joins (the client, then the follower says so)",
        || node_ids(&c).contains(&2) && follower.nodes().contains(&2),
    );
    assert_eq!(follower.nodes(), vec![1, 2, 3]);
    assert_eq!(follower.stats().joined, 1);
}

#[test]
fn a_server_restarted_at_the_same_address_within_its_ttl_is_reconnected() {
    let Some(etcd) = Etcd::start("restart") else {
        return;
    };
    let mut cfg = etcd.config("/rdmapool/test-restart");
    cfg.ttl = Duration::from_secs(10); // the old key outlives the restart
    let (_s1, _r1) = registered(&cfg, 1);
    let (s2, r2) = registered(&cfg, 2);
    let addr = s2.addr();
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 41, Box::new(RoundRobin::default()));
    let follower = members.follow(c.clone()).unwrap();
    assert_eq!(follower.nodes(), vec![1, 2]);
    let before: Vec<RemotePtr> = (0..4)
        .map(|_| c.block_on(c.alloc(64, None)).unwrap())
        .filter(|p| p.node == 2)
        .collect();
    assert!(!before.is_empty());
    r2.abandon();
    drop(s2);
    // The client finds it down (its lease renewals fail) while the key stays.
    wait_until("the client sees node 2 down", || !node_ids(&c).contains(&2));
    assert_eq!(
        follower.nodes(),
        vec![1, 2],
        "the key stays: not removed yet"
    );
    let (_s2b, _r2b) = {
        let s = server_at(2, addr);
        let r = EtcdRegistration::register(&cfg, 2, s.addr()).unwrap();
        (s, r)
    };
    let t = wait_until("the restarted server is reconnected", || {
        node_ids(&c).contains(&2)
    });
    eprintln!(
        "restart at {addr}: reconnected {:.1} ms after it registered",
        ms(t)
    );
    let st = follower.stats();
    // The follower replaces it, unless the client rejoined the new incarnation by itself
    // first (it dials a down node again): either way it is connected once.
    assert!(st.replaced <= 1 && (st.left, st.joined) == (0, 1), "{st:?}");
    // Pointers into the old incarnation are refused before any byte moves: an idle holder
    // never reads the new server's memory through them.
    for p in &before {
        match c.block_on(c.fetch_and_add(*p, 0, 1)) {
            Err(Error::StalePointer { node: 2, .. }) => {}
            other => panic!("{p}: a pointer into the restarted server: {other:?}"),
        }
    }
    let p = (0..4)
        .map(|_| c.block_on(c.alloc(64, None)).unwrap())
        .find(|p| p.node == 2);
    assert!(p.is_some(), "allocations reach the restarted server");
}

#[test]
fn a_server_that_drops_its_registration_leaves_at_once() {
    let Some(etcd) = Etcd::start("leave") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-leave");
    let (_s1, _r1) = registered(&cfg, 1);
    let (_s2, r2) = registered(&cfg, 2);
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 31, Box::new(RoundRobin::default()));
    let follower = members.follow(c.clone()).unwrap();
    assert_eq!(follower.nodes(), vec![1, 2]);
    // The lease is renewed while the registration lives (well past its TTL).
    std::thread::sleep(cfg.ttl + Duration::from_millis(500));
    assert!(r2.renewals() >= 2);
    assert_eq!(members.members().unwrap().len(), 2);
    let t0 = Instant::now();
    drop(r2); // revokes
    let left = wait_until("the client drops the server", || !node_ids(&c).contains(&2));
    eprintln!(
        "graceful leave: client dropped the server {:.1} ms after the revoke",
        ms(t0.elapsed())
    );
    assert!(
        left < cfg.ttl,
        "a revoke is seen before any lease would expire"
    );
    // An etcd that goes away is a typed error, not a panic.
    drop(follower);
    drop(etcd);
    assert!(matches!(members.members(), Err(Error::Connection { .. })));
}

/// Issue #22, finding 2: anyone who can write under the membership prefix could add a server
/// of their own (which got a share of the allocations, and read them) and black holes (which
/// kept the follower from joining a real new server for minutes: it dialled them one after
/// another, a connect timeout each). With the cluster key, a server that cannot prove it gets
/// nothing; joins run at once, so the holes cost one timeout per round, not ten.
#[test]
fn rogue_and_black_hole_entries_get_nothing_and_delay_no_real_server() {
    let Some(etcd) = Etcd::start("rogue") else {
        return;
    };
    let cfg = etcd.config("/rdmapool/test-rogue");
    let key = PreSharedKey::new(&[5; 32]).unwrap();
    let keyed = |node: u32| {
        let s = server_with(
            node,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            Some(key.clone()),
        );
        let r = EtcdRegistration::register(&cfg, node, s.addr()).expect("registers");
        (s, r)
    };
    let _real = keyed(1);
    let (_rogue, _rogue_key) = registered(&cfg, 66);
    // Listening sockets that never answer: a connect waits out its timeout on each.
    let holes: Vec<TcpListener> = (0..10)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
        .collect();
    let _hole_keys: Vec<EtcdRegistration> = holes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            EtcdRegistration::register(&cfg, 10 + i as u32, h.local_addr().unwrap()).unwrap()
        })
        .collect();
    let members = EtcdMembership::new(&cfg).unwrap();
    let n = node();
    let mut ccfg = ClientConfig::new(21);
    ccfg.cluster_key = Some(key.clone());
    let c = Arc::new(PoolClient::connect(&n.ctx, &n.pd, &members, ccfg).expect("connects"));
    assert_eq!(node_ids(&c), vec![1], "only the server that proved the key");
    let follower = members.follow(c.clone()).unwrap();
    // A real server registers later, after the holes in the follower's order (nodes 10 to
    // 19): joined although they are retried every round (one after another they held a
    // round for ten connect timeouts, 50 s).
    let _second = keyed(50);
    let waited = wait_until("the follower joins the real new server", || {
        node_ids(&c).contains(&50)
    });
    eprintln!("joined a real server {:.0} ms after it registered, next to 10 black holes and a rogue server", ms(waited));
    for _ in 0..40 {
        let p = c.block_on(c.alloc(4096, None)).unwrap();
        assert!(
            p.node == 1 || p.node == 50,
            "an allocation on node {}",
            p.node
        );
    }
    assert!(follower.stats().connect_failures >= 11);
}

/// Issue #22 ("support etcd's own TLS and user/password auth"): against a real etcd that
/// serves TLS only, asks for client certificates and has authentication on, a server with
/// the CA, a client certificate and the user's password registers and a follower joins it;
/// everyone short of one of these is refused with `Unauthenticated` naming etcd, and so
/// cannot add, rewrite or remove a member. A token etcd forgot (simple tokens expire after
/// `--auth-token-ttl` of disuse) is renewed without the caller seeing it.
#[test]
fn etcd_over_tls_with_authentication_admits_only_holders_of_the_credentials() {
    let Some((etcd, pki)) = Etcd::start_tls("tls", 1) else {
        return;
    };
    etcd.enable_auth("r00t-pw");
    let mut cfg = etcd.config("/rdmapool/test-tls");
    cfg.credentials = Some(EtcdCredentials::new("root", "r00t-pw").unwrap());

    // Everything short of the full set is refused, and says who refused and why.
    let refused = |what: &str, c: &EtcdConfig| {
        let r = EtcdRegistration::register(c, 9, "127.0.0.1:1".parse().unwrap());
        match r {
            Err(Error::Unauthenticated { peer, reason }) => {
                assert!(peer.contains(&etcd.url), "{what}: names {peer}");
                eprintln!("{what}: refused: {reason}");
                reason
            }
            Err(e) => panic!("{what}: {e} (want Unauthenticated)"),
            Ok(_) => panic!("{what}: registered"),
        }
    };
    let mut no_user = cfg.clone();
    no_user.credentials = None;
    assert!(refused("no user", &no_user).contains("user name is empty"));
    let mut bad_password = cfg.clone();
    bad_password.credentials = Some(EtcdCredentials::new("root", "guess").unwrap());
    assert!(refused("a wrong password", &bad_password).contains("authentication failed"));
    let mut web_roots = cfg.clone();
    web_roots.tls = Some(EtcdTls {
        ca_file: None,
        ..pki.client()
    });
    assert!(refused("the web's roots", &web_roots).contains("TLS"));
    let mut other_ca = cfg.clone();
    other_ca.tls = Some(EtcdTls {
        ca_file: Some(pki.other_ca.clone()),
        ..pki.client()
    });
    assert!(refused("another CA", &other_ca).contains("TLS"));
    let mut no_client_cert = cfg.clone();
    no_client_cert.tls = Some(EtcdTls {
        ca_file: Some(pki.ca.clone()),
        ..EtcdTls::default()
    });
    // etcd ends the TLS connection after the handshake (TLS 1.3 sends its alert then), so
    // this side sees the connection break as it sends: a connection error with a hint.
    match EtcdRegistration::register(&no_client_cert, 9, "127.0.0.1:1".parse().unwrap()) {
        Err(Error::Connection { reason, .. }) | Err(Error::Unauthenticated { reason, .. }) => {
            eprintln!("no client certificate: refused: {reason}");
            assert!(reason.contains("cert"), "{reason}");
        }
        Err(e) => panic!("no client certificate: {e}"),
        Ok(_) => panic!("no client certificate: registered"),
    }
    let mut plain = cfg.clone();
    plain.tls = None;
    plain.endpoints = vec![etcd.url.replace("https://", "http://")];
    assert!(
        EtcdMembership::new(&plain).unwrap().servers().is_err(),
        "plain HTTP to a TLS port"
    );
    // A client key that others may read is refused before any connection, as ssh does.
    {
        use std::os::unix::fs::PermissionsExt;
        let open = pki.client_key.with_extension("open");
        std::fs::copy(&pki.client_key, &open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut c = cfg.clone();
        c.tls = Some(EtcdTls {
            key_file: Some(open),
            ..pki.client()
        });
        match EtcdMembership::new(&c) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("chmod 600"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a key file of mode 0644 was taken"),
        }
    }

    // A key that is not the certificate's is refused up front (ureq 3.5 would panic on it
    // at the first connection).
    let mut mismatched = cfg.clone();
    mismatched.tls = Some(EtcdTls {
        key_file: Some(pki.server_key.clone()),
        ..pki.client()
    });
    match EtcdMembership::new(&mismatched) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("KeyMismatch"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a key of another certificate was taken"),
    }

    // With all of it: a server registers, a client finds it and follows the prefix.
    let (_s1, _r1) = registered(&cfg, 1);
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 31, Box::new(RoundRobin::default()));
    assert_eq!(node_ids(&c), vec![1]);
    let follower = members.follow(c.clone()).unwrap();

    // Unused for longer than the token's TTL, a gateway logs in again on its own.
    let idle = EtcdMembership::new(&cfg).unwrap();
    assert_eq!(idle.servers().unwrap().len(), 1);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        idle.servers().expect("an expired token is renewed").len(),
        1
    );

    // A second server registers: the follower (over TLS, as the user) joins it.
    let (_s2, _r2) = registered(&cfg, 2);
    wait_until("the follower joins the second server", || {
        node_ids(&c).contains(&2)
    });
    let on: Vec<u32> = (0..8)
        .map(|_| c.block_on(c.alloc(4096, None)).unwrap().node)
        .collect();
    assert!(on.contains(&1) && on.contains(&2), "allocations on {on:?}");
    assert_eq!(
        c.block_on(c.fetch_and_add(c.block_on(c.alloc(64, None)).unwrap(), 0, 7))
            .unwrap(),
        0
    );
    drop(follower);
}
