//! Memory regions of the soft provider and the key tables that find them.

use super::access::{Grant, RemoteAccess};
use super::control;
use super::MAX_SGE;
use crate::fabric::{AccessFlags, WcStatus};
use crate::os::mapping::Mapping;
use crate::os::pin::Pin;
use crate::{Error, Result};
use arrayvec::ArrayVec;
use parking_lot::{RwLock, RwLockReadGuard};
// Keys come from the OS CSPRNG, so a fast non-keyed hash spreads them as well as SipHash;
// a peer controls only the keys it probes, never the ones stored.
use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

/// One registration: its range, rights, keys and the memory behind it.
#[derive(Debug)]
pub struct MrInner {
    pub addr: u64,
    pub len: u64,
    pub access: AccessFlags,
    pub pd_id: u32,
    pub lkey: u32,
    pub rkey: u32,
    /// `true` while registered. Operations hold a read guard while they touch the memory;
    /// deregistration takes the write guard, so it waits for them and later ones see `false`.
    valid: RwLock<bool>,
    pin: parking_lot::Mutex<Option<Pin>>,
    /// Remote keys of the memory windows bound to this region (removed with it).
    windows: parking_lot::Mutex<Vec<u32>>,
    /// Memory owned by the region (None when the caller lent it), with its control page for
    /// the intra-host path; unmapped only after the last in-flight user lets go.
    pub memory: Option<Mapping>,
}

/// A checked local SGE: the region it lies in, and the range.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub mr: Arc<MrInner>,
    pub addr: u64,
    pub len: u32,
}

/// The checked SGEs of one work request.
pub type LocalList = ArrayVec<Resolved, MAX_SGE>;

impl MrInner {
    /// What the region grants: its range, rights and PD.
    pub fn grant(&self) -> Grant {
        Grant {
            base: self.addr,
            len: self.len,
            access: self.access,
            pd: self.pd_id,
        }
    }

    /// Whether `[addr, addr+len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        self.grant().covers(addr, len)
    }

    /// The access check an HCA makes: PD, rights and bounds.
    pub fn allows(&self, pd_id: u32, need: AccessFlags, addr: u64, len: u64) -> bool {
        self.grant().allows(pd_id, need, addr, len)
    }

    /// Holds the region registered while the returned guard lives; `None` once deregistered.
    pub fn hold(&self) -> Option<RwLockReadGuard<'_, bool>> {
        let g = self.valid.read();
        if *g {
            Some(g)
        } else {
            None
        }
    }
}

/// A bound memory window: a range of a region, its rights, and the QP it was bound through
/// (type 2: remote access must arrive on that QP).
#[derive(Debug)]
pub struct Window {
    pub mr: Arc<MrInner>,
    pub addr: u64,
    pub len: u64,
    pub access: AccessFlags,
    pub qpn: u32,
}

/// What a remote key names.
#[derive(Debug, Clone)]
enum RemoteTarget {
    Region(Arc<MrInner>),
    Window(Arc<Window>),
}

/// lkey and rkey lookup for one context.
#[derive(Debug, Default)]
pub struct KeyTable {
    lkeys: RwLock<HashMap<u32, Arc<MrInner>>>,
    rkeys: RwLock<HashMap<u32, RemoteTarget>>,
}

fn random_u32() -> Result<u32> {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).map_err(|e| Error::Sys {
        call: "getrandom",
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(u32::from_ne_bytes(b))
}

/// A CSPRNG key that is non-zero and not `taken`.
fn fresh_key(taken: impl Fn(u32) -> bool) -> Result<u32> {
    loop {
        let k = random_u32()?;
        if k != 0 && !taken(k) {
            return Ok(k);
        }
    }
}

/// What a new registration is made of.
pub struct NewRegion {
    pub addr: u64,
    pub len: u64,
    pub access: AccessFlags,
    pub pd_id: u32,
    /// None for on-demand-paging regions, which are not pinned.
    pub pin: Option<Pin>,
    pub mapping: Option<Mapping>,
}

// Public only for the fuzz targets; a table is asked for its size, never for emptiness.
#[allow(clippy::len_without_is_empty)]
impl KeyTable {
    /// Registers a region under fresh, unguessable (CSPRNG), unique, non-zero keys.
    pub fn insert(&self, r: NewRegion) -> Result<Arc<MrInner>> {
        let mut lkeys = self.lkeys.write();
        let mut rkeys = self.rkeys.write();
        let lkey = fresh_key(|k| lkeys.contains_key(&k) || rkeys.contains_key(&k))?;
        let rkey = fresh_key(|k| k == lkey || lkeys.contains_key(&k) || rkeys.contains_key(&k))?;
        let mr = Arc::new(MrInner {
            addr: r.addr,
            len: r.len,
            access: r.access,
            pd_id: r.pd_id,
            lkey,
            rkey,
            valid: RwLock::new(true),
            pin: parking_lot::Mutex::new(r.pin),
            windows: parking_lot::Mutex::new(Vec::new()),
            memory: r.mapping,
        });
        if let Some(m) = &mr.memory {
            control::publish(m, rkey, mr.grant());
        }
        lkeys.insert(lkey, mr.clone());
        rkeys.insert(rkey, RemoteTarget::Region(mr.clone()));
        Ok(mr)
    }

    /// A fresh remote key that names nothing (a memory window's, unbound).
    pub fn unused_rkey(&self) -> Result<u32> {
        let lkeys = self.lkeys.read();
        let rkeys = self.rkeys.read();
        fresh_key(|k| lkeys.contains_key(&k) || rkeys.contains_key(&k))
    }

    /// Makes `window` reachable under a fresh remote key, returned; `old` (the window's
    /// previous key) must no longer name anything (a type-2 window is rebound only after
    /// invalidation).
    pub fn bind_window(&self, window: Window) -> Result<u32> {
        // Lock order as everywhere: lkeys, then rkeys.
        let lkeys = self.lkeys.read();
        let mut rkeys = self.rkeys.write();
        let rkey = fresh_key(|k| lkeys.contains_key(&k) || rkeys.contains_key(&k))?;
        window.mr.windows.lock().push(rkey);
        rkeys.insert(rkey, RemoteTarget::Window(Arc::new(window)));
        Ok(rkey)
    }

    /// Invalidates the window under `rkey` if it is one of PD `pd_id`'s; false otherwise.
    pub fn invalidate_window(&self, rkey: u32, pd_id: u32) -> bool {
        let mut rkeys = self.rkeys.write();
        match rkeys.get(&rkey) {
            Some(RemoteTarget::Window(w)) if w.mr.pd_id == pd_id => {
                w.mr.windows.lock().retain(|&k| k != rkey);
                rkeys.remove(&rkey);
                true
            }
            _ => false,
        }
    }

    /// Whether `rkey` names a bound window.
    pub fn is_window(&self, rkey: u32) -> bool {
        matches!(self.rkeys.read().get(&rkey), Some(RemoteTarget::Window(_)))
    }

    /// The access check an HCA makes for a remote request arriving on QP `qpn`: the region
    /// behind `rkey` if what the key names (the region, or a window bound through `qpn`)
    /// allows `access`, else the status the request completes with.
    pub fn resolve(
        &self,
        rkey: u32,
        qpn: u32,
        access: &RemoteAccess,
    ) -> std::result::Result<Arc<MrInner>, WcStatus> {
        let rkeys = self.rkeys.read();
        let (grant, mr) = match rkeys.get(&rkey) {
            Some(RemoteTarget::Region(mr)) => (Some(mr.grant()), Some(mr)),
            Some(RemoteTarget::Window(w)) if w.qpn == qpn => {
                let g = Grant {
                    base: w.addr,
                    len: w.len,
                    access: w.access,
                    pd: w.mr.pd_id,
                };
                (Some(g), Some(&w.mr))
            }
            _ => (None, None),
        };
        access.check(grant)?;
        mr.cloned().ok_or(WcStatus::RemAccessErr)
    }

    /// The region with this local key.
    pub fn by_lkey(&self, lkey: u32) -> Option<Arc<MrInner>> {
        self.lkeys.read().get(&lkey).cloned()
    }

    /// The region with this remote key (not a window's).
    /// The PD of the region behind `rkey` (a region's or a window's key), if it names one.
    pub fn pd_of(&self, rkey: u32) -> Option<u32> {
        match self.rkeys.read().get(&rkey) {
            Some(RemoteTarget::Region(mr)) => Some(mr.pd_id),
            Some(RemoteTarget::Window(w)) => Some(w.mr.pd_id),
            None => None,
        }
    }

    pub fn by_rkey(&self, rkey: u32) -> Option<Arc<MrInner>> {
        match self.rkeys.read().get(&rkey) {
            Some(RemoteTarget::Region(mr)) => Some(mr.clone()),
            _ => None,
        }
    }

    /// Deregisters: keys stop resolving at once, in-flight users are waited for, pages are
    /// unpinned. Memory the region owns is freed when its last user lets go.
    pub fn remove(&self, mr: &MrInner) {
        self.lkeys.write().remove(&mr.lkey);
        {
            // The region's key, and the keys of windows bound to it.
            let mut rkeys = self.rkeys.write();
            rkeys.remove(&mr.rkey);
            for k in mr.windows.lock().drain(..) {
                rkeys.remove(&k);
            }
        }
        if let Some(m) = &mr.memory {
            control::retract(m);
        }
        *mr.valid.write() = false;
        mr.pin.lock().take();
    }

    /// Live registrations.
    pub fn len(&self) -> usize {
        self.lkeys.read().len()
    }
}
