//! `rdma-tool serve`: runs one memory server of the cross-node pool until SIGINT/SIGTERM
//! arrives, or its stdin closes when stdin is a pipe, a socket or a terminal (whoever
//! started it holds the other end), then drains it. With stdin at /dev/null or a file (a
//! daemon under systemd, `nohup`, `&` in a script) only a signal stops it.

use crate::device_args::DeviceArgs;
use crate::units::{duration_arg, show, show_duration, size_arg};
use crate::{Result, ToolError};
use rdmapool::fabric::Transport;
use rdmapool::remote::{MemoryServer, ServerConfig};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Bytes to export, with a K/M/G suffix (a multiple of 2 MiB; the first chunk holds the
    /// pool's metadata).
    #[arg(long, default_value = "64M", value_parser = size_arg)]
    size: usize,
    /// Bytes per chunk (a power of two, at least 64K); objects up to a chunk can be allocated.
    #[arg(long, default_value = "2M", value_parser = size_arg)]
    chunk_size: usize,
    /// This node's id: unique in the cluster, it names the node in pointers (`node:offset:len`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    node: u32,
    /// Lease of a client (`2s`, `500ms`, `1m`): a client that stops renewing (its process
    /// exited) loses its allocations this long after its last renewal.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    lease: Duration,
    /// Deprecated: --lease in milliseconds.
    #[arg(long, hide = true, conflicts_with = "lease", value_parser = crate::units::millis_arg)]
    lease_ms: Option<u64>,
    /// How many clients can hold a lease at once.
    #[arg(long, default_value_t = 256, value_parser = crate::units::count_arg(65536))]
    clients: u64,
    /// Where to listen for clients (ip:port; port 0 picks one, printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    #[command(flatten)]
    device: DeviceArgs,
    /// Register with etcd at `--etcd` (built in by default), under `--etcd-prefix`, for
    /// clients that follow it.
    #[command(flatten)]
    etcd: crate::etcd_args::EtcdArgs,
    /// On shutdown, how long to wait for clients to release their chunks (`2s`, `500ms`).
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    drain: Duration,
    /// Deprecated: --drain in milliseconds.
    #[arg(long, hide = true, conflicts_with = "drain", value_parser = crate::units::millis_arg)]
    drain_ms: Option<u64>,
    /// Print the `listening`, `stats` and `stopped` lines as JSON objects instead.
    #[arg(long)]
    json: bool,
    /// How often to print a `stats` line with the server's counters (leases held, chunks
    /// owned and free, connections, requests handled) on stdout (`5s`, `500ms`).
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    interval: Duration,
    /// Serve this process's metrics, the server's counters included (`pool_servers` in
    /// JSON, `rdmapool_pool_server_*` in Prometheus), on a Unix socket (a path, or `@name`
    /// for an abstract socket), for `rdma-tool monitor --target` or socat. Without it, the
    /// RDMAPOOL_METRICS_SOCKET and RDMAPOOL_METRICS_HTTP variables are honoured.
    #[arg(long)]
    metrics_socket: Option<String>,
    /// Listen beyond loopback without keys: no cluster key (RDMAPOOL_POOL_KEY_FILE) and, on
    /// the soft provider, no pre-shared key (RDMAPOOL_SOFT_PSK_FILE). Anyone who can reach
    /// the port can then use the pool: for private networks only.
    /// RDMAPOOL_ALLOW_UNAUTHENTICATED=1 does the same.
    #[arg(long)]
    allow_unauthenticated: bool,
    /// Isolate the clients: each reaches only its own lease slot and chunks, enforced by
    /// the NIC (memory windows bound to its connection); chunk claims and releases go
    /// through the server. Without it every connected client may use the whole region.
    #[arg(long)]
    isolated: bool,
    /// With --isolated: the most chunks one client id may own at once (default: no limit).
    #[arg(long, requires = "isolated", value_parser = crate::units::count_arg(1 << 24))]
    max_chunks_per_client: Option<u64>,
    /// With --isolated: the most bytes of chunks one client id (a tenant) may own at once,
    /// its lease's and its store's together, e.g. 64M (default: no limit).
    #[arg(long, requires = "isolated", value_parser = crate::units::size_arg)]
    max_bytes_per_client: Option<usize>,
    /// Keep running when stdin closes, even when stdin is a pipe, a socket or a terminal
    /// (stdin at /dev/null or a file is never watched); only SIGINT or SIGTERM stop it
    /// then.
    #[arg(long)]
    ignore_stdin: bool,
}

/// Whether stdin is held by whoever started the server, so that closing it asks the
/// server to stop: a pipe, a socket or a terminal. /dev/null, a file or a closed stdin (a
/// daemon under systemd or `nohup`, `serve &` in a script) is not: the server runs until
/// a signal (issue #40: before, stdin at /dev/null stopped it at once).
fn stdin_is_held() -> bool {
    // SAFETY: fstat fills the stat buffer we own for descriptor 0 (an error if closed).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(0, &mut st) } != 0 {
        return false;
    }
    let kind = st.st_mode & libc::S_IFMT;
    // SAFETY: isatty only inspects descriptor 0.
    kind == libc::S_IFIFO || kind == libc::S_IFSOCK || unsafe { libc::isatty(0) } == 1
}

/// The error for `--etcd` in a build without etcd support.
#[cfg(not(feature = "etcd"))]
pub fn no_etcd(url: &str) -> ToolError {
    ToolError::Msg(format!(
        "--etcd {url}: rdma-tool was built without etcd support; \
         rebuild with the default features (`cargo install rdma-tool`) or list the servers \
         with --servers/--servers-file instead"
    ))
}

/// Parses the server's flags into a configuration.
fn config(args: &Args) -> Result<ServerConfig> {
    let listen: SocketAddr = args.listen.parse().map_err(|e| {
        ToolError::Msg(format!(
            "--listen {:?}: {e} (want ip:port, e.g. 0.0.0.0:7000)",
            args.listen
        ))
    })?;
    let lease = args.lease_ms.map_or(args.lease, Duration::from_millis);
    // The region is touched page by page when it is allocated: more than the machine has
    // would end in the OOM killer, not an error.
    crate::units::fits_in_memory("--size", args.size)?;
    Ok(ServerConfig {
        node: args.node,
        size: args.size,
        chunk_size: args.chunk_size as u64,
        clients: args.clients,
        lease,
        listen,
        cluster_key: crate::pool::cluster_key()?,
        allow_unauthenticated: args.allow_unauthenticated,
        isolation: if args.isolated {
            rdmapool::remote::Isolation::Isolated
        } else {
            rdmapool::remote::Isolation::Trusted
        },
        max_chunks_per_client: args.max_chunks_per_client.unwrap_or(0),
        max_bytes_per_client: args.max_bytes_per_client.unwrap_or(0) as u64,
    })
}

/// The `stats` line: the server's counters now, as text (`stats node 1 leases 2 ...`) or
/// one JSON object (crates/rdma-tool/schemas/serve.schema.json).
fn stats_line(node: u32, st: &rdmapool::remote::ServerStats, json: bool) -> String {
    let fields = [
        ("leases", st.clients),
        ("lease_slots", st.lease_slots),
        ("chunks", st.chunks),
        ("chunks_owned", st.chunks_owned),
        ("chunks_free", st.chunks - st.chunks_owned),
        ("connections", st.connections),
        ("connected", st.connected),
        ("requests_handled", st.requests_handled),
        ("expired_leases", st.expired_clients),
        ("reclaimed_chunks", st.reclaimed_chunks),
    ];
    if json {
        let mut o = serde_json::Map::new();
        o.insert("stats".into(), node.into());
        for (k, v) in fields {
            o.insert(k.into(), v.into());
        }
        serde_json::Value::Object(o).to_string()
    } else {
        let mut s = format!("stats node {node}");
        for (k, v) in fields {
            s += &format!(" {k} {v}");
        }
        s
    }
}

/// On the soft provider, a server listening beyond loopback while its soft NIC listens on
/// loopback (RDMAPOOL_SOFT_BIND unset, or a loopback address) accepts clients from other
/// hosts whose QPs then cannot reach the NIC: says so, naming the variable.
fn soft_bind_warning(listen: &SocketAddr) -> Option<String> {
    if listen.ip().is_loopback() {
        return None;
    }
    let bind = std::env::var("RDMAPOOL_SOFT_BIND").ok();
    let nic_on_loopback = match &bind {
        None => true,
        Some(b) => b.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback()),
    };
    nic_on_loopback.then(|| {
        format!(
            "--listen {listen} takes clients from other hosts, but the soft NIC listens on \
             loopback ({}): their QPs will not connect. Set RDMAPOOL_SOFT_BIND=<this host's \
             address>:0 (and RDMAPOOL_SOFT_PSK_FILE) on every node; see docs/rdma-tool.md",
            bind.map_or("RDMAPOOL_SOFT_BIND is unset".to_string(), |b| {
                format!("RDMAPOOL_SOFT_BIND={b}")
            })
        )
    })
}

/// How long to drain on shutdown.
fn drain(args: &Args) -> Duration {
    args.drain_ms.map_or(args.drain, Duration::from_millis)
}

/// Runs the server; prints `listening <addr> node <id> ...` once it accepts clients.
pub fn run(args: Args) -> Result<()> {
    #[cfg(not(feature = "etcd"))]
    if let Some(url) = &args.etcd.etcd {
        return Err(no_etcd(url));
    }
    let cfg = config(&args)?;
    let provider = args.device.kind();
    if provider == rdmapool::fabric::ProviderKind::Soft {
        if let Some(warning) = soft_bind_warning(&cfg.listen) {
            crate::errln!("rdma-tool serve: warning: {warning}");
        }
    }
    let ctx = args
        .device
        .open_allowing(Transport::Auto, args.allow_unauthenticated)?;
    crate::signals::install()?;
    let server = MemoryServer::start(&ctx, cfg.clone())?;
    // Serves the server's context (where the server is listed); stops when dropped.
    let metrics = match &args.metrics_socket {
        Some(s) => Some(
            rdmapool_exporter::Endpoint::start(rdmapool_exporter::EndpointConfig {
                unix: Some(rdmapool_exporter::UnixName::parse(s)),
                http: None,
            })
            .map_err(|e| ToolError::Msg(format!("--metrics-socket: {e}")))?,
        ),
        None => rdmapool_exporter::Endpoint::from_env()
            .map_err(|e| ToolError::Msg(format!("metrics endpoint: {e}")))?,
    };
    if let Some(ep) = &metrics {
        ep.watch(ctx.metrics());
    }
    let d = server.descriptor();
    // Registered in etcd while it serves; dropping it (on the way out) revokes the key.
    #[cfg(feature = "etcd")]
    let _registration = match args.etcd.config()? {
        Some(cfg) => Some(rdmapool::remote::EtcdRegistration::register(
            &cfg,
            d.node,
            server.addr(),
        )?),
        None => None,
    };
    let l = d.layout;
    {
        let mut out = std::io::stdout().lock();
        let line = if args.json {
            serde_json::json!({
                "listening": server.addr().to_string(),
                "node": d.node,
                "size": l.len,
                "chunks": l.chunk_count,
                "chunk_size": l.chunk_size,
                "clients": l.client_count,
                "lease_ms": d.lease.as_millis() as u64,
                "provider": provider.name(),
                "device": ctx.device().name,
            })
            .to_string()
        } else {
            format!(
                "listening {} node {} size {} chunks {} chunk_size {} clients {} lease_ms {} provider {}",
                server.addr(),
                d.node,
                l.len,
                l.chunk_count,
                l.chunk_size,
                l.client_count,
                d.lease.as_millis(),
                provider.name()
            )
        };
        writeln!(out, "{line}")
            .and_then(|_| out.flush())
            .map_err(|e| ToolError::Io("stdout".into(), e))?;
    }
    let watch_stdin = !args.ignore_stdin && stdin_is_held();
    crate::errln!(
        "rdma-tool serve: node {} exports {} in {} chunks of {}, lease {}; stop with Ctrl-C{}",
        d.node,
        show(l.len as usize),
        l.chunk_count,
        show(l.chunk_size as usize),
        show_duration(d.lease),
        if watch_stdin {
            " or by closing stdin"
        } else {
            " (or SIGTERM)"
        }
    );
    let stdin_closed = Arc::new(AtomicBool::new(false));
    if watch_stdin {
        let closed = stdin_closed.clone();
        // Detached: it ends with the process (a read on stdin cannot be interrupted).
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            closed.store(true, Ordering::SeqCst);
        });
    }
    let mut next_stats = std::time::Instant::now() + args.interval;
    while !crate::signals::stopped() && !stdin_closed.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        let now = std::time::Instant::now();
        if now >= next_stats {
            next_stats = now + args.interval;
            // Whoever started us may have stopped reading: the server goes on.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", stats_line(d.node, &server.stats(), args.json))
                .and_then(|_| out.flush());
        }
    }
    let st = server.stats();
    crate::errln!(
        "rdma-tool serve: draining node {} ({} of {} chunks owned by {} clients; {} connections, \
         {} expired leases, {} chunks reclaimed)",
        d.node,
        st.chunks_owned,
        st.chunks,
        st.clients,
        st.connections,
        st.expired_clients,
        st.reclaimed_chunks
    );
    let left = server.shutdown(drain(&args));
    // Whoever started us may have stopped reading: not an error, and no panic.
    let mut out = std::io::stdout().lock();
    let line = if args.json {
        serde_json::json!({"stopped": d.node, "chunks_still_owned": left}).to_string()
    } else {
        format!("stopped node {} chunks_still_owned {left}", d.node)
    };
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    #[test]
    fn flags_become_a_config_and_bad_ones_are_refused() {
        let t = T::parse_from(["t", "--size", "8M", "--chunk-size", "256K", "--node", "3"]);
        let c = config(&t.a).unwrap();
        assert_eq!((c.size, c.chunk_size, c.node), (8 << 20, 256 << 10, 3));
        let t = T::parse_from(["t", "--listen", "nowhere"]);
        assert!(config(&t.a).unwrap_err().to_string().contains("ip:port"));
        assert!(T::try_parse_from(["t", "--size", "lots"]).is_err());
        let t = T::parse_from(["t", "--lease", "1500ms", "--drain", "3s"]);
        assert_eq!(config(&t.a).unwrap().lease, Duration::from_millis(1500));
        assert_eq!(drain(&t.a), Duration::from_secs(3));
        // The deprecated millisecond flags still work.
        let t = T::parse_from(["t", "--lease-ms", "700", "--drain-ms", "900"]);
        assert_eq!(config(&t.a).unwrap().lease, Duration::from_millis(700));
        assert_eq!(drain(&t.a), Duration::from_millis(900));
    }
}
