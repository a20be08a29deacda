//! Standard output that never panics: `println!` panics when stdout is a full disk or a
//! closed pipe. Every line the tool prints goes through [`outln!`](crate::outln) (or
//! [`write_all`]) instead, and a failed write ends the process cleanly:
//!
//! - a closed pipe (`EPIPE`, e.g. `rdma-tool devices | head -1`): the reader has all it
//!   wanted, so the tool exits 0 without a message, as ripgrep does (Rust ignores SIGPIPE,
//!   so the write fails instead of killing the process);
//! - any other error (`ENOSPC` with `> /dev/full`, `EIO`): a message on stderr, exit 1.
//!
//! Diagnostics go to stderr through [`errln!`](crate::errln), which drops what cannot be
//! written instead of panicking.

use std::io::Write;

/// Writes `args` and a newline to stdout; ends the process on a write error (see the
/// module docs).
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|_| out.write_all(b"\n")) {
        fail(&e);
    }
}

/// Writes `args` to stdout without a newline, then flushes; ends the process on a write
/// error.
pub fn text(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|_| out.flush()) {
        fail(&e);
    }
}

/// Writes `bytes` to stdout and flushes; ends the process on a write error.
pub fn write_all(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|_| out.flush()) {
        fail(&e);
    }
}

/// Flushes stdout; ends the process on a write error (called before a normal exit, so
/// that the last buffered bytes are checked too).
pub fn flush() {
    if let Err(e) = std::io::stdout().lock().flush() {
        fail(&e);
    }
}

/// Whether `e` means the reader of stdout went away.
pub fn is_closed_pipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

/// Ends the process after a failed write to stdout: quietly with 0 for a closed pipe,
/// with a message and 1 otherwise.
pub fn fail(e: &std::io::Error) -> ! {
    if is_closed_pipe(e) {
        std::process::exit(0);
    }
    let _ = writeln!(
        std::io::stderr(),
        "rdma-tool: cannot write to standard output: {e}"
    );
    std::process::exit(1);
}

/// Writes `args` and a newline to stderr, ignoring a failure: a diagnostic that cannot be
/// written has nowhere else to go, and `eprintln!` would panic (`2>/dev/full`).
pub fn diag(args: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|_| err.write_all(b"\n"));
}

/// `eprintln!` through [`diag`]: never panics.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::diag(format_args!($($arg)*))
    };
}

/// `println!` through [`line()`]: never panics.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

/// `print!` through [`text`]: never panics.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::text(format_args!($($arg)*))
    };
}
