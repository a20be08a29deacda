//! The worker threads' loop: take the next request, register with retries by error class
//! (ENOMEM/EAGAIN retried with bounded backoff, unless the region exceeds the whole memlock
//! limit; EIO/ENODEV/ENXIO break the device; the rest fail at once), honour cancellation and
//! the deadline, record the outcome.

use super::request::{Job, RegOwner, Request};
use super::stats::{inc, LATENCY_CLASSES};
use super::Shared;
use crate::fabric::recorder::RegistrarEvent;
use crate::fabric::Mr;
use crate::mr::state::RegState;
use crate::mr::state::StateCell;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::time::Instant;

enum Class {
    Retry,
    Broken,
    Fatal,
}

fn classify(e: &Error) -> Class {
    // A region larger than the whole memlock limit can never be pinned: retrying only
    // delays the error.
    if let Error::Core(crate::CoreError::MemlockLimit {
        requested, limit, ..
    }) = e
    {
        let limit = limit
            .split(' ')
            .next()
            .and_then(|n| n.parse::<usize>().ok());
        if limit.is_some_and(|l| *requested > l) {
            return Class::Fatal;
        }
    }
    let errno = match e {
        Error::Core(crate::CoreError::MemlockLimit { errno, .. }) => Some(*errno),
        Error::Core(crate::CoreError::Sys { source, .. }) => source.raw_os_error(),
        _ => None,
    };
    match errno {
        Some(libc::ENOMEM | libc::EAGAIN) => Class::Retry,
        Some(libc::EIO | libc::ENODEV | libc::ENXIO) => Class::Broken,
        _ => Class::Fatal,
    }
}

pub(super) fn worker(s: &Shared) {
    loop {
        let req = {
            let mut q = s.queue.lock();
            loop {
                if s.shutdown.load(Ordering::Acquire) {
                    return;
                }
                if let Some(r) = q.pop_front() {
                    break r;
                }
                s.work.wait(&mut q);
            }
        };
        if req.state().get() != RegState::Posted {
            continue; // cancelled while queued
        }
        req.run(s);
    }
}

impl<O: RegOwner> Job for Request<O> {
    fn state(&self) -> &StateCell {
        &self.state
    }
    fn run(&self, s: &Shared) {
        run(s, self)
    }
    fn finish_err(&self, e: Error) {
        self.finish(Err(e))
    }
}

/// Registers one request (with retries) and delivers the outcome.
fn run<O: RegOwner>(s: &Shared, req: &Request<O>) {
    {
        let result = attempt(s, req);
        match result {
            Ok(mr) => {
                if req.state.complete() {
                    inc(&s.counters.completed);
                    let len = req.spec.len as u64;
                    let class = LATENCY_CLASSES
                        .iter()
                        .position(|&c| len <= c)
                        .unwrap_or(LATENCY_CLASSES.len() - 1);
                    let ns = req.submitted.elapsed().as_nanos().max(1) as u64;
                    s.latency.lock()[class].saturating_record(ns);
                    req.finish(Ok(mr));
                } else {
                    inc(&s.counters.undone_after_cancel);
                    drop(mr); // cancelled meanwhile: deregister, never leak
                }
            }
            Err(e) => {
                if req.state.fail() {
                    inc(&s.counters.failed);
                    req.finish(Err(e));
                }
            }
        }
    }
}

/// Registers with retries by error class, honouring cancellation and the deadline.
fn attempt<O: RegOwner>(s: &Shared, req: &Request<O>) -> Result<Mr<O>> {
    let mut delay = s.cfg.retry.initial_delay;
    let mut retries = 0;
    loop {
        if let Some(reason) = s.broken.lock().clone() {
            return Err(Error::DeviceBroken(reason));
        }
        if req.deadline.is_some_and(|d| Instant::now() >= d) {
            inc(&s.counters.timed_out);
            s.pd.recorder().registrar_event(RegistrarEvent::TimedOut);
            return Err(Error::TimedOut("registration".into()));
        }
        let e = match O::register(&s.pd, req.spec.addr, req.spec.len, req.spec.access) {
            Ok(mr) => return Ok(mr),
            Err(e) => e,
        };
        match classify(&e) {
            Class::Fatal => return Err(e),
            Class::Broken => {
                let reason = e.to_string();
                *s.broken.lock() = Some(reason.clone());
                fail_all_queued(s, &reason);
                return Err(Error::DeviceBroken(reason));
            }
            Class::Retry if retries >= s.cfg.retry.max_retries => return Err(e),
            Class::Retry => {
                retries += 1;
                inc(&s.counters.retries);
                s.pd.recorder().registrar_event(RegistrarEvent::Retry);
                let mut wait = delay;
                if let Some(d) = req.deadline {
                    wait = wait.min(d.saturating_duration_since(Instant::now()));
                }
                std::thread::sleep(wait);
                delay = (delay * 2).min(s.cfg.retry.max_delay);
                if req.state.get() != RegState::Posted {
                    return Err(Error::Cancelled);
                }
            }
        }
    }
}

fn fail_all_queued(s: &Shared, reason: &str) {
    let left: Vec<_> = s.queue.lock().drain(..).collect();
    for r in left {
        if r.state().fail() {
            inc(&s.counters.failed);
            r.finish_err(Error::DeviceBroken(reason.to_string()));
        }
    }
}
