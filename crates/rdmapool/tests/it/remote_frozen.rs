//! A memory server that stops answering (SIGSTOP: connected, silent) must cost a client only
//! that node. Its operations there run out at the client's deadline (5 s), longer than the
//! default 2 s lease; meanwhile the client's leases on the other nodes must keep being
//! renewed. (They were renewed one node after another, so a healthy node's lease ran out
//! while a renewal on the silent node waited, and the client lost that node too.)

use crate::support::child::{parent_line, Child};
use crate::support::*;
use rdmapool::fabric::Transport;
use rdmapool::remote::*;
use rdmapool::Error;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const LEASE: Duration = Duration::from_secs(2);

fn server(node: u32) -> MemoryServer {
    server_on(node, Transport::Tcp)
}

fn server_on(node: u32, transport: Transport) -> MemoryServer {
    MemoryServer::start(
        &node_on(transport).ctx,
        ServerConfig {
            node,
            size: 8 << 20,
            chunk_size: 256 << 10,
            clients: 8,
            lease: LEASE,
            listen: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0),
            ..ServerConfig::default()
        },
    )
    .expect("server starts")
}

/// The child's side: role `server` runs node 1 until stdin closes.
#[test]
fn child_entry() {
    let s = match std::env::var("RDMAPOOL_TEST_CHILD").as_deref() {
        Ok("server") => server(1),
        Ok("mapped") => server_on(1, Transport::Auto),
        _ => return, // an ordinary test run: nothing to do
    };
    println!("@{}", s.addr());
    while !parent_line().is_empty() {}
}

#[test]
fn a_silent_server_costs_the_client_that_node_only() {
    if soft_only("a stopped server process on loopback") {
        return;
    }
    let mut silent = Child::spawn(module_path!(), "server", &[]);
    let silent_addr: SocketAddr = silent.line().parse().unwrap();
    let healthy = server(2);
    let members = StaticMembership::new(vec![silent_addr, healthy.addr()]);
    // Over TCP: on the local path a same-user client would reach the stopped server's
    // memory directly, which keeps working (as it should).
    let n = node_on(Transport::Tcp);
    let c = PoolClient::connect(&n.ctx, &n.pd, &members, ClientConfig::new(7)).unwrap();
    let ptrs: Vec<RemotePtr> = (0..4)
        .map(|_| c.block_on(c.alloc(64, None)).unwrap())
        .collect();
    let on_silent = *ptrs
        .iter()
        .find(|p| p.node == 1)
        .expect("a pointer on node 1");
    let on_healthy = *ptrs
        .iter()
        .find(|p| p.node == 2)
        .expect("a pointer on node 2");

    silent.stop();
    // Two operations on the silent node, each waiting out the deadline: over 2.5 leases
    // during which the healthy node's lease must be renewed by the client's lease thread.
    let started = Instant::now();
    for _ in 0..2 {
        let r = c.block_on(c.fetch_and_add(on_silent, 0, 1));
        assert!(r.is_err(), "a stopped server answered: {r:?}");
    }
    let waited = started.elapsed();
    let r = c.block_on(c.fetch_and_add(on_healthy, 0, 1));
    assert!(
        r.is_ok(),
        "after {waited:?} of a silent node 1, node 2 (healthy, lease {LEASE:?}) failed: {r:?}"
    );
    let p = c.block_on(c.alloc(64, None)).unwrap();
    assert_eq!(p.node, 2, "new allocations go to the healthy node");
    c.block_on(c.free(p)).unwrap();
    assert!(
        matches!(
            c.block_on(c.fetch_and_add(on_silent, 0, 1)),
            Err(Error::NodeDown { node: 1, .. })
        ),
        "the silent node is down"
    );
    silent.signal(libc::SIGCONT);
}

/// A trusted soft server exports memory its NIC owns: a client of the same user on this host
/// maps it and runs READ, WRITE, atomics, alloc and free without the server's CPU, so they
/// keep working while the server process is stopped (as a NIC serves a frozen host). Once
/// the process is gone, the client finds out within its liveness probe: operations fail with
/// the node down, none succeed against the dead server's memory.
#[test]
fn a_stopped_server_still_serves_same_host_clients_through_its_memory_and_a_dead_one_does_not() {
    if soft_only("a stopped server process on this host") {
        return;
    }
    let mut server = Child::spawn(module_path!(), "mapped", &[]);
    let addr: SocketAddr = server.line().parse().unwrap();
    let members = StaticMembership::new(vec![addr]);
    let n = node_on(Transport::Local);
    let c = PoolClient::connect(&n.ctx, &n.pd, &members, ClientConfig::new(7)).unwrap();
    let p = c.block_on(c.alloc(64, None)).unwrap();
    let local = std::sync::Arc::new(
        n.pd.alloc_mr(64, rdmapool::fabric::AccessFlags::LOCAL_WRITE)
            .unwrap(),
    );
    local.write_at(0, b"written before the stop").unwrap();
    c.block_on(c.write(p, 0, local.clone(), 0, 23)).0.unwrap();

    server.stop();
    // Served from the mapping: the stopped process takes no part.
    assert_eq!(c.block_on(c.fetch_and_add(p, 32, 5)).unwrap(), 0);
    assert_eq!(c.block_on(c.fetch_and_add(p, 32, 1)).unwrap(), 5);
    local.write_at(0, &[0u8; 23]).unwrap();
    c.block_on(c.read(p, 0, local.clone(), 0, 23)).0.unwrap();
    let mut got = [0u8; 23];
    local.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"written before the stop");
    let q = c.block_on(c.alloc(64, None)).unwrap();
    c.block_on(c.free(q)).unwrap();
    server.signal(libc::SIGCONT);

    drop(server); // killed and reaped
                  // Issue #40: no window. The first operation after the reaping fails, whatever it is,
                  // and alloc does not hand out a pointer on the dead node.
    let err = c
        .block_on(c.fetch_and_add(p, 32, 1))
        .expect_err("an atomic on a reaped server's memory succeeded");
    assert!(matches!(err, Error::NodeDown { node: 1, .. }), "{err:?}");
    let w = c.block_on(c.write(p, 0, local.clone(), 0, 23)).0;
    assert!(
        matches!(w, Err(Error::NodeDown { node: 1, .. })),
        "a WRITE to a reaped server: {w:?}"
    );
    let r = c.block_on(c.read(p, 0, local.clone(), 0, 23)).0;
    assert!(
        matches!(r, Err(Error::NodeDown { node: 1, .. })),
        "a READ from a reaped server: {r:?}"
    );
    let a = c.block_on(c.alloc(64, None));
    assert!(
        matches!(a, Err(Error::NoServer { .. })),
        "alloc with the only server dead: {a:?}"
    );
}
