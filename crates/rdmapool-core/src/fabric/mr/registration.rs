//! [`Registration`]: one provider registration, deregistered (and timed) when dropped.

use crate::fabric::provider::MrOps;
use crate::fabric::recorder::Recorder;
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// A provider's registration with its context's recorder. Dropping it deregisters: work
/// requests that still name its keys complete with an error instead of touching the memory.
pub(super) struct Registration {
    /// Dropped only in `Drop`, where the deregistration is timed.
    ops: ManuallyDrop<Box<dyn MrOps>>,
    /// Its context's recorder (registered bytes, deregistrations).
    recorder: Arc<Recorder>,
}

impl Registration {
    /// Takes over a provider's registration and counts it in the recorder.
    pub(super) fn new(ops: Box<dyn MrOps>, recorder: &Arc<Recorder>) -> Self {
        recorder.region_added(ops.len());
        Self {
            ops: ManuallyDrop::new(ops),
            recorder: recorder.clone(),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let len = self.ops.len();
        let t = std::time::Instant::now();
        // SAFETY: `ops` is dropped exactly once, here, and not touched afterwards.
        unsafe { ManuallyDrop::drop(&mut self.ops) };
        self.recorder.record_deregistration(len, t.elapsed());
    }
}
