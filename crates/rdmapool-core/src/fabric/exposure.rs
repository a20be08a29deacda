//! Keys and exposure, shared by every listener of the library (a soft NIC, a pool server):
//! the pre-shared key and the secret files it is read from, and the refusal to listen beyond
//! loopback without a key unless the operator opted in.

use crate::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// A pre-shared key: both sides must hold the same one. It never crosses the wire; it keys
/// the MAC of the data connection's hello (challenge–response).
#[derive(Clone, PartialEq, Eq)]
pub struct PreSharedKey(Arc<[u8]>);

impl PreSharedKey {
    /// Shortest key accepted, in bytes.
    pub const MIN_LEN: usize = 16;

    /// A key from bytes (at least [`Self::MIN_LEN`]).
    pub fn new(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < Self::MIN_LEN {
            return Err(Error::BadKey {
                what: "a pre-shared key".into(),
                reason: format!(
                    "it needs at least {} bytes, got {} (make one with `head -c 32 \
                     /dev/urandom > key`)",
                    Self::MIN_LEN,
                    bytes.len()
                ),
            });
        }
        Ok(Self(bytes.into()))
    }

    /// The key in a file (its bytes, with surrounding whitespace trimmed). The file must not
    /// be readable or writable by its group or by others (as ssh requires of its keys): a
    /// key others can read is no secret, and one others can write lets them choose it.
    pub fn from_file(path: &str) -> Result<Self> {
        let raw = read_private_file(std::path::Path::new(path), "key file")?;
        Self::new(raw.trim_ascii())
    }

    #[doc(hidden)]
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The bytes of a secret file (a key), which must be private to its owner: a file its group
/// or others may read or write is refused with an error naming the mode and `chmod 600`, as
/// ssh refuses such keys. `what` names the file in errors.
pub fn read_private_file(path: &std::path::Path, what: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let bad = |why: String| Error::BadKey {
        what: format!("{what} {shown}"),
        reason: why,
    };
    let mut file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    // The mode of the file opened, not of whatever the path names a moment later.
    let mode = file
        .metadata()
        .map_err(|e| bad(e.to_string()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "its mode is {:04o}: a key file must be private to its owner (`chmod 600 {shown}`)",
            mode & 0o7777
        )));
    }
    let mut raw = Vec::new();
    file.read_to_end(&mut raw).map_err(|e| bad(e.to_string()))?;
    Ok(raw)
}

impl fmt::Debug for PreSharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PreSharedKey({} bytes, redacted)", self.0.len())
    }
}

/// Environment variable that lets listeners beyond loopback start without a key (`1`): a
/// soft NIC without a pre-shared key, a pool server without a cluster key.
pub const ENV_ALLOW_UNAUTHENTICATED: &str = "RDMAPOOL_ALLOW_UNAUTHENTICATED";

/// Whether [`ENV_ALLOW_UNAUTHENTICATED`] is `1`.
pub fn unauthenticated_allowed_by_env() -> bool {
    std::env::var(ENV_ALLOW_UNAUTHENTICATED).is_ok_and(|v| v.trim() == "1")
}

/// Refuses to listen on `addr` for `what` without a key unless the address is loopback or
/// the operator opted in (`allowed`, or [`ENV_ALLOW_UNAUTHENTICATED`]).
pub fn check_exposure(
    what: &'static str,
    addr: std::net::SocketAddr,
    has_key: bool,
    allowed: bool,
    fix: &'static str,
) -> Result<()> {
    if has_key || addr.ip().is_loopback() || allowed || unauthenticated_allowed_by_env() {
        return Ok(());
    }
    Err(Error::Unprotected { what, addr, fix })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_others_can_read_or_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rdmapool-psk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, b"0123456789abcdef0123456789abcdef\n").unwrap();
        let p = path.to_str().unwrap();
        for (mode, ok) in [
            (0o600, true),
            (0o400, true),
            (0o644, false),
            (0o620, false),
            (0o604, false),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            match PreSharedKey::from_file(p) {
                Ok(_) => assert!(ok, "mode {mode:o} accepted"),
                Err(e) => {
                    assert!(!ok, "mode {mode:o}: {e}");
                    assert!(e.to_string().contains("chmod 600"), "{e}");
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn short_keys_are_refused_and_keys_never_print() {
        assert!(PreSharedKey::new(b"short").is_err());
        let k = PreSharedKey::new(b"0123456789abcdef0123").unwrap();
        let shown = format!("{k:?}");
        assert!(!shown.contains("0123"), "{shown}");
    }
}
