use rdmapool::fabric::*;
use rdmapool::remote::regions::Payload;
use rdmapool::remote::step::{Io, Op};
use rdmapool::remote::*;
fn main() -> rdmapool::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let len: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(320);
    let ctx = Context::open(SoftConfig::from_env()?.with_transport(Transport::Tcp))?;
    let s = MemoryServer::start(
        &ctx,
        ServerConfig {
            node: 1,
            size: 64 << 20,
            chunk_size: 4 << 20,
            ..ServerConfig::default()
        },
    )?;
    let members = StaticMembership::new(vec![s.addr()]);
    let cctx = Context::open(SoftConfig::from_env()?.with_transport(Transport::Tcp))?;
    let pd = cctx.alloc_pd()?;
    let pool = PoolClient::connect(&cctx, &pd, &members, ClientConfig::new(7))?;
    let node = pool.regions().up_nodes()[0];
    for round in 0..300 {
        let ops: Vec<Op> = (0..n)
            .map(|i| Op {
                node: 1,
                io: Io::Read {
                    at: node.layout.data_offset + (i as u64 * 4096) % (32 << 20),
                    len,
                },
            })
            .collect();
        let r = pool.block_on(
            pool.regions()
                .perform(&ops, |_| node.incarnation, Payload::None),
        )?;
        assert!(
            r.iter().all(|a| a.bytes().is_some()),
            "round {round}: a read failed"
        );
        if round % 100 == 0 {
            eprintln!("round {round}");
        }
    }
    println!("ok");
    Ok(())
}
