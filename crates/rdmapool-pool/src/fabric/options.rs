//! The run-time choice of a provider's options: [`ProviderOptions`].

use crate::fabric::provider::{ContextOps, ContextOptions, Provider};
use crate::fabric::{ProviderKind, SoftConfig, VerbsConfig};
use rdmapool_core::{Error, Result};
use std::sync::Arc;

/// A provider's options for opening a context, chosen at run time; the variant picks the
/// provider. Where the provider is known when the program is written, its own options type
/// opens a context directly.
///
/// ```
/// use rdmapool_pool::fabric::{Context, ProviderKind, ProviderOptions, SoftConfig};
/// let cfg = SoftConfig { spin: std::time::Duration::ZERO, ..SoftConfig::default() };
/// let ctx = Context::open(ProviderOptions::from(cfg))?;
/// assert_eq!(ctx.device().name, "soft0");
/// # Ok::<(), rdmapool_pool::Error>(())
/// ```
#[derive(Debug, Clone)]
pub enum ProviderOptions {
    /// The soft provider.
    Soft(SoftConfig),
    /// rdma-core verbs.
    Verbs(VerbsConfig),
}

impl ProviderOptions {
    /// The provider these options are for.
    pub fn provider(&self) -> ProviderKind {
        match self {
            Self::Soft(_) => ProviderKind::Soft,
            Self::Verbs(_) => ProviderKind::Verbs,
        }
    }

    /// The options from the environment for `provider`, on device `device` (or the first;
    /// for verbs, the one `RDMAPOOL_DEVICE` names when `device` is `None`). A soft device
    /// name other than the soft provider's one is an error.
    ///
    /// ```
    /// use rdmapool_pool::fabric::{Context, ProviderKind, ProviderOptions};
    /// let ctx = Context::open(ProviderOptions::from_env(ProviderKind::Soft, None)?)?;
    /// assert_eq!(ctx.device().name, "soft0");
    /// # Ok::<(), rdmapool_pool::Error>(())
    /// ```
    pub fn from_env(provider: ProviderKind, device: Option<&str>) -> Result<Self> {
        Ok(match provider {
            ProviderKind::Soft => {
                if let Some(d) = device {
                    let status = rdmapool_soft::PROVIDER.status();
                    if !status.devices.iter().any(|x| x.name == d) {
                        return Err(Error::NoSuchDevice {
                            provider,
                            name: d.into(),
                            known: status.devices.into_iter().map(|x| x.name).collect(),
                        });
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

    /// The chosen provider's own options.
    fn chosen(&self) -> &dyn ContextOptions {
        match self {
            Self::Soft(c) => c,
            Self::Verbs(c) => c,
        }
    }
}

impl ContextOptions for ProviderOptions {
    fn provider(&self) -> &'static dyn Provider {
        self.chosen().provider()
    }

    fn device(&self) -> Option<&str> {
        self.chosen().device()
    }

    fn open_context(&self) -> Result<Arc<dyn ContextOps>> {
        self.chosen().open_context()
    }
}

impl From<SoftConfig> for ProviderOptions {
    fn from(c: SoftConfig) -> Self {
        Self::Soft(c)
    }
}

impl From<VerbsConfig> for ProviderOptions {
    fn from(c: VerbsConfig) -> Self {
        Self::Verbs(c)
    }
}
