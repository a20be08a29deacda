//! `rdma-tool store ...`: a one-shot client of the replicated object store on the pool's
//! servers (docs/STORE.md): put, get, rm, ls, stats, repair. Values come from an argument, a file or
//! stdin, and go to stdout or a file; `--json` prints one object per command. Before it
//! exits, the client adds what it counted to the servers' counters (`Store::flush_counters`),
//! so `stats` run after it sees its gets.

use crate::pool::{connect, ConnArgs};
use crate::{Result, ToolError};
use rdmapool::store::{CacheConfig, Eviction, Pin, PutOptions, ServerStats, Store, StoreConfig};
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `store`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    conn: ConnArgs,
    /// Replicas of every object, on distinct servers.
    #[arg(long, default_value_t = 2, value_parser = crate::units::usize_arg(16))]
    replicas: usize,
    /// Use the store as a cache of BYTES per server (`64M`; docs/STORE.md section 12): a
    /// put past the budget evicts sampled values instead of failing for room, and `stats`
    /// shows each server's usage against it. Every client of one cache gives the same.
    #[arg(long, value_name = "BYTES", value_parser = crate::units::size_arg)]
    cache_budget: Option<usize>,
    /// How a cache ranks what it evicts: the least recently read (lru) or the least often
    /// read (lfu), approximated from sampled candidates as Redis does.
    #[arg(long, value_enum, requires = "cache_budget", default_value = "lru")]
    eviction: EvictionArg,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    op: Op,
}

/// A cache's eviction policy, as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EvictionArg {
    /// The least recently read value first.
    Lru,
    /// The least often read value first.
    Lfu,
}

/// A value's pin, as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PinArg {
    /// Never evicted (it stays until replaced, removed or expired).
    Hard,
    /// Kept while it was read or put lately (the cache's soft-pin time), unless nothing
    /// else is left to evict.
    Soft,
}

/// One store operation.
#[derive(clap::Subcommand)]
pub enum Op {
    /// Stores a value under a key (a new version): the value is VALUE, or the bytes of
    /// --file (`-` for stdin).
    Put {
        /// The key (1 to 255 bytes).
        key: String,
        /// The value, as text.
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        value: Option<String>,
        /// Read the value from this file (`-`: stdin).
        #[arg(long)]
        file: Option<PathBuf>,
        /// A time to live (`30s`, `500ms`): once past it the key holds nothing, to every
        /// client (docs/STORE.md section 11). Without it, until replaced or removed.
        #[arg(long, value_parser = crate::units::duration_arg)]
        ttl: Option<Duration>,
        /// Keep the value from a cache's eviction: hard (never evicted) or soft.
        #[arg(long, value_enum)]
        pin: Option<PinArg>,
    },
    /// Prints the value stored under a key (exit status 1 when there is none).
    Get {
        /// The key.
        key: String,
        /// Write the value to this file instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Removes a key.
    Rm {
        /// The key.
        key: String,
    },
    /// Lists the keys that start with PREFIX (all, without one).
    Ls {
        /// The prefix.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// The servers the store uses, the replicas asked for, the keys held, and a table of
    /// each server's counters as every client added them (docs/STORE.md section 2): the
    /// bytes used against the cache's budget, hits, misses, hit rate, evictions and
    /// expirations, and their total.
    Stats,
    /// Prints the store's numbered view (the servers it places keys over), or changes it
    /// with --set: the new view is written on every server, puts made under the old one
    /// are refused and made again, and the keys move by a repair (docs/STORE.md
    /// section 4). For static server lists; with etcd the membership is the view.
    View {
        /// The node ids of the new view's servers, comma-separated (e.g. 1,2,4): each
        /// must be one of --servers and answer.
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
        set: Option<Vec<u32>>,
    },
    /// Brings every key back to --replicas copies on its servers and clears what no longer
    /// belongs (run after a server left, restarted or joined; safe beside running
    /// clients). Exit status 1 when some key could not be repaired.
    Repair {
        /// Keep running, as the cluster's background repairer: repair every DURATION and
        /// whenever a server goes, comes back or restarts, while this client is the
        /// cluster's repairer (one client at a time: elected through an etcd lease with
        /// --etcd, which it then follows; by the repairer word with a static list), and
        /// clear removed keys' tombstones past the hold. One line per repair; stops on
        /// SIGINT/SIGTERM.
        #[arg(long, value_parser = crate::units::duration_arg)]
        every: Option<Duration>,
        /// With --every: how long a removed key's tombstone stays before it is cleared.
        #[arg(long, requires = "every", default_value = "60s", value_parser = crate::units::duration_arg)]
        tombstone_hold: Duration,
    },
}

/// The most a value may be (the store's limit).
const MAX_VALUE: u64 = rdmapool::store::format::MAX_VALUE_LEN;

fn read_value(file: &std::path::Path) -> Result<Vec<u8>> {
    let shown = file.display().to_string();
    let mut bytes = Vec::new();
    let reader: Box<dyn Read> = if shown == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            std::fs::File::open(file).map_err(|e| ToolError::Io(format!("--file {shown}"), e))?,
        )
    };
    reader
        .take(MAX_VALUE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::Io(format!("--file {shown}"), e))?;
    if bytes.len() as u64 > MAX_VALUE {
        return Err(ToolError::Msg(format!(
            "--file {shown}: larger than {}, the largest value",
            crate::units::show(MAX_VALUE as usize)
        )));
    }
    Ok(bytes)
}

/// `store repair --every`: the cluster's background repairer until a signal, a line per
/// repair it ran. With `--etcd`, the client follows the membership and the repairer is
/// elected through an etcd lease; with a static list, by the repairer word.
fn repair_every(
    store: Store,
    pool: std::sync::Arc<rdmapool::remote::PoolClient>,
    conn: &crate::pool::ConnArgs,
    every: Duration,
    json: bool,
) -> Result<()> {
    use rdmapool::store::Repairer;
    crate::signals::install()?;
    let store = std::sync::Arc::new(store);
    let watched = store.clone();
    #[cfg(feature = "etcd")]
    let (repairer, _follower) = match conn.etcd.config()? {
        Some(cfg) => (
            Repairer::start_elected(store, every, &cfg)?,
            Some(rdmapool::remote::EtcdMembership::new(&cfg)?.follow(pool)?),
        ),
        None => (Repairer::start(store, every)?, None),
    };
    #[cfg(not(feature = "etcd"))]
    let repairer = {
        let _ = (pool, conn);
        Repairer::start(store, every)?
    };
    crate::errln!(
        "rdma-tool store: repairing every {} while this client is the cluster's repairer; \
         stop with Ctrl-C",
        crate::units::show_duration(every)
    );
    let (mut shown, mut views_shown) = (0, 0);
    while !crate::signals::stopped() {
        std::thread::sleep(Duration::from_millis(50));
        let st = repairer.stats();
        if st.views_changed != views_shown {
            // The elected repairer changed the store's view (with --etcd): say which.
            views_shown = st.views_changed;
            if let Ok(view) = watched.block_on(watched.view()) {
                if json {
                    crate::outln!("{}", view_json(&view));
                } else {
                    crate::outln!("view {}: servers {:?}", view.number, view.members);
                }
            }
        }
        if st.runs == shown {
            continue;
        }
        shown = st.runs;
        let Some(r) = st.last else { continue };
        if json {
            crate::outln!("{}", repair_json(&r));
        } else {
            crate::outln!(
                "repair {}: {} server(s), {} key(s): {} copied, {} cleared, {} tombstone \
                 slot(s) cleared, {} deferred, {} failed, {} unreadable",
                st.runs,
                r.nodes,
                r.keys,
                r.copied,
                r.cleared,
                r.tombstones_cleared,
                r.deferred,
                r.failed,
                r.unreadable
            );
        }
    }
    drop(repairer); // gives the repairer word back
    Ok(())
}

/// A view as `store --json` prints it (schema `store.schema.json`, `view`).
fn view_json(view: &rdmapool::store::view::View) -> serde_json::Value {
    serde_json::json!({"op": "view", "number": view.number,
        "members": view.members, "previous": view.previous})
}

/// A repair's report as `store --json` prints it (schema `store.schema.json`, `repair`).
fn repair_json(r: &rdmapool::store::RepairReport) -> serde_json::Value {
    serde_json::json!({"op": "repair", "nodes": r.nodes, "keys": r.keys,
        "copied": r.copied, "cleared": r.cleared, "unreadable": r.unreadable,
        "failed": r.failed, "deferred": r.deferred, "conflicts": r.conflicts,
        "reclaimed": r.reclaimed, "released": r.released,
        "reclaim_pending": r.reclaim_pending, "expired": r.expired})
}

/// `items` as JSON strings without loss, and the encoding they are in: `"utf-8"` (the text
/// itself) when every item is UTF-8, else `"base64"` (standard alphabet, padded) for all.
fn lossless(items: &[&[u8]]) -> (Vec<serde_json::Value>, &'static str) {
    use base64::Engine as _;
    match items
        .iter()
        .map(|b| std::str::from_utf8(b))
        .collect::<std::result::Result<Vec<&str>, _>>()
    {
        Ok(text) => (text.into_iter().map(Into::into).collect(), "utf-8"),
        Err(_) => (
            items
                .iter()
                .map(|b| base64::engine::general_purpose::STANDARD.encode(b).into())
                .collect(),
            "base64",
        ),
    }
}

/// Connects, runs the operation, exits.
pub fn run(args: Args) -> Result<()> {
    // Read the value before connecting: a bad file fails fast.
    let value = match &args.op {
        Op::Put { value: Some(v), .. } => Some(v.clone().into_bytes()),
        Op::Put { file: Some(f), .. } => Some(read_value(f)?),
        _ => None,
    };
    let pool = std::sync::Arc::new(connect(&args.conn, "store")?);
    let tombstone_hold = match args.op {
        Op::Repair { tombstone_hold, .. } => tombstone_hold,
        _ => StoreConfig::default().tombstone_hold,
    };
    let cache = args.cache_budget.map(|budget| CacheConfig {
        policy: match args.eviction {
            EvictionArg::Lru => Eviction::Lru,
            EvictionArg::Lfu => Eviction::Lfu,
        },
        ..CacheConfig::new(budget as u64)
    });
    let store = Store::new(
        pool.clone(),
        StoreConfig {
            replicas: args.replicas,
            tombstone_hold,
            cache,
            ..StoreConfig::default()
        },
    )?;
    let json = args.json;
    if let Op::Repair {
        every: Some(every), ..
    } = args.op
    {
        return repair_every(store, pool, &args.conn, every, json);
    }
    let done = one_op(&store, args.op, value, args.replicas, json);
    // What this client counted (hits, misses, expirations) goes to the servers' counters
    // before it exits, whether the operation succeeded or not (a get of a missing key).
    store.block_on(store.flush_counters());
    done
}

/// Runs one operation (not the background repairer) and prints its result.
fn one_op(
    store: &Store,
    op: Op,
    value: Option<Vec<u8>>,
    replicas: usize,
    json: bool,
) -> Result<()> {
    match op {
        Op::Put { key, ttl, pin, .. } => {
            let value = value.unwrap_or_default();
            let options = PutOptions {
                ttl,
                pin: match pin {
                    None => Pin::None,
                    Some(PinArg::Hard) => Pin::Hard,
                    Some(PinArg::Soft) => Pin::Soft,
                },
            };
            let v = store.block_on(store.put_with_options(key.as_bytes(), &value, options))?;
            if json {
                crate::outln!(
                    "{}",
                    serde_json::json!({"op": "put", "key": key, "bytes": value.len(),
                        "seq": v.seq, "writer": v.writer, "replicas": replicas})
                );
            } else {
                crate::outln!(
                    "put {key}: {} bytes, version {} by client {}",
                    value.len(),
                    v.seq,
                    v.writer
                );
            }
        }
        Op::Get { key, out } => {
            let Some(value) = store.block_on(store.get(key.as_bytes()))? else {
                if json {
                    crate::outln!(
                        "{}",
                        serde_json::json!({"op": "get", "key": key, "found": false})
                    );
                }
                return Err(ToolError::Msg(format!("get {key}: no such key")));
            };
            match (&out, json) {
                (Some(path), _) => std::fs::write(path, &value)
                    .map_err(|e| ToolError::Io(format!("--out {}", path.display()), e))?,
                (None, true) => {}
                (None, false) => crate::output::write_all(&value),
            }
            if json {
                // Lossless: the text when it is UTF-8, else base64; null with --out.
                let (shown, encoding) = match out {
                    None => {
                        let (v, e) = lossless(&[&value[..]]);
                        (
                            v.into_iter().next().unwrap_or_default(),
                            serde_json::json!(e),
                        )
                    }
                    Some(_) => (serde_json::Value::Null, serde_json::Value::Null),
                };
                crate::outln!(
                    "{}",
                    serde_json::json!({"op": "get", "key": key, "found": true,
                        "bytes": value.len(), "encoding": encoding, "value": shown})
                );
            }
        }
        Op::Rm { key } => {
            let removed = store.block_on(store.remove(key.as_bytes()))?;
            if json {
                crate::outln!(
                    "{}",
                    serde_json::json!({"op": "rm", "key": key, "removed": removed})
                );
            } else if removed {
                crate::outln!("removed {key}");
            } else {
                crate::outln!("{key}: no such key (nothing removed)");
            }
        }
        Op::Ls { prefix } => {
            let keys = store.block_on(store.list(prefix.as_bytes()))?;
            if json {
                let all: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let (shown, encoding) = lossless(&all);
                crate::outln!(
                    "{}",
                    serde_json::json!({"op": "ls", "prefix": prefix, "encoding": encoding,
                        "keys": shown})
                );
            } else {
                for k in keys {
                    crate::outln!("{}", String::from_utf8_lossy(&k));
                }
            }
        }
        Op::Stats => {
            let nodes: Vec<u32> = store.pool().nodes().iter().map(|n| n.node).collect();
            let keys = store.block_on(store.list(b""))?.len();
            let servers = store.block_on(store.server_stats())?;
            let total = total_of(&servers);
            if json {
                let rows: Vec<serde_json::Value> = servers.iter().map(stats_json).collect();
                let mut total = stats_json(&total);
                if let Some(t) = total.as_object_mut() {
                    t.remove("node");
                }
                crate::outln!(
                    "{}",
                    serde_json::json!({"op": "stats", "nodes": nodes, "replicas": replicas,
                        "keys": keys, "servers": rows, "total": total})
                );
            } else {
                crate::outln!(
                    "store: {} server(s) {nodes:?}, {} replicas per object, {keys} key(s)",
                    nodes.len(),
                    replicas
                );
                print_table(&servers, &total);
            }
        }
        Op::View { set } => {
            let (view, repaired) = match set {
                Some(members) => {
                    let (v, r) = store.block_on(store.set_view(&members))?;
                    (v, Some(r))
                }
                None => (store.block_on(store.view())?, None),
            };
            if json {
                let mut out = view_json(&view);
                if let Some(r) = &repaired {
                    out["op"] = "set_view".into();
                    out["repair"] = repair_json(r);
                }
                crate::outln!("{out}");
            } else if view.number == 0 {
                crate::outln!("no view set: keys are placed over the servers each client is given");
            } else {
                crate::outln!(
                    "view {}: servers {:?}{}",
                    view.number,
                    view.members,
                    if view.moving() {
                        format!(", keys still moving from {:?}", view.previous)
                    } else {
                        String::new()
                    }
                );
                if let Some(r) = repaired {
                    crate::outln!(
                        "moved: {} copied, {} cleared, {} failed, {} deferred",
                        r.copied,
                        r.cleared,
                        r.failed,
                        r.deferred
                    );
                }
            }
        }
        Op::Repair { .. } => {
            let mut r = store.block_on(store.repair())?;
            if r.reclaim_pending > 0 {
                // Space of gone writers is freed on a second look, twice the grace period
                // later (docs/STORE.md section 8).
                std::thread::sleep(StoreConfig::default().grace * 2 + Duration::from_millis(100));
                let again = store.block_on(store.repair())?;
                r.copied += again.copied;
                r.cleared += again.cleared;
                r.reclaimed += again.reclaimed;
                r.released += again.released;
                (
                    r.reclaim_pending,
                    r.unreadable,
                    r.failed,
                    r.conflicts,
                    r.deferred,
                ) = (
                    again.reclaim_pending,
                    again.unreadable,
                    again.failed,
                    again.conflicts,
                    again.deferred,
                );
            }
            if json {
                crate::outln!("{}", repair_json(&r));
            } else {
                crate::outln!(
                    "repair: {} server(s), {} key(s): {} replica(s) copied, {} slot(s) cleared, \
                     {} unreadable, {} failed, {} deferred (a replica down), {} conflict(s) \
                     left alone; {} block(s) of gone writers reclaimed, {} chunk(s) given back",
                    r.nodes,
                    r.keys,
                    r.copied,
                    r.cleared,
                    r.unreadable,
                    r.failed,
                    r.deferred,
                    r.conflicts,
                    r.reclaimed,
                    r.released
                );
            }
            if r.unreadable + r.failed > 0 {
                return Err(ToolError::Msg(format!(
                    "repair: {} key(s) unreadable (every copy damaged), {} failed (run it again)",
                    r.unreadable, r.failed
                )));
            }
        }
    }
    Ok(())
}

/// The servers' counters added up (`node` 0).
fn total_of(servers: &[ServerStats]) -> ServerStats {
    servers
        .iter()
        .fold(ServerStats::default(), |t, s| ServerStats {
            node: 0,
            used: t.used + s.used,
            budget: t.budget + s.budget,
            hits: t.hits + s.hits,
            misses: t.misses + s.misses,
            evictions: t.evictions + s.evictions,
            expirations: t.expirations + s.expirations,
        })
}

/// `used` as a percentage of `budget` (`None` without a budget: not a cache).
fn used_percent(s: &ServerStats) -> Option<f64> {
    (s.budget > 0).then(|| 100.0 * s.used as f64 / s.budget as f64)
}

/// One server's counters as `store --json stats` prints them (schema `store.schema.json`,
/// `server_stats`).
fn stats_json(s: &ServerStats) -> serde_json::Value {
    serde_json::json!({"node": s.node, "used": s.used, "budget": s.budget,
        "used_percent": used_percent(s), "hits": s.hits, "misses": s.misses,
        "hit_rate": s.hit_rate(), "evictions": s.evictions, "expirations": s.expirations})
}

/// The table of `store stats`: a row per server, then the total. `-` where there is no
/// percentage (no budget, no gets).
fn print_table(servers: &[ServerStats], total: &ServerStats) {
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |p| format!("{p:.1}%"));
    let row = |cells: [&dyn std::fmt::Display; 9]| {
        crate::outln!(
            "{:>8} {:>14} {:>14} {:>7} {:>12} {:>12} {:>9} {:>10} {:>12}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8]
        )
    };
    row([
        &"node",
        &"used",
        &"budget",
        &"used %",
        &"hits",
        &"misses",
        &"hit rate",
        &"evictions",
        &"expirations",
    ]);
    let rows = servers.iter().map(|s| (s.node.to_string(), s));
    for (name, s) in rows.chain(std::iter::once(("total".to_string(), total))) {
        row([
            &name,
            &s.used,
            &s.budget,
            &pct(used_percent(s)),
            &s.hits,
            &s.misses,
            &pct(s.hit_rate().map(|r| 100.0 * r)),
            &s.evictions,
            &s.expirations,
        ]);
    }
}
