//! The remote pool across hosts: three memory servers and three client processes, each host
//! its own network namespace on one bridged LAN (support/lan.rs), over the soft provider's
//! TCP path. Needs root and iproute2 (CI has both); elsewhere it says why it
//! skips.

use crate::support::child::{parent_line as stdin_line, Child as Proc};
use crate::support::lan::Lan;
use crate::support::*;
use rdmapool::fabric::*;
use rdmapool::remote::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn parse_ptr(s: &str) -> RemotePtr {
    s.parse().expect("a node:offset:len pointer")
}

/// The child's side: `pool-server` (serves until stdin closes, reports stats on request)
/// and `pool-client` (random operations against a model, then reports what it holds and
/// frees it on request).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("RDMAPOOL_TEST_CHILD") else {
        return;
    };
    let env = |k: &str| std::env::var(k).unwrap();
    let ctx = Context::open(SoftConfig::from_env().unwrap()).unwrap(); // binds RDMAPOOL_SOFT_BIND, this host's address
    match role.as_str() {
        "pool-server" => {
            let s = MemoryServer::start(
                &ctx,
                ServerConfig {
                    node: env("NODE").parse().unwrap(),
                    size: 8 << 20,
                    chunk_size: 256 << 10,
                    clients: 64,
                    lease: Duration::from_secs(2),
                    // PORT: a restart listens where its predecessor did.
                    listen: format!(
                        "{}:{}",
                        env("IP"),
                        std::env::var("PORT").unwrap_or("0".into())
                    )
                    .parse()
                    .unwrap(),
                    cluster_key: pool_key_from_env(),
                    ..ServerConfig::default()
                },
            )
            .unwrap();
            println!("@{}", s.addr());
            loop {
                match stdin_line().as_str() {
                    "" => return,
                    _ => {
                        let st = s.stats();
                        println!("@stats {} {}", st.chunks_owned, st.requests_handled);
                    }
                }
            }
        }
        "pool-client" => {
            let servers = StaticMembership::parse(&env("SERVERS")).unwrap();
            let id: u64 = env("ID").parse().unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let mut cfg = ClientConfig::new(id);
            cfg.cluster_key = pool_key_from_env();
            let c = PoolClient::connect(&ctx, &pd, &servers, cfg).unwrap();
            let buf = Arc::new(pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).unwrap());
            let mut rng = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut model: BTreeMap<RemotePtr, Vec<u8>> = BTreeMap::new();
            for _ in 0..200 {
                let r = next() % 10;
                if r < 6 || model.is_empty() {
                    let size = 1 + next() % 2000;
                    let p = c.block_on(c.alloc(size, None)).unwrap();
                    let data: Vec<u8> = (0..size).map(|_| next() as u8).collect();
                    buf.write_at(0, &data).unwrap();
                    c.block_on(c.write(p, 0, buf.clone(), 0, size as u32))
                        .0
                        .unwrap();
                    model.insert(p, data);
                } else if r < 8 {
                    let k = (next() % model.len() as u64) as usize;
                    let (p, data) = model.iter().nth(k).unwrap();
                    c.block_on(c.read(*p, 0, buf.clone(), 4096, p.len as u32))
                        .0
                        .unwrap();
                    let mut got = vec![0u8; p.len as usize];
                    buf.read_at(4096, &mut got).unwrap();
                    assert!(&got == data, "{p:?} changed");
                } else {
                    let k = (next() % model.len() as u64) as usize;
                    let p = *model.keys().nth(k).unwrap();
                    c.block_on(c.free(p)).unwrap();
                    model.remove(&p);
                }
            }
            let held: Vec<String> = model.keys().map(|p| p.to_string()).collect();
            println!("@live {}", held.join(" "));
            let mut line = stdin_line();
            if let Some(node) = line.strip_prefix("stale ") {
                // Node `node` was killed and restarted: every pointer into it must fail,
                // as down until the client rejoins the new incarnation, then as stale; it
                // must never succeed (the new server's memory is someone else's).
                let node: u32 = node.parse().unwrap();
                let gone: Vec<RemotePtr> =
                    model.keys().filter(|p| p.node == node).copied().collect();
                let until = std::time::Instant::now() + Duration::from_secs(30);
                for p in &gone {
                    loop {
                        let (r, _) = c.block_on(c.write(*p, 0, buf.clone(), 0, p.len as u32));
                        match r {
                            Err(rdmapool::Error::StalePointer { .. }) => break,
                            Err(rdmapool::Error::NodeDown { .. }) => {
                                assert!(std::time::Instant::now() < until, "{p}: never stale");
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            other => panic!("{p}: a pointer into a restarted server: {other:?}"),
                        }
                    }
                    model.remove(p);
                }
                // The new incarnation takes new allocations.
                let fresh = loop {
                    let p = c.block_on(c.alloc(64, None)).unwrap();
                    if p.node == node {
                        break p;
                    }
                    c.block_on(c.free(p)).unwrap();
                };
                c.block_on(c.free(fresh)).unwrap();
                println!("@stale {}", gone.len());
                line = stdin_line();
            }
            if line == "free" {
                for (p, data) in &model {
                    c.block_on(c.read(*p, 0, buf.clone(), 0, p.len as u32))
                        .0
                        .unwrap();
                    let mut got = vec![0u8; p.len as usize];
                    buf.read_at(0, &mut got).unwrap();
                    assert!(&got == data, "{p:?} changed while others worked");
                    c.block_on(c.free(*p)).unwrap();
                }
                println!("@freed");
            }
            let _ = stdin_line();
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn three_servers_and_three_clients_on_four_hosts() {
    if soft_only("the soft TCP path between namespaces") {
        return;
    }
    let lan = match Lan::new(4) {
        Ok(l) => l,
        Err(why) if std::env::var("CI").is_err() => {
            eprintln!("skipped: {why}");
            return;
        }
        Err(why) => panic!("CI must be able to make network namespaces: {why}"),
    };
    let mut servers: Vec<Proc> = lan.hosts[..3]
        .iter()
        .enumerate()
        .map(|(i, (ns, ip))| {
            let (node, bind) = ((i + 1).to_string(), format!("{ip}:0"));
            Proc::spawn_in(
                Some(ns),
                module_path!(),
                "pool-server",
                &[("NODE", &node), ("IP", ip), ("RDMAPOOL_SOFT_BIND", &bind)],
            )
        })
        .collect();
    let addrs: Vec<String> = servers.iter_mut().map(|s| s.line()).collect();
    for (a, (_, ip)) in addrs.iter().zip(&lan.hosts) {
        assert!(
            a.starts_with(ip.as_str()),
            "{a} listens on its host's address"
        );
    }
    let (client_ns, client_ip) = &lan.hosts[3];
    let mut clients: Vec<Proc> = (1..=3)
        .map(|id| {
            let (id, servers, bind) = (id.to_string(), addrs.join(","), format!("{client_ip}:0"));
            Proc::spawn_in(
                Some(client_ns),
                module_path!(),
                "pool-client",
                &[
                    ("ID", &id),
                    ("SERVERS", &servers),
                    ("RDMAPOOL_SOFT_BIND", &bind),
                    ("RDMAPOOL_SOFT_TRANSPORT", "tcp"),
                ],
            )
        })
        .collect();
    // All three hold their allocations now: no byte is allocated twice, across clients.
    let mut held: Vec<RemotePtr> = Vec::new();
    for c in &mut clients {
        let line = c.line();
        let rest = line.strip_prefix("live").expect("a live line");
        held.extend(rest.split_whitespace().map(parse_ptr));
    }
    assert!(
        held.len() > 30,
        "the clients hold allocations: {}",
        held.len()
    );
    let nodes: std::collections::HashSet<u32> = held.iter().map(|p| p.node).collect();
    assert_eq!(nodes.len(), 3, "every server got allocations");
    held.sort();
    for w in held.windows(2) {
        assert!(
            w[0].node != w[1].node || w[0].offset + w[0].len <= w[1].offset,
            "two allocations overlap: {w:?}"
        );
    }
    // Kill node 1's server (-9) and start it again where it was: the clients hold pointers
    // into it across the restart, and none of them may reach the new memory.
    let (ns1, ip1) = &lan.hosts[0];
    let port = addrs[0].rsplit(':').next().unwrap().to_string();
    // Killed and reaped before its successor starts, which binds the same port.
    drop(servers.remove(0));
    servers.insert(
        0,
        Proc::spawn_in(
            Some(ns1),
            module_path!(),
            "pool-server",
            &[
                ("NODE", "1"),
                ("IP", ip1),
                ("PORT", &port),
                ("RDMAPOOL_SOFT_BIND", &format!("{ip1}:0")),
            ],
        ),
    );
    assert_eq!(
        servers[0].line(),
        addrs[0],
        "the restart listens where node 1 did"
    );
    let on_node_1 = held.iter().filter(|p| p.node == 1).count();
    assert!(on_node_1 > 0);
    for c in &mut clients {
        c.say("stale 1");
    }
    let mut stale = 0;
    for c in &mut clients {
        let line = c.line();
        let n: usize = line
            .strip_prefix("stale ")
            .expect("a stale line")
            .parse()
            .unwrap();
        stale += n;
    }
    assert_eq!(
        stale, on_node_1,
        "every pointer into node 1 was refused as stale"
    );
    for c in &mut clients {
        c.say("free");
    }
    for c in &mut clients {
        assert_eq!(c.line(), "freed");
    }
    for s in &mut servers {
        s.say("stats");
        assert_eq!(
            s.line(),
            "stats 0 0",
            "everything freed, no request handled"
        );
    }
}
