//! SIGINT and SIGTERM as a request to stop: the handler sets a flag that long-running
//! commands (`serve`, `monitor`, `stress`) poll, so they can finish cleanly (drain, restore the
//! terminal line, write their plot) instead of dying mid-way.

use crate::{Result, ToolError};
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the handlers for SIGINT and SIGTERM.
pub fn install() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe); the sigaction
        // struct is zero-initialised and then filled in.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            // Restarted, not failed with EINTR: a read, write or ioctl (ibv_reg_mr's) that
            // the signal lands in goes on; the command notices the flag at its next check.
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(ToolError::Io(
                "sigaction".into(),
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// Whether SIGINT or SIGTERM has arrived since [`install`].
pub fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}
