//! `rdma-tool pool ...`: a one-shot client of the cross-node memory pool, for shells and
//! scripts. Pointers are printed and taken as `node:offset:len:incarnation` (decimal, the server's
//! incarnation in `0x` hex: a pointer into a restarted server is refused as stale).

mod op;
mod session;

use crate::{Result, ToolError};
use op::{check, Op};
use rdmapool::fabric::Transport;
use rdmapool::remote::{ClientConfig, Membership, PoolClient, StaticMembership};
use session::Session;
use std::path::PathBuf;

/// How a one-shot client finds and joins the pool (shared by `pool` and `store`).
#[derive(clap::Args)]
pub struct ConnArgs {
    /// Memory servers, comma-separated ip:port.
    #[arg(long, required_unless_present_any = ["servers_file", "etcd"])]
    servers: Option<String>,
    /// A file of memory servers, one ip:port per line (`#` starts a comment).
    #[arg(long, conflicts_with = "servers")]
    servers_file: Option<PathBuf>,
    /// Find the servers in etcd at `--etcd` (built in by default), under `--etcd-prefix`.
    #[command(flatten)]
    pub(crate) etcd: crate::etcd_args::EtcdArgs,
    /// This client's id (1 to 2^63 - 1); the same id in a later command finds its
    /// allocations. Without it, the command takes a free one of the 64 one-shot ids from
    /// 2^62 (it says which), so that commands run at once do not collide.
    #[arg(long, value_parser = crate::units::count_arg(rdmapool::remote::MAX_CLIENT_ID))]
    client_id: Option<u64>,
    #[command(flatten)]
    device: crate::device_args::DeviceArgs,
}

/// Arguments of `pool` (the lease rules are in its help, in main.rs).
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    conn: ConnArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    op: Op,
}

/// Connects, runs the operation, exits (the lease stops being renewed).
pub fn run(args: Args) -> Result<()> {
    // Check the operation's arguments before connecting (which may take half a lease).
    check(&args.op)?;
    let client = connect(&args.conn, "pool")?;
    let session = Session {
        client,
        json: args.json,
    };
    if let Op::Shell = args.op {
        let failed = session.shell();
        linger();
        let failed = failed?;
        return if failed == 0 {
            Ok(())
        } else {
            Err(ToolError::Msg(format!("{failed} command(s) failed")))
        };
    }
    let allocating = matches!(args.op, Op::Alloc { .. });
    let stats = matches!(args.op, Op::Stats);
    let out = session.exec(args.op);
    linger();
    let mut out = out?;
    // In JSON, an unreachable server is a field too (`stats` always has it).
    let unreachable = session.client.unreachable();
    if args.json && !stats && !unreachable.is_empty() {
        if let Ok(serde_json::Value::Object(mut o)) = serde_json::from_str(&out) {
            o.insert(
                "unreachable".into(),
                session::unreachable_json(&unreachable),
            );
            out = serde_json::Value::Object(o).to_string();
        }
    }
    crate::outln!("{out}");
    if allocating {
        crate::errln!(
            "rdma-tool pool: note: client {} stops renewing its lease as this command exits; \
             the server frees the allocation one lease later (`serve --lease`, 2s by default) \
             unless a command with the same --client-id runs before then (`pool shell` keeps \
             one lease for many commands)",
            session.client.client_id()
        );
    }
    Ok(())
}

/// Finds the servers `conn` names and connects to them as its client id (with the cluster
/// or client key the environment gives), warning of those it cannot reach; `command` names
/// the subcommand in the warnings.
pub(crate) fn connect(conn: &ConnArgs, command: &str) -> Result<PoolClient> {
    let members: Box<dyn Membership> = match (&conn.servers, &conn.servers_file, &conn.etcd.etcd) {
        (Some(list), _, _) => Box::new(StaticMembership::parse(list)?),
        (None, Some(path), _) => Box::new(StaticMembership::parse(&read_servers_file(path)?)?),
        #[cfg(feature = "etcd")]
        (None, None, Some(_)) => {
            let cfg = conn
                .etcd
                .config()?
                .ok_or_else(|| ToolError::Msg("no --etcd".into()))?;
            Box::new(rdmapool::remote::EtcdMembership::new(&cfg)?)
        }
        #[cfg(not(feature = "etcd"))]
        (None, None, Some(url)) => return Err(crate::serve::no_etcd(url)),
        (None, None, None) => {
            return Err(ToolError::Msg(
                "no servers: give --servers or --etcd".into(),
            ))
        }
    };
    let ctx = conn.device.open(Transport::Auto)?;
    // The RDMAPOOL_SOFT_BIND hint is for the soft provider only.
    let soft = conn.device.kind() == rdmapool::fabric::ProviderKind::Soft;
    let hint = |server: &std::net::SocketAddr| {
        if soft {
            bind_hint(server)
        } else {
            String::new()
        }
    };
    let pd = ctx.alloc_pd()?;
    let cluster = cluster_key()?;
    let client_key = client_key_from_env()?;
    let ids: Vec<u64> = match conn.client_id {
        Some(id) => vec![id],
        None if client_key.is_some() => {
            return Err(ToolError::Msg(
                "RDMAPOOL_POOL_CLIENT_KEY_FILE proves one client id: give it with --client-id"
                    .into(),
            ))
        }
        None => one_shot_ids(),
    };
    let mut tried = 0;
    let joined = loop {
        let id = ids[tried];
        tried += 1;
        let mut cfg = ClientConfig::new(id);
        cfg.cluster_key = cluster.clone();
        cfg.client_key = client_key.clone();
        match PoolClient::connect(&ctx, &pd, &*members, cfg) {
            // Held by a live command: the next one-shot id.
            Err(rdmapool::Error::ClientIdInUse { .. }) if tried < ids.len() => continue,
            other => break other,
        }
    };
    let client = joined.map_err(|e| {
        // Named when a server off loopback may be unreachable because of it.
        let said = members
            .servers()
            .unwrap_or_default()
            .iter()
            .map(hint)
            .find(|h| !h.is_empty());
        match said {
            Some(said) => ToolError::Msg(format!("{e}{said}")),
            None => e.into(),
        }
    })?;
    for (server, error) in client.unreachable() {
        crate::errln!(
            "rdma-tool {command}: warning: memory server {server} unreachable, going on \
             without it: {error}{}",
            hint(&server)
        );
    }
    Ok(client)
}

/// The ids one-shot commands take when not given `--client-id`: 64 from 2^62, far from the
/// small ids applications pick. A command tries them from a random one on, and takes the
/// first no live client holds (a command's lease ends with it). Their number bounds what
/// one-shot commands can hold at once: the store's chunks of an id are its own, and the
/// next command with that id uses them again.
const ONE_SHOT_IDS: std::ops::Range<u64> = (1 << 62)..(1 << 62) + 64;

/// [`ONE_SHOT_IDS`] from a random one on, wrapping around.
fn one_shot_ids() -> Vec<u64> {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    let n = ONE_SHOT_IDS.end - ONE_SHOT_IDS.start;
    let start = h.finish() % n;
    (0..n)
        .map(|i| ONE_SHOT_IDS.start + (start + i) % n)
        .collect()
}

/// The most a `--servers-file` may hold: a list of addresses, not a data file.
const MAX_SERVERS_FILE: u64 = 1 << 20;

/// Reads `--servers-file`, refusing more than [`MAX_SERVERS_FILE`] bytes (`/dev/zero`
/// would otherwise be read until memory runs out).
fn read_servers_file(path: &std::path::Path) -> Result<String> {
    use std::io::Read;
    let shown = path.display();
    let file = std::fs::File::open(path)
        .map_err(|e| ToolError::Io(format!("--servers-file {shown}"), e))?;
    let mut bytes = Vec::new();
    file.take(MAX_SERVERS_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::Io(format!("--servers-file {shown}"), e))?;
    if bytes.len() as u64 > MAX_SERVERS_FILE {
        return Err(ToolError::Msg(format!(
            "--servers-file {shown}: larger than {}, the most read (a servers file lists \
             ip:port, one per line)",
            crate::units::show(MAX_SERVERS_FILE as usize)
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        ToolError::Msg(format!(
            "--servers-file {shown}: not text (want ip:port, one per line)"
        ))
    })
}

/// For a memory server off loopback on the soft provider, the likely cause of failing to
/// reach it across hosts: a soft NIC (the server's or this process's) listening on
/// loopback. A hint naming `RDMAPOOL_SOFT_BIND` and where this process's NIC listens
/// (empty for a server on loopback).
fn bind_hint(server: &std::net::SocketAddr) -> String {
    if server.ip().is_loopback() {
        return String::new();
    }
    let here = match std::env::var("RDMAPOOL_SOFT_BIND") {
        Ok(bind) => format!("RDMAPOOL_SOFT_BIND={bind}"),
        Err(_) => "RDMAPOOL_SOFT_BIND is unset: loopback".into(),
    };
    format!(
        " (if the server is on another host: every node's soft NIC must listen on an address \
         the others reach, so set RDMAPOOL_SOFT_BIND=<the host's address>:0 on the servers \
         and here ({here}); see docs/rdma-tool.md)"
    )
}

/// Lets the client's lease thread renew once before the process exits. A one-shot client
/// spends most of its life connecting; its lease thread starts only once `connect` returns,
/// and a process that exits before that thread first runs leaves the heartbeat as the last
/// process left it, so the server would count the time since then against the lease and the
/// next command could find the allocations gone. (PoolClient has no explicit renewal.)
fn linger() {
    std::thread::sleep(std::time::Duration::from_millis(30));
}

/// The pool's cluster key, from the file `RDMAPOOL_POOL_KEY_FILE` names (private to its
/// owner, at least 16 bytes); `None` when the variable is unset. `serve` proves it to its
/// clients, and `pool` refuses servers that cannot (docs/rdma-tool.md).
pub(crate) fn cluster_key() -> Result<Option<rdmapool::fabric::PreSharedKey>> {
    match std::env::var("RDMAPOOL_POOL_KEY_FILE") {
        Ok(path) if !path.is_empty() => rdmapool::fabric::PreSharedKey::from_file(&path)
            .map(Some)
            .map_err(|e| ToolError::Msg(format!("RDMAPOOL_POOL_KEY_FILE: {e}"))),
        _ => Ok(None),
    }
}

/// This client id's own key, from the file `RDMAPOOL_POOL_CLIENT_KEY_FILE` names (made by
/// `rdma-tool client-key`; private to its owner); `None` when the variable is unset.
fn client_key_from_env() -> Result<Option<rdmapool::fabric::PreSharedKey>> {
    match std::env::var("RDMAPOOL_POOL_CLIENT_KEY_FILE") {
        Ok(path) if !path.is_empty() => rdmapool::fabric::PreSharedKey::from_file(&path)
            .map(Some)
            .map_err(|e| ToolError::Msg(format!("RDMAPOOL_POOL_CLIENT_KEY_FILE: {e}"))),
        _ => Ok(None),
    }
}

/// Arguments of `client-key`.
#[derive(clap::Args)]
pub struct ClientKeyArgs {
    /// The client id the key is for (1 to 2^63 - 1).
    #[arg(long, value_parser = crate::units::count_arg(rdmapool::remote::MAX_CLIENT_ID))]
    client_id: u64,
    /// Write the key to this new file, readable by its owner only (else: to stdout).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `rdma-tool client-key`: the client id's key (64 hex digits) from the cluster key.
pub fn client_key_command(args: ClientKeyArgs) -> Result<()> {
    let Some(cluster) = cluster_key()? else {
        return Err(ToolError::Msg(
            "client-key needs the cluster key: set RDMAPOOL_POOL_KEY_FILE to its file".into(),
        ));
    };
    let key = rdmapool::remote::client_key(&cluster, args.client_id);
    let text = format!("{}\n", rdmapool::remote::client_key_text(&key));
    match &args.out {
        None => crate::output::write_all(text.as_bytes()),
        Some(path) => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| ToolError::Io(format!("--out {}", path.display()), e))?;
            f.write_all(text.as_bytes())
                .map_err(|e| ToolError::Io(format!("--out {}", path.display()), e))?;
        }
    }
    Ok(())
}
