//! `rdma-tool demo`: two processes, one-sided WRITE, READ, CAS and FAA, every result checked.

use crate::peer::PeerProcess;
use crate::{Result, ToolError};
use rdmapool::fabric::*;
use std::time::Duration;

/// Arguments of `demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Path to the target: auto (local when on one host), tcp or local.
    #[arg(long, default_value = "auto")]
    transport: String,
}

const REGION: usize = 1 << 20; // fits the 8 MiB locked-memory limit of ordinary accounts
const WAIT: Duration = Duration::from_secs(10);

struct Demo {
    cq: Cq,
    qp: Qp,
    failures: usize,
}

impl Demo {
    fn post(&self, wr_id: u64, op: WrOp, sge: Sge) -> Result<Completion> {
        self.qp.post_send(&[SendWr {
            wr_id,
            op,
            sg_list: &[sge],
            signaled: true,
        }])?;
        let c = self.cq.wait(1, WAIT)?;
        let c = c
            .first()
            .copied()
            .ok_or_else(|| ToolError::Msg(format!("no completion within {WAIT:?}")))?;
        if c.status != WcStatus::Success {
            return Err(ToolError::Msg(format!(
                "work request {wr_id} failed: {}",
                c.status
            )));
        }
        Ok(c)
    }

    fn check(&mut self, what: &str, ok: bool, detail: String) {
        println!("  {} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            self.failures += 1;
        }
    }
}

/// Runs the demo; an error or any failed check makes the process exit non-zero.
pub fn run(args: Args) -> Result<()> {
    Transport::parse(&args.transport)?;
    println!("1. starting the target process (soft provider, {REGION} bytes exported)");
    let mut peer = PeerProcess::spawn(REGION, &args.transport, false)?;
    println!(
        "   target pid {} listens for connections on {}",
        peer.pid(),
        peer.cm_addr
    );

    println!("2. initiator: opening a soft context, registering 64 KiB, connecting a QP");
    let ctx = crate::peer::open_context(ProviderKind::Soft, Transport::parse(&args.transport)?)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let cfg = QpConfig::default();
    let (qp, r) = peer.connect(&pd, &cq, &cfg)?;
    let buf = pd.alloc_mr(64 * 1024, AccessFlags::LOCAL_WRITE)?;
    println!(
        "   QP {} is {}; local lkey={:#010x}",
        qp.qpn(),
        qp.state(),
        buf.lkey()
    );
    println!(
        "   region descriptor from the accept's private data: addr={:#x} len={} rkey={:#010x}",
        r.addr, r.len, r.rkey
    );
    let mut d = Demo {
        cq,
        qp,
        failures: 0,
    };

    println!("3. RDMA WRITE 4096 bytes to the target at offset 0");
    let msg: Vec<u8> = b"hello from rdmapool! "
        .iter()
        .cycle()
        .take(4096)
        .copied()
        .collect();
    buf.write_at(0, &msg)?;
    let c = d.post(
        1,
        WrOp::Write {
            remote: r.at(0)?,
            imm: None,
        },
        buf.sge(0, 4096)?,
    )?;
    let seen = peer.dump(0, 4096)?;
    d.check(
        "target memory holds the written bytes",
        seen == msg,
        format!("{} bytes, completion {}", c.byte_len, c.status),
    );

    println!("4. RDMA READ them back into a different local buffer");
    d.post(2, WrOp::Read { remote: r.at(0)? }, buf.sge(8192, 4096)?)?;
    let mut back = vec![0u8; 4096];
    buf.read_at(8192, &mut back)?;
    d.check(
        "read-back equals what was written",
        back == msg,
        format!("{:?}...", String::from_utf8_lossy(&back[..21])),
    );

    println!("5. compare-and-swap on the 8-byte word at offset 4096 (initially 0)");
    let word = r.at(4096)?;
    let res = buf.sge(16384, 8)?;
    d.post(
        3,
        WrOp::CompareSwap {
            remote: word,
            compare: 0,
            swap: 0xC0FFEE,
        },
        res,
    )?;
    let old = buf.read_u64(16384)?;
    d.check(
        "CAS(0 -> 0xC0FFEE) saw 0 and swapped",
        old == 0,
        format!("old={old:#x}"),
    );
    d.post(
        4,
        WrOp::CompareSwap {
            remote: word,
            compare: 1,
            swap: 0xBAD,
        },
        res,
    )?;
    let old = buf.read_u64(16384)?;
    d.check(
        "CAS(1 -> 0xBAD) saw 0xC0FFEE and did not swap",
        old == 0xC0FFEE,
        format!("old={old:#x}"),
    );

    println!("6. fetch-and-add 5, twice");
    d.post(
        5,
        WrOp::FetchAdd {
            remote: word,
            add: 5,
        },
        res,
    )?;
    let first = buf.read_u64(16384)?;
    d.post(
        6,
        WrOp::FetchAdd {
            remote: word,
            add: 5,
        },
        res,
    )?;
    let second = buf.read_u64(16384)?;
    d.check(
        "FAA returned the old values",
        first == 0xC0FFEE && second == 0xC0FFEE + 5,
        format!("{first:#x}, {second:#x}"),
    );
    let target_word = u64::from_ne_bytes(
        peer.dump(4096, 8)?
            .try_into()
            .map_err(|_| ToolError::Msg("short dump".into()))?,
    );
    d.check(
        "the target's own view of the word",
        target_word == 0xC0FFEE + 10,
        format!("{target_word:#x}"),
    );

    if d.failures > 0 {
        return Err(ToolError::Msg(format!(
            "demo failed: {} check(s) did not hold",
            d.failures
        )));
    }
    println!("demo passed: every result verified");
    Ok(())
}
