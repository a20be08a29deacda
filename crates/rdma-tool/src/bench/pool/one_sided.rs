//! alloc+free through `PoolClient`s, one-sided: against one server or spread over several.

use super::*;

/// One client of the pool and the objects it holds; frees them when dropped.
struct OneSided {
    client: PoolClient,
    held: VecDeque<RemotePtr>,
    _ctx: Context,
}

impl Drop for OneSided {
    fn drop(&mut self) {
        for p in self.held.drain(..) {
            let _ = self.client.block_on(self.client.free(p));
        }
    }
}

/// alloc+free of one client spread round-robin over `n` servers (each on a context of its
/// own, as on separate hosts) against the same client on the first of them alone: the
/// servers take no part in allocation, so the rate should not drop with more of them.
#[allow(clippy::too_many_arguments)]
pub(super) fn across_servers(
    device: &DeviceArgs,
    transport: Transport,
    n: usize,
    size: usize,
    object: u64,
    live: usize,
    secs: f64,
    first_id: u64,
    bar: &mut Steps,
) -> Result<Row> {
    let mut contexts = Vec::with_capacity(n);
    let mut servers = Vec::with_capacity(n);
    for i in 0..n {
        let ctx = device.open(transport)?;
        let cfg = ServerConfig {
            node: i as u32 + 1,
            ..server_config(SocketAddr::new(IpAddr::from([127, 0, 0, 1]), 0), size)
        };
        servers.push(MemoryServer::start(&ctx, cfg)?);
        contexts.push(ctx);
    }
    let all: Vec<&MemoryServer> = servers.iter().collect();
    bar.set_message(format!("alloc+free, 1 client, {n} servers"));
    let spread = one_sided(device, transport, &all, 1, first_id, object, live, secs)?;
    bar.inc();
    bar.set_message("alloc+free, 1 client, 1 server".to_string());
    let one = one_sided(
        device,
        transport,
        &all[..1],
        1,
        first_id + 1,
        object,
        live,
        secs,
    )?;
    bar.inc();
    Ok(spread.row(
        (device.kind(), transport),
        format!("alloc+free x1, {n} servers"),
        object,
        "1 server x1".into(),
        &one,
    ))
}

/// alloc+free through `PoolClient`s, one-sided, over `servers` (round-robin).
#[allow(clippy::too_many_arguments)]
pub(super) fn one_sided(
    device: &DeviceArgs,
    transport: Transport,
    servers: &[&MemoryServer],
    n: usize,
    first_id: u64,
    object: u64,
    live: usize,
    secs: f64,
) -> Result<Rate> {
    let members = StaticMembership::new(servers.iter().map(|s| s.addr()).collect());
    let members = &members;
    let rate = clients(n, secs, |i| {
        let ctx = device.open(transport)?;
        let pd = ctx.alloc_pd()?;
        let client =
            PoolClient::connect(&ctx, &pd, members, ClientConfig::new(first_id + i as u64))?;
        let mut held = VecDeque::with_capacity(live + 1);
        for _ in 0..live {
            held.push_back(client.block_on(client.alloc(object, None))?);
        }
        let mut me = OneSided {
            client,
            held,
            _ctx: ctx,
        };
        Ok(move || -> Result<()> {
            let p = me.client.block_on(me.client.alloc(object, None))?;
            me.held.push_back(p);
            if let Some(old) = me.held.pop_front() {
                me.client.block_on(me.client.free(old))?;
            }
            Ok(())
        })
    });
    // Every measurement starts from the same empty pool (the clients freed what they held).
    let until = Instant::now() + Duration::from_secs(10);
    while servers.iter().any(|s| s.stats().chunks_owned > 0) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    rate
}
