//! etcd's v3 JSON gateway over HTTP/1.1: leases, puts, ranges and the watch stream.

use super::*;
use crate::{Error, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
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
}

pub(super) fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

pub(super) fn malformed(reason: impl Into<String>) -> Error {
    Error::Malformed {
        what: "etcd response",
        reason: reason.into(),
    }
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
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(cfg.request_timeout))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let watcher = ureq::Agent::config_builder()
            .timeout_connect(Some(cfg.request_timeout))
            .timeout_send_request(Some(cfg.request_timeout))
            .timeout_recv_response(Some(cfg.request_timeout))
            .timeout_per_read(Some(cfg.watch_idle))
            .http_status_as_error(false)
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
        })
    }

    /// POSTs `body` to `path` on the endpoints in turn (from the last one that answered),
    /// returning the first answer's response; HTTP errors from etcd are not retried.
    pub(super) fn send(
        &self,
        agent: &ureq::Agent,
        path: &str,
        body: &Value,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let start = self.current.load(Ordering::Relaxed);
        let mut errors = Vec::new();
        for k in 0..self.endpoints.len() {
            let i = (start + k) % self.endpoints.len();
            let url = format!("{}{path}", self.endpoints[i]);
            match agent.post(&url).send_json(body) {
                Ok(mut resp) => {
                    self.current.store(i, Ordering::Relaxed);
                    let status = resp.status();
                    if !status.is_success() {
                        let msg = resp
                            .body_mut()
                            .read_json::<Value>()
                            .ok()
                            .and_then(|v| {
                                v.get("message").and_then(Value::as_str).map(String::from)
                            })
                            .unwrap_or_default();
                        return Err(Error::Connection {
                            peer: url,
                            reason: format!("etcd answered {status}: {msg}"),
                        });
                    }
                    return Ok(resp);
                }
                Err(e) => errors.push(format!("{url}: {e}")),
            }
        }
        Err(Error::Connection {
            peer: self.endpoints.join(","),
            reason: format!("no etcd endpoint answered: {}", errors.join("; ")),
        })
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
            Err(Error::Connection { reason, .. }) if reason.contains("not found") => Ok(()),
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
