//! The object store across hosts, under failure (issue #23): three memory servers and
//! three client processes, each host its own network namespace on one bridged LAN
//! (support/lan.rs), over the soft provider's TCP path. The clients put, get and remove at
//! random for a minute (`r = 2`) and log every operation; meanwhile one server is killed
//! (`kill -9`) and started again where it was, with empty memory, and a repair runs from
//! another host while the clients work. Afterwards a last repair runs and every key is read
//! once more. The history checker (store_hosts/history.rs) then holds every answer to
//! docs/STORE.md's promises: no torn or invented bytes, no acknowledged write lost, never an
//! older value after a newer one was acknowledged; and every key is back to two replicas.
//!
//! Needs root and iproute2 (CI has both); elsewhere it says why it skips. The minute is
//! `RDMAPOOL_STORE_HOSTS_SECS` (default 60).

mod history;

use crate::support::child::{parent_line as stdin_line, Child as Proc};
use crate::support::lan::Lan;
use crate::support::*;
use history::{check, id_of, value_of, Op, Outcome};
use rdmapool::fabric::*;
use rdmapool::remote::*;
use rdmapool::store::{Store, StoreConfig};
use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Keys each client alone writes, and keys every client writes.
const OWN_KEYS: usize = 20;
const SHARED_KEYS: usize = 5;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} is set by the parent"))
}

fn open_store(id: u64) -> Store {
    let ctx = Context::open(SoftConfig::from_env().unwrap()).unwrap(); // binds RDMAPOOL_SOFT_BIND
    let servers = StaticMembership::parse(&env("SERVERS")).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut cfg = ClientConfig::new(id);
    cfg.cluster_key = pool_key_from_env();
    let pool = PoolClient::connect(&ctx, &pd, &servers, cfg).unwrap();
    Store::new(pool, StoreConfig::default()).unwrap()
}

fn all_keys(clients: u64) -> Vec<String> {
    let own = (1..=clients).flat_map(|c| (0..OWN_KEYS).map(move |k| format!("c{c}/k{k}")));
    own.chain((0..SHARED_KEYS).map(|k| format!("shared/k{k}")))
        .collect()
}

/// A get's answer as the log says it.
fn outcome_of(r: rdmapool::Result<Option<Vec<u8>>>) -> Outcome {
    match r {
        Ok(Some(bytes)) => id_of(&bytes).map_or(Outcome::Corrupt, Outcome::Val),
        Ok(None) => Outcome::Nothing,
        Err(_) => Outcome::Err,
    }
}

/// Repairs until a pass has nothing failed, and prints its report.
fn repair_line(st: &Store) {
    let until = Instant::now() + WAIT * 3;
    loop {
        match st.block_on(st.repair()) {
            Ok(r) if r.failed == 0 || Instant::now() > until => {
                println!(
                    "@repair {} {} {} {} {} {}",
                    r.nodes, r.keys, r.copied, r.cleared, r.failed, r.unreadable
                );
                return;
            }
            Ok(_) => {}
            Err(e) if Instant::now() > until => panic!("repair: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The child's side: `store-server`, `store-client` (the random workload, logged),
/// `store-repair` (one repair) and `store-check` (a repair, then every key read and
/// located).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("RDMAPOOL_TEST_CHILD") else {
        return;
    };
    match role.as_str() {
        "store-server" => {
            let ctx = Context::open(SoftConfig::from_env().unwrap()).unwrap();
            let port = std::env::var("PORT").unwrap_or("0".into());
            let s = MemoryServer::start(
                &ctx,
                ServerConfig {
                    node: env("NODE").parse().unwrap(),
                    size: 32 << 20,
                    chunk_size: 1 << 20,
                    clients: 64,
                    lease: Duration::from_secs(2),
                    listen: format!("{}:{port}", env("IP")).parse().unwrap(),
                    cluster_key: pool_key_from_env(),
                    ..ServerConfig::default()
                },
            )
            .unwrap();
            println!("@{}", s.addr());
            while !stdin_line().is_empty() {}
        }
        "store-client" => {
            let id: u64 = env("ID").parse().unwrap();
            let st = open_store(id);
            let until = Instant::now() + Duration::from_secs(env("SECS").parse().unwrap());
            let mut log = std::io::BufWriter::new(std::fs::File::create(env("LOG")).unwrap());
            let mut rng = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let (mut ops, mut n) = (0u64, 0u64);
            while Instant::now() < until {
                let key = if next() % 5 == 0 {
                    format!("shared/k{}", next() % SHARED_KEYS as u64)
                } else {
                    format!("c{id}/k{}", next() % OWN_KEYS as u64)
                };
                let roll = next() % 20;
                let start = now_ns();
                let (kind, vid, outcome) = if roll < 10 {
                    n += 1;
                    let vid = format!("{id}.{n}");
                    let r = st.block_on(st.put(key.as_bytes(), &value_of(&vid)));
                    let o = if r.is_ok() { Outcome::Ok } else { Outcome::Err };
                    ("put", Some(vid), o)
                } else if roll < 17 {
                    ("get", None, outcome_of(st.block_on(st.get(key.as_bytes()))))
                } else {
                    let r = st.block_on(st.remove(key.as_bytes()));
                    (
                        "rm",
                        None,
                        if r.is_ok() { Outcome::Ok } else { Outcome::Err },
                    )
                };
                let op = Op {
                    kind: kind.into(),
                    key,
                    vid,
                    start,
                    end: now_ns(),
                    outcome,
                };
                writeln!(log, "{}", op.line()).unwrap();
                ops += 1;
                if op.outcome == Outcome::Err {
                    // Give a failed server's absence a moment to be noticed.
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            log.flush().unwrap();
            println!("@done {ops}");
            let _ = stdin_line();
        }
        "store-repair" => {
            let st = open_store(env("ID").parse().unwrap());
            repair_line(&st);
            let _ = stdin_line();
        }
        "store-check" => {
            let st = open_store(env("ID").parse().unwrap());
            repair_line(&st);
            let mut out = std::io::BufWriter::new(std::fs::File::create(env("OUT")).unwrap());
            for key in all_keys(env("CLIENTS").parse().unwrap()) {
                let until = Instant::now() + WAIT;
                let got = loop {
                    match outcome_of(st.block_on(st.get(key.as_bytes()))) {
                        Outcome::Err if Instant::now() < until => {
                            std::thread::sleep(Duration::from_millis(50))
                        }
                        o => break o,
                    }
                };
                let at = st.block_on(st.locate(key.as_bytes())).unwrap();
                let same = at.windows(2).all(|w| w[0].version == w[1].version);
                let got = Op {
                    kind: "get".into(),
                    key: key.clone(),
                    vid: None,
                    start: 0,
                    end: 0,
                    outcome: got,
                };
                writeln!(out, "{} {} {same}", got.line(), at.len()).unwrap();
            }
            out.flush().unwrap();
            println!("@checked");
            let _ = stdin_line();
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn_server(lan: &Lan, i: usize, port: Option<&str>) -> Proc {
    let (ns, ip) = &lan.hosts[i];
    let node = (i + 1).to_string();
    let bind = format!("{ip}:0");
    let mut env = vec![
        ("NODE", node.as_str()),
        ("IP", ip.as_str()),
        ("RDMAPOOL_SOFT_BIND", bind.as_str()),
    ];
    if let Some(p) = port {
        env.push(("PORT", p));
    }
    Proc::spawn_in(Some(ns), module_path!(), "store-server", &env)
}

fn spawn_client(lan: &Lan, host: usize, role: &str, servers: &str, extra: &[(&str, &str)]) -> Proc {
    let (ns, ip) = &lan.hosts[host];
    let bind = format!("{ip}:0");
    let mut env = vec![
        ("SERVERS", servers),
        ("RDMAPOOL_SOFT_BIND", bind.as_str()),
        ("RDMAPOOL_SOFT_TRANSPORT", "tcp"),
    ];
    env.extend_from_slice(extra);
    Proc::spawn_in(Some(ns), module_path!(), role, &env)
}

fn read_log(path: &std::path::Path) -> Vec<Op> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| Op::parse(l).unwrap_or_else(|| panic!("a log line: {l}")))
        .collect()
}

#[test]
fn a_minute_of_random_clients_with_a_server_killed_and_restarted_loses_nothing() {
    if soft_only("the soft TCP path between namespaces") {
        return;
    }
    let lan = match Lan::new(5) {
        Ok(l) => l,
        Err(why) if std::env::var("CI").is_err() => {
            eprintln!("skipped: {why}");
            return;
        }
        Err(why) => panic!("CI must be able to make network namespaces: {why}"),
    };
    let secs: u64 = std::env::var("RDMAPOOL_STORE_HOSTS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = std::env::temp_dir().join(format!("rdmapool-store-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut servers: Vec<Proc> = (0..3).map(|i| spawn_server(&lan, i, None)).collect();
    let addrs: Vec<String> = servers.iter_mut().map(|s| s.line()).collect();
    let list = addrs.join(",");
    let clients = 3u64;
    let started = Instant::now();
    let mut workers: Vec<Proc> = (1..=clients)
        .map(|id| {
            let log = dir.join(format!("c{id}.log"));
            let (id, secs, log) = (id.to_string(), secs.to_string(), log.display().to_string());
            let extra = [
                ("ID", id.as_str()),
                ("SECS", secs.as_str()),
                ("LOG", log.as_str()),
            ];
            spawn_client(&lan, 3, "store-client", &list, &extra)
        })
        .collect();
    // A third of the way in: kill -9 node 2's server; a little later start it again where
    // it was (same id, same port, empty memory).
    let at = |frac: f64| started + Duration::from_secs_f64(secs as f64 * frac);
    std::thread::sleep(at(0.33).saturating_duration_since(Instant::now()));
    drop(servers.remove(1));
    std::thread::sleep(at(0.5).saturating_duration_since(Instant::now()));
    let port = addrs[1].rsplit(':').next().unwrap().to_string();
    servers.insert(1, spawn_server(&lan, 1, Some(&port)));
    assert_eq!(
        servers[1].line(),
        addrs[1],
        "the restart listens where node 2 did"
    );
    // While the clients work, a repair from another host.
    std::thread::sleep(at(0.66).saturating_duration_since(Instant::now()));
    let mut fixer = spawn_client(&lan, 4, "store-repair", &list, &[("ID", "10")]);
    let during = fixer.line();
    eprintln!("repair during the workload: {during}");
    // Then node 3's server freezes (SIGSTOP) for a while and comes back as it was: the
    // clients' operations on it time out, they carry on without it, and find it again.
    std::thread::sleep(at(0.75).saturating_duration_since(Instant::now()));
    servers[2].stop();
    std::thread::sleep(at(0.85).saturating_duration_since(Instant::now()));
    servers[2].signal(libc::SIGCONT);
    for w in &mut workers {
        assert!(w.line().starts_with("done"), "a client finished");
    }
    // After: a repair, then every key read and located.
    let out = dir.join("final.txt");
    let (out_s, clients_s) = (out.display().to_string(), clients.to_string());
    let extra = [
        ("ID", "11"),
        ("OUT", out_s.as_str()),
        ("CLIENTS", clients_s.as_str()),
    ];
    let mut checker = spawn_client(&lan, 4, "store-check", &list, &extra);
    let last = checker.line();
    assert!(last.starts_with("repair 3 "), "{last}");
    let fields: Vec<usize> = last
        .split(' ')
        .skip(1)
        .map(|f| f.parse().unwrap())
        .collect();
    assert_eq!(
        (fields[4], fields[5]),
        (0, 0),
        "the last repair failed nowhere: {last}"
    );
    assert_eq!(checker.line(), "checked");
    let logs: Vec<Vec<Op>> = (1..=clients)
        .map(|id| read_log(&dir.join(format!("c{id}.log"))))
        .collect();
    let mut finals = HashMap::new();
    let mut replicas_bad = Vec::new();
    for line in std::fs::read_to_string(&out).unwrap().lines() {
        let (op, rest) = line.rsplit_once(' ').unwrap();
        let (op, located) = op.rsplit_once(' ').unwrap();
        let op = Op::parse(op).unwrap();
        let (located, same): (usize, bool) = (located.parse().unwrap(), rest == "true");
        let got = match &op.outcome {
            Outcome::Val(v) => Some(v.clone()),
            Outcome::Nothing => None,
            other => panic!("final read of {}: {other:?}", op.key),
        };
        // Two replicas of one version for a key with a value; a removed or never-written
        // key has its tombstone on both or nothing.
        let whole = same && (located == 2 || (got.is_none() && located == 0));
        if !whole {
            replicas_bad.push(format!(
                "{}: {located} replica(s), same version {same}",
                op.key
            ));
        }
        finals.insert(op.key, got);
    }
    let summary = check(&logs, &finals)
        .unwrap_or_else(|bad| panic!("{} broken promise(s):\n{}", bad.len(), bad.join("\n")));
    eprintln!("store across hosts: {summary:?}; repair during: {during}; last: {last}");
    assert!(
        replicas_bad.is_empty(),
        "not back to r = 2: {replicas_bad:?}"
    );
    assert_eq!(summary.finals_checked, all_keys(clients).len());
    assert!(
        summary.acked_writes > 100 && summary.gets_with_value > 100,
        "enough happened to check: {summary:?}"
    );
    for s in &mut servers {
        s.say("");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
