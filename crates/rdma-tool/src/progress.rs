//! Progress of a long run, on stderr: a bar with the ETA when stderr is a terminal, a plain
//! line every few seconds otherwise (a log), nothing in a log when the output is JSON.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often a line is written to a log.
const EVERY: Duration = Duration::from_secs(5);

/// Progress over a known number of steps.
pub struct Steps {
    bar: Option<indicatif::ProgressBar>,
    /// What runs (`bench data`), the prefix of each log line.
    what: &'static str,
    lines: bool,
    total: u64,
    done: u64,
    message: String,
    started: Instant,
    last_line: Instant,
}

impl Steps {
    /// Progress of `what` over `total` steps; `json` silences the log lines.
    pub fn new(what: &'static str, total: u64, json: bool) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = tty.then(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len}, {elapsed} elapsed, ETA {eta} {msg}",
                )
                .expect("valid template"),
            );
            b
        });
        let now = Instant::now();
        Self {
            bar,
            what,
            lines: !tty && !json,
            total,
            done: 0,
            message: String::new(),
            started: now,
            last_line: now,
        }
    }

    /// Says what the current step is.
    pub fn set_message(&mut self, msg: String) {
        if let Some(b) = &self.bar {
            b.set_message(msg.clone());
        }
        self.message = msg;
        self.log();
    }

    /// One step done.
    pub fn inc(&mut self) {
        self.done += 1;
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    fn log(&mut self) {
        if self.lines && self.last_line.elapsed() >= EVERY {
            self.last_line = Instant::now();
            crate::errln!(
                "{}: step {}/{}, {:.0} s elapsed: {}",
                self.what,
                self.done + 1,
                self.total,
                self.started.elapsed().as_secs_f64(),
                self.message
            );
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
