//! The providers this build has: [`devices`] lists them with their devices. Each provider is
//! a crate of its own (`rdmapool-soft`, `rdmapool-verbs`) implementing `rdmapool-core`'s
//! provider interface; [`ProviderOptions`](crate::fabric::ProviderOptions) chooses one at run
//! time for [`Context::open`](crate::fabric::Context::open).

use crate::fabric::provider::Provider;
use crate::fabric::{ProviderKind, ProviderStatus};

/// Every provider, in the order [`devices`] lists them.
fn table() -> [&'static dyn Provider; 2] {
    [find(ProviderKind::Soft), find(ProviderKind::Verbs)]
}

/// The provider of `kind`.
pub(crate) fn find(kind: ProviderKind) -> &'static dyn Provider {
    match kind {
        ProviderKind::Soft => &rdmapool_soft::PROVIDER,
        ProviderKind::Verbs => &rdmapool_verbs::PROVIDER,
    }
}

/// Lists every provider with its devices, or the reason it is unavailable.
///
/// ```
/// let providers = rdmapool_pool::devices();
/// assert!(providers.iter().any(|p| p.provider == rdmapool_pool::fabric::ProviderKind::Soft));
/// ```
pub fn devices() -> Vec<ProviderStatus> {
    table().into_iter().map(|p| p.status()).collect()
}
