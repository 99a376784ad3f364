//! A queued run's [`RunSpec`] (the HTTP body, validated by the proxy) as the [`RunRequest`]
//! the runner takes — what `omabox run`'s arguments become, for the same fields.
//!
//! Must never: put a credential spec (`HOST=SECRET`) in an error; a bad one is named by its
//! position only.

use crate::config::Key;
use crate::environment::EnvironmentConfig;
use crate::runner::{AcpRequest, QueuedRun, RunRequest};
use crate::session_inputs::SessionInputs;
use crate::wiring::Backend;
use crate::{NodeConfig, work_profile};
use omabox_acp::AcpTurnOptions;
use omabox_acp::agents::{AGENT_MOUNT, known_agent};
use omabox_backend_linux::credential_egress::EgressCredential;
use omabox_host::work_item::session_scope;
use omabox_proxy::runs::RunSpec;
use std::time::Duration;

/// The run `spec` asks for in `session_id`, with the node's settings; `queued` when it is
/// a claimed run (its publication goes through the queue). An error names the field.
pub fn request(
    spec: &RunSpec,
    session_id: &str,
    config: &NodeConfig,
    queued: Option<QueuedRun>,
) -> anyhow::Result<RunRequest> {
    crate::session::check_id("the session id", session_id)?;
    let backend = match spec.backend.as_deref() {
        None | Some("linux") => Backend::Linux,
        Some("local") => Backend::Local,
        Some(_) => anyhow::bail!("`backend` must be \"linux\" or \"local\""),
    };
    let credentials = spec
        .credentials
        .iter()
        .enumerate()
        .map(|(index, text)| {
            EgressCredential::parse(text).map_err(|_| {
                anyhow::anyhow!(
                    "`credentials[{index}]` is not HOST[/PREFIX]=SECRET[:bearer|basic|token]"
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !credentials.is_empty() && backend != Backend::Linux {
        anyhow::bail!("`credentials` need the linux backend (its enforced egress path)");
    }
    let environment = spec
        .environment
        .as_ref()
        .map(|value| {
            EnvironmentConfig::parse(&value.to_string())
                .map_err(|error| anyhow::anyhow!("`environment`: {error:#}"))
        })
        .transpose()?;
    let session_inputs = SessionInputs::from_resources(&spec.resources)?;
    let (mut profile, acp) = match (&spec.command, &spec.agent) {
        (Some(command), None) => (work_profile::for_command(command, false), None),
        (None, Some(name)) => {
            let Some(agent) = known_agent(name) else {
                anyhow::bail!("`agent` must be \"claude\" or \"codex\"");
            };
            if backend != Backend::Linux {
                anyhow::bail!("`agent` needs the linux backend (its package is mounted)");
            }
            let mut profile = work_profile::for_command(&agent.command(AGENT_MOUNT), false);
            work_profile::set_agent_env(&mut profile, agent);
            let mut turn = AcpTurnOptions::new(spec.prompt.clone().unwrap_or_default());
            if let Some(ms) = config.number(Key::AcpInitializeTimeoutMs)? {
                turn.initialize_timeout = Duration::from_millis(ms);
            }
            if let Some(ms) = config.number(Key::AcpTurnTimeoutMs)? {
                turn.turn_timeout = Duration::from_millis(ms);
            }
            let acp = AcpRequest {
                turn,
                install: Some(agent),
                adapter: Some(agent),
                inference_config: None,
            };
            (profile, Some(acp))
        }
        _ => anyhow::bail!("give `command` or `agent`"),
    };
    if !credentials.is_empty() {
        work_profile::require_credential_egress(&mut profile);
    }
    Ok(RunRequest {
        backend,
        scope: session_scope(session_id),
        profile,
        workspace_seed: None,
        from_revision: None,
        environment,
        credentials,
        session_inputs,
        acp,
        inference_gateway: config
            .checked_secret(Key::InferenceGateway)?
            .map(|url| url.expose().to_owned()),
        queued,
    })
}

/// `text` with every credential of `spec` (and each secret name in it) replaced by
/// `[redacted]`: for error texts and events of the run.
pub fn redact(spec: &RunSpec, text: &str) -> String {
    let mut secrets: Vec<String> = Vec::new();
    for credential in &spec.credentials {
        secrets.push(credential.clone());
        if let Ok(parsed) = EgressCredential::parse(credential) {
            secrets.push(parsed.secret);
        }
        if let Some((_, secret)) = credential.split_once('=') {
            secrets.push(secret.to_owned());
            if let Some((name, _)) = secret.rsplit_once(':') {
                secrets.push(name.to_owned());
            }
        }
    }
    // Longest first, so a name inside a whole spec does not split it.
    secrets.retain(|secret| !secret.trim().is_empty());
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets.iter().fold(text.to_owned(), |text, secret| {
        text.replace(secret, "[redacted]")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(credentials: &[&str]) -> RunSpec {
        RunSpec {
            command: Some(vec!["true".into()]),
            credentials: credentials.iter().map(|c| (*c).to_owned()).collect(),
            ..RunSpec::default()
        }
    }

    #[test]
    fn credentials_and_their_secret_names_are_redacted() {
        let spec = spec(&["api.example.com/v1=team-token-7:bearer"]);
        let text = redact(
            &spec,
            "vault secret team-token-7 missing for api.example.com/v1=team-token-7:bearer",
        );
        assert!(!text.contains("team-token-7"), "{text}");
    }

    #[test]
    fn a_bad_credential_is_named_by_its_position_only() {
        let env: crate::config::Environment = [("HOME", "/nonexistent")].into_iter().collect();
        let config = NodeConfig::from_sources(&crate::config::Flags::new(), env).unwrap();
        let error = request(&spec(&["no-equals-sign-secret"]), "s1", &config, None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("`credentials[0]`"), "{error}");
        assert!(!error.contains("no-equals-sign-secret"), "{error}");
    }
}
