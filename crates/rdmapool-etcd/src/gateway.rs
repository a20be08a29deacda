//! etcd's v3 JSON gateway over HTTP/1.1 or HTTPS: leases, puts, ranges and the watch
//! stream, as an etcd user when credentials are given.

use super::*;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use parking_lot::Mutex;
use rdmapool_pool::{Error, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The JSON gateway of one etcd cluster.
pub(super) struct Gateway {
    pub(super) endpoints: Vec<String>,
    /// The endpoint that answered last (tried first).
    pub(super) current: AtomicUsize,
    /// Unary calls.
    pub(super) agent: ureq::Agent,
    /// Watches: no total budget, a per-read one of `watch_idle`.
    pub(super) watcher: ureq::Agent,
    /// The etcd user to call as, if etcd's authentication is on.
    credentials: Option<EtcdCredentials>,
    /// The token etcd gave for `credentials`: none before the first call, and again after
    /// etcd said it expired (etcd's simple tokens expire after `--auth-token-ttl` of disuse).
    token: Mutex<Option<String>>,
    /// Whether this side presents a client certificate (if not, an etcd that wants one
    /// closes the connection after the handshake, and the error says it might be that).
    client_cert: bool,
}

/// How one POST to one endpoint went wrong.
enum Failure {
    /// etcd answered with an HTTP error: not retried on another endpoint.
    Answered {
        url: String,
        status: u16,
        message: String,
    },
    /// No endpoint answered; whether one of them failed TLS verification.
    Unreachable { reasons: Vec<String>, tls: bool },
}

/// Whether `url` names a loopback host (`http://127.x.y.z:port`, `[::1]`, `localhost`).
pub(super) fn is_loopback_url(url: &str) -> bool {
    let host = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = host.split(['/', '?']).next().unwrap_or("");
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The TLS settings of `tls` for ureq: its CA file's certificates as the only roots (else
/// the web's), its client certificate and key (the key file private to its owner).
fn tls_config(tls: &EtcdTls) -> Result<ureq::tls::TlsConfig> {
    use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            Error::Core(rdmapool_pool::CoreError::BadKey {
                what: format!("etcd TLS {what} {}", path.display()),
                reason: e.to_string(),
            })
        })
    };
    let certs = |path: &std::path::Path, what: &str| -> Result<Vec<Certificate<'static>>> {
        let pem = read(path, what)?;
        let mut out = Vec::new();
        for item in ureq::tls::parse_pem(&pem) {
            match item {
                Ok(PemItem::Certificate(c)) => out.push(c),
                Ok(_) => {}
                Err(e) => {
                    return Err(Error::Core(rdmapool_pool::CoreError::BadKey {
                        what: format!("etcd TLS {what} {}", path.display()),
                        reason: e.to_string(),
                    }))
                }
            }
        }
        if out.is_empty() {
            return Err(Error::Core(rdmapool_pool::CoreError::BadKey {
                what: format!("etcd TLS {what} {}", path.display()),
                reason: "no PEM certificate in it".into(),
            }));
        }
        Ok(out)
    };
    let mut builder = TlsConfig::builder();
    if let Some(ca) = &tls.ca_file {
        builder = builder.root_certs(RootCerts::new_with_certs(&certs(ca, "CA file")?));
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        // The key first: one that others can read is refused whatever the certificate.
        let pem = rdmapool_pool::fabric::read_private_file(key, "etcd TLS key file")?;
        let chain = certs(cert, "certificate file")?;
        let key = PrivateKey::from_pem(&pem).map_err(|e| {
            Error::Core(rdmapool_pool::CoreError::BadKey {
                what: format!("etcd TLS key file {}", key.display()),
                reason: e.to_string(),
            })
        })?;
        check_client_cert(&chain, &pem).map_err(|e| {
            Error::Core(rdmapool_pool::CoreError::BadKey {
                what: format!(
                    "etcd TLS certificate file {} with key file {}",
                    cert.display(),
                    tls.key_file.as_deref().unwrap_or(cert).display()
                ),
                reason: e.to_string(),
            })
        })?;
        builder = builder.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
    }
    Ok(builder.build())
}

/// Whether rustls takes `chain` and the key in `key_pem` as a client certificate: ureq
/// builds its rustls configuration when it first connects and panics on a pair rustls
/// refuses (an X.509 v1 certificate, a key of another certificate), so it is checked first.
fn check_client_cert(
    chain: &[ureq::tls::Certificate<'static>],
    key_pem: &[u8],
) -> std::result::Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = chain
        .iter()
        .map(|c| CertificateDer::from(c.der().to_vec()))
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| e.to_string())?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain, key)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Whether a transport error is TLS refusing the peer (or the peer refusing us), rather than
/// the network failing.
fn is_tls_failure(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Rustls(_) | ureq::Error::Tls(_) => true,
        ureq::Error::Io(io) => io
            .get_ref()
            .is_some_and(|inner| inner.to_string().contains("certificate")),
        _ => false,
    }
}

pub(super) fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

pub(super) fn malformed(reason: impl Into<String>) -> Error {
    Error::Core(rdmapool_pool::CoreError::Malformed {
        what: "etcd response",
        reason: reason.into(),
    })
}

/// An int64 of the gateway's JSON (a string, or a number; absent is 0).
pub(super) fn int(v: &Value, field: &str) -> Result<i64> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|e| malformed(format!("{field} = {s:?}: {e}"))),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| malformed(format!("{field} = {n}"))),
        Some(other) => Err(malformed(format!("{field} = {other}"))),
    }
}

pub(super) fn text(v: &Value, field: &str) -> Result<String> {
    let s = v.get(field).and_then(Value::as_str).unwrap_or("");
    let bytes = B64
        .decode(s)
        .map_err(|e| malformed(format!("{field}: {e}")))?;
    String::from_utf8(bytes).map_err(|e| malformed(format!("{field}: {e}")))
}

impl Gateway {
    pub(super) fn new(cfg: &EtcdConfig) -> Result<Self> {
        cfg.check()?;
        let tls = cfg.tls.as_ref().map(tls_config).transpose()?;
        let with_tls = |b: ureq::config::ConfigBuilder<ureq::typestate::AgentScope>| match &tls {
            Some(t) => b.tls_config(t.clone()),
            None => b,
        };
        let agent = with_tls(
            ureq::Agent::config_builder()
                .timeout_global(Some(cfg.request_timeout))
                .http_status_as_error(false),
        )
        .build()
        .new_agent();
        let watcher = with_tls(
            ureq::Agent::config_builder()
                .timeout_connect(Some(cfg.request_timeout))
                .timeout_send_request(Some(cfg.request_timeout))
                .timeout_recv_response(Some(cfg.request_timeout))
                .timeout_per_read(Some(cfg.watch_idle))
                .http_status_as_error(false),
        )
        .build()
        .new_agent();
        Ok(Self {
            endpoints: cfg
                .endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_string())
                .collect(),
            current: AtomicUsize::new(0),
            agent,
            watcher,
            credentials: cfg.credentials.clone(),
            token: Mutex::new(None),
            client_cert: cfg.tls.as_ref().is_some_and(|t| t.cert_file.is_some()),
        })
    }

    /// POSTs `body` to `path` on the endpoints in turn (from the last one that answered),
    /// as the configured etcd user, returning the first answer's response. HTTP errors from
    /// etcd are not retried on another endpoint, but an expired token is renewed once.
    pub(super) fn send(
        &self,
        agent: &ureq::Agent,
        path: &str,
        body: &Value,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let token = match &self.credentials {
            None => None,
            Some(_) => Some(self.token()?),
        };
        match self.post(agent, path, body, token.as_deref()) {
            Err(Failure::Answered { status: 401, .. }) if token.is_some() => {
                // etcd forgot the token (it expired, or etcd restarted): log in again.
                self.token.lock().take();
                let token = self.token()?;
                self.post(agent, path, body, Some(&token))
                    .map_err(|f| self.failure(f))
            }
            r => r.map_err(|f| self.failure(f)),
        }
    }

    /// The current token, logging in as the configured user first if there is none.
    fn token(&self) -> Result<String> {
        let mut token = self.token.lock();
        if let Some(t) = token.as_ref() {
            return Ok(t.clone());
        }
        let Some(c) = &self.credentials else {
            return Err(Error::NoCredentials { service: "etcd" });
        };
        let body = json!({ "name": c.user, "password": c.password() });
        let mut resp = self
            .post(&self.agent, "/v3/auth/authenticate", &body, None)
            .map_err(|f| self.failure(f))?;
        let v = resp
            .body_mut()
            .read_json::<Value>()
            .map_err(|e| malformed(format!("authenticate: {e}")))?;
        let t = v
            .get("token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| malformed(format!("authenticate without a token: {v}")))?
            .to_string();
        *token = Some(t.clone());
        Ok(t)
    }

    /// One POST, on each endpoint in turn until one answers.
    fn post(
        &self,
        agent: &ureq::Agent,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, Failure> {
        let start = self.current.load(Ordering::Relaxed);
        let (mut reasons, mut tls) = (Vec::new(), false);
        for k in 0..self.endpoints.len() {
            let i = (start + k) % self.endpoints.len();
            let url = format!("{}{path}", self.endpoints[i]);
            let mut request = agent.post(&url);
            if let Some(t) = token {
                request = request.header("Authorization", t);
            }
            match request.send_json(body) {
                Ok(mut resp) => {
                    self.current.store(i, Ordering::Relaxed);
                    let status = resp.status();
                    if !status.is_success() {
                        let message = resp
                            .body_mut()
                            .read_json::<Value>()
                            .ok()
                            .and_then(|v| {
                                v.get("message").and_then(Value::as_str).map(String::from)
                            })
                            .unwrap_or_default();
                        return Err(Failure::Answered {
                            url,
                            status: status.as_u16(),
                            message,
                        });
                    }
                    return Ok(resp);
                }
                Err(e) => {
                    tls |= is_tls_failure(&e);
                    reasons.push(format!("{url}: {e}"));
                }
            }
        }
        Err(Failure::Unreachable { reasons, tls })
    }

    /// The error a failure is: etcd refusing who we are (a bad password, no user, a user
    /// without the right, a certificate either side refused) is `Unauthenticated`.
    fn failure(&self, f: Failure) -> Error {
        match f {
            Failure::Answered {
                url,
                status,
                message,
            } => {
                let refused = status == 401
                    || [
                        "authentication failed",
                        "user name is empty",
                        "permission denied",
                    ]
                    .iter()
                    .any(|m| message.contains(m));
                if refused {
                    Error::Unauthenticated {
                        peer: format!("etcd at {url}"),
                        reason: format!("etcd answered {status}: {message}"),
                    }
                } else {
                    Error::Core(rdmapool_pool::CoreError::Connection {
                        peer: url,
                        reason: format!("etcd answered {status}: {message}"),
                    })
                }
            }
            Failure::Unreachable { reasons, tls: true } => Error::Unauthenticated {
                peer: format!("etcd at {}", self.endpoints.join(",")),
                reason: format!("TLS refused: {}", reasons.join("; ")),
            },
            Failure::Unreachable { reasons, .. } => {
                let tls_without_cert =
                    !self.client_cert && self.endpoints.iter().any(|e| e.starts_with("https://"));
                let hint = if tls_without_cert {
                    " (an etcd run with --client-cert-auth closes the connection of a client \
                     without a certificate: see EtcdTls::cert_file)"
                } else {
                    ""
                };
                Error::Core(rdmapool_pool::CoreError::Connection {
                    peer: self.endpoints.join(","),
                    reason: format!("no etcd endpoint answered: {}{hint}", reasons.join("; ")),
                })
            }
        }
    }

    /// A unary call: its JSON answer.
    pub(super) fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let mut resp = self.send(&self.agent, path, body)?;
        resp.body_mut()
            .read_json::<Value>()
            .map_err(|e| malformed(format!("{path}: {e}")))
    }

    pub(super) fn grant(&self, ttl: Duration) -> Result<i64> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl.as_secs() }))?;
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            return Err(malformed(format!("lease grant: {e}")));
        }
        match int(&v, "ID")? {
            0 => Err(malformed("lease grant without an ID")),
            id => Ok(id),
        }
    }

    /// Renews `lease` once; false when etcd no longer has it.
    pub(super) fn keep_alive(&self, lease: i64) -> Result<bool> {
        let v = self.call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))?;
        let result = v
            .get("result")
            .ok_or_else(|| malformed(format!("lease keepalive: {v}")))?;
        Ok(int(result, "TTL")? > 0)
    }

    pub(super) fn revoke(&self, lease: i64) -> Result<()> {
        match self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() })) {
            // Already gone (expired): what revoking wanted.
            Err(Error::Core(rdmapool_pool::CoreError::Connection { reason, .. }))
                if reason.contains("not found") =>
            {
                Ok(())
            }
            r => r.map(|_| ()),
        }
    }

    pub(super) fn put(&self, key: &str, value: &str, lease: i64) -> Result<()> {
        self.call(
            "/v3/kv/put",
            &json!({ "key": b64(key), "value": b64(value), "lease": lease.to_string() }),
        )
        .map(|_| ())
    }

    /// The keys under `dir` with their values and leases, and the store's revision.
    pub(super) fn list(&self, dir: &str) -> Result<(Listing, i64)> {
        let v = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(dir), "range_end": b64(&prefix_end(dir)) }),
        )?;
        let revision = v
            .get("header")
            .map(|h| int(h, "revision"))
            .ok_or_else(|| malformed(format!("range without a header: {v}")))??;
        let mut out = BTreeMap::new();
        if let Some(kvs) = v.get("kvs").and_then(Value::as_array) {
            for kv in kvs {
                out.insert(text(kv, "key")?, (text(kv, "value")?, int(kv, "lease")?));
            }
        }
        Ok((out, revision))
    }
}

/// Keys with their values and leases.
pub(super) type Listing = BTreeMap<String, (String, i64)>;

/// The smallest key above every key starting with `dir` (its last byte plus one; server
/// prefixes end in `/`, so no carry).
pub(super) fn prefix_end(dir: &str) -> String {
    let mut b = dir.as_bytes().to_vec();
    while let Some(last) = b.pop() {
        if last < 0x7f {
            b.push(last + 1);
            return String::from_utf8(b).unwrap_or_default();
        }
    }
    String::from("\0")
}
