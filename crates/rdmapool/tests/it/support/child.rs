//! A child process that is this same test binary, re-run with `RDMAPOOL_TEST_CHILD=<role>`
//! so that only the test named `child_entry` does anything. Lines starting with `@` are the
//! protocol between parent and child (libtest may print its own text around them).

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};

/// The running child; dropping it kills it.
pub struct Child {
    child: std::process::Child,
    stdin: ChildStdin,
    lines: BufReader<ChildStdout>,
}

impl Child {
    /// Starts the `child_entry` test of the test module `module` (pass `module_path!()`) in
    /// this test binary, with `role` and extra environment.
    pub fn spawn(module: &str, role: &str, env: &[(&str, &str)]) -> Child {
        Self::spawn_in(None, module, role, env)
    }

    /// Like [`Child::spawn`], inside network namespace `ns` (via `ip netns exec`) if given.
    pub fn spawn_in(ns: Option<&str>, module: &str, role: &str, env: &[(&str, &str)]) -> Child {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(exe);
                // Beyond loopback, soft NICs and pool servers start only with keys.
                c.envs(super::key_env());
                c
            }
            None => Command::new(exe),
        };
        cmd.args(["--exact", &super::test_name(module, "child_entry")])
            .args(["--nocapture", "--test-threads=1"])
            .env("RDMAPOOL_TEST_CHILD", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        Child {
            stdin: child.stdin.take().unwrap(),
            lines: BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// The next protocol line from the child, without the `@`.
    pub fn line(&mut self) -> String {
        loop {
            let mut l = String::new();
            assert!(
                self.lines.read_line(&mut l).unwrap() > 0,
                "child exited early"
            );
            if let Some(at) = l.find('@') {
                return l[at + 1..].trim_end().to_string();
            }
        }
    }

    /// Sends one protocol line.
    pub fn say(&mut self, s: &str) {
        writeln!(self.stdin, "@{s}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid, which is not reaped before Drop.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}

impl Child {
    /// SIGSTOP, then waits until the kernel reports every thread of the child stopped (state
    /// T in /proc/PID/task/*/stat): a signal is delivered asynchronously, and until then the
    /// child may still answer.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.child.id());
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let all_stopped = std::fs::read_dir(&tasks).unwrap().all(|t| {
                let stat = std::fs::read_to_string(t.unwrap().path().join("stat"));
                // A thread that exited meanwhile has nothing to answer with either.
                stat.map_or(true, |s| s.contains(") T ") || s.contains(") t "))
            });
            if all_stopped {
                return;
            }
            assert!(std::time::Instant::now() < until, "the child never stopped");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's side: the next protocol line from stdin ("" once stdin closes).
pub fn parent_line() -> String {
    loop {
        let mut l = String::new();
        if std::io::stdin().read_line(&mut l).unwrap() == 0 {
            return String::new();
        }
        if let Some(rest) = l.trim_end().strip_prefix('@') {
            return rest.to_string();
        }
    }
}
