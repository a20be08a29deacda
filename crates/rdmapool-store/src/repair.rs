//! Repair and rebalancing decided per key, without I/O (docs/STORE.md section 7).
//!
//! A repair scans every live node's index ([`Entry`]: a slot, with the header and key of the
//! block it names), groups the entries by key and, for each key, decides:
//!
//! 1. The version to keep ([`keep`]): the newest any of the key's replicas (its top `r`
//!    live servers) names, or, when none names any, the newest anywhere. So a repair makes
//!    visible what no get could see (a key all of whose replicas were lost or moved), and
//!    never puts an older version in front of a newer one a get already reads. Entries on
//!    other nodes naming a newer version than the one kept are left alone and reported as
//!    conflicts (their writers saw another membership).
//! 2. After the blocks of that version were read whole and verified ([`plan`]): the
//!    replicas that need a copy (no sound block of it), a sound source, and the entries to
//!    clear once every replica holds the version: older versions and damaged copies
//!    anywhere, and every entry on a node that is not one of the key's replicas
//!    (rebalancing). Each clear is a compare-and-swap of the slot from the word scanned to
//!    0, so a slot a put changed meanwhile is left as it is.

use super::format::{KeyHash, Kind, Version};
use super::placement;
use std::collections::BTreeMap;

/// One occupied index slot as a repair scanned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The node holding the slot.
    pub(crate) node: u32,
    /// The slot's region offset.
    pub(crate) at: u64,
    /// The slot's word as read.
    pub(crate) word: u64,
    /// The key the named block's header carries.
    pub(crate) key: Vec<u8>,
    /// The version it names.
    pub(crate) version: Version,
    /// What the block holds.
    pub(crate) kind: Kind,
    /// When it expires, as its header says.
    pub(crate) expiry: crate::format::Expiry,
}

/// Groups scanned entries by key.
pub(crate) fn by_key(entries: Vec<Entry>) -> BTreeMap<Vec<u8>, Vec<Entry>> {
    let mut out: BTreeMap<Vec<u8>, Vec<Entry>> = BTreeMap::new();
    for e in entries {
        out.entry(e.key.clone()).or_default().push(e);
    }
    out
}

/// The key's replicas among `live` (its top `r`).
pub(crate) fn targets(key: &[u8], live: &[u32], r: usize) -> Vec<u32> {
    placement::replicas(KeyHash::of(key), live, r)
}

/// The version a repair keeps for a key whose entries are `entries` and whose replicas are
/// `targets` (see the module's text); `None` for no entries.
pub(crate) fn keep(entries: &[Entry], targets: &[u32]) -> Option<Version> {
    let on_targets = entries
        .iter()
        .filter(|e| targets.contains(&e.node))
        .map(|e| e.version)
        .max();
    on_targets.or_else(|| entries.iter().map(|e| e.version).max())
}

/// What a repair does for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The version kept.
    pub(crate) version: Option<Version>,
    /// What the kept version's block holds.
    pub(crate) kind: Kind,
    /// A sound entry of the version, to copy from (by position in the entries).
    pub(crate) source: Option<usize>,
    /// Replicas with no sound block of the version: copy it there.
    pub(crate) need: Vec<u32>,
    /// Entries (by position) to clear once every replica holds the version.
    pub(crate) clear: Vec<usize>,
    /// Entries on other nodes naming a newer version than the one kept: left alone.
    pub(crate) conflicts: usize,
}

impl Default for Plan {
    fn default() -> Self {
        Self {
            version: None,
            kind: Kind::Value,
            source: None,
            need: Vec::new(),
            clear: Vec::new(),
            conflicts: 0,
        }
    }
}

/// The plan for a key: `entries` as scanned, `sound[i]` whether entry `i` was read whole
/// and verified (asked only of entries of the kept version), `targets` its replicas. With
/// no sound entry of the kept version there is no source: nothing is copied or cleared.
#[cfg(test)]
pub(crate) fn plan(entries: &[Entry], sound: &[bool], targets: &[u32]) -> Plan {
    plan_moving(entries, sound, targets, targets)
}

/// [`plan`] while data moves from a previous view's placement (docs/STORE.md section 4):
/// the version kept is the newest on `readable`, what gets read (the key's replicas under
/// both views), so a version acknowledged under the previous view is kept and copied to
/// the new `targets`; the entries off `targets` are cleared as usual.
pub(crate) fn plan_moving(
    entries: &[Entry],
    sound: &[bool],
    targets: &[u32],
    readable: &[u32],
) -> Plan {
    let Some(version) = keep(entries, readable) else {
        return Plan::default();
    };
    let is_sound = |i: usize| sound.get(i).copied().unwrap_or(false);
    let kept = |i: usize| entries[i].version == version && is_sound(i);
    let source = (0..entries.len())
        .filter(|&i| kept(i))
        .min_by_key(|&i| !targets.contains(&entries[i].node));
    let Some(source) = source else {
        return Plan {
            version: Some(version),
            ..Plan::default()
        };
    };
    let need = targets
        .iter()
        .copied()
        .filter(|&t| !(0..entries.len()).any(|i| entries[i].node == t && kept(i)))
        .collect();
    let mut clear = Vec::new();
    let mut conflicts = 0;
    // On each target, the sound entry of the version that stays (the first, if a
    // duplicate names it too).
    let mut stays: Vec<u32> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.version > version {
            conflicts += 1;
        } else if targets.contains(&e.node) && kept(i) && !stays.contains(&e.node) {
            stays.push(e.node);
        } else {
            clear.push(i);
        }
    }
    Plan {
        version: Some(version),
        kind: entries[source].kind,
        source: Some(source),
        need,
        clear,
        conflicts,
    }
}

#[cfg(test)]
mod tests;
