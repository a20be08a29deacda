//! `--provider` and `--device`: the one flag group of every subcommand that opens a device,
//! and the one function that opens the context they select.

use crate::{Result, ToolError};
use rdmapool::devices;
use rdmapool::fabric::{Context, ProviderKind, ProviderOptions, SoftConfig, Transport};

/// A provider as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// rdmapool's software RDMA (pure Rust, no NIC needed).
    Soft,
    /// rdma-core verbs: a NIC, or SoftRoCE (rdma_rxe).
    Verbs,
}

impl From<Provider> for ProviderKind {
    fn from(p: Provider) -> Self {
        match p {
            Provider::Soft => ProviderKind::Soft,
            Provider::Verbs => ProviderKind::Verbs,
        }
    }
}

/// Which device a subcommand opens.
///
/// Each flag names its help heading itself: a `next_help_heading` on the flattened struct
/// would also put every flag declared after it in the subcommand under "Device".
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// soft (software RDMA, no NIC needed) or verbs (rdma-core: a NIC or SoftRoCE). Commands
    /// that open a device use soft when it is not given; `devices` then lists both.
    #[arg(long, value_enum, help_heading = "Device")]
    pub provider: Option<Provider>,
    /// The device by name, as `rdma-tool devices` lists it (verbs: e.g. rxe0 or mlx5_0, the
    /// first one or $RDMAPOOL_DEVICE when not given; soft: soft0).
    #[arg(long, value_name = "NAME", help_heading = "Device")]
    pub device: Option<String>,
}

impl DeviceArgs {
    /// The provider selected (soft when none was given).
    pub fn kind(&self) -> ProviderKind {
        self.provider.map_or(ProviderKind::Soft, Into::into)
    }

    /// The flags as a child `rdma-tool` process takes them, so it opens the same device.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec!["--provider".to_string(), self.kind().name().to_string()];
        if let Some(d) = &self.device {
            v.extend(["--device".to_string(), d.clone()]);
        }
        v
    }

    /// Checks that the provider can be used here and the device exists; the error says why
    /// not and what to do.
    pub fn check(&self) -> Result<()> {
        let kind = self.kind();
        let status = devices()
            .into_iter()
            .find(|p| p.provider == kind)
            .ok_or_else(|| ToolError::Msg(format!("provider {kind} is not built in")))?;
        if let Some(reason) = status.unavailable {
            let other = match kind {
                ProviderKind::Verbs => " (or use --provider soft, which needs no NIC)",
                ProviderKind::Soft => "",
            };
            return Err(ToolError::Msg(format!(
                "--provider {kind}: not available here: {reason}{other}"
            )));
        }
        let wanted = self.device.clone().or_else(|| match kind {
            ProviderKind::Verbs => std::env::var("RDMAPOOL_DEVICE")
                .ok()
                .filter(|v| !v.trim().is_empty()),
            ProviderKind::Soft => None,
        });
        if let Some(name) = wanted {
            if !status.devices.iter().any(|d| d.name == name) {
                let known: Vec<&str> = status.devices.iter().map(|d| d.name.as_str()).collect();
                let from = if self.device.is_some() {
                    "--device"
                } else {
                    "RDMAPOOL_DEVICE="
                };
                return Err(ToolError::Msg(format!(
                    "{from}{}{name}: no {kind} device of that name; {kind} has: {} \
                     (see `rdma-tool devices`)",
                    if from == "--device" { " " } else { "" },
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
        Ok(())
    }

    /// Opens the selected device. A soft NIC takes `transport` to its peers (verbs has one
    /// path and ignores it); other soft settings come from the environment.
    pub fn open(&self, transport: Transport) -> Result<Context> {
        self.open_allowing(transport, false)
    }

    /// [`DeviceArgs::open`]; with `allow_unauthenticated`, a soft NIC may listen beyond
    /// loopback without a pre-shared key (`--allow-unauthenticated`).
    pub fn open_allowing(
        &self,
        transport: Transport,
        allow_unauthenticated: bool,
    ) -> Result<Context> {
        self.check()?;
        Ok(match self.kind() {
            ProviderKind::Soft => {
                let mut cfg = SoftConfig::from_env()?.with_transport(transport);
                cfg.admission.allow_unauthenticated |= allow_unauthenticated;
                Context::open(cfg)?
            }
            p => Context::open(ProviderOptions::from_env(p, self.device.as_deref())?)?,
        })
    }
}

/// A clap value parser for `--transport`: auto, tcp or local, or a comma-separated list of
/// them where a command measures several paths; a bad one is a usage error.
pub fn transport_arg(s: &str) -> std::result::Result<String, String> {
    for t in s.split(',') {
        Transport::parse(t.trim()).map_err(|e| e.to_string())?;
    }
    Ok(s.to_string())
}

/// [`transport_arg`] for commands that take one path.
pub fn single_transport_arg(s: &str) -> std::result::Result<String, String> {
    Transport::parse(s.trim()).map_err(|e| e.to_string())?;
    Ok(s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_soft_device_names_the_ones_that_exist() {
        let a = DeviceArgs {
            provider: Some(Provider::Soft),
            device: Some("nope0".into()),
        };
        let e = a.open(Transport::Auto).err().expect("refused").to_string();
        assert!(e.contains("nope0") && e.contains("soft0"), "{e}");
        let a = DeviceArgs {
            device: Some("soft0".into()),
            ..DeviceArgs::default()
        };
        assert_eq!(a.open(Transport::Auto).unwrap().device().name, "soft0");
        assert_eq!(a.to_args(), ["--provider", "soft", "--device", "soft0"]);
    }
}
