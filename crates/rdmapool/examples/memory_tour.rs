//! The memory model and the connection API end to end, on either provider:
//! * a server and a client connect with the one `connect` (the provider's natural manager:
//!   a TCP handshake on soft, RDMA CM on verbs), the request carrying private data;
//! * the server exports one pooled buffer through a memory window that covers exactly it,
//!   and sends the window's descriptor in a SEND;
//! * the client READs through the window into a pooled buffer and into a `Vec<u8>` it
//!   registered without `unsafe`; both come back from the async API and are inspected.
//!
//! ```sh
//! cargo run --release -p rdmapool --example memory_tour               # soft, 127.0.0.1
//! cargo run --release -p rdmapool --example memory_tour -- verbs IP   # IP of an RDMA netdev
//! ```

use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::conn::{connect, Listener};
use rdmapool::cq::{Engine, EngineConfig, Progress};
use rdmapool::fabric::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);
const SECRET: &[u8] = b"exported through a window, nothing else";

/// One side: a context, a PD, and an engine driven by the caller (`run_until`).
fn side(provider: ProviderKind) -> rdmapool::Result<(Context, Pd, Engine)> {
    let ctx = Context::open(ProviderOptions::from_env(provider, None)?)?;
    let pd = ctx.alloc_pd()?;
    let caller = EngineConfig {
        progress: Progress::Caller,
        ..EngineConfig::default()
    };
    let engine = Engine::new(vec![ctx.create_cq(1024)?], caller)?;
    Ok((ctx, pd, engine))
}

/// A side's pool: its buffers are small, so it serves up to 4 KiB, all from one shared 2 MiB
/// chunk. Both sides run in this process, and their two pools (4 MiB) stay inside an
/// ordinary account's 8 MiB locked-memory limit with the rest; two default pools (4 MiB
/// each, every class up to 2 MiB) would fill it on their own.
fn side_pool(pd: &Pd) -> rdmapool::Result<BufferPool> {
    let small = PoolConfig {
        largest: 4096,
        ..PoolConfig::default()
    };
    BufferPool::new(pd.clone(), small)
}

fn server(provider: ProviderKind, listener: Listener) -> rdmapool::Result<()> {
    let (_ctx, pd, engine) = side(provider)?;
    let pool = side_pool(&pd)?;
    let buf = pool.alloc(SECRET.len())?;
    buf.write_at(0, SECRET)?;
    let req = listener.get_request(T)?;
    println!(
        "server: request says {:?}",
        String::from_utf8_lossy(req.private_data())
    );
    let cq = engine.cqs()[0].clone();
    let qp = engine.wrap(req.accept(&pd, &cq, &cq, &QpConfig::default(), b"welcome")?);
    // A window over exactly this buffer, reachable only through this connection.
    let mw = Arc::new(pd.alloc_mw()?);
    let (bound, window) =
        engine.run_until(qp.bind_window(mw, &buf, 0, buf.len(), AccessFlags::REMOTE_READ));
    bound?;
    let desc = pool.alloc(RemoteRegion::ENCODED_LEN)?;
    desc.write_at(0, &window.region().to_bytes())?;
    let (sent, _desc) = engine.run_until(qp.send(desc, 0, RemoteRegion::ENCODED_LEN as u32));
    sent?;
    // Wait for the client's "done" before revoking the window and disconnecting.
    let (done, _) = engine.run_until(qp.recv(pool.alloc(8)?, 0, 8));
    done?;
    let (revoked, ()) = engine.run_until(qp.invalidate(window.region().rkey));
    revoked?;
    println!("server: window revoked");
    Ok(())
}

fn client(provider: ProviderKind, addr: SocketAddr) -> rdmapool::Result<()> {
    let (_ctx, pd, engine) = side(provider)?;
    let pool = side_pool(&pd)?;
    let cq = engine.cqs()[0].clone();
    let conn = connect(
        &pd,
        addr,
        &ConnectSpec::new(&pd, &cq, &QpConfig::default())
            .private_data(b"hello")
            .timeout(T),
    )?;
    println!(
        "client: accepted with {:?}",
        String::from_utf8_lossy(&conn.private_data)
    );
    let qp = engine.wrap(conn.qp);
    // The window's descriptor arrives in a SEND.
    let (got, desc) = engine.run_until(qp.recv(pool.alloc(64)?, 0, 64));
    got?;
    let mut bytes = [0u8; RemoteRegion::ENCODED_LEN];
    desc.read_at(0, &mut bytes)?;
    let window = RemoteRegion::from_bytes(&bytes)?;
    let len = window.len as u32;
    // A READ into a pooled buffer: it comes back holding the data.
    let (read, pooled) =
        engine.run_until(qp.read(pool.alloc(len as usize)?, 0, len, window.at(0)?));
    read?;
    let mut seen = vec![0u8; len as usize];
    pooled.read_at(0, &mut seen)?;
    assert_eq!(seen, SECRET);
    // A READ into a Vec registered without unsafe, given back as a plain Vec.
    let owned = pd.register(vec![0u8; len as usize], AccessFlags::LOCAL_WRITE)?;
    let (read, owned) = engine.run_until(qp.read(owned, 0, len, window.at(0)?));
    read?;
    let plain: Vec<u8> = owned.into_inner();
    assert_eq!(plain, SECRET);
    println!(
        "client: read {:?} through the window",
        String::from_utf8_lossy(&plain)
    );
    let (sent, _) = engine.run_until(qp.send(pool.alloc(8)?, 0, 8));
    sent?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let provider = match args.first() {
        Some(p) => ProviderKind::parse(p)?,
        None => ProviderKind::Soft,
    };
    let ip = args.get(1).map_or("127.0.0.1", String::as_str);
    let ip = ip.parse().map_err(|e| format!("address {ip:?}: {e}"))?;
    let listener = Listener::bind(provider, SocketAddr::new(ip, 0))?;
    let addr = listener.local_addr();
    println!("{provider}: listening on {addr} ({:?})", listener.manager());
    let srv = std::thread::spawn(move || server(provider, listener));
    client(provider, addr)?;
    srv.join().map_err(|_| "the server thread panicked")??;
    println!("memory tour: every check passed");
    Ok(())
}
