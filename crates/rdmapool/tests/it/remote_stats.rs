//! What can be seen of a running pool: `PoolClient::node_stats` (one-sided READs of a
//! server's region), `PoolClient::unreachable`, and the memory servers in the metrics
//! registry, each checked against the server's own counters.

use crate::support::*;
use rdmapool::fabric::*;
use rdmapool::remote::*;
use std::net::SocketAddr;
use std::time::Duration;

/// Server `node`'s section of `ctx`'s metrics, by JSON key (`leases`, `chunks_owned`, ...).
fn listed(ctx: &Context, node: u32) -> Option<std::collections::HashMap<&'static str, u64>> {
    ctx.metrics()
        .snapshot()
        .sections
        .into_iter()
        .find(|s| s.family == "pool_servers" && s.label == ("node", u64::from(node)))
        .map(|s| s.series.iter().map(|v| (v.key, v.value)).collect())
}

#[test]
fn node_stats_unreachable_servers_and_metrics_agree_with_the_server() {
    let ctx = node_on(Transport::Auto).ctx;
    let server = MemoryServer::start(
        &ctx,
        ServerConfig {
            node: 71,
            size: 8 << 20,
            chunk_size: 256 << 10,
            clients: 64,
            lease: Duration::from_secs(5),
            listen: SocketAddr::new(listen_ip(), 0),
            ..ServerConfig::default()
        },
    )
    .expect("server starts");
    // A port nothing listens on any more: refused at once.
    let dead = std::net::TcpListener::bind(SocketAddr::new(listen_ip(), 0))
        .and_then(|l| l.local_addr())
        .unwrap();
    let n = node();
    let members = StaticMembership::new(vec![server.addr(), dead]);
    let c = PoolClient::connect(&n.ctx, &n.pd, &members, ClientConfig::new(5)).unwrap();
    assert_eq!(c.unreachable().len(), 1, "{:?}", c.unreachable());
    assert_eq!(c.unreachable()[0].0, dead);
    assert!(!c.unreachable()[0].1.is_empty());

    let p = c.block_on(c.alloc(100, None)).unwrap();
    let seen = c.block_on(c.node_stats()).unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let s = seen[0];
    let own = server.stats();
    assert_eq!(s.node, 71);
    assert_eq!((s.leases, own.clients), (1, 1), "{s:?} {own:?}");
    assert_eq!((s.lease_slots, own.lease_slots), (64, 64));
    assert_eq!((s.chunks, own.chunks), (31, 31));
    assert_eq!((s.chunks_owned, own.chunks_owned), (1, 1));
    assert_eq!(s.chunks_free, 30);
    assert_eq!(s.chunk_size, 256 << 10);
    assert!(!s.draining);
    assert_eq!(own.connected, 1);
    assert_eq!(own.requests_handled, 0);

    // Its context's metrics list the server with the same counters while it lives.
    let m = listed(&ctx, 71).expect("the server is in its context's metrics");
    assert!(
        listed(&n.ctx, 71).is_none(),
        "the client's context runs no server"
    );
    assert_eq!(
        (m["leases"], m["chunks_owned"], m["connected"]),
        (own.clients, own.chunks_owned, own.connected),
        "{m:?}"
    );
    assert_eq!(
        (m["leases"], m["chunks_owned"], m["connected"]),
        (1, 1, 1),
        "{m:?}"
    );
    let json = ctx.metrics().snapshot().to_json();
    assert!(json.contains("\"node\":71,\"leases\":1,"), "{json}");
    let text = ctx.metrics().snapshot().to_prometheus();
    assert!(
        text.contains("rdmapool_pool_server_chunks_owned{node=\"71\"} 1\n"),
        "{text}"
    );

    // Draining shows in the region's state word.
    c.block_on(c.free(p)).unwrap();
    let stopping = std::thread::spawn(move || server.shutdown(Duration::from_secs(1)));
    // Node 71 by id: the client dials the never-reached address again by itself, and
    // another test's server may have taken that port meanwhile.
    wait_until("node_stats sees the server draining", || {
        c.block_on(c.node_stats())
            .ok()
            .and_then(|v| v.iter().find(|s| s.node == 71).map(|s| s.draining))
            .unwrap_or(false)
    });
    stopping.join().unwrap();
    // Dropped, the server leaves the listing.
    assert!(listed(&ctx, 71).is_none());
}
