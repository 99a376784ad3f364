//! Says what is wrong with a profile that admission rejected, and what to use instead.
//!
//! The host's rejection texts are the contract's ("The selected composition cannot provide a
//! durable workspace") and stay verbatim; this module appends a hint computed from the
//! profile and the strategies omabox's persistence offers. It never changes a decision: it
//! only explains one.

use omabox_contract::{ManagedRuntimeProfile, PortError, WorkspaceStrategy};
use omabox_host::plan::eligible_workspace_strategies;

/// `error` with a hint appended when it is a workspace-strategy rejection of `profile`;
/// any other error is returned unchanged. `offered` are the workspace strategies the
/// backend's persistence provides.
pub fn explain_rejection(
    profile: &ManagedRuntimeProfile,
    offered: &[WorkspaceStrategy],
    error: PortError,
) -> PortError {
    if !error
        .message()
        .starts_with("The selected composition cannot provide a")
        || !error.message().ends_with(" workspace")
    {
        return error;
    }
    let Some(hint) = workspace_hint(profile, offered) else {
        return error;
    };
    PortError::with_kind(error.kind(), format!("{}: {hint}", error.message()))
}

fn workspace_hint(
    profile: &ManagedRuntimeProfile,
    offered: &[WorkspaceStrategy],
) -> Option<String> {
    let requirement = profile.workspace.requirement;
    let eligible = eligible_workspace_strategies(requirement);
    let usable: Vec<String> = eligible
        .iter()
        .filter(|strategy| offered.contains(strategy))
        .map(|strategy| format!("\"{strategy}\""))
        .collect();
    let instead = if usable.is_empty() {
        "omabox offers no strategy for this requirement; use requirement \"ephemeral\"".to_owned()
    } else {
        format!(
            "use \"preferredStrategies\": [{}] (or leave preferredStrategies out)",
            usable.join(", ")
        )
    };
    let asked = profile.workspace.preferred_strategies.as_deref()?;
    let mut problems = Vec::new();
    for strategy in asked {
        if !eligible.contains(strategy) {
            problems.push(format!(
                "{strategy} does not satisfy a {} workspace (the contract allows {} only for {})",
                requirement.as_str(),
                strategy,
                allowed_for(*strategy)
            ));
        } else if !offered.contains(strategy) {
            problems.push(format!(
                "{strategy} is not offered by omabox's backends (they offer {})",
                offered
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
        }
    }
    if asked.is_empty() {
        problems.push("the profile's workspace.preferredStrategies is empty".to_owned());
    }
    Some(format!(
        "the profile asks for workspace strategies [{}]: {}; {instead}",
        asked
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        problems.join("; ")
    ))
}

fn allowed_for(strategy: WorkspaceStrategy) -> &'static str {
    match strategy {
        WorkspaceStrategy::RetainedRuntime => "continuable or ephemeral workspaces",
        WorkspaceStrategy::Ephemeral => "ephemeral workspaces",
        _ => "durable, continuable or ephemeral workspaces",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::{WorkspaceProfile, WorkspaceRequirement};

    fn profile(
        requirement: WorkspaceRequirement,
        preferred: &[WorkspaceStrategy],
    ) -> ManagedRuntimeProfile {
        let mut profile: ManagedRuntimeProfile = serde_json::from_value(serde_json::json!({
            "workspace": {"requirement": "durable"},
            "outputs": {"requirement": "disabled"},
            "runtimeCheckpoint": "disabled",
            "driver": {"type": "ama_worker", "process": {"command": "true"}}
        }))
        .unwrap();
        profile.workspace = WorkspaceProfile {
            requirement,
            preferred_strategies: Some(preferred.to_vec()),
        };
        profile
    }

    const OFFERED: &[WorkspaceStrategy] = &[
        WorkspaceStrategy::CheckpointRestore,
        WorkspaceStrategy::Ephemeral,
    ];

    #[test]
    fn a_retained_runtime_profile_is_told_what_is_wrong_and_what_to_use() {
        let durable = profile(
            WorkspaceRequirement::Durable,
            &[WorkspaceStrategy::RetainedRuntime],
        );
        let error = explain_rejection(
            &durable,
            OFFERED,
            PortError::capability("The selected composition cannot provide a durable workspace"),
        );
        let text = error.message();
        assert!(
            text.starts_with("The selected composition cannot provide a durable workspace: "),
            "{text}"
        );
        assert!(
            text.contains("retained_runtime does not satisfy a durable workspace"),
            "{text}"
        );
        assert!(
            text.contains("\"preferredStrategies\": [\"checkpoint_restore\"]"),
            "{text}"
        );

        let continuable = profile(
            WorkspaceRequirement::Continuable,
            &[WorkspaceStrategy::RetainedRuntime],
        );
        let text = explain_rejection(
            &continuable,
            OFFERED,
            PortError::capability(
                "The selected composition cannot provide a continuable workspace",
            ),
        )
        .message()
        .to_owned();
        assert!(text.contains("retained_runtime is not offered by omabox's backends (they offer checkpoint_restore and ephemeral)"), "{text}");
    }

    #[test]
    fn other_errors_are_unchanged() {
        let durable = profile(
            WorkspaceRequirement::Durable,
            &[WorkspaceStrategy::RetainedRuntime],
        );
        let error = explain_rejection(&durable, OFFERED, PortError::new("boom"));
        assert_eq!(error.message(), "boom");
    }
}
