//! Cluster membership on etcd (crate `rdmapool-etcd`; in `rdmapool` as `rdmapool::remote`'s
//! etcd items, feature `etcd`): memory servers register themselves under a
//! key prefix with a lease they keep alive, clients follow the prefix and connect to servers
//! that join and drop those that leave. Only addresses travel through etcd: a server's pool
//! descriptor still comes from the connection to it.
//!
//! - [`EtcdRegistration`] (server side) grants a lease, puts `<prefix>/<node>` = `ip:port`
//!   under it, and renews it from a thread (every third of the TTL). Dropping it revokes the
//!   lease, so the key goes at once; a server that dies without dropping it (a crash, or
//!   [`EtcdRegistration::abandon`]) loses the key when the lease runs out, one TTL later.
//! - [`EtcdMembership`] (client side) is a [`Membership`](rdmapool_pool::remote::Membership) listing the servers registered
//!   now, and [`EtcdMembership::follow`] starts an [`EtcdFollower`]: a thread that watches
//!   the prefix and calls [`PoolClient::add_server`](rdmapool_pool::remote::PoolClient::add_server) / [`PoolClient::remove_server`](rdmapool_pool::remote::PoolClient::remove_server) as keys
//!   appear and disappear.
//! - [`EtcdElection`] elects one holder of a role at a time under `<prefix>/elections/`
//!   (the store's background repairer, `rdmapool::store::Repairer::start_elected`).
//!
//! etcd is reached through its v3 JSON gateway (`/v3/kv/*`, `/v3/lease/*`, `/v3/watch`:
//! HTTP/1.1, base64 keys and values), which every etcd 3.4+ serves on its client port, over
//! plain HTTP or over TLS ([`EtcdTls`]: etcd's own CA, and a client certificate when etcd
//! runs with `--client-cert-auth`), as an etcd user when etcd's authentication is on
//! ([`EtcdCredentials`]: the token etcd gives is renewed whenever etcd says it expired). With
//! both, only holders of the credentials can add, change or remove a member. The watch is a streamed response read line by line; it is reopened
//! from the last revision seen whenever it has been quiet for a while (so the thread can
//! notice it should stop, and retry servers it could not reach), and after a failure the
//! follower lists the prefix again and reconciles.
//!
//! ```no_run
//! use rdmapool_etcd::*;
//! use rdmapool_pool::fabric::*;
//! use rdmapool_pool::remote::*;
//! use std::sync::Arc;
//! # fn main() -> rdmapool_pool::Result<()> {
//! let etcd = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()], "/rdmapool/pool-a");
//! // A server: serve, then say so in etcd.
//! let ctx = Context::open(SoftConfig::default())?;
//! let server = MemoryServer::start(&ctx, ServerConfig::default())?;
//! let reg = EtcdRegistration::register(&etcd, server.descriptor().node, server.addr())?;
//! // A client: connect to whoever is registered, then follow the prefix.
//! let members = EtcdMembership::new(&etcd)?;
//! let pd = ctx.alloc_pd()?;
//! let client = Arc::new(PoolClient::connect(&ctx, &pd, &members, ClientConfig::new(7))?);
//! let follower = members.follow(client.clone())?;
//! # drop((reg, follower)); Ok(()) }
//! ```

#![warn(missing_docs)]

mod election;
mod follower;
mod gateway;
mod registration;

pub use election::EtcdElection;
pub use follower::{EtcdFollower, EtcdMember, EtcdMembership, FollowerStats};
pub use registration::EtcdRegistration;

use rdmapool_pool::{Error, Result};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Where etcd is and which part of its key space a pool uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members (`http://host:port`), tried in turn.
    pub endpoints: Vec<String>,
    /// The key prefix the pool's servers register under (a server's key is
    /// `<prefix>/<node>`); a trailing `/` is ignored.
    pub prefix: String,
    /// The registration lease's time to live, in whole seconds (rounded down; at least
    /// 1 s): a server that stops renewing leaves the membership this long after its last
    /// renewal (etcd may round a very short TTL up to its own minimum).
    pub ttl: Duration,
    /// How long one request to etcd may take (connect, send, receive).
    pub request_timeout: Duration,
    /// How long a quiet watch is kept open before it is reopened from the last revision
    /// (bounds how long dropping an [`EtcdFollower`] takes, and how often it retries servers
    /// it could not connect to; each reopen is one request to etcd per follower).
    pub watch_idle: Duration,
    /// TLS to etcd: needed for `https://` endpoints, refused with `http://` ones. `None`
    /// with `https://` endpoints trusts the public web roots (Mozilla's list).
    pub tls: Option<EtcdTls>,
    /// An etcd user, when etcd runs with authentication on (`etcdctl auth enable`).
    pub credentials: Option<EtcdCredentials>,
}

/// How to reach etcd over TLS: the CA that signed etcd's certificate and, when etcd runs
/// with `--client-cert-auth`, this side's certificate.
///
/// etcd 3.4's JSON gateway refuses requests from a client certificate with a common name
/// when authentication is on ("CommonName of client sending a request against gateway will
/// be ignored"): give such an etcd a certificate whose subject has no CN (a SAN suffices).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdTls {
    /// PEM file with the CA certificate(s) etcd's certificate must chain to (etcd's
    /// `--trusted-ca-file` side); `None` trusts the public web roots.
    pub ca_file: Option<PathBuf>,
    /// PEM file with this side's certificate chain, for etcd's `--client-cert-auth`.
    pub cert_file: Option<PathBuf>,
    /// PEM file with the private key of `cert_file`. Like every key file of rdmapool's, its
    /// group and others may neither read nor write it (`chmod 600`).
    pub key_file: Option<PathBuf>,
}

/// An etcd user name and password. The password never prints (`Debug` shows `<hidden>`).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdCredentials {
    /// The etcd user.
    pub user: String,
    password: String,
}

impl EtcdCredentials {
    /// The environment variable `rdma-tool` reads an etcd password from.
    pub const PASSWORD_ENV: &'static str = "RDMAPOOL_ETCD_PASSWORD";

    /// This user and password (neither may be empty).
    pub fn new(user: &str, password: &str) -> Result<Self> {
        if user.is_empty() || password.is_empty() {
            return Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                name: "etcd credentials".into(),
                value: user.into(),
                reason: "need a user name and a password".into(),
            }));
        }
        Ok(Self {
            user: user.to_string(),
            password: password.to_string(),
        })
    }

    /// This user, with the password in a file (its first line). The file must be private
    /// to its owner (`chmod 600`), as key files are.
    pub fn with_password_file(user: &str, path: &std::path::Path) -> Result<Self> {
        let raw = rdmapool_pool::fabric::read_private_file(path, "etcd password file")?;
        let text = String::from_utf8(raw).map_err(|_| {
            Error::Core(rdmapool_pool::CoreError::BadKey {
                what: format!("etcd password file {}", path.display()),
                reason: "not UTF-8".into(),
            })
        })?;
        Self::new(user, text.lines().next().unwrap_or("").trim_end())
    }

    pub(crate) fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCredentials")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl EtcdConfig {
    /// These endpoints and prefix, a 3 s lease, 2 s requests, watches reopened after 1 s of
    /// quiet.
    pub fn new(endpoints: Vec<String>, prefix: &str) -> Self {
        Self {
            endpoints,
            prefix: prefix.to_string(),
            ttl: Duration::from_secs(3),
            request_timeout: Duration::from_secs(2),
            watch_idle: Duration::from_secs(1),
            tls: None,
            credentials: None,
        }
    }

    fn check(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                name: "etcd endpoints".into(),
                value: String::new(),
                reason: "no etcd endpoint given".into(),
            }));
        }
        for e in &self.endpoints {
            match (e.split_once("://").map(|(scheme, _)| scheme), &self.tls) {
                (Some("https"), _) => {}
                (Some("http"), None) => {
                    if self.credentials.is_some() && !gateway::is_loopback_url(e) {
                        tracing::warn!(
                            endpoint = %e,
                            "the etcd password crosses the network in clear text: use https://"
                        );
                    }
                }
                (Some("http"), Some(_)) => {
                    return Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                        name: "etcd endpoint".into(),
                        value: e.clone(),
                        reason: "TLS is configured, so want https://host:port".into(),
                    }))
                }
                _ => {
                    return Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                        name: "etcd endpoint".into(),
                        value: e.clone(),
                        reason: "want http://host:port or https://host:port (etcd's JSON \
                                 gateway)"
                            .into(),
                    }))
                }
            }
        }
        if let Some(tls) = &self.tls {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                    name: "etcd TLS".into(),
                    value: format!("cert_file {:?}, key_file {:?}", tls.cert_file, tls.key_file),
                    reason: "a client certificate needs its key file, and a key its certificate"
                        .into(),
                }));
            }
        }
        if self.prefix.trim_end_matches('/').is_empty() {
            return Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                name: "etcd key prefix".into(),
                value: self.prefix.clone(),
                reason: "must not be empty".into(),
            }));
        }
        if self.ttl < Duration::from_secs(1) {
            return Err(Error::Core(rdmapool_pool::CoreError::OutOfLimits {
                what: "etcd lease TTL (ms)",
                value: self.ttl.as_millis() as u64,
                min: 1000,
                max: u64::MAX,
            }));
        }
        if self.request_timeout.is_zero() || self.watch_idle.is_zero() {
            return Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                name: "etcd request timeout and watch idle time".into(),
                value: format!("{:?}, {:?}", self.request_timeout, self.watch_idle),
                reason: "must be non-zero".into(),
            }));
        }
        Ok(())
    }

    /// `<prefix>/`: every server key starts with it.
    fn dir(&self) -> String {
        format!("{}/", self.prefix.trim_end_matches('/'))
    }

    fn key(&self, node: u32) -> String {
        format!("{}{node}", self.dir())
    }
}

#[cfg(test)]
mod tests {
    use super::follower::*;
    use super::gateway::*;
    use super::*;
    use rdmapool_pool::remote::Membership;
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

    #[test]
    fn keys_ranges_and_members_parse() {
        let cfg = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()], "/pool/a/");
        assert_eq!(cfg.dir(), "/pool/a/");
        assert_eq!(cfg.key(7), "/pool/a/7");
        assert_eq!(prefix_end("/pool/a/"), "/pool/a0");
        let m = parse_member("/pool/a/", "/pool/a/7", "127.0.0.1:9000").unwrap();
        assert_eq!(m.node, 7);
        assert!(parse_member("/pool/a/", "/pool/a/x", "127.0.0.1:9000").is_none());
        assert!(parse_member("/pool/a/", "/pool/a/7", "nowhere").is_none());
    }

    #[test]
    fn bad_configs_are_typed_errors() {
        let mut cfg = EtcdConfig::new(vec![], "/p");
        assert!(matches!(
            cfg.check(),
            Err(Error::Core(rdmapool_pool::CoreError::BadSetting { .. }))
        ));
        cfg.endpoints = vec!["ftp://x:1".into()];
        assert!(
            matches!(cfg.check(), Err(Error::Core(rdmapool_pool::CoreError::BadSetting { value, .. })) if value == "ftp://x:1")
        );
        cfg.endpoints = vec!["https://x:1".into()];
        assert!(cfg.check().is_ok());
        cfg.endpoints = vec!["http://x:1".into()];
        cfg.tls = Some(EtcdTls::default());
        assert!(
            matches!(cfg.check(), Err(Error::Core(rdmapool_pool::CoreError::BadSetting { reason, .. })) if reason.contains("https://")),
            "TLS with a plain-HTTP endpoint is a mistake, not a downgrade"
        );
        cfg.tls = Some(EtcdTls {
            cert_file: Some("c.pem".into()),
            ..EtcdTls::default()
        });
        cfg.endpoints = vec!["https://x:1".into()];
        assert!(
            matches!(cfg.check(), Err(Error::Core(rdmapool_pool::CoreError::BadSetting { reason, .. })) if reason.contains("key"))
        );
        cfg.tls = None;
        cfg.endpoints = vec!["http://x:1".into()];
        assert!(EtcdCredentials::new("", "pw").is_err());
        let creds = EtcdCredentials::new("root", "s3cret").unwrap();
        assert!(
            !format!("{creds:?}").contains("s3cret"),
            "a password never prints"
        );
        cfg.ttl = Duration::from_millis(10);
        assert!(matches!(
            cfg.check(),
            Err(Error::Core(rdmapool_pool::CoreError::OutOfLimits {
                value: 10,
                min: 1000,
                ..
            }))
        ));
        cfg.ttl = Duration::from_secs(2);
        cfg.prefix = "/".into();
        assert!(matches!(
            cfg.check(),
            Err(Error::Core(rdmapool_pool::CoreError::BadSetting { .. }))
        ));
    }

    #[test]
    fn watch_messages_as_etcd_3_4_sends_them_apply() {
        // Captured from etcd 3.4's gateway: keys /p/1, values 127.0.0.1:5; PUT has no type.
        let dir = "/p/";
        let (mut wanted, mut rev) = (BTreeMap::new(), 1);
        let created: Value =
            serde_json::from_str(r#"{"result":{"header":{"revision":"9"},"created":true}}"#)
                .unwrap();
        assert_eq!(apply_watch(dir, &mut wanted, &mut rev, &created), Ok(false));
        assert_eq!(
            rev, 1,
            "a header does not say every event up to it was seen"
        );
        let put: Value = serde_json::from_str(
            r#"{"result":{"header":{"revision":"2"},"events":[{"kv":{"key":"L3AvMQ==",
            "create_revision":"2","mod_revision":"2","version":"1","value":"MTI3LjAuMC4xOjU=",
            "lease":"2324035739767540487"}}]}}"#,
        )
        .unwrap();
        assert_eq!(apply_watch(dir, &mut wanted, &mut rev, &put), Ok(true));
        assert_eq!(rev, 2);
        assert_eq!(wanted[&1].member.addr, "127.0.0.1:5".parse().unwrap());
        assert_eq!(wanted[&1].lease, 2324035739767540487);
        assert_eq!(apply_watch(dir, &mut wanted, &mut rev, &put), Ok(false));
        let del: Value = serde_json::from_str(
            r#"{"result":{"header":{"revision":"3"},"events":[{"type":"DELETE",
            "kv":{"key":"L3AvMQ==","mod_revision":"3"}}]}}"#,
        )
        .unwrap();
        assert_eq!(apply_watch(dir, &mut wanted, &mut rev, &del), Ok(true));
        assert!(wanted.is_empty());
        assert_eq!(rev, 3);
        let compacted: Value = serde_json::from_str(
            r#"{"result":{"header":{"revision":"9"},"compact_revision":"5","canceled":true}}"#,
        )
        .unwrap();
        assert!(apply_watch(dir, &mut wanted, &mut rev, &compacted).is_err());
        let error: Value =
            serde_json::from_str(r#"{"error":{"grpc_code":14,"message":"unavailable"}}"#).unwrap();
        assert!(apply_watch(dir, &mut wanted, &mut rev, &error).is_err());
    }

    #[test]
    fn int64s_come_as_strings_or_numbers() {
        let v = json!({ "a": "12", "b": 13, "c": "x" });
        assert_eq!(int(&v, "a").unwrap(), 12);
        assert_eq!(int(&v, "b").unwrap(), 13);
        assert_eq!(int(&v, "missing").unwrap(), 0);
        assert!(matches!(
            int(&v, "c"),
            Err(Error::Core(rdmapool_pool::CoreError::Malformed { .. }))
        ));
    }

    #[test]
    fn an_unreachable_etcd_is_a_connection_error() {
        // Port 9 on loopback: nothing listens (discard is not run in test environments).
        let mut cfg = EtcdConfig::new(vec!["http://127.0.0.1:9".into()], "/p");
        cfg.request_timeout = Duration::from_millis(500);
        let m = EtcdMembership::new(&cfg).unwrap();
        assert!(matches!(
            m.servers(),
            Err(Error::Core(rdmapool_pool::CoreError::Connection { .. }))
        ));
    }
}
