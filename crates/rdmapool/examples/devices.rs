//! The library calls behind `rdma-tool devices`: every provider, whether it is available
//! (and why not), its devices and their limits, then one device opened for real.
//!
//! ```sh
//! cargo run --release -p rdmapool --example devices
//! ```

use rdmapool::devices;
use rdmapool::fabric::{Context, SoftConfig};

fn main() -> rdmapool::Result<()> {
    for p in devices() {
        match &p.unavailable {
            Some(reason) => println!("{}: not available ({reason})", p.provider),
            None => println!("{}: {} device(s)", p.provider, p.devices.len()),
        }
        for d in &p.devices {
            println!(
                "  {}: max_mr_size {} B, max_qp_wr {}, max_sge {}, max_cqe {}, atomics {:?}, \
                 on-demand paging {}",
                d.name,
                d.max_mr_size,
                d.max_qp_wr,
                d.max_sge,
                d.max_cqe,
                d.atomic_cap,
                d.on_demand_paging
            );
            for port in &d.ports {
                println!(
                    "    port {}: {} {} mtu {} gid[{}] {}",
                    port.num,
                    port.state,
                    port.link_layer,
                    port.active_mtu,
                    port.gid_index,
                    port.gid
                );
            }
        }
    }
    // Opening is what every other command does first; the soft provider is always there.
    let ctx = Context::open(SoftConfig::from_env()?)?;
    let pd = ctx.alloc_pd()?;
    println!(
        "opened {} ({}) and allocated a protection domain",
        ctx.device().name,
        pd.provider()
    );
    Ok(())
}
