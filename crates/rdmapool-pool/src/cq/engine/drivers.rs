//! Who polls the CQs: a busy-polling thread per CQ, the caller ([`super::Engine::progress`],
//! nothing runs here), or a tokio task per CQ woken by its completion channel.

use super::{EngineConfig, Progress, Shared};
use crate::fabric::Completion;
use crate::util::spin::PollPause;
use crate::{Error, Result};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The engine's progress threads or tasks. Every `Engine` and `AsyncQp` holds them, so they
/// stop only when the last of those is gone: a QP that outlives its `Engine` handle still
/// gets its completions.
pub(super) struct Progressors {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    #[cfg(not(loom))]
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Progressors {
    /// Starts what `cfg.progress` asks for on every CQ of `shared`.
    pub(super) fn start(shared: Arc<Shared>, cfg: &EngineConfig) -> Result<Self> {
        // Built first: if a later start fails, dropping it stops what already runs.
        let mut p = Progressors {
            shared,
            threads: Vec::new(),
            #[cfg(not(loom))]
            tasks: Vec::new(),
        };
        let n = p.shared.pool.cqs().len();
        match cfg.progress {
            Progress::Caller => {}
            Progress::BusyPoll => {
                for i in 0..n {
                    let s = p.shared.clone();
                    p.threads.push(
                        std::thread::Builder::new()
                            .name(format!("rdmapool-progress-{i}"))
                            .spawn(move || busy_poll(&s, i))
                            .map_err(|e| {
                                Error::Core(crate::CoreError::Sys {
                                    call: "spawn",
                                    source: e,
                                })
                            })?,
                    );
                }
            }
            #[cfg(not(loom))]
            Progress::Event => {
                let rt = tokio::runtime::Handle::try_current().map_err(|_| {
                    Error::Core(crate::CoreError::BadSetting {
                        name: "EngineConfig::progress".into(),
                        value: "Event".into(),
                        reason: "event-driven progress needs a tokio runtime (create the engine \
                             inside one)"
                            .into(),
                    })
                })?;
                let _in_runtime = rt.enter();
                for i in 0..n {
                    let channel = crate::cq::event::CompletionChannel::new(p.shared.cq(i).clone());
                    // SAFETY: the channel holds its CQ, so the descriptor stays open and the
                    // same for the AsyncFd's whole life.
                    let afd = unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(
                            channel,
                            tokio::io::Interest::READABLE,
                        )
                    }
                    .map_err(|e| {
                        Error::Core(crate::CoreError::Sys {
                            call: "AsyncFd::register (completion channel)",
                            source: e.into_parts().1,
                        })
                    })?;
                    let s = p.shared.clone();
                    p.tasks.push(rt.spawn(event_loop(s, i, afd)).abort_handle());
                }
            }
            #[cfg(loom)]
            Progress::Event => {
                return Err(Error::Core(crate::CoreError::Unsupported(
                    "event-driven progress is not built under loom".into(),
                )))
            }
        }
        Ok(p)
    }
}

impl Drop for Progressors {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // The last holder may be a progress thread itself (releasing an abandoned
        // operation's QP): it must not wait for itself, and exits on the stop flag.
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        #[cfg(not(loom))]
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

/// CPU hints a busy-polling thread kept off the CQs waits before it looks again (a few µs;
/// a future that stops spinning and parks waits at most that long for the thread).
const KEPT_OFF_HINTS: u32 = 64;

fn busy_poll(s: &Shared, cq: usize) {
    let mut buf = [Completion::EMPTY; 32];
    let mut idle = 0u32;
    // Yielding between empty polls past the first microseconds: the threads whose work this
    // one waits for (a NIC's, the tasks') get the core when all are busy.
    let mut pause = PollPause::new();
    while !s.stop.load(Ordering::Acquire) {
        // Every operation in flight is being looked for by its own future, on its own
        // thread: polling the same CQ would only pull its lines across cores.
        let spinners = s.spinners.load(Ordering::Acquire);
        if spinners > 0 && s.table.in_flight() <= spinners {
            // Looked again only after a while: every look reads lines the spinning futures
            // write per operation (the spinner count, the slot table's), and pulls them to
            // this core, which makes their next write a miss (8 B intra-host WRITEs under a
            // busy-polling thread: 229 → 205 ns).
            for _ in 0..KEPT_OFF_HINTS {
                std::hint::spin_loop();
            }
            pause.pause();
            continue;
        }
        if s.poll_once(cq, &mut buf) > 0 {
            idle = 0;
            pause = PollPause::new();
        } else if s.broken[cq].load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        } else {
            idle += 1;
            if idle > 2000 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                pause.pause();
            }
        }
    }
}

#[cfg(not(loom))]
async fn event_loop(
    s: Arc<Shared>,
    cq: usize,
    afd: tokio::io::unix::AsyncFd<crate::cq::event::CompletionChannel>,
) {
    loop {
        // Drain; then, if operations are in flight and nobody spins, arm and drain again
        // (a completion that lands after the last poll raises an event, the ones before
        // the arm are drained here). The CQ is armed only for someone who waits: a future
        // arms it when it parks (`OpFuture::park`), a spinner when it leaves others in
        // flight, this loop for the operations of dropped futures. An operation that
        // completes while its future spins, or during its post, costs no event and no
        // wake-up of this task.
        s.drain(cq);
        // Pairs with the fence of a parking future: either it sees the CQ unarmed (and
        // arms it), or this loop sees its operation in flight.
        fence(Ordering::SeqCst);
        if s.spinners.load(Ordering::SeqCst) == 0 && s.table.in_flight() > 0 && s.ensure_armed(cq) {
            s.drain(cq);
        }
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // Every completion, a retry timeout's included, arrives through the channel (the
        // soft NIC's own thread completes timed-out requests): no tick is needed.
        match afd.readable().await {
            Err(e) => {
                tracing::error!(cq, "completion channel failed: {e}");
                return;
            }
            Ok(mut guard) => {
                s.wakeups.fetch_add(1, Ordering::Relaxed);
                // Consume every queued event (an unconsumed one raises no new edge), then
                // clear readiness only if the channel would now block.
                let _ = s.cq(cq).ack_events();
                // The request that raised this event is used up.
                s.armed[cq].store(false, Ordering::SeqCst);
                if !guard.get_inner().readable_now() {
                    guard.clear_ready();
                }
            }
        }
    }
}
