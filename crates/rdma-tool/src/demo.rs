//! `rdma-tool demo`: two processes, one-sided WRITE, READ, CAS and FAA, every result checked.

use crate::device_args::DeviceArgs;
use crate::peer::PeerProcess;
use crate::{Result, ToolError};
use rdmapool::fabric::*;
use serde_json::{json, Value};
use std::time::Duration;

/// Arguments of `demo`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    device: DeviceArgs,
    /// Path to the target on the soft provider: auto (local when on one host), tcp or local
    /// (verbs has one path).
    #[arg(long, default_value = "auto", value_parser = crate::device_args::single_transport_arg)]
    transport: String,
    /// Print the steps and checks as one JSON object instead of text (the exit code is the
    /// same: 0 when every check held).
    #[arg(long)]
    json: bool,
}

const REGION: usize = 1 << 20; // fits the 8 MiB locked-memory limit of ordinary accounts
const WAIT: Duration = Duration::from_secs(10);

/// What the demo did: printed as it goes, or collected for `--json`.
struct Report {
    json: bool,
    /// The initiator's device, once open.
    device: Option<String>,
    steps: Vec<Value>,
    failures: usize,
}

impl Report {
    /// Starts step `n`.
    fn step(&mut self, title: String) {
        if !self.json {
            crate::outln!("{}. {title}", self.steps.len() + 1);
        }
        self.steps.push(json!({
            "step": self.steps.len() + 1, "title": title, "details": [], "checks": []
        }));
    }

    fn last(&mut self, key: &str) -> &mut Vec<Value> {
        self.steps
            .last_mut()
            .and_then(|s| s[key].as_array_mut())
            .expect("a step was started")
    }

    /// A detail of the current step.
    fn detail(&mut self, text: String) {
        if !self.json {
            crate::outln!("   {text}");
        }
        self.last("details").push(Value::String(text));
    }

    fn check(&mut self, what: &str, ok: bool, detail: String) {
        if !self.json {
            crate::outln!("  {} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
        }
        self.last("checks")
            .push(json!({"check": what, "ok": ok, "detail": detail}));
        if !ok {
            self.failures += 1;
        }
    }
}

struct Demo {
    cq: Cq,
    qp: Qp,
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
}

/// Runs the demo; an error or any failed check makes the process exit non-zero.
pub fn run(args: Args) -> Result<()> {
    let transport = Transport::parse(&args.transport)?;
    args.device.check()?;
    let mut rep = Report {
        json: args.json,
        device: args.device.device.clone(),
        steps: Vec::new(),
        failures: 0,
    };
    let result = steps(&args, transport, &mut rep);
    let error = match &result {
        Ok(()) if rep.failures > 0 => Some(format!(
            "demo failed: {} check(s) did not hold",
            rep.failures
        )),
        Ok(()) => None,
        Err(e) => Some(e.to_string()),
    };
    if args.json {
        let checks: Vec<&Value> = rep
            .steps
            .iter()
            .flat_map(|s| s["checks"].as_array().into_iter().flatten())
            .collect();
        let v = json!({
            "provider": args.device.kind().name(),
            "device": rep.device,
            "transport": args.transport,
            "passed": error.is_none(),
            "checks": checks.len(),
            "checks_failed": rep.failures,
            "error": error,
            "steps": rep.steps,
        });
        crate::outln!("{v}");
    }
    result?;
    match error {
        Some(e) => Err(ToolError::Msg(e)),
        None => {
            if !args.json {
                crate::outln!("demo passed: every result verified");
            }
            Ok(())
        }
    }
}

/// The steps, each check recorded in `rep`; an error stops them.
fn steps(args: &Args, transport: Transport, rep: &mut Report) -> Result<()> {
    let provider = args.device.kind();
    rep.step(format!(
        "starting the target process ({provider} provider, {REGION} bytes exported)"
    ));
    let mut peer = PeerProcess::spawn_on(&args.device, REGION, &args.transport, false)?;
    rep.detail(format!(
        "target pid {} listens for connections on {}",
        peer.pid(),
        peer.cm_addr
    ));

    let ctx = args.device.open(transport)?;
    rep.device = Some(ctx.device().name.clone());
    rep.step(format!(
        "initiator: opening {} ({provider}), registering 64 KiB, connecting a QP",
        ctx.device().name
    ));
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let cfg = QpConfig::default();
    let (qp, r) = peer.connect(&pd, &cq, &cfg)?;
    let buf = pd.alloc_mr(64 * 1024, AccessFlags::LOCAL_WRITE)?;
    rep.detail(format!(
        "QP {} is {}; local lkey={:#010x}",
        qp.qpn(),
        qp.state(),
        buf.lkey()
    ));
    rep.detail(format!(
        "region descriptor from the accept's private data: addr={:#x} len={} rkey={:#010x}",
        r.addr, r.len, r.rkey
    ));
    let d = Demo { cq, qp };

    rep.step("RDMA WRITE 4096 bytes to the target at offset 0".into());
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
    rep.check(
        "target memory holds the written bytes",
        seen == msg,
        format!("{} bytes, completion {}", c.byte_len, c.status),
    );

    rep.step("RDMA READ them back into a different local buffer".into());
    d.post(2, WrOp::Read { remote: r.at(0)? }, buf.sge(8192, 4096)?)?;
    let mut back = vec![0u8; 4096];
    buf.read_at(8192, &mut back)?;
    rep.check(
        "read-back equals what was written",
        back == msg,
        format!("{:?}...", String::from_utf8_lossy(&back[..21])),
    );

    rep.step("compare-and-swap on the 8-byte word at offset 4096 (initially 0)".into());
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
    rep.check(
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
    rep.check(
        "CAS(1 -> 0xBAD) saw 0xC0FFEE and did not swap",
        old == 0xC0FFEE,
        format!("old={old:#x}"),
    );

    rep.step("fetch-and-add 5, twice".into());
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
    rep.check(
        "FAA returned the old values",
        first == 0xC0FFEE && second == 0xC0FFEE + 5,
        format!("{first:#x}, {second:#x}"),
    );
    let target_word = u64::from_ne_bytes(
        peer.dump(4096, 8)?
            .try_into()
            .map_err(|_| ToolError::Msg("short dump".into()))?,
    );
    rep.check(
        "the target's own view of the word",
        target_word == 0xC0FFEE + 10,
        format!("{target_word:#x}"),
    );

    Ok(())
}
