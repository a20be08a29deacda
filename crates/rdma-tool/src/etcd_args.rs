//! The etcd arguments `serve` and `pool` share: where etcd is, the key prefix, TLS and an
//! etcd user.

use std::path::PathBuf;

/// Where the pool's membership lives in etcd, and how to reach it.
#[derive(clap::Args, Debug, Clone)]
pub struct EtcdArgs {
    /// etcd's client URLs (comma-separated `http://host:port` or `https://host:port`; built
    /// in by default).
    #[arg(long)]
    pub etcd: Option<String>,
    /// The etcd key prefix of this pool's servers.
    #[arg(long, default_value = "/rdmapool/pool")]
    pub etcd_prefix: String,
    /// PEM file of the CA that signed etcd's certificate (for `https://` URLs; without it,
    /// the public web roots).
    #[arg(long, requires = "etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM file of this side's certificate, for an etcd run with `--client-cert-auth`.
    #[arg(long, requires_all = ["etcd", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// PEM file of the key of `--etcd-cert` (mode 0600).
    #[arg(long, requires_all = ["etcd", "etcd_cert"])]
    pub etcd_key: Option<PathBuf>,
    /// The etcd user, when etcd's authentication is on; the password comes from
    /// `--etcd-password-file` or the environment variable RDMAPOOL_ETCD_PASSWORD.
    #[arg(long, requires = "etcd")]
    pub etcd_user: Option<String>,
    /// A file whose first line is the etcd user's password (mode 0600).
    #[arg(long, requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdArgs {
    /// The etcd configuration these arguments give, or `None` without `--etcd`.
    #[cfg(feature = "etcd")]
    pub fn config(&self) -> Result<Option<rdmapool::remote::EtcdConfig>, crate::ToolError> {
        use rdmapool::remote::{EtcdConfig, EtcdCredentials, EtcdTls};
        let Some(urls) = &self.etcd else {
            return Ok(None);
        };
        let endpoints = urls.split(',').map(|u| u.trim().to_string()).collect();
        let mut cfg = EtcdConfig::new(endpoints, &self.etcd_prefix);
        let https = urls.contains("https://");
        if https || self.etcd_ca.is_some() || self.etcd_cert.is_some() {
            cfg.tls = Some(EtcdTls {
                ca_file: self.etcd_ca.clone(),
                cert_file: self.etcd_cert.clone(),
                key_file: self.etcd_key.clone(),
            });
        }
        if let Some(user) = &self.etcd_user {
            let var = EtcdCredentials::PASSWORD_ENV;
            cfg.credentials = Some(match &self.etcd_password_file {
                Some(path) => EtcdCredentials::with_password_file(user, path)?,
                None => match std::env::var(var) {
                    Ok(pw) => EtcdCredentials::new(user, &pw)?,
                    Err(_) => {
                        return Err(crate::ToolError::Msg(format!(
                            "--etcd-user {user}: give the password in --etcd-password-file or \
                             in the environment variable {var}"
                        )))
                    }
                },
            });
        }
        Ok(Some(cfg))
    }
}
