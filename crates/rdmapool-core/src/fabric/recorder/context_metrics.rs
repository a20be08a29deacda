//! [`ContextMetrics`]: the public handle on one context's recorder, from
//! [`crate::fabric::Context::metrics`].

use super::{snapshot_of_recorders, Recorder, Snapshot};
use std::sync::Arc;

/// What one context's objects did, and its opt-in settings: registrations, completions,
/// connections, caches, pools and memory servers built on the context record here, and
/// nowhere else. Cheap to clone; every clone reads the same recorder.
///
/// ```
/// use rdmapool::fabric::{AccessFlags, Context, SoftConfig};
/// # fn main() -> rdmapool::Result<()> {
/// let ctx = Context::open(SoftConfig::default())?;
/// let pd = ctx.alloc_pd()?;
/// drop(pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
/// let m = ctx.metrics().snapshot();
/// assert_eq!((m.registrations, m.deregistrations), (1, 1));  // this context's, exactly
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ContextMetrics(#[doc(hidden)] pub Arc<Recorder>);

impl std::fmt::Debug for ContextMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextMetrics").finish_non_exhaustive()
    }
}

impl ContextMetrics {
    /// Everything recorded so far, at one moment.
    pub fn snapshot(&self) -> Snapshot {
        self.0.snapshot()
    }

    /// Counts completions per CQ and per QP of this context from now on (`true`), or stops
    /// counting (`false`; what was counted stays listed). Off until chosen or until an
    /// exporter (`rdmapool_exporter::Endpoint`) watches the context.
    pub fn track_objects(&self, on: bool) {
        self.0.objects.track(on);
    }

    /// Whether completions are counted per CQ and per QP.
    pub fn objects_tracked(&self) -> bool {
        self.0.objects.tracked()
    }

    /// Times one signalled work request in `every` (per thread) on this context's QPs from
    /// now on; 0 turns timing off. Off until chosen or until an exporter
    /// (`rdmapool_exporter::Endpoint`) watches the context (which sets
    /// [`super::DEFAULT_OP_SAMPLE_EVERY`]).
    pub fn sample_op_latency(&self, every: u32) {
        self.0.ops.sample(every);
    }

    /// The current sampling rate (0: off).
    pub fn op_sample_every(&self) -> u32 {
        self.0.ops.every()
    }

    /// Turns on per-object counts, and op latency sampling at
    /// [`super::DEFAULT_OP_SAMPLE_EVERY`], each unless the program chose a value for this
    /// context: what an exporter does when it starts serving the context.
    pub fn turn_on_defaults(&self) {
        self.0.objects.default_on();
        self.0.ops.default_on();
    }
}

/// What several contexts recorded, together: counters summed, latency histograms merged,
/// objects and memory servers listed side by side (what an exporter (`rdmapool_exporter::Endpoint`)
/// watching them serves).
pub fn snapshot_of<'a>(contexts: impl IntoIterator<Item = &'a ContextMetrics>) -> Snapshot {
    let recorders: Vec<&Recorder> = contexts.into_iter().map(|c| &*c.0).collect();
    snapshot_of_recorders(&recorders)
}
