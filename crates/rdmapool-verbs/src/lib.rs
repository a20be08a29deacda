//! rdmapool-verbs: rdmapool's provider over rdma-core (real NICs, and SoftRoCE).
//!
//! It implements the provider interface of `rdmapool-core`
//! ([`rdmapool_core::fabric::provider`]); [`VerbsConfig`] opens a device with
//! [`Context::open`](rdmapool_core::fabric::Context::open), and RDMA CM is its connection
//! manager ([`Provider::connection_manager`]), which `rdmapool::conn` uses on verbs.
//!
//! rdma-core is opened at run time (`rdmapool-sys`): on a machine without it, or without
//! RDMA devices, the provider reports "not available" with the reason and the rest of the
//! library works. Objects hold the raw verbs handles; every handle is destroyed in `Drop`,
//! children (MRs, QPs, CQs) keep their parents alive through `Arc`s.

#![warn(missing_docs)]

mod addr;
mod cm;
mod config;
mod cq;
mod error;
mod events;
mod oplog;
mod pd;
mod qp;

pub(crate) use cq::VerbsCq;
use cq::VerbsCqHandle;
pub(crate) use pd::{ibv_access, VerbsMw, VerbsPd};

// The core crate's modules under the names the provider's files use (`crate::fabric::..`).
use rdmapool_core::{fabric, os, Error, Result};

pub use config::VerbsConfig;
pub use error::VerbsError;

use crate::fabric::provider::{
    ConnectionManager, ContextOps, ContextOptions, CqOps, PdOps, Provider,
};
use crate::fabric::{AtomicCap, DeviceInfo, ProviderKind, ProviderStatus};
use rdmapool_sys as sys;
use std::ffi::CStr;
use std::sync::Arc;

/// Port used on every device (multi-port devices: the first active one).
pub(crate) struct PortInfo {
    pub(crate) num: u8,
    pub(crate) lid: u16,
    pub(crate) active_mtu: u32,
    pub(crate) link_layer: u8,
    pub(crate) gid_index: u8,
    pub(crate) gid: [u8; 16],
}

/// The last OS error for a verbs call.
fn os_err(call: &'static str) -> Error {
    Error::last_os(call)
}

/// An errno returned as a value (post/modify calls) as an error.
fn errno_err(call: &'static str, errno: i32) -> Error {
    Error::Sys {
        call,
        source: std::io::Error::from_raw_os_error(errno),
    }
}

fn unavailable(reason: String) -> VerbsError {
    VerbsError::Unavailable {
        what: "verbs",
        reason,
    }
}

/// Loads libibverbs or explains why it cannot be used.
fn lib() -> std::result::Result<&'static sys::Verbs, VerbsError> {
    sys::verbs().map_err(|e| unavailable(e.to_string()))
}

/// Owns an `ibv_get_device_list` result.
struct DeviceList {
    v: &'static sys::Verbs,
    list: *mut *mut sys::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get(v: &'static sys::Verbs) -> Result<Self> {
        let mut n = 0;
        // SAFETY: n is a valid out-pointer; the list is freed in Drop.
        let list = unsafe { (v.ibv_get_device_list)(&mut n) };
        if list.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(unavailable(format!(
                "no RDMA devices ({e}; without a NIC, load SoftRoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <if>)"
            ))
            .into());
        }
        Ok(Self {
            v,
            list,
            len: n.max(0) as usize,
        })
    }

    fn devices(&self) -> impl Iterator<Item = *mut sys::ibv_device> + '_ {
        // SAFETY: the list holds `len` valid device pointers while it lives.
        (0..self.len).map(move |i| unsafe { *self.list.add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: a list from ibv_get_device_list, freed once.
        unsafe { (self.v.ibv_free_device_list)(self.list) };
    }
}

fn device_name(v: &sys::Verbs, dev: *mut sys::ibv_device) -> String {
    // SAFETY: a device from the live list; the name is a NUL-terminated string it owns.
    unsafe { CStr::from_ptr((v.ibv_get_device_name)(dev)) }
        .to_string_lossy()
        .into_owned()
}

/// The RoCE v2 IPv4 GID index from sysfs, else the first RoCE v2 GID, else 0.
/// [`VerbsConfig::gid_index`] (from `RDMAPOOL_GID_INDEX`) overrides; it must be inside the
/// port's GID table.
fn pick_gid_index(dev: &str, port: u8, gid_tbl_len: i32, wanted: Option<u8>) -> Result<u8> {
    if let Some(i) = wanted {
        return if (i as i32) < gid_tbl_len {
            Ok(i)
        } else {
            Err(Error::BadSetting {
                name: "RDMAPOOL_GID_INDEX".into(),
                value: i.to_string(),
                reason: format!(
                    "out of range: port {port} of {dev} has {gid_tbl_len} GIDs (see \
                     /sys/class/infiniband/{dev}/ports/{port}/gids)"
                ),
            })
        };
    }
    let base = format!("/sys/class/infiniband/{dev}/ports/{port}");
    let mut first_v2 = None;
    for i in 0..gid_tbl_len.clamp(0, 256) {
        let ty = std::fs::read_to_string(format!("{base}/gid_attrs/types/{i}")).unwrap_or_default();
        if !ty.trim().eq_ignore_ascii_case("RoCE v2") {
            continue;
        }
        let gid = std::fs::read_to_string(format!("{base}/gids/{i}")).unwrap_or_default();
        if gid.trim().starts_with("0000:0000:0000:0000:0000:ffff:") {
            return Ok(i as u8);
        }
        first_v2.get_or_insert(i as u8);
    }
    Ok(first_v2.unwrap_or(0))
}

/// An open device.
pub(crate) struct VerbsContext {
    pub(crate) v: &'static sys::Verbs,
    pub(crate) ctx: *mut sys::ibv_context,
    info: DeviceInfo,
    pub(crate) port: PortInfo,
    pub(crate) max_rd_atomic: u8,
    /// Registrations alive on this context.
    live_mrs: std::sync::atomic::AtomicUsize,
    /// The asynchronous-event thread (None only while opening).
    events: Option<events::AsyncEvents>,
    /// The work each QP has outstanding (exact queue depths, opcodes of error completions).
    pub(crate) work_logs: oplog::WorkLogs,
    /// Live registrations by lkey (`ibv_mr` addresses), for binding memory windows to them.
    pub(crate) mrs_by_lkey: parking_lot::RwLock<std::collections::HashMap<u32, usize>>,
}

// SAFETY: libibverbs objects may be used from any thread; the raw pointers are only handles.
unsafe impl Send for VerbsContext {}
// SAFETY: as above; all verbs calls are thread-safe per rdma-core's documentation.
unsafe impl Sync for VerbsContext {}

impl Drop for VerbsContext {
    fn drop(&mut self) {
        if let Some(e) = &mut self.events {
            e.stop(); // it reads events of this context: stop it before closing
        }
        // SAFETY: every child holds an Arc to us, so none is alive any more.
        unsafe { (self.v.ibv_close_device)(self.ctx) };
    }
}

fn open_device(
    v: &'static sys::Verbs,
    dev: *mut sys::ibv_device,
    cfg: &VerbsConfig,
) -> Result<VerbsContext> {
    let name = device_name(v, dev);
    // SAFETY: a device from a live list.
    let ctx = unsafe { (v.ibv_open_device)(dev) };
    if ctx.is_null() {
        return Err(os_err("ibv_open_device"));
    }
    let mut c = VerbsContext {
        v,
        ctx,
        info: DeviceInfo {
            provider: ProviderKind::Verbs,
            name: name.clone(),
            max_mr_size: 0,
            max_msg_size: 0,
            max_qp_wr: 0,
            max_sge: 0,
            max_cqe: 0,
            max_mr: 0,
            atomic_cap: AtomicCap::None,
            on_demand_paging: false,
            ports: Vec::new(),
        },
        port: PortInfo {
            num: 1,
            lid: 0,
            active_mtu: sys::IBV_MTU_1024,
            link_layer: 0,
            gid_index: 0,
            gid: [0; 16],
        },
        max_rd_atomic: 0,
        live_mrs: std::sync::atomic::AtomicUsize::new(0),
        work_logs: oplog::WorkLogs::default(),
        mrs_by_lkey: Default::default(),
        events: None,
    };
    // SAFETY: all-zero is a valid ibv_device_attr_ex (plain integers and arrays).
    let mut attr: sys::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: a live context and a writable attribute struct.
    let rc = unsafe { sys::ibv_query_device_ex(v, ctx, std::ptr::null(), &mut attr) };
    if rc != 0 {
        return Err(errno_err("ibv_query_device_ex", rc));
    }
    let a = &attr.orig_attr;
    c.info.max_mr_size = a.max_mr_size;
    c.info.max_qp_wr = a.max_qp_wr.max(0) as u32;
    // What this layer posts at most (its work requests carry the SGEs in a fixed array).
    c.info.max_sge = (a.max_sge.max(0) as u32).min(crate::fabric::MAX_SGE as u32);
    c.info.max_cqe = a.max_cqe.max(0) as u32;
    c.info.max_mr = a.max_mr.max(0) as u32;
    c.info.atomic_cap = match a.atomic_cap {
        sys::IBV_ATOMIC_HCA => AtomicCap::Hca,
        sys::IBV_ATOMIC_GLOB => AtomicCap::Global,
        _ => AtomicCap::None,
    };
    c.info.on_demand_paging = attr.odp_caps.general_caps & sys::IBV_ODP_SUPPORT as u64 != 0
        && attr.odp_caps.per_transport_caps.rc_odp_caps & sys::IBV_ODP_SUPPORT_WRITE != 0;
    c.max_rd_atomic = a.max_qp_rd_atom.clamp(1, 16) as u8;
    // The first active port (port numbers start at 1).
    let mut chosen = None;
    for p in 1..=a.phys_port_cnt.max(1) {
        // SAFETY: all-zero is a valid ibv_port_attr.
        let mut pa: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and a writable attribute struct.
        if unsafe { sys::ibv_query_port(v, ctx, p, &mut pa) } == 0
            && (chosen.is_none() || pa.state == sys::IBV_PORT_ACTIVE)
        {
            let first_is_active = chosen
                .as_ref()
                .is_some_and(|(_, q): &(u8, sys::ibv_port_attr)| q.state == sys::IBV_PORT_ACTIVE);
            if !first_is_active {
                chosen = Some((p, pa));
            }
        }
    }
    let (num, pa) = chosen.ok_or_else(|| Error::PortDown {
        device: name.clone(),
        port: 1,
        state: "not queryable".into(),
    })?;
    c.info.max_msg_size = pa.max_msg_sz;
    let gid_index = pick_gid_index(&name, num, pa.gid_tbl_len, cfg.gid_index)?;
    let mut gid: sys::ibv_gid = unsafe_zeroed_gid();
    // SAFETY: a live context and a writable GID.
    if unsafe { (v.ibv_query_gid)(ctx, num, gid_index as i32, &mut gid) } != 0 {
        return Err(os_err("ibv_query_gid"));
    }
    let gid_bytes = gid_raw(&gid);
    if gid_bytes == [0; 16] && cfg.gid_index.is_some() {
        return Err(Error::BadSetting {
            name: "RDMAPOOL_GID_INDEX".into(),
            value: gid_index.to_string(),
            reason: format!("out of range: that entry of port {num} of {name} is empty"),
        });
    }
    c.info.ports.push(crate::fabric::PortInfo {
        num,
        state: port_state_name(pa.state).into(),
        link_layer: if pa.link_layer == sys::IBV_LINK_LAYER_ETHERNET as u8 {
            "Ethernet"
        } else {
            "InfiniBand"
        }
        .into(),
        lid: pa.lid,
        active_mtu: 128u32 << pa.active_mtu.clamp(1, 5),
        gid_index,
        gid: gid_bytes
            .chunks(2)
            .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
            .collect::<Vec<_>>()
            .join(":"),
        roce_v2: std::fs::read_to_string(format!(
            "/sys/class/infiniband/{name}/ports/{num}/gid_attrs/types/{gid_index}"
        ))
        .is_ok_and(|t| t.trim().eq_ignore_ascii_case("RoCE v2")),
    });
    c.port = PortInfo {
        num,
        lid: pa.lid,
        active_mtu: pa.active_mtu,
        link_layer: pa.link_layer,
        gid_index,
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        gid: unsafe { gid.raw },
    };
    c.events = Some(events::AsyncEvents::start(v, ctx)?);
    Ok(c)
}

fn gid_raw(g: &sys::ibv_gid) -> [u8; 16] {
    // SAFETY: every bit pattern of the union is a valid [u8; 16].
    unsafe { g.raw }
}

fn port_state_name(s: u32) -> &'static str {
    match s {
        sys::IBV_PORT_DOWN => "DOWN",
        sys::IBV_PORT_INIT => "INIT",
        sys::IBV_PORT_ARMED => "ARMED",
        sys::IBV_PORT_ACTIVE => "ACTIVE",
        sys::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

impl VerbsContext {
    /// Fails with a clear error unless the port this context uses is ACTIVE now.
    pub(crate) fn require_active_port(&self) -> Result<()> {
        // SAFETY: all-zero is a valid ibv_port_attr.
        let mut pa: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and a writable attribute struct.
        let rc = unsafe { sys::ibv_query_port(self.v, self.ctx, self.port.num, &mut pa) };
        if rc != 0 {
            return Err(errno_err("ibv_query_port", rc));
        }
        if pa.state != sys::IBV_PORT_ACTIVE {
            return Err(Error::PortDown {
                device: self.info.name.clone(),
                port: self.port.num,
                state: port_state_name(pa.state).to_string(),
            });
        }
        Ok(())
    }
}

fn unsafe_zeroed_gid() -> sys::ibv_gid {
    sys::ibv_gid { raw: [0; 16] }
}

/// Whether verbs can be used here: its devices, or why not.
fn status() -> ProviderStatus {
    let listed = VerbsConfig::from_env().map_err(Error::from).and_then(|cfg| {
        let v = lib()?;
        let list = DeviceList::get(v)?;
        let mut infos = Vec::new();
        let mut first_error = None;
        for d in list.devices() {
            match open_device(v, d, &cfg) {
                Ok(c) => infos.push(c.info.clone()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match (infos.is_empty(), first_error) {
            (false, _) => Ok(infos),
            (true, Some(e)) => Err(e),
            (true, None) => Err(unavailable(
                "no RDMA devices (no NIC, or the kernel modules are not loaded; for SoftRoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <if>)".into(),
            ).into()),
        }
    });
    match listed {
        Ok(devices) => ProviderStatus {
            provider: ProviderKind::Verbs,
            devices,
            unavailable: None,
        },
        Err(e) => ProviderStatus {
            provider: ProviderKind::Verbs,
            devices: Vec::new(),
            unavailable: Some(match e {
                Error::ProviderUnavailable { reason, .. } => reason,
                other => other.to_string(),
            }),
        },
    }
}

/// The verbs provider: rdma-core's devices, or why it cannot be used
/// ([`Provider::status`]); [`VerbsConfig`] opens one.
pub struct VerbsProvider;

/// The verbs provider, for a table of providers (`rdmapool::devices()`).
pub static PROVIDER: VerbsProvider = VerbsProvider;

impl Provider for VerbsProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Verbs
    }
    fn status(&self) -> ProviderStatus {
        status()
    }
    fn connection_manager(&self) -> Option<&'static dyn ConnectionManager> {
        Some(&cm::RDMA_CM)
    }
}

impl ContextOptions for VerbsConfig {
    fn provider(&self) -> &'static dyn Provider {
        &PROVIDER
    }

    fn device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    fn open_context(&self) -> Result<Arc<dyn ContextOps>> {
        open(self)
    }
}

/// Opens the device `cfg` names (or the first one).
fn open(cfg: &VerbsConfig) -> Result<Arc<dyn ContextOps>> {
    let name = cfg.device.as_deref();
    let v = lib()?;
    let list = DeviceList::get(v)?;
    let mut names = Vec::new();
    for d in list.devices() {
        let n = device_name(v, d);
        if name.is_none_or(|want| want == n) {
            return Ok(Arc::new(OpenedContext(Arc::new(open_device(v, d, cfg)?))));
        }
        names.push(n);
    }
    Err(match name {
        Some(n) => Error::NoSuchDevice {
            provider: ProviderKind::Verbs,
            name: n.into(),
            known: names,
        },
        None => unavailable("no RDMA devices".into()).into(),
    })
}

/// An opened device as the provider interface sees it.
struct OpenedContext(Arc<VerbsContext>);

impl std::ops::Deref for OpenedContext {
    type Target = VerbsContext;
    fn deref(&self) -> &VerbsContext {
        &self.0
    }
}

impl ContextOps for OpenedContext {
    fn device(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
        // SAFETY: a live context.
        let pd = unsafe { (self.v.ibv_alloc_pd)(self.ctx) };
        if pd.is_null() {
            return Err(os_err("ibv_alloc_pd"));
        }
        Ok(Arc::new(pd::PdHandle(Arc::new(VerbsPd {
            ctx: self.0.clone(),
            pd,
        }))))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>> {
        cq::create(&self.0, depth)
    }

    fn live_regions(&self) -> usize {
        self.live_mrs.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn live_qps(&self) -> usize {
        self.work_logs.len()
    }
}
