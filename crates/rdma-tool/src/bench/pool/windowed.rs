//! Keeping a number of operations in flight: the pool benchmarks' bandwidth and batch rows
//! run their futures through it.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Polls up to `window` futures from `start` at once until `count` have finished (each
/// posts in its first poll, so `window` operations are in flight).
pub(super) async fn windowed<F, Fut>(
    count: u64,
    window: usize,
    mut start: F,
) -> rdmapool::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = rdmapool::Result<()>>,
{
    let mut inflight: Vec<Pin<Box<Fut>>> = Vec::with_capacity(window);
    let (mut started, mut done) = (0u64, 0u64);
    std::future::poll_fn(move |cx| loop {
        while started < count && inflight.len() < window {
            inflight.push(Box::pin(start()));
            started += 1;
        }
        let mut progressed = false;
        let mut i = 0;
        while i < inflight.len() {
            match inflight[i].as_mut().poll(cx) {
                Poll::Ready(r) => {
                    if let Err(e) = r {
                        return Poll::Ready(Err(e));
                    }
                    drop(inflight.swap_remove(i));
                    done += 1;
                    progressed = true;
                }
                Poll::Pending => i += 1,
            }
        }
        if done == count {
            return Poll::Ready(Ok(()));
        }
        if !progressed {
            return Poll::Pending;
        }
    })
    .await
}
