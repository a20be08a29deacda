//! What `Store(...)` and `PoolClient(...)` share: opening the provider, finding the servers
//! (a list of addresses, or etcd) and joining them as a client id, with the cluster's keys.

use crate::errors::{bad_arg, IntoPyResult};
use pyo3::prelude::*;
use rdmapool::fabric::{Context, ProviderKind, ProviderOptions, SoftConfig, Transport};
use rdmapool::remote::{
    ClientConfig, EtcdConfig, EtcdFollower, EtcdMembership, Membership, PoolClient,
    StaticMembership,
};
use std::sync::Arc;

/// The etcd key prefix servers register under by default (as `rdma-tool serve --etcd`).
pub const ETCD_PREFIX: &str = "/rdmapool/pool";

/// The keyword arguments that say how to reach the cluster.
pub struct Join {
    /// `"ip:port"` addresses of memory servers.
    pub servers: Option<Vec<String>>,
    /// etcd endpoints (`http://host:port`), instead of `servers`.
    pub etcd: Option<Vec<String>>,
    /// The etcd key prefix.
    pub etcd_prefix: String,
    /// This client's id; a fresh random one when `None`.
    pub client_id: Option<u64>,
    /// A file holding the cluster key (as `RDMAPOOL_POOL_KEY_FILE`).
    pub key_file: Option<String>,
    /// A file holding this client id's own key (as `RDMAPOOL_POOL_CLIENT_KEY_FILE`).
    pub client_key_file: Option<String>,
    /// `"soft"` or `"verbs"`.
    pub provider: String,
    /// The device of the verbs provider (default: the first, or `RDMAPOOL_DEVICE`).
    pub device: Option<String>,
}

/// A client joined to the pool, and what keeps its membership current.
pub struct Joined {
    /// The pool client.
    pub client: Arc<PoolClient>,
    /// With etcd: follows servers coming and going, while it lives.
    pub _follower: Option<EtcdFollower>,
}

/// Opens the provider `provider` names (`"soft"`, the default, needs no NIC).
pub fn open_context(py: Python<'_>, provider: &str, device: Option<&str>) -> PyResult<Context> {
    let soft = || -> rdmapool::Result<Context> {
        let cfg = SoftConfig::from_env()?.with_transport(Transport::Auto);
        Ok(Context::open(cfg)?)
    };
    let verbs = || -> rdmapool::Result<Context> {
        Ok(Context::open(ProviderOptions::from_env(
            ProviderKind::Verbs,
            device,
        )?)?)
    };
    let opened = match provider {
        "soft" => soft(),
        "verbs" => verbs(),
        other => {
            return Err(bad_arg(
                py,
                format!("provider {other:?}: want \"soft\" or \"verbs\""),
            ))
        }
    };
    opened.py(py)
}

/// A fresh client id for a client not given one: random in [2^62, 2^63), far from the small
/// ids applications pick and from `rdma-tool`'s one-shot ids.
fn fresh_client_id() -> u64 {
    let mut b = [0u8; 8];
    // A failed getrandom leaves zeros: the time then picks the id.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b = (t ^ u64::from(std::process::id())).to_le_bytes();
    }
    (1u64 << 62) | (u64::from_le_bytes(b) & ((1u64 << 62) - 1))
}

/// Joins the cluster `join` names (the GIL released while connecting).
pub fn join(py: Python<'_>, join: Join) -> PyResult<Joined> {
    let ctx = open_context(py, &join.provider, join.device.as_deref())?;
    let key = |path: &Option<String>| -> PyResult<Option<rdmapool::fabric::PreSharedKey>> {
        path.as_deref()
            .map(rdmapool::fabric::PreSharedKey::from_file)
            .transpose()
            .map_err(rdmapool::Error::from)
            .py(py)
    };
    let mut cfg = ClientConfig::new(join.client_id.unwrap_or_else(fresh_client_id));
    cfg.cluster_key = key(&join.key_file)?;
    cfg.client_key = key(&join.client_key_file)?;
    let (members, etcd): (Box<dyn Membership>, Option<EtcdMembership>) =
        match (join.servers, join.etcd) {
            (Some(list), None) => {
                if list.is_empty() {
                    return Err(bad_arg(py, "servers: an empty list"));
                }
                let m = StaticMembership::parse(&list.join(",")).py(py)?;
                (Box::new(m), None)
            }
            (None, Some(endpoints)) => {
                let cfg = EtcdConfig::new(endpoints, &join.etcd_prefix);
                let m = py.detach(|| EtcdMembership::new(&cfg)).py(py)?;
                let follow = py.detach(|| EtcdMembership::new(&cfg)).py(py)?;
                (Box::new(m), Some(follow))
            }
            (Some(_), Some(_)) => return Err(bad_arg(py, "give servers or etcd, not both")),
            (None, None) => return Err(bad_arg(py, "no servers: give servers=[...] or etcd=...")),
        };
    let client = py
        .detach(|| {
            let pd = ctx.alloc_pd()?;
            PoolClient::connect(&ctx, &pd, &*members, cfg)
        })
        .py(py)?;
    let client = Arc::new(client);
    let follower = match etcd {
        Some(m) => Some(py.detach(|| m.follow(client.clone())).py(py)?),
        None => None,
    };
    Ok(Joined {
        client,
        _follower: follower,
    })
}

/// Parses `servers=`: a list of `"ip:port"`, or one string of them separated by commas.
pub fn server_list(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<String>>> {
    let Some(obj) = obj else { return Ok(None) };
    if obj.is_none() {
        return Ok(None);
    }
    if let Ok(s) = obj.extract::<String>() {
        return Ok(Some(
            s.split(',')
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect(),
        ));
    }
    Ok(Some(obj.extract::<Vec<String>>()?))
}
