//! The `CredentialEgressPort` of a backend whose sandboxes' network is a [`SandboxNetwork`]
//! (linux, docker), `enforced` for HTTPS: vault secrets are injected by the host's relay into
//! requests to bound hosts; the sandbox holds only the opaque binding id and trust in the
//! binding's CA. The backend supplies the live sandboxes ([`LiveSandboxes`]) and how one is
//! made to trust the CA ([`CredentialTarget`]).
//!
//! [`SandboxNetwork`]: crate::SandboxNetwork
//!
//! | step | what happens |
//! |------|--------------|
//! | `prepare` | a binding id (`<provider>-egress-` + sha256 of the scope, generation and key), recorded for the scope and generation |
//! | `attach` | the rules' vault secrets are read (`live`: at attach, so a rotated secret is used by the next work item), a CA is made for the binding (its key stays in host memory), the sandbox's relay intercepts the bound hosts, and the sandbox trusts the CA: a bundle holding it named by [`CA_ENV`] for every process started afterwards (the backend's [`CredentialTarget`]) |
//! | `revoke` | the secrets are dropped at once: open intercepted connections carry no more of them, new ones are not intercepted |
//! | `release` | the binding is forgotten |
//!
//! A bound host must also be admitted by the sandbox's networking (a binding opens nothing
//! by itself). Plain HTTP and raw TCP are not intercepted: a secret never goes out in clear.
//! NOT FOUND in the reference: how bindings map hosts to vault secrets (the TypeScript
//! contract leaves it to each backend); here the operator lists [`EgressCredential`]s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use base64::Engine as _;
use omabox_contract::{
    AbortSignal, CredentialEgressBinding, CredentialEgressBindingEnforcement,
    CredentialEgressCapabilities, CredentialEgressEnforcement, CredentialEgressMode,
    CredentialEgressPort, CredentialEgressProtocol, ManagedSandboxLease, PortError,
    PrepareCredentialEgressInput, RuntimeResourceFence, RuntimeResourceScope, SecretString,
    TerminationReason, VaultSecretPort,
};
use omabox_egress::intercept::{Credentials, InjectionRule, InterceptCa, roots_from_pem};
use sha2::{Digest, Sha256};

/// The variables a sandbox's processes are given naming the CA bundle to trust (every
/// common TLS stack reads one of them).
pub const CA_ENV: [&str; 6] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
];

/// A live sandbox whose network is a [`SandboxNetwork`](crate::SandboxNetwork): what
/// [`CredentialEgress::attach`](CredentialEgressPort::attach) makes intercept and trust.
#[async_trait]
pub trait CredentialTarget: Send + Sync {
    /// The relay intercepts the hosts `credentials` binds, and every process started in
    /// the sandbox afterwards trusts its CA. Needs a network (not `none`).
    async fn attach_credentials(&self, credentials: Arc<Credentials>) -> Result<(), PortError>;
}

/// Where the port finds the live sandbox of a lease: the managed provider that started it.
pub trait LiveSandboxes: Send + Sync {
    /// The live tool sandbox of runtime `id`, when this process created it.
    fn live_target(&self, id: &str) -> Option<Arc<dyn CredentialTarget>>;
}

/// How a secret becomes a header value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthScheme {
    /// `Authorization: Bearer <secret>`.
    Bearer,
    /// `Authorization: Basic base64(<secret>)`, the secret being `user:password`.
    Basic,
    /// `Authorization: token <secret>` (GitHub's classic form).
    Token,
}

/// One operator rule: requests to `host` under `path_prefix` carry vault secret `secret`
/// (the prefix matches whole path segments: `/org/app` covers `/org/app/x`, not
/// `/org/app-x`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressCredential {
    /// The host name (HTTPS, any admitted port).
    pub host: String,
    /// Path prefix (`/` for all).
    pub path_prefix: String,
    /// The vault secret's name.
    pub secret: String,
    /// How it is sent.
    pub scheme: AuthScheme,
}

impl EgressCredential {
    /// Parses `HOST[/PREFIX]=SECRET[:bearer|basic|token]` (the CLI's `--credential`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (target, secret) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?} is not HOST[/PREFIX]=SECRET[:SCHEME]"))?;
        let (host, prefix) = match target.find('/') {
            Some(i) => (&target[..i], &target[i..]),
            None => (target, "/"),
        };
        let (secret, scheme) = match secret.rsplit_once(':') {
            Some((name, "bearer")) => (name, AuthScheme::Bearer),
            Some((name, "basic")) => (name, AuthScheme::Basic),
            Some((name, "token")) => (name, AuthScheme::Token),
            Some((_, other)) => {
                return Err(format!("unknown scheme {other:?} (bearer, basic, token)"));
            }
            None => (secret, AuthScheme::Bearer),
        };
        if secret.is_empty() {
            return Err(format!("{text:?} names no secret"));
        }
        let host = omabox_contract::networking::normalize_name(host)
            .ok_or_else(|| format!("{host:?} is not a host name"))?;
        InjectionRule::check_prefix(prefix)?;
        Ok(Self {
            host,
            path_prefix: prefix.to_owned(),
            secret: secret.to_owned(),
            scheme,
        })
    }

    fn header_value(&self, secret: &SecretString) -> SecretString {
        SecretString::new(match self.scheme {
            AuthScheme::Bearer => format!("Bearer {}", secret.expose()),
            AuthScheme::Token => format!("token {}", secret.expose()),
            AuthScheme::Basic => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(secret.expose())
            ),
        })
    }
}

/// What one prepared binding is.
struct Binding {
    scope: RuntimeResourceScope,
    generation: u64,
    credentials: Option<Arc<Credentials>>,
}

/// What the credential egress port of the driver injects, from where.
#[derive(Clone)]
pub struct CredentialEgressOptions {
    /// Where the secrets are read (at every attach).
    pub vault: Arc<dyn omabox_contract::VaultSecretPort>,
    /// The bindings' rules.
    pub rules: Vec<EgressCredential>,
    /// PEM roots upstream servers are checked against (`None`: the host's bundle).
    pub upstream_roots: Option<Vec<u8>>,
}

impl std::fmt::Debug for CredentialEgressOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialEgressOptions")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

/// The host's CA bundle: what upstream servers are checked against unless the operator
/// gives other roots.
pub const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

impl CredentialEgressOptions {
    /// The port injecting these secrets into the sandboxes of `provider` (named
    /// `provider_name`), upstream servers checked against the given roots or else the
    /// host's bundle ([`HOST_CA_BUNDLE`]; none when it cannot be read: every upstream then
    /// fails its check).
    pub fn into_port(
        self,
        provider_name: &'static str,
        provider: Arc<dyn LiveSandboxes>,
    ) -> CredentialEgress {
        let roots = self
            .upstream_roots
            .unwrap_or_else(|| std::fs::read(HOST_CA_BUNDLE).unwrap_or_default());
        CredentialEgress::new(provider_name, provider, self.vault, self.rules, roots)
    }
}

/// The port (see the module doc).
pub struct CredentialEgress {
    /// The backend's provider name (binding ids, errors).
    provider_name: &'static str,
    provider: Arc<dyn LiveSandboxes>,
    vault: Arc<dyn VaultSecretPort>,
    rules: Vec<EgressCredential>,
    /// PEM roots the real servers are checked against.
    upstream_roots: Vec<u8>,
    bindings: Mutex<HashMap<String, Binding>>,
}

impl std::fmt::Debug for CredentialEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialEgress")
            .field("provider", &self.provider_name)
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl CredentialEgress {
    /// A port injecting `rules`' secrets from `vault` into the sandboxes of `provider`
    /// (named `provider_name`), checking upstream servers against `upstream_roots` (PEM).
    pub fn new(
        provider_name: &'static str,
        provider: Arc<dyn LiveSandboxes>,
        vault: Arc<dyn VaultSecretPort>,
        rules: Vec<EgressCredential>,
        upstream_roots: Vec<u8>,
    ) -> Self {
        Self {
            provider_name,
            provider,
            vault,
            rules,
            upstream_roots,
            bindings: Mutex::new(HashMap::new()),
        }
    }

    /// What it proves: enforced, live, HTTPS only.
    pub fn capabilities_value() -> CredentialEgressCapabilities {
        CredentialEgressCapabilities {
            enforcement: CredentialEgressEnforcement::Enforced,
            credential_mode: CredentialEgressMode::Live,
            intercepted_protocols: vec![CredentialEgressProtocol::Https],
        }
    }

    fn bindings(&self) -> MutexGuard<'_, HashMap<String, Binding>> {
        self.bindings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
    ) -> Result<(), PortError> {
        let bindings = self.bindings();
        let known = bindings.get(&binding.binding_id).ok_or_else(|| {
            PortError::new("Credential egress binding is unknown or already released")
        })?;
        if known.scope != *scope || known.generation != fence.generation {
            return Err(PortError::new(
                "Credential egress binding belongs to another fenced runtime scope",
            ));
        }
        Ok(())
    }

    /// The binding's credentials: every rule's secret read from the vault now.
    async fn credentials(&self, binding_id: &str) -> Result<Arc<Credentials>, PortError> {
        let mut rules = Vec::new();
        for rule in &self.rules {
            let secret = self.vault.get(&rule.secret).await?.ok_or_else(|| {
                PortError::new(format!(
                    "credential egress: vault secret {:?} (for {}) is not stored",
                    rule.secret, rule.host
                ))
            })?;
            let value = rule.header_value(&secret);
            rules.push(
                InjectionRule::new(&rule.host, &rule.path_prefix, "authorization", value)
                    .map_err(|e| PortError::new(format!("credential egress: {e}")))?,
            );
        }
        let ca = InterceptCa::generate(binding_id).map_err(|e| PortError::new(e.to_string()))?;
        let credentials = Credentials::new(ca, rules, roots_from_pem(&self.upstream_roots))
            .map_err(|e| PortError::new(e.to_string()))?;
        Ok(Arc::new(credentials))
    }
}

#[async_trait]
impl CredentialEgressPort for CredentialEgress {
    async fn capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<CredentialEgressCapabilities, PortError> {
        Ok(Self::capabilities_value())
    }

    async fn prepare(
        &self,
        input: PrepareCredentialEgressInput,
    ) -> Result<Option<CredentialEgressBinding>, PortError> {
        input.signal.throw_if_aborted()?;
        let scope = &input.scope;
        let key = serde_json::json!([
            self.provider_name,
            scope.workspace_id,
            scope.environment_id,
            scope.session_id,
            scope.work_id,
            input.fence.generation,
            input.idempotency_key,
        ]);
        let binding_id = format!(
            "{}-egress-{}",
            self.provider_name,
            hex::encode(Sha256::digest(key.to_string().as_bytes()))
        );
        self.bindings()
            .entry(binding_id.clone())
            .or_insert(Binding {
                scope: scope.clone(),
                generation: input.fence.generation,
                credentials: None,
            });
        Ok(Some(CredentialEgressBinding {
            binding_id,
            enforcement: CredentialEgressBindingEnforcement::Enforced,
            credential_mode: CredentialEgressMode::Live,
        }))
    }

    async fn attach(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
        sandbox: &ManagedSandboxLease,
        signal: AbortSignal,
    ) -> Result<(), PortError> {
        signal.throw_if_aborted()?;
        self.check(scope, fence, binding)?;
        let port = self
            .provider
            .live_target(&sandbox.runtime_id)
            .ok_or_else(|| {
                PortError::new(format!(
                    "credential egress: {} sandbox {} is not live in this process",
                    self.provider_name, sandbox.runtime_id
                ))
            })?;
        let credentials = self.credentials(&binding.binding_id).await?;
        port.attach_credentials(Arc::clone(&credentials)).await?;
        if let Some(known) = self.bindings().get_mut(&binding.binding_id) {
            known.credentials = Some(credentials);
        }
        Ok(())
    }

    async fn revoke(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
        _reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.check(scope, fence, binding)?;
        let credentials = self
            .bindings()
            .get(&binding.binding_id)
            .and_then(|b| b.credentials.clone())
            .ok_or_else(|| {
                PortError::new("Credential egress binding was never attached to provider compute")
            })?;
        credentials.revoke();
        Ok(())
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
    ) -> Result<(), PortError> {
        let mut bindings = self.bindings();
        if let Some(known) = bindings.get(&binding.binding_id) {
            if known.scope != *scope {
                return Err(PortError::new(
                    "Credential egress binding belongs to another runtime scope",
                ));
            }
            if let Some(credentials) = &known.credentials {
                credentials.revoke();
            }
            bindings.remove(&binding.binding_id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_host_prefix_secret_and_scheme() {
        assert_eq!(
            EgressCredential::parse("GitHub.com/org/=gh-token:basic").unwrap(),
            EgressCredential {
                host: "github.com".into(),
                path_prefix: "/org/".into(),
                secret: "gh-token".into(),
                scheme: AuthScheme::Basic,
            }
        );
        assert_eq!(
            EgressCredential::parse("api.example.com=key")
                .unwrap()
                .scheme,
            AuthScheme::Bearer
        );
        for bad in [
            "nohost",
            "=x",
            "a.com=",
            "a.com=x:digest",
            "a b=x",
            "a.com/org/../x=tok",
            "a.com/org/%2e%2e=tok",
            "a.com/org%2fx=tok",
            "a.com//org=tok",
        ] {
            assert!(EgressCredential::parse(bad).is_err(), "{bad}");
        }
        let rule = EgressCredential::parse("a.com=x:basic").unwrap();
        assert_eq!(
            rule.header_value(&SecretString::new("u:p")).expose(),
            "Basic dTpw"
        );
    }
}
