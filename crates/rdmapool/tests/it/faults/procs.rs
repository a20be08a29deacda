//! Child processes for the fault tests (this test binary re-run with `RDMAPOOL_TEST_CHILD`
//! inside a namespace), read with a watchdog so nothing can hang the test, and the resource
//! levels a process samples of itself.

use rdmapool::fabric::Context;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long the parent waits for any one line from a child before it calls the child hung.
/// Only bounds a hang (every operation has its own, much shorter, timeout); never a speed
/// assertion.
pub const WATCHDOG: Duration = Duration::from_secs(90);

pub struct Proc {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Proc {
    /// Runs `role` in namespace `ns` with `env`, on the soft provider's TCP path bound to
    /// `ip`.
    pub fn spawn(ns: &str, name: &str, role: &str, ip: &str, env: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .arg(std::env::current_exe().unwrap())
            // faults.rs's child_entry, as libtest names it in this binary.
            .args(["--exact", "faults::child_entry"])
            .args(["--nocapture", "--test-threads=1"])
            .env("RDMAPOOL_TEST_CHILD", role)
            .env("NAME", format!("{name} in {ns}"))
            .env("IP", ip)
            .env("RDMAPOOL_SOFT_BIND", format!("{ip}:0"))
            .env("RDMAPOOL_SOFT_TRANSPORT", "tcp")
            .envs(crate::support::key_env()) // beyond loopback: keys
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { return };
                // libtest may print "test child_entry ... " just before our first line.
                if let Some(at) = l.find('@') {
                    if tx.send(l[at + 1..].trim_end().to_string()).is_err() {
                        return;
                    }
                }
            }
        });
        Proc {
            name: name.into(),
            child,
            stdin,
            lines,
        }
    }

    /// The next protocol line; panics if the child exits or says nothing for [`WATCHDOG`].
    pub fn line(&mut self) -> String {
        match self.lines.recv_timeout(WATCHDOG) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                panic!("{}: silent for {WATCHDOG:?}: hung", self.name)
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("{}: exited early ({:?})", self.name, self.child.wait())
            }
        }
    }

    /// The next line, which must start with `word`; returns the rest.
    pub fn expect(&mut self, word: &str) -> String {
        let l = self.line();
        match l.strip_prefix(word) {
            Some(rest) => rest.trim().to_string(),
            None => panic!("{}: expected {word}, got {l}", self.name),
        }
    }

    pub fn say(&mut self, s: &str) {
        let w = self.stdin.as_mut().expect("stdin open");
        writeln!(w, "@{s}").unwrap();
        w.flush().unwrap();
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` to the child. (`ip netns exec` execs the test binary: the pid is its.)
    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Kills it with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Waits until the kernel reports it stopped (state T in /proc/PID/stat).
    pub fn wait_stopped(&self) {
        let stat = format!("/proc/{}/stat", self.pid());
        let until = Instant::now() + WATCHDOG;
        while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
            assert!(Instant::now() < until, "{} never stopped", self.name);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process's resource levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    pub pinned: u64,
    pub fds: usize,
    pub threads: usize,
    pub qps: usize,
}

impl Levels {
    pub fn now(ctx: &Context) -> Levels {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let threads = status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("Threads in /proc/self/status");
        Levels {
            pinned: rdmapool::metrics::pinned_bytes(),
            fds: std::fs::read_dir("/proc/self/fd").unwrap().count(),
            threads,
            qps: ctx.live_qps(),
        }
    }

    /// Polls (bounded) until the levels are back to `start`; returns the last sample.
    pub fn settle(ctx: &Context, start: Levels) -> Levels {
        let until = Instant::now() + Duration::from_secs(45);
        loop {
            let now = Levels::now(ctx);
            if now == start || Instant::now() > until {
                return now;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl std::fmt::Display for Levels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pinned={},fds={},threads={},qps={}",
            self.pinned, self.fds, self.threads, self.qps
        )
    }
}

impl std::str::FromStr for Levels {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let m: BTreeMap<&str, u64> = s
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.parse().unwrap_or(u64::MAX)))
            .collect();
        let g = |k: &str| m.get(k).copied().ok_or(format!("no {k} in {s}"));
        Ok(Levels {
            pinned: g("pinned")?,
            fds: g("fds")? as usize,
            threads: g("threads")? as usize,
            qps: g("qps")? as usize,
        })
    }
}

/// Parses `k=v k=v ...` (values stay text).
pub fn fields(s: &str) -> BTreeMap<String, String> {
    s.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Reads one `@`-line from stdin (empty at EOF).
pub fn stdin_line() -> String {
    loop {
        let mut l = String::new();
        if std::io::stdin().read_line(&mut l).unwrap_or(0) == 0 {
            return String::new();
        }
        if let Some(rest) = l.trim_end().strip_prefix('@') {
            return rest.to_string();
        }
    }
}

/// FNV-1a, 64 bits: the blocks' checksum.
pub fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Deterministic bytes for (seed, slot, generation).
pub fn block(len: usize, seed: u64, slot: u64, generation: u64) -> Vec<u8> {
    let mut x = (seed ^ (slot << 32) ^ generation.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}
