//! Who may connect to a soft NIC, with what proof, and how many: its admission policy.
//!
//! A soft NIC checks every incoming data connection (docs/SECURITY.md has the threat model):
//! - the hello must prove it was made by the peer that received the target QP's endpoint (a
//!   MAC keyed by that QP's secret token, and by the pre-shared key when one is set);
//! - on this host (Unix socket, or TCP from a loopback address) the peer's user must be
//!   allowed ([`AllowUsers`]: the same user by default);
//! - connections are capped in total and per peer address.

use crate::SoftError;
use rdmapool_core::fabric::{read_private_file, unauthenticated_allowed_by_env, PreSharedKey};

/// Which local users may connect (checked with `SO_PEERCRED` on the Unix socket, and through
/// the kernel's socket table for TCP from a loopback address).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AllowUsers {
    /// Only processes running as this process's effective user.
    #[default]
    Same,
    /// Any local user.
    Any,
    /// This process's user and these uids.
    List(Vec<u32>),
}

impl AllowUsers {
    /// Parses `same`, `any` or a comma-separated list of uids.
    pub fn parse(s: &str) -> std::result::Result<Self, SoftError> {
        match s.trim() {
            "" | "same" => Ok(Self::Same),
            "any" => Ok(Self::Any),
            list => list
                .split(',')
                .map(|u| {
                    u.trim().parse::<u32>().map_err(|_| SoftError::Setting {
                        name: "RDMAPOOL_SOFT_ALLOW_UIDS".into(),
                        value: s.into(),
                        reason: format!(
                            "{u:?} is not a uid (want same, any or a list like 1000,1001)"
                        ),
                    })
                })
                .collect::<std::result::Result<Vec<_>, SoftError>>()
                .map(Self::List),
        }
    }

    /// Whether a peer running as `uid` may connect to a process running as `own`.
    pub fn allows(&self, uid: u32, own: u32) -> bool {
        uid == own
            || match self {
                Self::Same => false,
                Self::Any => true,
                Self::List(l) => l.contains(&uid),
            }
    }
}

/// A soft NIC's admission policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Local users allowed to connect.
    pub allow_users: AllowUsers,
    /// The pre-shared key, if any. A NIC listening beyond loopback without one warns at
    /// startup: anyone who sees an endpoint exchange could then connect to that QP.
    pub psk: Option<PreSharedKey>,
    /// Data connections open at once, in total.
    pub max_connections: usize,
    /// Data connections open at once from one peer: one user of this host (on the local
    /// socket, or over TCP from a socket of this host), or else one IP address. Users of
    /// this host share its addresses, so each has a share of its own.
    pub max_connections_per_peer: usize,
    /// Whether a same-user peer on this host may map regions that grant it both remote read
    /// and write (the zero-copy path). Off: every operation goes through the socket.
    pub local_mappings: bool,
    /// Whether the NIC may listen beyond loopback without a pre-shared key (it refuses to
    /// start otherwise: [`Error::Unprotected`](rdmapool_core::Error::Unprotected)). Also set by
    /// [`ENV_ALLOW_UNAUTHENTICATED`](rdmapool_core::fabric::ENV_ALLOW_UNAUTHENTICATED)` = 1`.
    pub allow_unauthenticated: bool,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            allow_users: AllowUsers::Same,
            psk: None,
            max_connections: 1024,
            max_connections_per_peer: 256,
            local_mappings: true,
            allow_unauthenticated: false,
        }
    }
}

impl Admission {
    /// Defaults, overridden by `RDMAPOOL_SOFT_ALLOW_UIDS`, `RDMAPOOL_SOFT_PSK_FILE`,
    /// `RDMAPOOL_SOFT_MAX_CONNECTIONS`, `RDMAPOOL_SOFT_MAX_CONNECTIONS_PER_PEER` and
    /// `RDMAPOOL_SOFT_LOCAL_MAPPINGS` (`on` or `off`), and [`ENV_ALLOW_UNAUTHENTICATED`](rdmapool_core::fabric::ENV_ALLOW_UNAUTHENTICATED).
    pub fn from_env() -> std::result::Result<Self, SoftError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let count = |k: &str, default: usize| -> std::result::Result<usize, SoftError> {
            match var(k) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<usize>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(SoftError::Setting {
                        name: k.into(),
                        value: v.clone(),
                        reason: "want a positive count".into(),
                    }),
                },
            }
        };
        let d = Self::default();
        let local_mappings = match var("RDMAPOOL_SOFT_LOCAL_MAPPINGS")
            .as_deref()
            .map(str::trim)
        {
            None | Some("on") => true,
            Some("off") => false,
            Some(v) => {
                return Err(SoftError::Setting {
                    name: "RDMAPOOL_SOFT_LOCAL_MAPPINGS".into(),
                    value: v.into(),
                    reason: "want on or off".into(),
                })
            }
        };
        Ok(Self {
            allow_users: match var("RDMAPOOL_SOFT_ALLOW_UIDS") {
                Some(v) => AllowUsers::parse(&v)?,
                None => AllowUsers::Same,
            },
            psk: var("RDMAPOOL_SOFT_PSK_FILE")
                .map(|p| {
                    let raw = read_private_file(p.trim().as_ref(), "RDMAPOOL_SOFT_PSK_FILE")?;
                    PreSharedKey::new(raw.trim_ascii())
                })
                .transpose()
                .map_err(SoftError::Key)?,
            max_connections: count("RDMAPOOL_SOFT_MAX_CONNECTIONS", d.max_connections)?,
            max_connections_per_peer: count(
                "RDMAPOOL_SOFT_MAX_CONNECTIONS_PER_PEER",
                d.max_connections_per_peer,
            )?,
            local_mappings,
            allow_unauthenticated: unauthenticated_allowed_by_env(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_parse_and_decide() {
        assert_eq!(AllowUsers::parse("same").unwrap(), AllowUsers::Same);
        assert_eq!(AllowUsers::parse("any").unwrap(), AllowUsers::Any);
        let l = AllowUsers::parse("1000, 1001").unwrap();
        assert_eq!(l, AllowUsers::List(vec![1000, 1001]));
        assert!(AllowUsers::parse("root").is_err());
        assert!(AllowUsers::Same.allows(5, 5));
        assert!(!AllowUsers::Same.allows(65534, 0));
        assert!(l.allows(1001, 0) && !l.allows(1002, 0));
        assert!(AllowUsers::Any.allows(65534, 0));
    }
}
