//! The profile `omabox run` asks for: the bundled demo, `CMD ARGS` in the default profile,
//! or a `ManagedRuntimeProfile` file whose entry process CMD may replace.
//!
//! Default profile: workspace `durable` (→ `checkpoint_restore`), outputs `durable`
//! (→ `final_collect`), runtime checkpoint `disabled`, harness `ama_worker` running CMD with
//! cwd `/workspace` (or, supervised, an `openma_supervised` supervisor speaking the
//! JSON-Lines protocol). What this must never do: put a secret into a profile (secrets reach
//! the harness only through the spawn-time env projection).

use anyhow::Context as _;
use omabox_contract::{
    HarnessDriverDeclaration, HarnessIdentity, ManagedRuntimeProfile, OutputRequirement,
    OutputStrategy, OutputsProfile, RuntimeCheckpointRequirement, RuntimeProcessDeclaration,
    SupervisorProtocol, WorkspaceProfile, WorkspaceRequirement, WorkspaceStrategy,
};
use std::path::Path;

/// The bundled demo harness: a shell script, run with cwd `/workspace`.
const DEMO_SCRIPT: &str = r##"set -eu
outputs="${OMA_OUTPUTS_DIR:-/mnt/session/outputs}"
previous=$(cat counter 2>/dev/null || echo 0)
run=$((previous + 1))
echo "$run" > counter
echo "run $run at $(date -u +%Y-%m-%dT%H:%M:%SZ)" >> history.log
{
  echo "# omabox demo report"
  echo
  echo "- run: $run (the previous run left counter=$previous in /workspace)"
  echo "- workspace files: $(ls | wc -l)"
  echo "- kernel: $(uname -sr)"
} > "$outputs/report.md"
echo "demo: /workspace/counter is now $run; wrote /mnt/session/outputs/report.md"
"##;

/// The demo work item's profile.
pub fn demo() -> ManagedRuntimeProfile {
    default_profile(
        RuntimeProcessDeclaration {
            command: "sh".into(),
            args: Some(vec!["-c".into(), DEMO_SCRIPT.into()]),
            cwd: Some("/workspace".into()),
            env: None,
        },
        false,
    )
}

/// Gives an `ama_worker` harness a known ACP agent's env (its inference adapter's
/// variables); `omabox run --agent` and a queued `{"agent": …}` run both use it.
pub fn set_agent_env(profile: &mut ManagedRuntimeProfile, agent: &omabox_acp::agents::KnownAgent) {
    if let HarnessDriverDeclaration::AmaWorker { process } = &mut profile.driver {
        process.env = Some(agent.env());
    }
}

/// Marks the work item as needing enforced credential egress (a run with credentials).
pub fn require_credential_egress(profile: &mut ManagedRuntimeProfile) {
    profile.credential_egress = Some(omabox_contract::CredentialEgressProfile {
        requirement: omabox_contract::CredentialEgressRequirement::Required,
    });
}

/// CMD ARGS in the default profile (see the module doc).
pub fn for_command(command: &[String], supervised: bool) -> ManagedRuntimeProfile {
    default_profile(process_of(command), supervised)
}

/// CMD ARGS as a process declaration running in `/workspace`.
fn process_of(command: &[String]) -> RuntimeProcessDeclaration {
    RuntimeProcessDeclaration {
        command: command.first().cloned().unwrap_or_default(),
        args: Some(command.iter().skip(1).cloned().collect()),
        cwd: Some("/workspace".into()),
        env: None,
    }
}

fn default_profile(process: RuntimeProcessDeclaration, supervised: bool) -> ManagedRuntimeProfile {
    let driver = if supervised {
        HarnessDriverDeclaration::OpenmaSupervised {
            protocol: SupervisorProtocol::V1,
            supervisor: process,
            harness: HarnessIdentity {
                id: "omabox-run".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
            ready_timeout_ms: 30_000,
            heartbeat_timeout_ms: 60_000,
            drain_timeout_ms: 30_000,
        }
    } else {
        HarnessDriverDeclaration::AmaWorker { process }
    };
    ManagedRuntimeProfile {
        workspace: WorkspaceProfile {
            requirement: WorkspaceRequirement::Durable,
            preferred_strategies: Some(vec![WorkspaceStrategy::CheckpointRestore]),
        },
        outputs: OutputsProfile {
            requirement: OutputRequirement::Durable,
            preferred_strategies: Some(vec![OutputStrategy::FinalCollect]),
        },
        runtime_checkpoint: RuntimeCheckpointRequirement::Disabled,
        credential_egress: None,
        driver,
    }
}

/// Reads a profile file; CMD, when given, replaces its entry process's command and args.
pub fn from_file(path: &Path, command: &[String]) -> anyhow::Result<ManagedRuntimeProfile> {
    let text = crate::input_file::read_text(path, "--profile", crate::input_file::DOCUMENT_MAX)?;
    let mut profile: ManagedRuntimeProfile = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a ManagedRuntimeProfile (JSON with workspace, outputs, runtimeCheckpoint, driver)",
            path.display()
        )
    })?;
    if let Some(program) = command.first() {
        let process = match &mut profile.driver {
            HarnessDriverDeclaration::AmaWorker { process } => process,
            HarnessDriverDeclaration::OpenmaSupervised { supervisor, .. } => supervisor,
        };
        process.command = program.clone();
        process.args = Some(command[1..].to_vec());
    }
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_file_keeps_its_lane_and_takes_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        let profile = for_command(&["old".into()], true);
        std::fs::write(&path, serde_json::to_string(&profile).unwrap()).unwrap();
        let read = from_file(&path, &["new".into(), "a".into()]).unwrap();
        let HarnessDriverDeclaration::OpenmaSupervised { supervisor, .. } = &read.driver else {
            panic!("the supervised lane is kept");
        };
        assert_eq!(supervisor.command, "new");
        assert_eq!(supervisor.args.as_deref(), Some(&["a".to_owned()][..]));
        assert_eq!(supervisor.cwd.as_deref(), Some("/workspace"));
        let unchanged = from_file(&path, &[]).unwrap();
        assert_eq!(unchanged, profile);
    }

    #[test]
    fn a_bad_profile_file_says_what_it_should_be() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        std::fs::write(&path, "{}").unwrap();
        let error = from_file(&path, &[]).unwrap_err().to_string();
        assert!(error.contains("is not a ManagedRuntimeProfile"), "{error}");
    }
}
