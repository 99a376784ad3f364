//! `omabox run --credential HOST…` for a host the sandbox can never reach is refused before
//! anything starts (no store opened, no fence claimed, no sandbox): a binding opens nothing
//! by itself (the host must also be admitted by the networking), so such a credential would
//! be silently useless.
//!
//! The networking judged is the one the sandbox will get ([`crate::environment`]'s order):
//! `--environment`'s `networking`, else the operator's `OMABOX_LINUX_NETWORK`, else `limited`
//! with nothing allowed. A host is reachable when the policy admits its name on some port
//! (`NetworkPolicy::answers`: `unrestricted`, or a `limited` entry naming it or a wildcard
//! covering it); never under `none`.

use omabox_backend_linux::credential_egress::EgressCredential;
use omabox_backend_linux::factory::parse_networking;
use omabox_contract::networking::{NetworkPolicy, NetworkingConfig};

/// Refuses the first credential whose host `networking` never reaches. `networking`: the
/// environment's config, if any; `operator`: `OMABOX_LINUX_NETWORK`'s value, if set.
pub fn check(
    credentials: &[EgressCredential],
    networking: Option<&NetworkingConfig>,
    operator: Option<&str>,
) -> anyhow::Result<()> {
    if credentials.is_empty() {
        return Ok(());
    }
    let (config, source) = match (networking, operator.filter(|o| !o.trim().is_empty())) {
        (Some(config), _) => (config.clone(), "--environment's networking"),
        (None, Some(operator)) => (
            parse_networking(operator).map_err(|e| anyhow::anyhow!("OMABOX_LINUX_NETWORK: {e}"))?,
            "OMABOX_LINUX_NETWORK",
        ),
        (None, None) => (
            NetworkingConfig::Limited {
                allowed_hosts: Vec::new(),
                allow_package_managers: false,
                allow_mcp_servers: false,
            },
            "the default networking",
        ),
    };
    let policy = NetworkPolicy::compile(&config, &[])?;
    for credential in credentials {
        let host = &credential.host;
        if policy.answers(host) {
            continue;
        }
        let why = match &policy {
            NetworkPolicy::None => "is `none` (the sandbox reaches nothing)".to_owned(),
            _ => format!("is `limited` and does not allow {host}"),
        };
        anyhow::bail!(
            "--credential for {host}: the sandbox could never reach {host}, so the secret would never be used: {source} {why}. \
             Allow the host: --environment FILE with {{\"networking\": {{\"type\": \"limited\", \"allowed_hosts\": [\"{host}\"]}}}}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(text: &str) -> EgressCredential {
        EgressCredential::parse(text).unwrap()
    }

    fn limited(hosts: &[&str]) -> NetworkingConfig {
        NetworkingConfig::Limited {
            allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
            allow_package_managers: false,
            allow_mcp_servers: false,
        }
    }

    #[test]
    fn a_credential_for_an_unreachable_host_is_refused_naming_why() {
        let api = [cred("api.test/org=tok")];
        for (networking, operator, says) in [
            (None, None, "the default networking is `limited`"),
            (None, Some("none"), "OMABOX_LINUX_NETWORK is `none`"),
            (
                None,
                Some("limited"),
                "`limited` and does not allow api.test",
            ),
            (
                Some(NetworkingConfig::None),
                Some("unrestricted"),
                "--environment's networking is `none`",
            ),
            (
                Some(limited(&["other.test", "*.api.test"])),
                None,
                "does not allow api.test",
            ),
        ] {
            let err = check(&api, networking.as_ref(), operator)
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{err}");
            assert!(err.contains("allowed_hosts"), "{err}");
        }
    }

    #[test]
    fn a_credential_for_a_reachable_host_passes() {
        let api = [cred("api.test=tok"), cred("x.cdn.test=tok")];
        for (networking, operator) in [
            (Some(limited(&["api.test:8443", "*.cdn.test"])), None),
            (Some(NetworkingConfig::Unrestricted), Some("none")),
            (None, Some("unrestricted")),
            (
                None,
                Some(r#"{"type":"limited","allowed_hosts":["API.test.","x.cdn.test"]}"#),
            ),
        ] {
            check(&api, networking.as_ref(), operator).unwrap();
        }
        check(&[], Some(&NetworkingConfig::None), None).unwrap();
    }
}
