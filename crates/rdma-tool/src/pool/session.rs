//! One connection to the pool running operations: one-shot, or a shell reading them from
//! stdin.

use super::op::{atomic_offset, parse_hex, show_ptr, to_hex, Op};
use crate::units::human;
use crate::{Result, ToolError};
use rdmapool::fabric::{AccessFlags, Mr};
use rdmapool::remote::{PoolClient, RemotePtr};
use serde_json::json;
use std::io::BufRead;
use std::sync::Arc;

/// A connected client and how to print.
pub struct Session {
    /// The pool client.
    pub client: PoolClient,
    /// Print JSON instead of text.
    pub json: bool,
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
    pub fn exec(&self, op: Op) -> Result<String> {
        let c = &self.client;
        let json = self.json;
        Ok(match op {
            Op::Alloc { size, key } => {
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
                let p = ptr;
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
                let p = ptr;
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
                let p = ptr;
                let offset = atomic_offset(&p, offset)?;
                self.live(p)?;
                let old = c.block_on(c.compare_and_swap(p, offset, compare, swap))?;
                if json {
                    json!({"op": "cas", "old": old, "swapped": old == compare}).to_string()
                } else {
                    old.to_string()
                }
            }
            Op::Faa { ptr, offset, add } => {
                let p = ptr;
                let offset = atomic_offset(&p, offset)?;
                self.live(p)?;
                let old = c.block_on(c.fetch_and_add(p, offset, add))?;
                if json {
                    json!({"op": "faa", "old": old}).to_string()
                } else {
                    old.to_string()
                }
            }
            Op::Free { ptr } => {
                let p = ptr;
                c.block_on(c.free(p))?;
                if json {
                    json!({"op": "free", "freed": show_ptr(&p)}).to_string()
                } else {
                    format!("freed {}", show_ptr(&p))
                }
            }
            Op::Stats => self.stats()?,
            Op::Shell => return Err(ToolError::Msg("`shell` does not nest".into())),
        })
    }

    /// `stats`: per node, what its region says (one-sided READs: leases, chunks owned and
    /// free, draining) and what this client id uses there; the servers that could not be
    /// reached; this id's live allocations.
    fn stats(&self) -> Result<String> {
        let c = &self.client;
        let loads = c.nodes();
        let regions = c.block_on(c.node_stats())?;
        let allocs = c.block_on(c.allocations())?;
        let used = |node: u32| loads.iter().find(|l| l.node == node).map_or(0, |l| l.used);
        let capacity: u64 = regions.iter().map(|n| n.chunks * n.chunk_size).sum();
        let total_used: u64 = loads.iter().map(|n| n.used).sum();
        let unreachable = c.unreachable();
        if self.json {
            return Ok(json!({
                "op": "stats",
                "nodes": regions.iter().map(|n| json!({
                    "node": n.node,
                    "capacity": n.chunks * n.chunk_size,
                    "used": used(n.node),
                    "draining": n.draining,
                    "chunk_size": n.chunk_size,
                    "chunks": n.chunks,
                    "chunks_owned": n.chunks_owned,
                    "chunks_free": n.chunks_free,
                    "lease_slots": n.lease_slots,
                    "leases": n.leases,
                })).collect::<Vec<_>>(),
                "capacity": capacity,
                "used": total_used,
                "allocations": allocs.iter().map(show_ptr).collect::<Vec<_>>(),
                "unreachable": unreachable_json(&unreachable),
            })
            .to_string());
        }
        let row = |cols: [&str; 7]| {
            let line = format!(
                "{:<6} {:>10} {:>10} {:>9} {:>8} {:>8} {:>8}",
                cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6]
            );
            line.trim_end().to_string() + "\n"
        };
        let mut s = row([
            "node", "capacity", "used", "leases", "owned", "free", "draining",
        ]);
        for n in &regions {
            s += &row([
                &n.node.to_string(),
                &human(n.chunks * n.chunk_size),
                &human(used(n.node)),
                &format!("{}/{}", n.leases, n.lease_slots),
                &n.chunks_owned.to_string(),
                &n.chunks_free.to_string(),
                if n.draining { "yes" } else { "no" },
            ]);
        }
        s += &row([
            "total",
            &human(capacity),
            &human(total_used),
            &regions.iter().map(|n| n.leases).sum::<u64>().to_string(),
            &regions
                .iter()
                .map(|n| n.chunks_owned)
                .sum::<u64>()
                .to_string(),
            &regions
                .iter()
                .map(|n| n.chunks_free)
                .sum::<u64>()
                .to_string(),
            "",
        ]);
        s += "(used: by this client id; leases, owned, free: chunks and lease slots as the \
              servers' regions show them now)\n";
        for (server, error) in unreachable {
            s += &format!("unreachable {server}: {error}\n");
        }
        s += &format!("allocations {}", allocs.len());
        for a in &allocs {
            s += &format!("\n  {}", show_ptr(a));
        }
        Ok(s)
    }

    /// Reads commands from stdin; a failed command prints its error and the shell goes on.
    /// Returns how many failed.
    pub fn shell(&self) -> Result<usize> {
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
                    crate::out!("{e}"); // `help`, `write --help`: what was asked for, no failure
                    continue;
                }
            }
            let result = parsed
                .map_err(|e| ToolError::Msg(shell_usage_error(&e.to_string())))
                .and_then(|l| self.exec(l.op));
            match result {
                Ok(out) => crate::outln!("{out}"),
                Err(e) => {
                    failed += 1;
                    if self.json {
                        crate::outln!("{}", json!({ "error": e.to_string() }));
                    } else {
                        crate::outln!("error: {e}");
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

/// The servers a client could not reach, for `--json` output.
pub fn unreachable_json(list: &[(std::net::SocketAddr, String)]) -> serde_json::Value {
    list.iter()
        .map(|(server, error)| json!({"server": server.to_string(), "error": error}))
        .collect()
}
