//! The operations of `rdma-tool pool` (and of its shell): their arguments, parsed and
//! checked before connecting.

use crate::units::parse_size;
use crate::{Result, ToolError};
use rdmapool::remote::RemotePtr;

/// Operations on the pool. Every argument is parsed here, by clap, so that a value the
/// tool cannot read is a usage error (exit code 2) naming the argument, before connecting.
#[derive(clap::Subcommand, Debug)]
pub enum Op {
    /// Allocates SIZE bytes (K/M/G suffixes); prints the pointer as node:offset:len:incarnation.
    Alloc {
        /// Bytes to allocate (at least 1).
        #[arg(value_parser = alloc_size_arg)]
        size: u64,
        /// Placement key (allocations with the same key prefer the same node).
        #[arg(long)]
        key: Option<u64>,
    },
    /// Writes DATA at OFFSET of PTR (DATA as text, or as hex digits with --hex).
    Write {
        /// node:offset:len:incarnation, as `alloc` printed it.
        #[arg(value_parser = ptr_arg)]
        ptr: RemotePtr,
        /// Offset inside the allocation.
        #[arg(value_parser = number_arg)]
        offset: u64,
        /// The bytes.
        data: String,
        /// DATA is hex digits (e.g. 00ff10).
        #[arg(long)]
        hex: bool,
    },
    /// Reads LEN bytes at OFFSET of PTR; prints them as text (non-printable bytes escaped
    /// like \x00) or as hex with --hex.
    Read {
        /// node:offset:len:incarnation.
        #[arg(value_parser = ptr_arg)]
        ptr: RemotePtr,
        /// Offset inside the allocation.
        #[arg(value_parser = number_arg)]
        offset: u64,
        /// Bytes to read.
        #[arg(value_parser = length_arg)]
        len: u32,
        /// Print hex digits.
        #[arg(long)]
        hex: bool,
    },
    /// Compare-and-swap on the 8-byte word at OFFSET (8-byte aligned); prints the old value.
    Cas {
        /// node:offset:len:incarnation.
        #[arg(value_parser = ptr_arg)]
        ptr: RemotePtr,
        /// Offset inside the allocation.
        #[arg(value_parser = number_arg)]
        offset: u64,
        /// Expected value (decimal or 0x hex).
        #[arg(value_parser = number_arg)]
        compare: u64,
        /// New value when it matched.
        #[arg(value_parser = number_arg)]
        swap: u64,
    },
    /// Fetch-and-add on the 8-byte word at OFFSET (8-byte aligned); prints the old value.
    Faa {
        /// node:offset:len:incarnation.
        #[arg(value_parser = ptr_arg)]
        ptr: RemotePtr,
        /// Offset inside the allocation.
        #[arg(value_parser = number_arg)]
        offset: u64,
        /// Amount to add (decimal or 0x hex, wrapping).
        #[arg(value_parser = number_arg)]
        add: u64,
    },
    /// Frees an allocation (any client id may free any allocation).
    Free {
        /// node:offset:len:incarnation.
        #[arg(value_parser = ptr_arg)]
        ptr: RemotePtr,
    },
    /// The pool as the servers' regions show it (one-sided READs of their lease slots and
    /// chunk tables): per node leases held, chunks owned and free, draining; then this
    /// client id's live allocations.
    Stats,
    /// Runs commands read from stdin, one per line (e.g. `alloc 100`), on one connection.
    Shell,
}

/// [`parse_ptr`] as a clap value parser.
fn ptr_arg(s: &str) -> std::result::Result<RemotePtr, String> {
    parse_ptr(s).map_err(|e| e.to_string())
}

/// [`parse_u64`] as a clap value parser.
fn number_arg(s: &str) -> std::result::Result<u64, String> {
    parse_u64(s).map_err(|e| e.to_string())
}

/// An allocation size: [`parse_size`], at least 1 byte.
fn alloc_size_arg(s: &str) -> std::result::Result<u64, String> {
    if s.trim().parse::<u64>() == Ok(0) {
        return Err("size must be at least 1 byte".into());
    }
    parse_size(s).map(|n| n as u64).map_err(|e| e.to_string())
}

/// [`length`] as a clap value parser.
fn length_arg(s: &str) -> std::result::Result<u32, String> {
    length(s).map_err(|e| e.to_string())
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

/// Hex digits to bytes.
pub fn parse_hex(s: &str) -> Result<Vec<u8>> {
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

/// Bytes to hex digits.
pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// `offset` when `p`'s word there is 8-byte aligned.
pub fn atomic_offset(p: &RemotePtr, offset: u64) -> Result<u64> {
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

/// Checks what clap cannot check alone, without connecting: hex data, and that atomics
/// target an aligned word. A failure is a usage error (exit code 2).
pub fn check(op: &Op) -> Result<()> {
    let r = match op {
        Op::Write {
            data, hex: true, ..
        } => parse_hex(data).map(|_| ()),
        Op::Cas { ptr, offset, .. } | Op::Faa { ptr, offset, .. } => {
            atomic_offset(ptr, *offset).map(|_| ())
        }
        _ => Ok(()),
    };
    r.map_err(|e| ToolError::Usage(e.to_string()))
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
        assert_eq!(length("0").unwrap(), 0);
        assert!(alloc_size_arg("0").unwrap_err().contains("at least 1 byte"));
        assert!(alloc_size_arg("10Q").is_err());
        assert_eq!(alloc_size_arg("1K"), Ok(1024));
        assert!(number_arg("99999999999999999999").is_err());
        assert!(length("8G").is_err());
    }
}
