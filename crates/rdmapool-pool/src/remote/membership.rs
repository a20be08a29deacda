//! Which memory servers exist: a static list (the embedded default), or etcd with the `etcd`
//! feature (`super::etcd`). Descriptors never come from here, only from the connection to
//! each server.

use crate::{Error, Result};
use std::net::SocketAddr;

/// A source of memory-server addresses.
pub trait Membership: Send + Sync {
    /// The servers to use now.
    fn servers(&self) -> Result<Vec<SocketAddr>>;
}

/// A fixed list of servers: from code, a comma-separated flag, or a file with one
/// `ip:port` per line (`#` starts a comment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticMembership {
    servers: Vec<SocketAddr>,
}

impl StaticMembership {
    /// These servers.
    pub fn new(servers: Vec<SocketAddr>) -> Self {
        Self { servers }
    }

    /// Parses `ip:port` entries separated by commas, whitespace or new lines; `#` comments.
    pub fn parse(text: &str) -> Result<Self> {
        let mut servers = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            for item in line.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
                servers.push(item.parse().map_err(|e| {
                    Error::Core(crate::CoreError::BadSetting {
                        name: "server address".into(),
                        value: item.into(),
                        reason: format!("{e} (want ip:port)"),
                    })
                })?);
            }
        }
        if servers.is_empty() {
            return Err(Error::Core(crate::CoreError::BadSetting {
                name: "server addresses".into(),
                value: text.into(),
                reason: "no server address given".into(),
            }));
        }
        Ok(Self { servers })
    }

    /// Reads a file of addresses (see [`StaticMembership::parse`]).
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Core(crate::CoreError::Sys {
                call: "read servers file",
                source: e,
            })
        })?;
        Self::parse(&text)
    }
}

impl Membership for StaticMembership {
    fn servers(&self) -> Result<Vec<SocketAddr>> {
        Ok(self.servers.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_bad_entries_are_typed_errors() {
        let m = StaticMembership::parse("10.0.0.1:7000, 10.0.0.2:7000\n# c\n10.0.0.3:7000 # d\n")
            .unwrap();
        assert_eq!(m.servers().unwrap().len(), 3);
        assert!(matches!(
            StaticMembership::parse("10.0.0.1"),
            Err(Error::Core(crate::CoreError::BadSetting { .. }))
        ));
        assert!(StaticMembership::parse("# nothing").is_err());
    }
}
