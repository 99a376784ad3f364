//! The provider driver loader: the Rust form of `loadManagedRuntimeProviderDriver`.
//!
//! The TypeScript host imports an installed adapter package by module specifier and calls its
//! `createManagedRuntimeProviderDriver(factoryOptions)` export. Rust has no dynamic import, so
//! the binary that wires omabox together registers each compiled-in adapter's factory under
//! its module specifier (a crate or feature name such as `"omabox-backend-linux"`); `load`
//! then applies the same checks, with the same texts, as the original:
//!
//! | check | error |
//! |---|---|
//! | `provider.trim()` empty | TypeError "Managed Runtime provider must not be empty" |
//! | `module_specifier.trim()` empty | TypeError "Managed Runtime adapter module specifier must not be empty" |
//! | no factory under the specifier | TypeError "<spec> does not export createManagedRuntimeProviderDriver" |
//! | the factory fails | the factory's own error |
//! | `descriptor().provider` ≠ configured provider | Error "Configured provider <p> loaded <spec>, which advertised provider <q>" |
//!
//! The original's "<spec> returned an invalid Managed Runtime driver" cannot happen here: a
//! factory returns an `Arc<dyn ManagedRuntimeProviderDriverPort>`, so the type system already
//! guarantees `descriptor` and `create` exist.
//!
//! Like the original, loading is lazy: a factory runs only when its provider is selected, and
//! the host keeps no dependency on any adapter crate.

use omabox_contract::{ManagedRuntimeProviderDriverPort, PortError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `createManagedRuntimeProviderDriver(factoryOptions)` of one adapter.
pub type ManagedRuntimeDriverFactory = Arc<
    dyn Fn(serde_json::Value) -> Result<Arc<dyn ManagedRuntimeProviderDriverPort>, PortError>
        + Send
        + Sync,
>;

/// Input of [`ManagedRuntimeDriverLoader::load`].
#[derive(Debug, Clone, PartialEq)]
pub struct LoadDriverInput {
    /// Expected provider identity, from operator configuration.
    pub provider: String,
    /// The adapter's module specifier (crate or feature name).
    pub module_specifier: String,
    /// Adapter-owned options; the host never interprets them.
    pub factory_options: serde_json::Value,
}

/// The table of compiled-in adapter factories, keyed by module specifier.
#[derive(Clone, Default)]
pub struct ManagedRuntimeDriverLoader {
    factories: BTreeMap<String, ManagedRuntimeDriverFactory>,
}

impl std::fmt::Debug for ManagedRuntimeDriverLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRuntimeDriverLoader")
            .field("modules", &self.factories.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ManagedRuntimeDriverLoader {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `factory` under `specifier`.
    ///
    /// omabox-specific (the original resolves modules from the package manager): an empty
    /// specifier fails like `load` does, and a second factory for the same specifier fails
    /// with Error "Duplicate Managed Runtime adapter module: <spec>" rather than silently
    /// replacing the first.
    pub fn register(
        &mut self,
        specifier: impl Into<String>,
        factory: ManagedRuntimeDriverFactory,
    ) -> Result<(), PortError> {
        let specifier = specifier.into();
        if specifier.trim().is_empty() {
            return Err(empty_specifier());
        }
        if self.factories.contains_key(&specifier) {
            return Err(PortError::new(format!(
                "Duplicate Managed Runtime adapter module: {specifier}"
            )));
        }
        self.factories.insert(specifier, factory);
        Ok(())
    }

    /// The registered module specifiers, sorted.
    pub fn module_specifiers(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }

    /// Builds the driver of `input.module_specifier` and checks it is the configured provider.
    pub fn load(
        &self,
        input: LoadDriverInput,
    ) -> Result<Arc<dyn ManagedRuntimeProviderDriverPort>, PortError> {
        let LoadDriverInput {
            provider,
            module_specifier,
            factory_options,
        } = input;
        if provider.trim().is_empty() {
            return Err(PortError::invalid_argument(
                "Managed Runtime provider must not be empty",
            ));
        }
        if module_specifier.trim().is_empty() {
            return Err(empty_specifier());
        }
        let factory = self.factories.get(&module_specifier).ok_or_else(|| {
            PortError::invalid_argument(format!(
                "{module_specifier} does not export createManagedRuntimeProviderDriver"
            ))
        })?;
        let driver = factory(factory_options)?;
        let advertised = driver.descriptor().provider;
        if advertised != provider {
            return Err(PortError::new(format!(
                "Configured provider {provider} loaded {module_specifier}, which advertised provider {advertised}"
            )));
        }
        Ok(driver)
    }
}

fn empty_specifier() -> PortError {
    PortError::invalid_argument("Managed Runtime adapter module specifier must not be empty")
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::ErrorKind;
    use omabox_test_support::drivers::{
        FakeProviderDriver, provider_descriptor, provider_resources,
    };
    use std::sync::Mutex;

    fn loader_with(
        advertised: &'static str,
        seen: Arc<Mutex<Vec<serde_json::Value>>>,
    ) -> ManagedRuntimeDriverLoader {
        let mut loader = ManagedRuntimeDriverLoader::new();
        loader
            .register(
                "omabox-backend-fake",
                Arc::new(move |options| {
                    seen.lock().unwrap().push(options);
                    Ok(Arc::new(FakeProviderDriver::returning(
                        provider_descriptor(advertised),
                        provider_resources(),
                    ))
                        as Arc<dyn ManagedRuntimeProviderDriverPort>)
                }),
            )
            .unwrap();
        loader
            .register(
                "omabox-backend-broken",
                Arc::new(|_| Err(PortError::new("missing SDK credentials file"))),
            )
            .unwrap();
        loader
    }

    fn input(provider: &str, specifier: &str) -> LoadDriverInput {
        LoadDriverInput {
            provider: provider.into(),
            module_specifier: specifier.into(),
            factory_options: serde_json::json!({"image": "debian"}),
        }
    }

    #[test]
    fn loads_the_configured_provider_with_its_factory_options() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let loader = loader_with("fake", Arc::clone(&seen));
        let driver = loader.load(input("fake", "omabox-backend-fake")).unwrap();
        assert_eq!(driver.descriptor().provider, "fake");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![serde_json::json!({"image": "debian"})]
        );
        assert_eq!(
            loader.module_specifiers(),
            ["omabox-backend-broken", "omabox-backend-fake"]
        );
    }

    #[test]
    fn rejects_every_invalid_load_with_the_contract_text() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let loader = loader_with("other", Arc::clone(&seen));
        let cases = [
            (
                input("  ", "omabox-backend-fake"),
                ErrorKind::InvalidArgument,
                "Managed Runtime provider must not be empty",
            ),
            (
                input("fake", " \t"),
                ErrorKind::InvalidArgument,
                "Managed Runtime adapter module specifier must not be empty",
            ),
            (
                input("fake", "omabox-backend-missing"),
                ErrorKind::InvalidArgument,
                "omabox-backend-missing does not export createManagedRuntimeProviderDriver",
            ),
            (
                input("fake", "omabox-backend-broken"),
                ErrorKind::Failure,
                "missing SDK credentials file",
            ),
            (
                input("fake", "omabox-backend-fake"),
                ErrorKind::Failure,
                "Configured provider fake loaded omabox-backend-fake, which advertised provider other",
            ),
        ];
        for (input, kind, message) in cases {
            let error = loader.load(input).err().expect("load must fail");
            assert_eq!(error.message(), message);
            assert_eq!(error.kind(), kind, "{message}");
        }
        // The empty-input checks run before any factory.
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn refuses_an_empty_or_duplicate_registration() {
        let mut loader = ManagedRuntimeDriverLoader::new();
        let factory: ManagedRuntimeDriverFactory = Arc::new(|_| Err(PortError::new("unused")));
        assert_eq!(
            loader
                .register("", Arc::clone(&factory))
                .unwrap_err()
                .message(),
            "Managed Runtime adapter module specifier must not be empty"
        );
        loader
            .register("omabox-backend-local", Arc::clone(&factory))
            .unwrap();
        assert_eq!(
            loader
                .register("omabox-backend-local", factory)
                .unwrap_err()
                .message(),
            "Duplicate Managed Runtime adapter module: omabox-backend-local"
        );
    }
}
