//! `--trace FILE.csv`: a cache trace replayed instead of the generated workloads.
//!
//! The format is the common cache-trace CSV, one request per line, four fields:
//!
//! ```text
//! timestamp,key,size,op
//! 0,user1,1024,get
//! 0.5,user2,300,SET
//! 2,user1,0,delete
//! ```
//!
//! - `timestamp`: a number at least 0 (integer or decimal, any unit). It is checked and then
//!   ignored: the replay runs as fast as each system answers, in the trace's order.
//! - `key`: 1 to 250 bytes, none of them a space or a control character (memcached's rule,
//!   so that every system takes the same keys); no quoting, so no comma either.
//! - `size`: the value's size in bytes, 1 to 256 KiB (the store keeps no empty value). A
//!   `set` writes that many bytes; a `get` that misses is followed by a `set` of that many
//!   bytes, as cache trace replays do; a `delete` ignores it (0 is taken there).
//! - `op`: `get`, `set` or `delete`, in any case.
//!
//! The first line may be a header (its first field is not a number); blank lines are
//! skipped; `\r\n` line ends are taken. Any other line is an error naming its line number
//! ([`TraceError`]), never a panic.
//!
//! The clients share the trace by key: each key's requests all go to one client (chosen by a
//! hash of the key), in the trace's order, so every system sees the same hits and misses.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The largest value a trace line may ask for.
pub const MAX_VALUE: usize = 256 << 10;
/// The longest key (memcached's limit).
pub const MAX_KEY: usize = 250;
/// The most requests a trace may hold.
pub const MAX_REQUESTS: usize = 10_000_000;
/// The longest line read.
const MAX_LINE: usize = 4096;

/// A trace request's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceOp {
    /// Read the key; on a miss, set it to `size` bytes.
    Get,
    /// Write `size` bytes to the key.
    Set,
    /// Remove the key.
    Delete,
}

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRequest {
    /// What to do.
    pub op: TraceOp,
    /// The key, as an index into [`Trace::key`].
    pub key: u32,
    /// The value size in bytes (at most [`MAX_VALUE`]).
    pub size: u32,
}

/// What is wrong with one line of a trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Not four comma-separated fields.
    #[error("{0} fields, want 4: timestamp,key,size,op")]
    Fields(usize),
    /// A timestamp that is not a number at least 0.
    #[error("timestamp {0:?} is not a number at least 0")]
    Timestamp(String),
    /// An empty key, one too long, or one with a space or control character.
    #[error("key {0:?}: want 1 to 250 bytes with no space, comma or control character")]
    Key(String),
    /// A size that is not a whole number of bytes up to [`MAX_VALUE`], or 0 for a get or
    /// a set.
    #[error("size {0:?}: want a whole number of bytes from 1 to 262144 (256 KiB)")]
    Size(String),
    /// An operation other than get, set or delete.
    #[error("op {0:?}: want get, set or delete")]
    Op(String),
    /// A line longer than 4 KiB.
    #[error("longer than 4096 bytes")]
    TooLong,
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("--trace {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line that is not a request.
    #[error("--trace {path} line {line}: {error}")]
    Line {
        /// The file.
        path: String,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        error: LineError,
    },
    /// No request at all.
    #[error("--trace {path}: no request in it (want lines of timestamp,key,size,op)")]
    Empty {
        /// The file.
        path: String,
    },
    /// More requests than the replay keeps in memory.
    #[error("--trace {path}: more than {MAX_REQUESTS} requests")]
    TooLong {
        /// The file.
        path: String,
    },
}

impl From<TraceError> for crate::ToolError {
    fn from(e: TraceError) -> Self {
        crate::ToolError::Msg(e.to_string())
    }
}

/// A trace read into memory: its distinct keys and its requests.
#[derive(Debug)]
pub struct Trace {
    keys: Vec<Box<[u8]>>,
    /// A hash of each key, which shares the keys out to the clients.
    hashes: Vec<u64>,
    requests: Vec<TraceRequest>,
}

impl Trace {
    /// Reads the trace at `path`.
    pub fn read(path: &Path) -> Result<Self, TraceError> {
        let name = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
            path: name.clone(),
            source,
        })?;
        Self::parse(BufReader::new(file), &name)
    }

    /// Reads a trace from `input`, naming it `name` in errors.
    pub fn parse(mut input: impl BufRead, name: &str) -> Result<Self, TraceError> {
        let mut trace = Trace {
            keys: Vec::new(),
            hashes: Vec::new(),
            requests: Vec::new(),
        };
        let mut ids: HashMap<Box<[u8]>, u32> = HashMap::new();
        let mut buf = Vec::new();
        let mut seen_any = false;
        let mut line = 0usize;
        loop {
            buf.clear();
            let n = input
                .by_ref()
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|source| TraceError::Io {
                    path: name.into(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            line += 1;
            let bad = |error| TraceError::Line {
                path: name.into(),
                line,
                error,
            };
            if buf.len() > MAX_LINE && buf.last() != Some(&b'\n') {
                return Err(bad(LineError::TooLong));
            }
            let text = trim(&buf);
            if text.is_empty() {
                continue;
            }
            let first = !seen_any;
            seen_any = true;
            let fields: Vec<&[u8]> = text.split(|&b| b == b',').collect();
            if first && !is_number(trim(fields[0])) {
                continue; // a header
            }
            let (op, key, size) = parse_line(&fields).map_err(bad)?;
            if trace.requests.len() >= MAX_REQUESTS {
                return Err(TraceError::TooLong { path: name.into() });
            }
            let id = match ids.get(key) {
                Some(&id) => id,
                None => {
                    let id = trace.keys.len() as u32;
                    ids.insert(key.into(), id);
                    trace.keys.push(key.into());
                    trace.hashes.push(hash(key));
                    id
                }
            };
            trace.requests.push(TraceRequest { op, key: id, size });
        }
        if trace.requests.is_empty() {
            return Err(TraceError::Empty { path: name.into() });
        }
        Ok(trace)
    }

    /// Its requests, in order.
    #[cfg(test)]
    pub fn requests(&self) -> &[TraceRequest] {
        &self.requests
    }

    /// The key of index `id` (as [`TraceRequest::key`] names it).
    pub fn key(&self, id: u32) -> &[u8] {
        &self.keys[id as usize]
    }

    /// Its distinct keys.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.keys.iter().map(|k| &k[..])
    }

    /// The largest value each key holds (by its index, as [`TraceRequest::key`] names
    /// it): the most any get or set of it names.
    pub fn largest_per_key(&self) -> Vec<usize> {
        let mut most = vec![0usize; self.keys.len()];
        for r in &self.requests {
            if r.op != TraceOp::Delete {
                let m = &mut most[r.key as usize];
                *m = (*m).max(r.size as usize);
            }
        }
        most
    }

    /// The mean size of its gets and sets (at least 1): the `size` of its rows.
    pub fn mean_size(&self) -> usize {
        let (n, sum) = self
            .requests
            .iter()
            .filter(|r| r.op != TraceOp::Delete)
            .fold((0u64, 0u64), |(n, s), r| (n + 1, s + u64::from(r.size)));
        (sum.checked_div(n).unwrap_or(0) as usize).max(1)
    }

    /// Whether key `id` is one of client `client` of `clients`'s.
    fn owns(&self, id: u32, client: usize, clients: usize) -> bool {
        self.hashes[id as usize] % clients.max(1) as u64 == client as u64
    }

    /// The keys of client `client` of `clients`, by index.
    pub fn keys_of(&self, client: usize, clients: usize) -> impl Iterator<Item = u32> + '_ {
        (0..self.keys.len() as u32).filter(move |&id| self.owns(id, client, clients))
    }

    /// The requests of client `client` of `clients`, in order: those of its keys.
    pub fn share(&self, client: usize, clients: usize) -> impl Iterator<Item = &TraceRequest> {
        self.requests
            .iter()
            .filter(move |r| self.owns(r.key, client, clients))
    }
}

/// `b` without surrounding ASCII whitespace (and so without a line's `\r\n`).
fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

fn is_number(b: &[u8]) -> bool {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .is_some_and(|v| v.is_finite())
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A line's four fields as (op, key, size).
fn parse_line<'a>(fields: &[&'a [u8]]) -> Result<(TraceOp, &'a [u8], u32), LineError> {
    let [ts, key, size, op] = fields else {
        return Err(LineError::Fields(fields.len()));
    };
    let (ts, key, size, op) = (trim(ts), trim(key), trim(size), trim(op));
    let time = std::str::from_utf8(ts)
        .ok()
        .and_then(|s| s.parse::<f64>().ok());
    if !time.is_some_and(|t| t.is_finite() && t >= 0.0) {
        return Err(LineError::Timestamp(lossy(ts)));
    }
    if key.is_empty()
        || key.len() > MAX_KEY
        || key.iter().any(|&b| b <= b' ' || b == 0x7f || b == b',')
    {
        return Err(LineError::Key(lossy(key)));
    }
    let op = match op.to_ascii_lowercase().as_slice() {
        b"get" => TraceOp::Get,
        b"set" => TraceOp::Set,
        b"delete" => TraceOp::Delete,
        _ => return Err(LineError::Op(lossy(op))),
    };
    let least = if op == TraceOp::Delete { 0 } else { 1 };
    let size = std::str::from_utf8(size)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|&n| n >= least && n as usize <= MAX_VALUE)
        .ok_or_else(|| LineError::Size(lossy(size)))?;
    Ok((op, key, size))
}

/// FNV-1a of a key's bytes.
fn hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        Trace::parse(text.as_bytes(), "t.csv")
    }

    fn line_error(text: &str) -> (usize, LineError) {
        match parse(text) {
            Err(TraceError::Line { line, error, .. }) => (line, error),
            other => panic!("{text:?}: {other:?}"),
        }
    }

    #[test]
    fn a_good_trace_with_a_header_reads_every_request() {
        let t = parse(
            "timestamp,key,size,op\r\n0,user1,1024,get\r\n\n0.5, user2 ,300,SET\n2,user1,0,Delete\n",
        )
        .unwrap();
        let ops: Vec<(TraceOp, &[u8], u32)> = t
            .requests()
            .iter()
            .map(|r| (r.op, t.key(r.key), r.size))
            .collect();
        assert_eq!(
            ops,
            [
                (TraceOp::Get, &b"user1"[..], 1024),
                (TraceOp::Set, b"user2", 300),
                (TraceOp::Delete, b"user1", 0),
            ]
        );
        assert_eq!(t.keys().count(), 2);
        assert_eq!(t.largest_per_key(), [1024, 300]);
        assert_eq!(t.mean_size(), (1024 + 300) / 2);
    }

    #[test]
    fn without_a_header_the_first_line_is_a_request() {
        let t = parse("5,k,1,get").unwrap();
        assert_eq!(t.requests().len(), 1);
    }

    #[test]
    fn a_bad_line_is_an_error_naming_its_line_number() {
        let head = "timestamp,key,size,op\n1,a,1,get\n";
        for (bad, want) in [
            ("2,b,1,put", LineError::Op("put".into())),
            ("2,b,1", LineError::Fields(3)),
            ("2,b,1,get,extra", LineError::Fields(5)),
            ("-1,b,1,get", LineError::Timestamp("-1".into())),
            ("x,b,1,get", LineError::Timestamp("x".into())),
            ("2,,1,get", LineError::Key(String::new())),
            ("2,a b,1,get", LineError::Key("a b".into())),
            ("2,b,-1,get", LineError::Size("-1".into())),
            ("2,b,300000,get", LineError::Size("300000".into())),
            ("2,b,1K,set", LineError::Size("1K".into())),
            ("2,b,0,set", LineError::Size("0".into())),
            ("2,b,0,get", LineError::Size("0".into())),
        ] {
            let (line, error) = line_error(&format!("{head}{bad}\n3,c,1,get\n"));
            assert_eq!((line, &error), (3, &want), "{bad}");
            let shown = parse(&format!("{head}{bad}")).unwrap_err().to_string();
            assert!(shown.contains("t.csv line 3: "), "{shown}");
        }
        let long = format!("1,{},1,get\n", "k".repeat(5000));
        assert_eq!(line_error(&long), (1, LineError::TooLong));
        let key = "k".repeat(251);
        assert_eq!(
            line_error(&format!("1,{key},1,get")),
            (1, LineError::Key(key))
        );
    }

    #[test]
    fn an_empty_trace_or_a_header_alone_is_an_error() {
        assert!(matches!(parse(""), Err(TraceError::Empty { .. })));
        assert!(matches!(
            parse("timestamp,key,size,op\n\n"),
            Err(TraceError::Empty { .. })
        ));
        let e = Trace::read(Path::new("/nonexistent/trace.csv")).unwrap_err();
        assert!(matches!(e, TraceError::Io { .. }), "{e}");
    }

    #[test]
    fn the_clients_share_the_trace_by_key_each_in_order() {
        let text: String = (0..1000)
            .map(|i| format!("{i},key{},8,get\n", i % 37))
            .collect();
        let t = parse(&text).unwrap();
        let shares: Vec<Vec<&TraceRequest>> = (0..3).map(|c| t.share(c, 3).collect()).collect();
        assert_eq!(shares.iter().map(Vec::len).sum::<usize>(), 1000);
        let owned: usize = (0..3).map(|c| t.keys_of(c, 3).count()).sum();
        assert_eq!(owned, 37);
        for (c, share) in shares.iter().enumerate() {
            assert!(!share.is_empty());
            for r in share {
                for (d, other) in shares.iter().enumerate() {
                    if d != c {
                        assert!(other.iter().all(|o| o.key != r.key));
                    }
                }
            }
        }
    }
}
