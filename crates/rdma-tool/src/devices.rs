//! `rdma-tool devices`.

use crate::device_args::DeviceArgs;
use crate::units::human;
use crate::{Result, ToolError};
use rdmapool::devices;
use rdmapool::fabric::AtomicCap;
use serde_json::json;

/// Arguments of `devices`.
#[derive(clap::Args)]
pub struct Args {
    /// Only this provider and/or device (default: every provider and device).
    #[command(flatten)]
    device: DeviceArgs,
    /// Print JSON (an array of providers) instead of a table.
    #[arg(long)]
    json: bool,
}

fn atomic_name(a: AtomicCap) -> &'static str {
    match a {
        AtomicCap::None => "none",
        AtomicCap::Hca => "hca",
        AtomicCap::Global => "global",
    }
}

/// Lists providers, their devices and limits.
pub fn run(args: Args) -> Result<()> {
    let mut providers = devices();
    if let Some(p) = args.device.provider {
        let kind = p.into();
        providers.retain(|s| s.provider == kind);
    }
    if let Some(name) = &args.device.device {
        let mut known: Vec<String> = providers
            .iter()
            .flat_map(|p| {
                p.devices
                    .iter()
                    .map(|d| format!("{} ({})", d.name, p.provider))
            })
            .collect();
        known.extend(providers.iter().filter_map(|p| {
            let why = p.unavailable.as_ref()?;
            Some(format!("no {} devices: {why}", p.provider))
        }));
        for p in &mut providers {
            p.devices.retain(|d| &d.name == name);
        }
        providers.retain(|p| !p.devices.is_empty());
        if providers.is_empty() {
            return Err(ToolError::Msg(format!(
                "--device {name}: no such device; there are: {} (run `rdma-tool devices`)",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join("; ")
                }
            )));
        }
    }
    if args.json {
        let v: Vec<_> = providers
            .iter()
            .map(|p| {
                json!({
                    "provider": p.provider.name(),
                    "available": p.unavailable.is_none(),
                    "reason": p.unavailable,
                    "devices": p.devices.iter().map(|d| json!({
                        "name": d.name,
                        "max_mr_size": d.max_mr_size,
                        "max_msg_size": d.max_msg_size,
                        "max_qp_wr": d.max_qp_wr,
                        "max_sge": d.max_sge,
                        "max_cqe": d.max_cqe,
                        "max_mr": d.max_mr,
                        "atomic_cap": atomic_name(d.atomic_cap),
                        "on_demand_paging": d.on_demand_paging,
                        "ports": d.ports.iter().map(|p| json!({
                            "port": p.num,
                            "state": p.state,
                            "link_layer": p.link_layer,
                            "lid": p.lid,
                            "active_mtu": p.active_mtu,
                            "gid_index": p.gid_index,
                            "gid": p.gid,
                            "roce_v2": p.roce_v2,
                        })).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&v).expect("JSON of plain values")
        );
        return Ok(());
    }
    crate::outln!(
        "{:<9} {:<8} {:>14} {:>12} {:>9} {:>7} {:>9} {:>8}",
        "provider",
        "device",
        "max_mr_size",
        "max_msg",
        "max_qp_wr",
        "max_sge",
        "max_cqe",
        "atomics"
    );
    for p in &providers {
        if let Some(reason) = &p.unavailable {
            crate::outln!("{:<9} not available: {reason}", p.provider.name());
            continue;
        }
        for d in &p.devices {
            crate::outln!(
                "{:<9} {:<8} {:>14} {:>12} {:>9} {:>7} {:>9} {:>8}",
                p.provider.name(),
                d.name,
                human(d.max_mr_size),
                human(d.max_msg_size as u64),
                d.max_qp_wr,
                d.max_sge,
                d.max_cqe,
                atomic_name(d.atomic_cap)
            );
            for p in &d.ports {
                crate::outln!(
                    "          port {}: {} {} lid {} mtu {} gid[{}] {}{}",
                    p.num,
                    p.state,
                    p.link_layer,
                    p.lid,
                    p.active_mtu,
                    p.gid_index,
                    p.gid,
                    if p.roce_v2 { " (RoCE v2)" } else { "" }
                );
            }
        }
    }
    Ok(())
}
