//! The memcached reference of `bench ycsb`: a `memcached` (the Debian package) started here
//! on a free loopback port (`-l 127.0.0.1 -U 0`, `-m` the bench's memory budget; stopped
//! when dropped), and a client of its text protocol over a `std` `TcpStream`, one
//! connection per bench client.
//!
//! The client speaks five commands, each request in one write and its reply read through a
//! buffer:
//!
//! - `get <key>\r\n` → `VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n`, or `END\r\n` on a
//!   miss;
//! - `set <key> 0 0 <bytes>\r\n<data>\r\n` → `STORED\r\n`;
//! - `delete <key>\r\n` → `DELETED\r\n` or `NOT_FOUND\r\n`;
//! - `version\r\n` → `VERSION <v>\r\n` (to see that the server answers);
//! - `stats\r\n` → `STAT <name> <value>\r\n` lines, then `END\r\n` (the items held at the
//!   end of a hit-rate run).
//!
//! Any other reply (`ERROR`, `CLIENT_ERROR ...`, `SERVER_ERROR ...`) is an error naming it.
//!
//! Why not a client crate: `memcache` 0.21 (the maintained one on crates.io) builds, but its
//! connection pool checks each connection out with a `version` round trip before every
//! command unless the pool is built by hand, and its text protocol writes a `set` in several
//! small unbuffered writes: measured here with 1 KiB values, its sets took 77-100 µs
//! against 13-56 µs for the same set in one write. A reference must not be slowed by its
//! client.

use super::kv::Kv;
use crate::{Result, ToolError};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The longest reply line read (a `VALUE` line holds a key of up to 250 bytes).
const MAX_REPLY_LINE: u64 = 1024;
/// The largest value taken in a reply.
const MAX_VALUE: usize = 2 << 20;
/// How long a reply may take before the bench gives up on the server.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A `memcached` child process on 127.0.0.1.
pub(super) struct MemcachedServer {
    child: Child,
    port: u16,
}

impl MemcachedServer {
    /// Starts `memcached` on a free loopback port with `memory_mb` MiB for items, UDP off;
    /// waits until it answers. As root it runs as `nobody` (memcached refuses root without
    /// `-u`).
    pub(super) fn start(memory_mb: usize) -> Result<Self> {
        Self::start_with(memory_mb, &[])
    }

    /// [`MemcachedServer::start`] with `extra` arguments (`-I 512k`).
    pub(super) fn start_with(memory_mb: usize, extra: &[&str]) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| ToolError::Io("a free port for memcached".into(), e))?
            .port();
        let mut cmd = Command::new("memcached");
        cmd.args(["-l", "127.0.0.1", "-U", "0", "-p", &port.to_string()])
            .args(["-m", &memory_mb.to_string()])
            .args(extra);
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-u", "nobody"]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ToolError::Msg(
                    "memcached not found (install the Debian package memcached)".into(),
                ),
                _ => ToolError::Io("starting memcached".into(), e),
            })?;
        let mut server = Self { child, port };
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let mut why = String::new();
                if let Some(err) = server.child.stderr.as_mut() {
                    let _ = err.take(4096).read_to_string(&mut why);
                }
                return Err(ToolError::Msg(format!(
                    "memcached exited at start ({status}): {}",
                    why.trim()
                )));
            }
            match server.connect().and_then(|mut c| c.version()) {
                Ok(_) => return Ok(server),
                Err(e) if Instant::now() >= until => {
                    return Err(ToolError::Msg(format!("memcached did not answer: {e}")))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// A new connection to the server.
    pub(super) fn connect(&self) -> Result<Connection> {
        let stream = TcpStream::connect(("127.0.0.1", self.port))
            .map_err(|e| ToolError::Io("connecting to memcached".into(), e))?;
        let io = |e| ToolError::Io("memcached connection".into(), e);
        stream.set_nodelay(true).map_err(io)?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        Ok(Connection {
            reader: BufReader::with_capacity(64 << 10, stream),
            writer,
            out: Vec::with_capacity(4096),
            line: Vec::with_capacity(256),
        })
    }
}

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One text-protocol connection to memcached.
pub(super) struct Connection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The request being built (sent in one write).
    out: Vec<u8>,
    /// The reply line being read.
    line: Vec<u8>,
}

fn io_err(e: std::io::Error) -> ToolError {
    ToolError::Io("memcached".into(), e)
}

impl Connection {
    /// Sends the request built in `out`.
    fn send(&mut self) -> Result<()> {
        self.writer.write_all(&self.out).map_err(io_err)
    }

    /// Reads one reply line into `line`, without its `\r\n`.
    fn read_line(&mut self) -> Result<&[u8]> {
        self.line.clear();
        let n = self
            .reader
            .by_ref()
            .take(MAX_REPLY_LINE)
            .read_until(b'\n', &mut self.line)
            .map_err(io_err)?;
        if n == 0 {
            return Err(ToolError::Msg("memcached closed the connection".into()));
        }
        if !self.line.ends_with(b"\r\n") {
            return Err(self.unexpected());
        }
        Ok(&self.line[..self.line.len() - 2])
    }

    /// The error for the reply line in `line`.
    fn unexpected(&self) -> ToolError {
        ToolError::Msg(format!(
            "memcached answered {:?}",
            String::from_utf8_lossy(&self.line).trim_end()
        ))
    }

    /// The server's version.
    pub(super) fn version(&mut self) -> Result<String> {
        self.out.clear();
        self.out.extend_from_slice(b"version\r\n");
        self.send()?;
        let line = self.read_line()?;
        match line.strip_prefix(b"VERSION ") {
            Some(v) => Ok(String::from_utf8_lossy(v).into_owned()),
            None => Err(self.unexpected()),
        }
    }

    /// The general statistic `name` (`stats`: `STAT <name> <value>` lines up to `END`), if
    /// the server gives it as a number.
    pub(super) fn stat(&mut self, name: &str) -> Result<Option<u64>> {
        self.out.clear();
        self.out.extend_from_slice(b"stats\r\n");
        self.send()?;
        let mut found = None;
        loop {
            let line = self.read_line()?;
            if line == b"END" {
                return Ok(found);
            }
            let Some(rest) = line.strip_prefix(b"STAT ") else {
                return Err(self.unexpected());
            };
            let text = String::from_utf8_lossy(rest);
            if let Some((n, v)) = text.split_once(' ') {
                if n == name {
                    found = v.trim().parse().ok();
                }
            }
        }
    }

    /// `get`: the value of `key` into `value`; false on a miss.
    pub(super) fn get(&mut self, key: &[u8], value: &mut Vec<u8>) -> Result<bool> {
        self.out.clear();
        self.out.extend_from_slice(b"get ");
        self.out.extend_from_slice(key);
        self.out.extend_from_slice(b"\r\n");
        self.send()?;
        let line = self.read_line()?;
        if line == b"END" {
            return Ok(false);
        }
        // VALUE <key> <flags> <bytes>
        let len = line
            .strip_prefix(b"VALUE ")
            .and_then(|rest| rest.rsplit(|&b| b == b' ').next())
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n <= MAX_VALUE);
        let Some(len) = len else {
            return Err(self.unexpected());
        };
        value.clear();
        value.resize(len + 2, 0);
        self.reader.read_exact(value).map_err(io_err)?;
        if !value.ends_with(b"\r\n") {
            return Err(ToolError::Msg(
                "memcached: a value without its \\r\\n".into(),
            ));
        }
        value.truncate(len);
        if self.read_line()? != b"END" {
            return Err(self.unexpected());
        }
        Ok(true)
    }

    /// `set`: `key` to `value`, no flags, no expiry.
    pub(super) fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.out.clear();
        self.out.extend_from_slice(b"set ");
        self.out.extend_from_slice(key);
        self.out
            .extend_from_slice(format!(" 0 0 {}\r\n", value.len()).as_bytes());
        self.out.extend_from_slice(value);
        self.out.extend_from_slice(b"\r\n");
        self.send()?;
        if self.read_line()? != b"STORED" {
            return Err(self.unexpected());
        }
        Ok(())
    }

    /// `delete`: whether `key` was there.
    pub(super) fn delete(&mut self, key: &[u8]) -> Result<bool> {
        self.out.clear();
        self.out.extend_from_slice(b"delete ");
        self.out.extend_from_slice(key);
        self.out.extend_from_slice(b"\r\n");
        self.send()?;
        match self.read_line()? {
            b"DELETED" => Ok(true),
            b"NOT_FOUND" => Ok(false),
            _ => Err(self.unexpected()),
        }
    }
}

impl Kv for Connection {
    fn name(&self) -> &'static str {
        "memcached"
    }

    fn get(&mut self, key: &[u8], value: &mut Vec<u8>) -> Result<bool> {
        Connection::get(self, key, value)
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        Connection::set(self, key, value)
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        Connection::delete(self, key).map(drop)
    }
}
