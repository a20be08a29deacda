//! An opt-in setting of the data-path metrics: off until the program chooses a value or a
//! started exporter (`rdmapool_exporter::Endpoint`) sets its default (which never overrides a
//! choice).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// One setting: 0 is off; read with one relaxed load on the data path.
#[doc(hidden)]
pub struct OptIn {
    value: AtomicU32,
    chosen: AtomicBool,
}

impl OptIn {
    #[doc(hidden)]
    pub const fn off() -> Self {
        Self {
            value: AtomicU32::new(0),
            chosen: AtomicBool::new(false),
        }
    }

    /// The program's choice: kept, whatever an endpoint starts with later.
    #[doc(hidden)]
    pub fn choose(&self, value: u32) {
        self.chosen.store(true, Ordering::Relaxed);
        self.value.store(value, Ordering::Relaxed);
    }

    /// An endpoint's default: `value`, unless the program chose.
    #[doc(hidden)]
    pub fn default_to(&self, value: u32) {
        if !self.chosen.load(Ordering::Relaxed) {
            self.value.store(value, Ordering::Relaxed);
        }
    }

    #[inline]
    #[doc(hidden)]
    pub fn get(&self) -> u32 {
        self.value.load(Ordering::Relaxed)
    }
}

impl Default for OptIn {
    fn default() -> Self {
        Self::off()
    }
}
