//! The closed `SANDBOX_PROVIDER` map.
//!
//! Selection rules (OpenMA's `apps/main-node/src/sandbox-provider.ts`, plus omabox's own
//! `linux`):
//!
//! 1. `OPENMA_TEST_SANDBOX_PROVIDER`, when set and non-empty, wins. Its only value is
//!    `local-subprocess`, honoured only in test mode (`OMABOX_TEST_MODE=1` or `NODE_ENV=test`);
//!    outside test mode it is an error, never silently ignored.
//! 2. Otherwise `SANDBOX_PROVIDER` names the provider. The names are a closed set
//!    ([`SandboxProviderName`]); a known name with no factory registered in this build fails
//!    with "not available in this build". Empty, unset, unknown and `subprocess` fail.
//!
//! The registry is filled by the binary; this crate never names a backend crate.

use crate::factory::{SandboxFactory, SandboxFactoryEnv, is_test_mode};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The variable that selects the production provider.
pub const SANDBOX_PROVIDER_ENV: &str = "SANDBOX_PROVIDER";
/// The variable that selects the unisolated local backend in test mode.
pub const TEST_SANDBOX_PROVIDER_ENV: &str = "OPENMA_TEST_SANDBOX_PROVIDER";
/// The only value of [`TEST_SANDBOX_PROVIDER_ENV`].
pub const LOCAL_SUBPROCESS: &str = "local-subprocess";

/// Every `SANDBOX_PROVIDER` value the map knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum SandboxProviderName {
    /// omabox's namespace sandbox.
    Linux,
    /// OpenMA `@open-managed-agents/managed-runtime-sprites`.
    Sprites,
    /// OpenMA `@open-managed-agents/sandbox-adapter-litebox`.
    Litebox,
    /// Alias of `litebox`.
    Boxlite,
    /// OpenMA `@open-managed-agents/sandbox-adapter-boxrun`.
    Boxrun,
    /// OpenMA `@open-managed-agents/sandbox-adapter-daytona`.
    Daytona,
    /// OpenMA `@open-managed-agents/sandbox-adapter-opensandbox`.
    Opensandbox,
    /// OpenMA `@open-managed-agents/sandbox-adapter-e2b`.
    E2b,
}

impl SandboxProviderName {
    /// Every known name, in the order error messages list them.
    pub const ALL: &'static [SandboxProviderName] = &[
        SandboxProviderName::Linux,
        SandboxProviderName::Sprites,
        SandboxProviderName::Litebox,
        SandboxProviderName::Boxlite,
        SandboxProviderName::Boxrun,
        SandboxProviderName::Daytona,
        SandboxProviderName::Opensandbox,
        SandboxProviderName::E2b,
    ];

    /// The `SANDBOX_PROVIDER` value.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxProviderName::Linux => "linux",
            SandboxProviderName::Sprites => "sprites",
            SandboxProviderName::Litebox => "litebox",
            SandboxProviderName::Boxlite => "boxlite",
            SandboxProviderName::Boxrun => "boxrun",
            SandboxProviderName::Daytona => "daytona",
            SandboxProviderName::Opensandbox => "opensandbox",
            SandboxProviderName::E2b => "e2b",
        }
    }

    /// The name for an exact `SANDBOX_PROVIDER` value.
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|name| name.as_str() == value)
    }

    fn known_list() -> String {
        Self::ALL
            .iter()
            .map(|name| name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for SandboxProviderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why no sandbox factory could be selected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxProviderError {
    /// `SANDBOX_PROVIDER` is unset or empty.
    #[error(
        "SANDBOX_PROVIDER is not set; set it to one of: {known}",
        known = SandboxProviderName::known_list()
    )]
    Unset,
    /// `SANDBOX_PROVIDER=subprocess`.
    #[error(
        "SANDBOX_PROVIDER=subprocess is not allowed: a subprocess sandbox has no isolation \
         boundary. Tests may select it with OPENMA_TEST_SANDBOX_PROVIDER=local-subprocess in \
         test mode (OMABOX_TEST_MODE=1 or NODE_ENV=test)"
    )]
    SubprocessNotAllowed,
    /// A value outside the closed map.
    #[error(
        "SANDBOX_PROVIDER={value:?} is not a known sandbox provider; known providers: {known}",
        known = SandboxProviderName::known_list()
    )]
    Unknown {
        /// The value found.
        value: String,
    },
    /// A known provider whose backend this build does not include.
    #[error("SANDBOX_PROVIDER={name} is not available in this build")]
    NotAvailable {
        /// The provider.
        name: SandboxProviderName,
    },
    /// `OPENMA_TEST_SANDBOX_PROVIDER` set outside test mode.
    #[error(
        "OPENMA_TEST_SANDBOX_PROVIDER={value:?} is honoured only in test mode; set \
         OMABOX_TEST_MODE=1 (or NODE_ENV=test) or unset OPENMA_TEST_SANDBOX_PROVIDER"
    )]
    TestProviderOutsideTestMode {
        /// The value found.
        value: String,
    },
    /// `OPENMA_TEST_SANDBOX_PROVIDER` with a value other than `local-subprocess`.
    #[error(
        "OPENMA_TEST_SANDBOX_PROVIDER={value:?} is not a known test sandbox provider; the only \
         one is local-subprocess"
    )]
    UnknownTestProvider {
        /// The value found.
        value: String,
    },
    /// `OPENMA_TEST_SANDBOX_PROVIDER=local-subprocess` but no local backend was registered.
    #[error("OPENMA_TEST_SANDBOX_PROVIDER=local-subprocess is not available in this build")]
    TestProviderNotAvailable,
}

impl From<SandboxProviderError> for omabox_contract::PortError {
    fn from(error: SandboxProviderError) -> Self {
        omabox_contract::PortError::invalid_argument(error.to_string())
    }
}

/// Name → factory table, filled by the binary.
#[derive(Clone, Default)]
pub struct SandboxFactoryRegistry {
    providers: BTreeMap<SandboxProviderName, Arc<dyn SandboxFactory>>,
    local_subprocess: Option<Arc<dyn SandboxFactory>>,
}

impl fmt::Debug for SandboxFactoryRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxFactoryRegistry")
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .field("local_subprocess", &self.local_subprocess.is_some())
            .finish()
    }
}

impl SandboxFactoryRegistry {
    /// An empty table: every provider is "not available in this build".
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the factory for `name`, replacing any earlier one.
    pub fn register(&mut self, name: SandboxProviderName, factory: Arc<dyn SandboxFactory>) {
        self.providers.insert(name, factory);
    }

    /// Registers the unisolated local backend, selectable only by
    /// `OPENMA_TEST_SANDBOX_PROVIDER=local-subprocess` in test mode.
    pub fn register_local_subprocess(&mut self, factory: Arc<dyn SandboxFactory>) {
        self.local_subprocess = Some(factory);
    }

    /// The providers this build can create.
    pub fn available(&self) -> impl Iterator<Item = SandboxProviderName> + '_ {
        self.providers.keys().copied()
    }
}

/// Picks the factory `env` selects. See the module doc for the rules.
pub fn resolve_sandbox_provider(
    env: &SandboxFactoryEnv,
    registry: &SandboxFactoryRegistry,
) -> Result<Arc<dyn SandboxFactory>, SandboxProviderError> {
    if let Some(value) = env
        .get(TEST_SANDBOX_PROVIDER_ENV)
        .filter(|value| !value.is_empty())
    {
        if !is_test_mode(env) {
            return Err(SandboxProviderError::TestProviderOutsideTestMode {
                value: value.to_owned(),
            });
        }
        if value != LOCAL_SUBPROCESS {
            return Err(SandboxProviderError::UnknownTestProvider {
                value: value.to_owned(),
            });
        }
        return registry
            .local_subprocess
            .clone()
            .ok_or(SandboxProviderError::TestProviderNotAvailable);
    }

    let value = env.get(SANDBOX_PROVIDER_ENV).unwrap_or_default();
    if value.is_empty() {
        return Err(SandboxProviderError::Unset);
    }
    if value == "subprocess" {
        return Err(SandboxProviderError::SubprocessNotAllowed);
    }
    let name = SandboxProviderName::parse(value).ok_or_else(|| SandboxProviderError::Unknown {
        value: value.to_owned(),
    })?;
    registry
        .providers
        .get(&name)
        .cloned()
        .ok_or(SandboxProviderError::NotAvailable { name })
}
