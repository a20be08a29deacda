//! Completions per CQ and per QP, by status: which queue pair went wrong, not only that
//! something did.
//!
//! Off by default, so the poll path pays one relaxed atomic load.
//! [`ContextMetrics::track_objects`](super::ContextMetrics::track_objects)`(true)` (or an
//! exporter (`rdmapool_exporter::Endpoint`) watching the context) turns it on: every CQ then counts
//! the statuses it returns, and each poll that returned work takes one lock to add them to the
//! counters of the QPs they came from. Objects are listed while they live: a CQ or QP that is
//! destroyed leaves the listing (its completions stay in the context's `completions`), so the
//! number of series follows the number of live objects, which Prometheus exports cap at
//! [`MAX_LISTED`] per kind.

use super::opt_in::OptIn;
use super::Recorder;
use crate::fabric::{Completion, WcStatus};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// At most this many CQs and this many QPs are listed per snapshot (the lowest numbers);
/// the live counts are reported apart.
pub const MAX_LISTED: usize = 1024;

const STATUSES: usize = WcStatus::ALL.len();

/// CQ numbers: unique in the process, so that the listings of several contexts served
/// together never share one.
static NEXT_CQ: AtomicU64 = AtomicU64::new(1);

/// Completions per status of one QP.
type QpCounts = [u64; STATUSES];

/// One context's listing: its live CQs and QPs, and whether they count.
#[derive(Default)]
#[doc(hidden)]
pub struct Objects {
    /// 1: counting.
    tracking: OptIn,
    /// Live CQs, by id.
    cqs: Mutex<BTreeMap<u64, Arc<CqCounts>>>,
    /// Live QPs, by device, then QP number.
    qps: Mutex<BTreeMap<Arc<str>, BTreeMap<u32, QpCounts>>>,
}

impl Objects {
    /// Counts completions per CQ and per QP from now on (`true`), or stops (`false`; what
    /// was counted stays listed).
    #[doc(hidden)]
    pub fn track(&self, on: bool) {
        self.tracking.choose(u32::from(on));
    }

    /// What a watching endpoint does: tracking on, unless [`Objects::track`] chose.
    #[doc(hidden)]
    pub fn default_on(&self) {
        self.tracking.default_to(1);
    }

    /// Whether completions are counted per CQ and per QP.
    #[doc(hidden)]
    pub fn tracked(&self) -> bool {
        self.tracking.get() != 0
    }
}

struct CqCounts {
    id: u64,
    device: Arc<str>,
    counts: [AtomicU64; STATUSES],
}

/// A CQ's entry in the listing; every clone of the [`crate::fabric::Cq`] holds the same
/// one, and the last to go takes the CQ off the listing.
#[doc(hidden)]
pub struct CqTag(Arc<CqCounts>, Arc<Recorder>);

impl CqTag {
    /// Lists a new CQ of `device` with `recorder`.
    #[doc(hidden)]
    pub fn new(recorder: &Arc<Recorder>, device: &str) -> Arc<CqTag> {
        let c = Arc::new(CqCounts {
            id: NEXT_CQ.fetch_add(1, Ordering::Relaxed),
            device: device.into(),
            counts: [const { AtomicU64::new(0) }; STATUSES],
        });
        recorder.objects.cqs.lock().insert(c.id, c.clone());
        Arc::new(CqTag(c, recorder.clone()))
    }

    /// This CQ's number in the listing (process-wide, from 1, never reused).
    #[doc(hidden)]
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The recorder this CQ's polls record into.
    #[doc(hidden)]
    pub fn recorder(&self) -> &Recorder {
        &self.1
    }

    /// Counts what one poll of this CQ returned, when tracking is on (inlined: off, it is
    /// one relaxed load and a branch).
    #[inline]
    #[doc(hidden)]
    pub fn polled(&self, done: &[Completion]) {
        if self.1.objects.tracked() && !done.is_empty() {
            self.count(done);
        }
    }

    fn count(&self, done: &[Completion]) {
        for d in done {
            self.0.counts[d.status as usize].fetch_add(1, Ordering::Relaxed);
        }
        let mut qps = self.1.objects.qps.lock();
        let Some(on_device) = qps.get_mut(&*self.0.device) else {
            return;
        };
        for d in done {
            // A QP destroyed with work outstanding is no longer listed: its flushes count
            // for the CQ only.
            if let Some(counts) = on_device.get_mut(&d.qp_num) {
                counts[d.status as usize] += 1;
            }
        }
    }
}

impl Drop for CqTag {
    fn drop(&mut self) {
        self.1.objects.cqs.lock().remove(&self.0.id);
    }
}

/// A QP's entry in the listing, held by the [`crate::fabric::Qp`]; dropping it takes the QP
/// off the listing.
#[doc(hidden)]
pub struct QpTag {
    device: Arc<str>,
    qp_num: u32,
    recorder: Arc<Recorder>,
}

impl QpTag {
    /// Lists QP `qp_num` of `device` with `recorder` (a QP number a destroyed QP had starts
    /// from zero).
    #[doc(hidden)]
    pub fn new(recorder: &Arc<Recorder>, device: &str, qp_num: u32) -> QpTag {
        let device: Arc<str> = device.into();
        recorder
            .objects
            .qps
            .lock()
            .entry(device.clone())
            .or_default()
            .insert(qp_num, [0; STATUSES]);
        QpTag {
            device,
            qp_num,
            recorder: recorder.clone(),
        }
    }

    /// The recorder this QP's posts record into.
    #[doc(hidden)]
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }
}

impl Drop for QpTag {
    fn drop(&mut self) {
        let mut qps = self.recorder.objects.qps.lock();
        if let Some(on_device) = qps.get_mut(&*self.device) {
            on_device.remove(&self.qp_num);
            if on_device.is_empty() {
                qps.remove(&*self.device);
            }
        }
    }
}

/// Completions one CQ or QP returned, by status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectCompletions {
    /// The device the object belongs to.
    pub device: String,
    /// The QP number, or for a CQ its number in this process's listing (from 1).
    pub id: u64,
    /// Completions per status (success always, other statuses once seen; numeric order).
    pub completions: Vec<(WcStatus, u64)>,
}

fn by_status(counts: impl Fn(usize) -> u64) -> Vec<(WcStatus, u64)> {
    WcStatus::ALL
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, counts(i)))
        .filter(|&(s, n)| n > 0 || s == WcStatus::Success)
        .collect()
}

/// The live CQs of these listings (at most [`MAX_LISTED`], lowest ids first) and how many
/// live.
#[doc(hidden)]
pub fn cqs<'a>(listings: impl Iterator<Item = &'a Objects>) -> (Vec<ObjectCompletions>, usize) {
    let mut all: BTreeMap<u64, Arc<CqCounts>> = BTreeMap::new();
    for l in listings {
        all.extend(l.cqs.lock().iter().map(|(&id, c)| (id, c.clone())));
    }
    let listed = all
        .values()
        .take(MAX_LISTED)
        .map(|c| ObjectCompletions {
            device: c.device.to_string(),
            id: c.id,
            completions: by_status(|i| c.counts[i].load(Ordering::Relaxed)),
        })
        .collect();
    (listed, all.len())
}

/// The live QPs of these listings (at most [`MAX_LISTED`], by device then QP number) and
/// how many live.
#[doc(hidden)]
pub fn qps<'a>(listings: impl Iterator<Item = &'a Objects>) -> (Vec<ObjectCompletions>, usize) {
    let mut all: BTreeMap<Arc<str>, BTreeMap<u32, QpCounts>> = BTreeMap::new();
    for l in listings {
        for (device, on_device) in l.qps.lock().iter() {
            all.entry(device.clone())
                .or_default()
                .extend(on_device.iter().map(|(&n, c)| (n, *c)));
        }
    }
    let live = all.values().map(BTreeMap::len).sum();
    let listed = all
        .iter()
        .flat_map(|(device, on_device)| {
            on_device
                .iter()
                .map(move |(&qp_num, counts)| ObjectCompletions {
                    device: device.to_string(),
                    id: u64::from(qp_num),
                    completions: by_status(|i| counts[i]),
                })
        })
        .take(MAX_LISTED)
        .collect();
    (listed, live)
}
