//! `rdma-tool pool ...`: a one-shot client of the cross-node memory pool, for shells and
//! scripts. Pointers are printed and taken as `node:offset:len` (decimal).

use crate::units::{human, parse_size};
use crate::{Result, ToolError};
use rdmapool::fabric::{AccessFlags, Mr, Transport};
use rdmapool::remote::{ClientConfig, Membership, PoolClient, RemotePtr, StaticMembership};
use serde_json::json;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `pool` (the lease rules are in its help, in main.rs).
#[derive(clap::Args)]
pub struct Args {
    /// Memory servers, comma-separated ip:port.
    #[arg(long, required_unless_present_any = ["servers_file", "etcd"])]
    servers: Option<String>,
    /// A file of memory servers, one ip:port per line (`#` starts a comment).
    #[arg(long, conflicts_with = "servers")]
    servers_file: Option<PathBuf>,
    /// Find the servers in etcd at this URL (a build with `--features etcd`), under
    /// `--etcd-prefix`.
    #[arg(long)]
    etcd: Option<String>,
    /// The etcd key prefix of the pool's servers.
    #[arg(long, default_value = "/rdmapool/pool")]
    etcd_prefix: String,
    /// This client's id (non-zero); the same id in a later command finds its allocations.
    #[arg(long, default_value_t = 1)]
    client_id: u64,
    #[command(flatten)]
    device: crate::device_args::DeviceArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    op: Op,
}

/// Operations on the pool.
#[derive(clap::Subcommand, Debug)]
pub enum Op {
    /// Allocates SIZE bytes (K/M/G suffixes); prints the pointer as node:offset:len.
    Alloc {
        /// Bytes to allocate.
        size: String,
        /// Placement key (allocations with the same key prefer the same node).
        #[arg(long)]
        key: Option<u64>,
    },
    /// Writes DATA at OFFSET of PTR (DATA as text, or as hex digits with --hex).
    Write {
        /// node:offset:len, as `alloc` printed it.
        ptr: String,
        /// Offset inside the allocation.
        offset: String,
        /// The bytes.
        data: String,
        /// DATA is hex digits (e.g. 00ff10).
        #[arg(long)]
        hex: bool,
    },
    /// Reads LEN bytes at OFFSET of PTR; prints them as text (non-printable bytes escaped
    /// like \x00) or as hex with --hex.
    Read {
        /// node:offset:len.
        ptr: String,
        /// Offset inside the allocation.
        offset: String,
        /// Bytes to read.
        len: String,
        /// Print hex digits.
        #[arg(long)]
        hex: bool,
    },
    /// Compare-and-swap on the 8-byte word at OFFSET (8-byte aligned); prints the old value.
    Cas {
        /// node:offset:len.
        ptr: String,
        /// Offset inside the allocation.
        offset: String,
        /// Expected value (decimal or 0x hex).
        compare: String,
        /// New value when it matched.
        swap: String,
    },
    /// Fetch-and-add on the 8-byte word at OFFSET (8-byte aligned); prints the old value.
    Faa {
        /// node:offset:len.
        ptr: String,
        /// Offset inside the allocation.
        offset: String,
        /// Amount to add (decimal or 0x hex, wrapping).
        add: String,
    },
    /// Frees an allocation (any client id may free any allocation).
    Free {
        /// node:offset:len.
        ptr: String,
    },
    /// The client's view: nodes, capacity, bytes this client id uses, its live allocations.
    Stats,
    /// Runs commands read from stdin, one per line (e.g. `alloc 100`), on one connection.
    Shell,
}

/// Parses `node:offset:len:incarnation` (or the older `node:offset:len`).
pub fn parse_ptr(s: &str) -> Result<RemotePtr> {
    Ok(s.parse::<RemotePtr>()?)
}

/// A pointer as `node:offset:len:incarnation`.
pub fn show_ptr(p: &RemotePtr) -> String {
    p.to_string()
}

/// Decimal or `0x` hex.
fn parse_u64(s: &str) -> Result<u64> {
    let s = s.trim();
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| ToolError::Msg(format!("bad number {s:?}: want decimal or 0x hex")))
}

fn parse_hex(s: &str) -> Result<Vec<u8>> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ToolError::Msg(format!(
            "bad hex data {s:?}: want an even number of hex digits"
        )));
    }
    Ok((0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("checked hex digits"))
        .collect())
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn atomic_offset(p: &RemotePtr, offset: u64) -> Result<u64> {
    if !p.offset.wrapping_add(offset).is_multiple_of(8) {
        return Err(ToolError::Msg(format!(
            "offset {offset} of {}: atomics need an 8-byte aligned word",
            show_ptr(p)
        )));
    }
    Ok(offset)
}

fn length(s: &str) -> Result<u32> {
    let n = if s.trim() == "0" { 0 } else { parse_size(s)? };
    u32::try_from(n).map_err(|_| ToolError::Msg(format!("length {s}: at most 4G-1 bytes")))
}

struct Session {
    client: PoolClient,
    json: bool,
}

impl Session {
    /// Refuses a pointer that is not a live allocation before touching its memory: one
    /// READ, so that a pointer from an earlier command whose lease has run out fails with
    /// a reason instead of reading or writing memory the pool has taken back.
    fn live(&self, p: RemotePtr) -> Result<()> {
        let c = &self.client;
        c.block_on(c.check_live(p)).map_err(|e| match e {
            rdmapool::Error::NotAllocated(why) => ToolError::Msg(format!(
                "not a live allocation: {why}; a one-shot `pool` command holds its lease only \
                 while it runs, so what it allocated is freed one lease after it exits (`serve \
                 --lease`): allocate and use objects in one `pool shell`"
            )),
            other => other.into(),
        })
    }

    fn buffer(&self, len: usize) -> Result<Arc<Mr>> {
        Ok(Arc::new(
            self.client
                .pd()
                .alloc_mr(len.max(8), AccessFlags::LOCAL_WRITE)?,
        ))
    }

    /// Runs one operation; returns what to print.
    fn exec(&self, op: Op) -> Result<String> {
        let c = &self.client;
        let json = self.json;
        Ok(match op {
            Op::Alloc { size, key } => {
                let size = parse_size(&size)? as u64;
                let p = c.block_on(c.alloc(size, key))?;
                if json {
                    json!({"op": "alloc", "ptr": show_ptr(&p), "node": p.node, "offset": p.offset, "len": p.len})
                        .to_string()
                } else {
                    show_ptr(&p)
                }
            }
            Op::Write {
                ptr,
                offset,
                data,
                hex,
            } => {
                let p = parse_ptr(&ptr)?;
                let offset = parse_u64(&offset)?;
                self.live(p)?;
                let bytes = if hex {
                    parse_hex(&data)?
                } else {
                    data.into_bytes()
                };
                let len = u32::try_from(bytes.len())
                    .map_err(|_| ToolError::Msg("data longer than 4G-1 bytes".into()))?;
                let buf = self.buffer(bytes.len())?;
                buf.write_at(0, &bytes)?;
                c.block_on(c.write(p, offset, buf, 0, len)).0?;
                if json {
                    json!({"op": "write", "ptr": show_ptr(&p), "offset": offset, "written": len})
                        .to_string()
                } else {
                    format!("wrote {len} bytes")
                }
            }
            Op::Read {
                ptr,
                offset,
                len,
                hex,
            } => {
                let p = parse_ptr(&ptr)?;
                let offset = parse_u64(&offset)?;
                let len = length(&len)?;
                self.live(p)?;
                let buf = self.buffer(len as usize)?;
                let (r, buf) = c.block_on(c.read(p, offset, buf, 0, len));
                r?;
                let mut got = vec![0u8; len as usize];
                buf.read_at(0, &mut got)?;
                let text = if hex {
                    to_hex(&got)
                } else {
                    got.escape_ascii().to_string()
                };
                if json {
                    json!({"op": "read", "ptr": show_ptr(&p), "offset": offset, "hex": to_hex(&got)}).to_string()
                } else {
                    text
                }
            }
            Op::Cas {
                ptr,
                offset,
                compare,
                swap,
            } => {
                let p = parse_ptr(&ptr)?;
                let offset = atomic_offset(&p, parse_u64(&offset)?)?;
                let (compare, swap) = (parse_u64(&compare)?, parse_u64(&swap)?);
                self.live(p)?;
                let old = c.block_on(c.compare_and_swap(p, offset, compare, swap))?;
                if json {
                    json!({"op": "cas", "old": old, "swapped": old == compare}).to_string()
                } else {
                    old.to_string()
                }
            }
            Op::Faa { ptr, offset, add } => {
                let p = parse_ptr(&ptr)?;
                let offset = atomic_offset(&p, parse_u64(&offset)?)?;
                self.live(p)?;
                let old = c.block_on(c.fetch_and_add(p, offset, parse_u64(&add)?))?;
                if json {
                    json!({"op": "faa", "old": old}).to_string()
                } else {
                    old.to_string()
                }
            }
            Op::Free { ptr } => {
                let p = parse_ptr(&ptr)?;
                c.block_on(c.free(p))?;
                if json {
                    json!({"op": "free", "freed": show_ptr(&p)}).to_string()
                } else {
                    format!("freed {}", show_ptr(&p))
                }
            }
            Op::Stats => {
                let nodes = c.nodes();
                let allocs = c.block_on(c.allocations())?;
                if json {
                    json!({
                        "op": "stats",
                        "nodes": nodes.iter().map(|n| json!({
                            "node": n.node, "capacity": n.capacity, "used": n.used,
                            "draining": n.draining,
                        })).collect::<Vec<_>>(),
                        "capacity": nodes.iter().map(|n| n.capacity).sum::<u64>(),
                        "used": nodes.iter().map(|n| n.used).sum::<u64>(),
                        "allocations": allocs.iter().map(show_ptr).collect::<Vec<_>>(),
                    })
                    .to_string()
                } else {
                    let mut s = format!(
                        "{:<6} {:>14} {:>14} {:>9}\n",
                        "node", "capacity", "used", "draining"
                    );
                    for n in &nodes {
                        s += &format!(
                            "{:<6} {:>14} {:>14} {:>9}\n",
                            n.node,
                            human(n.capacity),
                            human(n.used),
                            if n.draining { "yes" } else { "no" }
                        );
                    }
                    s += &format!(
                        "total  {:>14} {:>14}\nallocations {}",
                        human(nodes.iter().map(|n| n.capacity).sum::<u64>()),
                        human(nodes.iter().map(|n| n.used).sum::<u64>()),
                        allocs.len()
                    );
                    for a in &allocs {
                        s += &format!("\n  {}", show_ptr(a));
                    }
                    s
                }
            }
            Op::Shell => return Err(ToolError::Msg("`shell` does not nest".into())),
        })
    }

    /// Reads commands from stdin; a failed command prints its error and the shell goes on.
    /// Returns how many failed.
    fn shell(&self) -> Result<usize> {
        #[derive(clap::Parser)]
        #[command(name = "", no_binary_name = true, disable_help_flag = false)]
        struct Line {
            #[command(subcommand)]
            op: Op,
        }
        use clap::Parser;
        let mut failed = 0;
        for line in std::io::stdin().lock().lines() {
            let line = line.map_err(|e| ToolError::Io("stdin".into(), e))?;
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.is_empty() || words[0].starts_with('#') {
                continue;
            }
            if matches!(words[0], "quit" | "exit") {
                break;
            }
            let parsed = Line::try_parse_from(&words);
            if let Err(e) = &parsed {
                if matches!(
                    e.kind(),
                    clap::error::ErrorKind::DisplayHelp
                        | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                ) {
                    print!("{e}"); // `help`, `write --help`: what was asked for, no failure
                    continue;
                }
            }
            let result = parsed
                .map_err(|e| ToolError::Msg(shell_usage_error(&e.to_string())))
                .and_then(|l| self.exec(l.op));
            match result {
                Ok(out) => println!("{out}"),
                Err(e) => {
                    failed += 1;
                    if self.json {
                        println!("{}", json!({ "error": e.to_string() }));
                    } else {
                        println!("error: {e}");
                    }
                }
            }
        }
        Ok(failed)
    }
}

/// A shell line's usage error on one line: clap's message with what it lists (the missing
/// arguments, a tip) and the usage, without the "for more information" footer.
fn shell_usage_error(text: &str) -> String {
    let mut said = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("For more information") {
            continue;
        }
        let line = line.strip_prefix("error: ").unwrap_or(line);
        said.push(match line.strip_prefix("Usage: ") {
            Some(usage) => format!("(usage: {usage})"),
            None => line.to_string(),
        });
    }
    said.join(" ")
}

/// Connects, runs the operation, exits (the lease stops being renewed).
pub fn run(args: Args) -> Result<()> {
    let members: Box<dyn Membership> = match (&args.servers, &args.servers_file, &args.etcd) {
        (Some(list), _, _) => Box::new(StaticMembership::parse(list)?),
        (None, Some(path), _) => Box::new(StaticMembership::from_file(path)?),
        #[cfg(feature = "etcd")]
        (None, None, Some(url)) => {
            let cfg = rdmapool::remote::EtcdConfig::new(vec![url.clone()], &args.etcd_prefix);
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
    if args.client_id == 0 {
        return Err(ToolError::Msg("--client-id must be non-zero".into()));
    }
    // Check the operation's arguments before connecting (which may take half a lease).
    check(&args.op)?;
    let ctx = args.device.open(Transport::Auto)?;
    let pd = ctx.alloc_pd()?;
    let client = PoolClient::connect(&ctx, &pd, &*members, ClientConfig::new(args.client_id))?;
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
    let out = session.exec(args.op);
    linger();
    println!("{}", out?);
    if allocating {
        eprintln!(
            "rdma-tool pool: note: client {} stops renewing its lease as this command exits; \
             the server frees the allocation one lease later (`serve --lease`, 2s by default) \
             unless a command with the same --client-id runs before then (`pool shell` keeps \
             one lease for many commands)",
            args.client_id
        );
    }
    Ok(())
}

/// Lets the client's lease thread renew once before the process exits. A one-shot client
/// spends most of its life connecting; its lease thread starts only once `connect` returns,
/// and a process that exits before that thread first runs leaves the heartbeat as the last
/// process left it, so the server would count the time since then against the lease and the
/// next command could find the allocations gone. (PoolClient has no explicit renewal.)
fn linger() {
    std::thread::sleep(std::time::Duration::from_millis(30));
}

/// Validates the text arguments of `op` without connecting.
fn check(op: &Op) -> Result<()> {
    match op {
        Op::Alloc { size, .. } => {
            parse_size(size)?;
        }
        Op::Write {
            ptr,
            offset,
            data,
            hex,
        } => {
            parse_ptr(ptr)?;
            parse_u64(offset)?;
            if *hex {
                parse_hex(data)?;
            }
        }
        Op::Read {
            ptr, offset, len, ..
        } => {
            parse_ptr(ptr)?;
            parse_u64(offset)?;
            length(len)?;
        }
        Op::Cas {
            ptr,
            offset,
            compare,
            swap,
        } => {
            atomic_offset(&parse_ptr(ptr)?, parse_u64(offset)?)?;
            parse_u64(compare)?;
            parse_u64(swap)?;
        }
        Op::Faa { ptr, offset, add } => {
            atomic_offset(&parse_ptr(ptr)?, parse_u64(offset)?)?;
            parse_u64(add)?;
        }
        Op::Free { ptr } => {
            parse_ptr(ptr)?;
        }
        Op::Stats | Op::Shell => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_round_trip_and_bad_text_is_an_error_not_a_panic() {
        let p = RemotePtr {
            node: 2,
            offset: 2_101_248,
            len: 100,
            incarnation: 0x9c1f_5e2a_77d0_4b13,
        };
        assert_eq!(parse_ptr(&show_ptr(&p)).unwrap(), p);
        assert_eq!(parse_ptr("1:0x1000:8").unwrap().offset, 4096);
        for bad in [
            "",
            "1:2",
            "1:2:3:4:5",
            "1:2:3:zz",
            "x:1:2",
            "1:-5:2",
            "1:2:99999999999999999999",
        ] {
            let e = parse_ptr(bad).unwrap_err().to_string();
            assert!(e.contains("node:offset:len"), "{bad:?}: {e}");
        }
        assert_eq!(parse_hex("00ff10").unwrap(), [0, 255, 16]);
        assert!(parse_hex("0").is_err());
        assert!(parse_hex("zz").is_err());
        assert_eq!(parse_u64("0x10").unwrap(), 16);
        assert!(parse_u64("ten").is_err());
        assert!(atomic_offset(&p, 3).is_err());
        assert_eq!(length("4K").unwrap(), 4096);
        assert!(length("8G").is_err());
    }
}
