//! Small helpers shared by several modules.

use crate::{Error, Result};

pub mod copy;
pub mod doc_text;
pub mod inflight;
pub mod spin;

/// Starts a thread named `name` running `f`; a failed spawn is `Error::Sys`.
#[doc(hidden)]
pub fn spawn_named(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| Error::Sys {
            call: "spawn",
            source: e,
        })
}

/// A random, non-zero 64-bit value from the OS (a pool server's incarnation, the first
/// value of a pool client's heartbeat).
#[doc(hidden)]
pub fn random_nonzero() -> Result<u64> {
    loop {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).map_err(|e| Error::Sys {
            call: "getrandom",
            source: std::io::Error::other(e.to_string()),
        })?;
        let v = u64::from_le_bytes(b);
        if v != 0 {
            return Ok(v);
        }
    }
}

/// Lower-case hex of `bytes`.
#[doc(hidden)]
pub fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Parses lower- or upper-case hex.
#[doc(hidden)]
pub fn hex_decode(s: &str) -> Result<Vec<u8>> {
    let bad = |reason: String| Error::Malformed {
        what: "hex text",
        reason,
    };
    if !s.len().is_multiple_of(2) {
        return Err(bad(format!("odd length {}", s.len())));
    }
    let nibble = |c: u8| -> Result<u8> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(bad(format!("not a hex digit: {:?}", c as char))),
        }
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Ok(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// The system page size (asked once: the data path needs it per operation).
#[doc(hidden)]
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    })
}
