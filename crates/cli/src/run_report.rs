//! How `omabox run` reports a finished work item: the human summary after the timeline, or
//! one `--json` document (`result`, `session`, `workId`, `generation`, `outputs`, `timings`,
//! `events`, …), and the exit code.
//!
//! Exit code: 0 when `completed`; 1 for `failed`, `lease_lost`, `conflict` or a rejected
//! run; 130 when cancelled by SIGINT/SIGTERM.
//!
//! What this must never do: print a text that did not come through the host's redaction —
//! results and rejections are the host's (redacted) values, events are the timeline's.

use crate::acp_events::AcpEventLog;
use crate::timeline::{Timeline, TimelineEvent, human_bytes};
use omabox_acp::AcpEvent;
use omabox_contract::{PortError, RuntimeResourceScope, SessionOutputEntryCandidate};
use omabox_host::runtime_host::ManagedRuntimeRunResult;
use serde::Serialize;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

/// Exit code of a run cancelled by a signal.
pub const EXIT_CANCELLED: u8 = 130;

/// What every report names.
#[derive(Debug, Clone)]
pub struct RunHeader {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The backend's provider id.
    pub backend: &'static str,
    /// The fence owner id.
    pub owner_id: String,
    /// One JSON document instead of the human summary.
    pub json: bool,
    /// `--from-revision N`: the revision restored instead of the last one.
    pub from_revision: Option<u64>,
    /// The ACP harness's event log (`--acp-command`).
    pub acp_events: Option<Arc<AcpEventLog>>,
    /// `--agent-json`'s `_oma.acp.agent.id` (the ACP registry id).
    pub agent_registry_id: Option<String>,
}

/// The `--json` document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RunReport {
    /// The contract's run result, or null when the run was rejected.
    result: Option<ManagedRuntimeRunResult>,
    /// Why the run was rejected (pre-flight admission or cleanup persistence).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<PortError>,
    session: String,
    work_id: String,
    generation: Option<u64>,
    /// The revision this run started from (null: a new session).
    restored_revision: Option<u64>,
    outputs: Vec<SessionOutputEntryCandidate>,
    timings: BTreeMap<String, f64>,
    backend: &'static str,
    owner_id: String,
    runtime_id: Option<String>,
    /// The sandbox's image with the digest this run's acquire resolved it to.
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    cancelled: bool,
    /// Workspace entries the restore could not bring back (missing or damaged blobs of the
    /// revision it started from; at most 100 listed), the run having gone on without them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    workspace_lost: Vec<omabox_persistence::Damage>,
    /// How many there were.
    #[serde(skip_serializing_if = "is_zero")]
    workspace_lost_count: u64,
    events: Vec<TimelineEvent>,
    /// The ACP harness's canonical event log (`--acp-command` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    acp_events: Option<Vec<AcpEvent>>,
    /// The agent definition's ACP registry id (`--agent-json` with `_oma.acp.agent.id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_registry_id: Option<String>,
}

/// Reports a run that resolved.
pub fn result(
    header: &RunHeader,
    timeline: &Timeline,
    result: ManagedRuntimeRunResult,
    outputs: Vec<SessionOutputEntryCandidate>,
    cancelled: bool,
) -> anyhow::Result<ExitCode> {
    let code = match (&result, cancelled) {
        (ManagedRuntimeRunResult::Completed { .. }, _) => ExitCode::SUCCESS,
        (_, true) => ExitCode::from(EXIT_CANCELLED),
        _ => ExitCode::FAILURE,
    };
    if header.json {
        print_json(header, timeline, Some(result), None, outputs, cancelled)?;
        return Ok(code);
    }
    let total = timeline.elapsed().as_millis();
    let session = &header.scope.session_id;
    match &result {
        ManagedRuntimeRunResult::Completed { revision } => {
            outln!("completed: revision {revision} published in {total} ms");
            if !outputs.is_empty() {
                outln!("outputs:");
                for entry in &outputs {
                    outln!(
                        "  {:<32} {:>10}  {:<24} {}",
                        crate::terminal_safe::one_line(&entry.logical_path),
                        human_bytes(entry.size),
                        entry.media_type.as_deref().unwrap_or("-"),
                        entry.content_hash
                    );
                }
            }
            outln!(
                "next: `omabox run --session {session} ...` continues from revision {revision}; \
                 `omabox outputs --session {session}`; `omabox workspace export --session {session} DIR`"
            );
        }
        ManagedRuntimeRunResult::Conflict { expires_at } => {
            outln!(
                "conflict: session {session} is being run by another omabox process; its fence \
                 expires at {} (if that process died, run again after that)",
                expires_at.as_deref().unwrap_or("an unknown time")
            );
        }
        ManagedRuntimeRunResult::LeaseLost => {
            let why = if cancelled {
                "the run was cancelled"
            } else {
                "the run lost ownership (fence, sandbox or heartbeat)"
            };
            outln!("lease_lost: {why}; this run published nothing (took {total} ms)");
        }
        ManagedRuntimeRunResult::Failed { error } => {
            outln!(
                "failed: {}; this run published nothing, its outputs were discarded (took {total} ms)",
                crate::terminal_safe::one_line(error.message())
            );
        }
    }
    Ok(code)
}

/// Reports a rejected run (admission or cleanup persistence).
pub fn rejection(
    header: &RunHeader,
    timeline: &Timeline,
    error: PortError,
) -> anyhow::Result<ExitCode> {
    if header.json {
        print_json(header, timeline, None, Some(error), Vec::new(), false)?;
        return Ok(ExitCode::FAILURE);
    }
    Err(anyhow::anyhow!("the run was rejected: {}", error.message()))
}

fn print_json(
    header: &RunHeader,
    timeline: &Timeline,
    result: Option<ManagedRuntimeRunResult>,
    error: Option<PortError>,
    outputs: Vec<SessionOutputEntryCandidate>,
    cancelled: bool,
) -> anyhow::Result<()> {
    let report = report(header, timeline, result, error, outputs, cancelled);
    if header.acp_events.is_some() {
        // The last line of the ACP run's JSON Lines stream (crate::acp_events).
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

fn report(
    header: &RunHeader,
    timeline: &Timeline,
    result: Option<ManagedRuntimeRunResult>,
    error: Option<PortError>,
    outputs: Vec<SessionOutputEntryCandidate>,
    cancelled: bool,
) -> RunReport {
    let facts = timeline.facts();
    RunReport {
        result,
        error,
        session: header.scope.session_id.clone(),
        work_id: header.scope.work_id.clone(),
        generation: facts.generation,
        restored_revision: facts
            .restored_revision
            .map(|last| header.from_revision.unwrap_or(last)),
        outputs,
        timings: timeline.timings(),
        backend: header.backend,
        owner_id: header.owner_id.clone(),
        runtime_id: facts.runtime_id,
        image: facts.image,
        cancelled,
        workspace_lost: facts.workspace_lost,
        workspace_lost_count: facts.workspace_lost_count,
        events: timeline.events(),
        acp_events: header.acp_events.as_ref().map(|log| log.events()),
        agent_registry_id: header.agent_registry_id.clone(),
    }
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_testkit::fakes::{Fixture, FixtureSpec};

    const TOKEN: &str = "fence-secret-0123456789";

    #[tokio::test]
    async fn the_json_report_carries_only_redacted_texts() {
        let mut spec = FixtureSpec::fault_matrix();
        spec.token = TOKEN.into();
        let fixture = Fixture::new(spec);
        let leaky = |what: &str| PortError::new(format!("{what} failed for fence token {TOKEN}"));
        fixture.workspace.checkpoint.fails(leaky("checkpoint"));
        fixture.sandbox.terminate.fails(leaky("terminate"));
        let timeline = Arc::new(Timeline::new(false, None));
        let mut input = fixture.input();
        input.observer = Some(Arc::clone(&timeline) as _);
        let result = fixture.host().unwrap().run(input).await.unwrap();
        let header = RunHeader {
            scope: fixture.scope(),
            backend: "fake",
            owner_id: fixture.owner_id.clone(),
            json: true,
            from_revision: None,
            acp_events: None,
            agent_registry_id: None,
        };
        let json = serde_json::to_string(&report(
            &header,
            &timeline,
            Some(result),
            None,
            Vec::new(),
            false,
        ))
        .unwrap();
        assert!(!json.contains(TOKEN), "the report leaks the token: {json}");
        let events = timeline.events();
        let checkpoint = events
            .iter()
            .find(|event| event.step == "workspace.checkpoint")
            .expect("a checkpoint event");
        assert_eq!(
            checkpoint.detail,
            "checkpoint failed for fence token [redacted]"
        );
        assert!(!checkpoint.ok);
        assert!(
            events.iter().any(|event| event.step == "sandbox.terminate"
                && event.detail == "terminate failed for fence token [redacted]"),
            "{events:?}"
        );
        assert!(json.contains(r#""type":"failed""#), "{json}");
    }
}
