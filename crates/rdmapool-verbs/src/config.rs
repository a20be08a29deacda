//! How to open a verbs context: [`VerbsConfig`].

use crate::VerbsError;

/// How to open a verbs context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerbsConfig {
    /// The device ("rxe0", "mlx5_0"); the first one when `None`.
    pub device: Option<String>,
    /// The GID index to address peers with; when `None`, the RoCE v2 IPv4 GID if there is
    /// one, else the first RoCE v2 GID, else 0.
    pub gid_index: Option<u8>,
}

impl VerbsConfig {
    /// From `RDMAPOOL_DEVICE` and `RDMAPOOL_GID_INDEX` (unset or empty: the defaults).
    pub fn from_env() -> Result<Self, VerbsError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let gid_index = match var("RDMAPOOL_GID_INDEX") {
            Some(t) => Some(t.trim().parse::<u8>().map_err(|_| VerbsError::Setting {
                name: "RDMAPOOL_GID_INDEX".into(),
                value: t.clone(),
                reason: "out of range: want a GID table index, 0..=255".into(),
            })?),
            None => None,
        };
        Ok(Self {
            device: var("RDMAPOOL_DEVICE"),
            gid_index,
        })
    }
}
