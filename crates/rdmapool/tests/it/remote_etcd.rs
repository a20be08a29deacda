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

mod membership;
mod tls;

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

    /// A key's value and modification revision (plain HTTP only), as `etcdctl get -w json`
    /// shows them.
    fn get(&self, key: &str) -> Option<(String, i64)> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let v: serde_json::Value = ureq::post(&format!("{}/v3/kv/range", self.url))
            .send_json(serde_json::json!({ "key": b64.encode(key) }))
            .expect("etcd range")
            .body_mut()
            .read_json()
            .expect("etcd's JSON");
        let kv = v.get("kvs")?.as_array()?.first()?.clone();
        let value = b64.decode(kv["value"].as_str()?).ok()?;
        let revision = kv["mod_revision"].as_str()?.parse().ok()?;
        Some((String::from_utf8(value).ok()?, revision))
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
