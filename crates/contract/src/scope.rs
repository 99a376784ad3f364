//! The identity of one Managed-Agents work item.

use serde::{Deserialize, Serialize};

/// `{workspaceId, environmentId, sessionId, workId}`: one lease is one work item.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeResourceScope {
    /// The tenant workspace (not the sandbox's /workspace).
    pub workspace_id: String,
    /// The environment the session runs in.
    pub environment_id: String,
    /// The session.
    pub session_id: String,
    /// The work item.
    pub work_id: String,
}

impl RuntimeResourceScope {
    /// Builds a scope from its four ids.
    pub fn new(
        workspace_id: impl Into<String>,
        environment_id: impl Into<String>,
        session_id: impl Into<String>,
        work_id: impl Into<String>,
    ) -> Self {
        Self {
            workspace_id: workspace_id.into(),
            environment_id: environment_id.into(),
            session_id: session_id.into(),
            work_id: work_id.into(),
        }
    }

    /// The four ids joined by NUL: the key a fence store files a work item under.
    pub fn key(&self) -> String {
        [
            self.workspace_id.as_str(),
            &self.environment_id,
            &self.session_id,
            &self.work_id,
        ]
        .join("\0")
    }
}
