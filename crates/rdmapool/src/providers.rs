//! The providers this build has, and the one way to open a device: [`devices`] lists them
//! with their devices, [`Context::open`] opens one. This module sits above `fabric` (the model
//! and the provider interface) and the providers that implement it (`soft`, `verbs`), so
//! that neither names the other.

use crate::fabric::provider::Provider;
use crate::fabric::{
    Context, ProviderKind, ProviderOptions, ProviderStatus, SoftConfig, VerbsConfig,
};
use crate::{Error, Result};

/// Every provider, in the order [`devices`] lists them.
fn table() -> [&'static dyn Provider; 2] {
    [&crate::soft::PROVIDER, &crate::verbs::PROVIDER]
}

/// The provider of `kind`.
fn find(kind: ProviderKind) -> &'static dyn Provider {
    table()
        .into_iter()
        .find(|p| p.kind() == kind)
        .expect("every ProviderKind is in the table")
}

/// Lists every provider with its devices, or the reason it is unavailable.
///
/// ```
/// let providers = rdmapool::devices();
/// assert!(providers.iter().any(|p| p.provider == rdmapool::fabric::ProviderKind::Soft));
/// ```
pub fn devices() -> Vec<ProviderStatus> {
    table().into_iter().map(|p| p.status()).collect()
}

impl Context {
    /// Opens a device: the provider and device the options name, with those options. This is
    /// the one way to open a context; the options come from a provider's own type
    /// ([`SoftConfig`](crate::fabric::SoftConfig), [`VerbsConfig`](crate::fabric::VerbsConfig)) or from the environment
    /// ([`ProviderOptions::from_env`]), and [`devices`] lists what can be opened.
    ///
    /// Fails with [`Error::ProviderUnavailable`] when the provider cannot be used here and
    /// [`Error::InvalidArgument`] (naming the devices there are) for a device that does not
    /// exist.
    pub fn open(options: impl Into<ProviderOptions>) -> Result<Self> {
        let options = options.into();
        let provider = find(options.provider());
        let device = match &options {
            ProviderOptions::Verbs(v) => v.device.as_deref(),
            ProviderOptions::Soft(_) => None,
        };
        let status = provider.status();
        if let Some(reason) = status.unavailable {
            return Err(Error::ProviderUnavailable {
                provider: options.provider().name().into(),
                reason,
            });
        }
        if let Some(name) = device {
            if !status.devices.iter().any(|d| d.name == name) {
                let known: Vec<_> = status.devices.iter().map(|d| d.name.as_str()).collect();
                return Err(Error::InvalidArgument(format!(
                    "no {} device {name:?} (devices: {})",
                    options.provider(),
                    known.join(", ")
                )));
            }
        }
        Ok(Self::from_ops(provider.open(&options)?))
    }
}

impl ProviderOptions {
    /// The options from the environment for `provider`, on device `device` (or the first;
    /// for verbs, the one `RDMAPOOL_DEVICE` names when `device` is `None`). A soft device
    /// name other than the soft provider's one is an error.
    ///
    /// ```
    /// use rdmapool::fabric::{Context, ProviderKind, ProviderOptions};
    /// let ctx = Context::open(ProviderOptions::from_env(ProviderKind::Soft, None)?)?;
    /// assert_eq!(ctx.device().name, "soft0");
    /// # Ok::<(), rdmapool::Error>(())
    /// ```
    pub fn from_env(provider: ProviderKind, device: Option<&str>) -> Result<Self> {
        Ok(match provider {
            ProviderKind::Soft => {
                if let Some(d) = device {
                    let status = find(provider).status();
                    if !status.devices.iter().any(|x| x.name == d) {
                        let known: Vec<_> =
                            status.devices.iter().map(|x| x.name.as_str()).collect();
                        return Err(Error::InvalidArgument(format!(
                            "no soft device {d:?} (devices: {})",
                            known.join(", ")
                        )));
                    }
                }
                Self::Soft(SoftConfig::from_env()?)
            }
            ProviderKind::Verbs => {
                let mut v = VerbsConfig::from_env()?;
                if let Some(d) = device {
                    v.device = Some(d.to_string());
                }
                Self::Verbs(v)
            }
        })
    }
}
