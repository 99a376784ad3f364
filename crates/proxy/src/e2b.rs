//! E2B's sandbox control plane as a port: what `omabox serve`'s E2B-compatible REST routes
//! (`routes/e2b.rs`, shapes from E2B's `spec/openapi.yml`) ask of whoever owns the
//! sandboxes. This crate defines the requests, the answers and the [`SandboxService`] trait;
//! the node implements it over linux sandboxes and the CLI wires it, so the HTTP edge never
//! names a backend.
//!
//! Must never: carry an access token anywhere but [`CreatedSandbox::access_token`] and
//! [`SandboxService::get`]'s answer (both `SecretString`, whose `Debug` is redacted); put a
//! token in an error.

use crate::envd::SandboxEnvd;
use async_trait::async_trait;
use omabox_contract::SecretString;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The longest timeout (create, set timeout) a sandbox may be given: 24 hours, E2B's
/// largest plan.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest `refreshes` duration: one hour, as E2B's spec says.
pub const MAX_REFRESH: Duration = Duration::from_secs(60 * 60);
/// A create's timeout when none is given (E2B's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);
/// Metadata entries one sandbox may carry, and the bytes of one key or value.
pub const MAX_METADATA: usize = 64;
/// Environment variables one create may set.
pub const MAX_ENV_VARS: usize = 256;
/// Bytes of one metadata or env var key.
pub const MAX_KEY_BYTES: usize = 256;
/// Bytes of one metadata or env var value.
pub const MAX_VALUE_BYTES: usize = 16 * 1024;

/// A validated `POST /sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSandbox {
    /// The template (`base`: the default root).
    pub template_id: String,
    /// How long it may live from its start.
    pub timeout: Duration,
    /// The caller's labels (listed back and filtered on).
    pub metadata: BTreeMap<String, String>,
    /// Environment variables of every process started in it.
    pub env_vars: BTreeMap<String, String>,
    /// `allow_internet_access` as given (the operator's network setting decides what the
    /// sandbox reaches; [`SandboxInfo::allow_internet_access`] says what it got).
    pub allow_internet_access: Option<bool>,
}

/// One running sandbox, as `GET /sandboxes/{id}` and the lists show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// E2B-style id (20 lowercase letters and digits).
    pub sandbox_id: String,
    /// The template it was made from.
    pub template_id: String,
    /// When it started.
    pub started_at: SystemTime,
    /// When it will be killed unless its timeout is changed.
    pub end_at: SystemTime,
    /// The caller's labels.
    pub metadata: BTreeMap<String, String>,
    /// CPUs it may use (at least 1).
    pub cpu_count: u32,
    /// Memory limit in MiB (0: unlimited).
    pub memory_mb: u64,
    /// Disk limit in MiB (0: no limit of its own).
    pub disk_size_mb: u64,
    /// Whether the sandbox reaches the internet (the operator's network setting; never
    /// merely what the create asked for).
    pub allow_internet_access: Option<bool>,
    /// Paused (its files kept, nothing running): listed with state `paused` until a
    /// connect resumes it.
    pub paused: bool,
}

/// One sample of a running sandbox's resource use (E2B's `SandboxMetric`).
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxMetrics {
    /// When it was taken.
    pub timestamp: SystemTime,
    /// CPUs the sandbox may use.
    pub cpu_count: u32,
    /// Share of those CPUs used since the previous sample, 0 to 100.
    pub cpu_used_pct: f64,
    /// Memory used, bytes (page cache included).
    pub mem_used: u64,
    /// The memory limit (the machine's memory without one), bytes.
    pub mem_total: u64,
    /// Page cache within `mem_used`, bytes.
    pub mem_cache: u64,
    /// Bytes used on the sandbox's disk (its `/workspace`).
    pub disk_used: u64,
    /// Size of that disk, bytes.
    pub disk_total: u64,
}

/// What a sandbox may reach after `PUT /sandboxes/{id}/network`, validated: only what the
/// sandbox's network policy enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkUpdate {
    /// Any host (the operator's network must allow it).
    Internet,
    /// Only these host entries (`HOST`, `HOST:PORT`, `*.SUFFIX`), none for nothing.
    Only(Vec<String>),
}

/// How much a sandbox log entry matters (E2B's `LogLevel`), least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Detail.
    Debug,
    /// What happened.
    Info,
    /// Something went wrong but the sandbox lives on.
    Warn,
    /// Something failed.
    Error,
}

impl LogLevel {
    /// E2B's name of the level.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

/// One entry of a sandbox's log (E2B's `SandboxLogEntry`): what happened to it, never a
/// secret (no environment value, no token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLogEntry {
    /// When it happened.
    pub timestamp: SystemTime,
    /// How much it matters.
    pub level: LogLevel,
    /// What happened, one line.
    pub message: String,
    /// Structured details (`event`, `pid`, `exitCode`, …).
    pub fields: BTreeMap<String, String>,
}

/// A filesystem snapshot of a sandbox (E2B's `SnapshotInfo`): sandboxes created with its
/// id as their template start with its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// `NAME:default` for a named snapshot, else `ID:default` (E2B's template-with-tag form).
    pub snapshot_id: String,
    /// Its full names (the one above).
    pub names: Vec<String>,
    /// The sandbox it was taken from.
    pub sandbox_id: String,
    /// When it was taken.
    pub created_at: SystemTime,
}

/// The tag of every snapshot id (E2B names a snapshot `NAME:TAG`; one build is kept per
/// name).
pub const SNAPSHOT_TAG: &str = "default";

impl SnapshotInfo {
    /// Whether `wanted` (an id or a name, with or without its tag) names this snapshot.
    pub fn is_named(&self, wanted: &str) -> bool {
        let bare = |text: &str| -> String {
            text.strip_suffix(SNAPSHOT_TAG)
                .and_then(|text| text.strip_suffix(':'))
                .unwrap_or(text)
                .to_owned()
        };
        let wanted = bare(wanted);
        bare(&self.snapshot_id) == wanted || self.names.iter().any(|name| bare(name) == wanted)
    }
}

/// A service call this service does not offer.
fn not_offered(what: &str) -> SandboxServiceError {
    SandboxServiceError::BadRequest(format!("{what} is not supported by this server"))
}

/// A sandbox just created, with its access token (shown to the creator).
#[derive(Debug, Clone)]
pub struct CreatedSandbox {
    /// The sandbox.
    pub info: SandboxInfo,
    /// Its access token (`envdAccessToken`).
    pub access_token: SecretString,
}

/// Why a sandbox call failed. No variant carries a token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxServiceError {
    /// No running sandbox has this id.
    #[error("sandbox \"{0}\" not found")]
    NotFound(String),
    /// Something other than a sandbox (a template, a build, a tag) is not there (the text
    /// says what).
    #[error("{0}")]
    Missing(String),
    /// The request cannot be served as asked (the text says why).
    #[error("{0}")]
    BadRequest(String),
    /// No room for another sandbox now.
    #[error("{0}")]
    Unavailable(String),
    /// Starting or killing a sandbox failed (the text says why).
    #[error("{0}")]
    Internal(String),
    /// The request does not carry the sandbox's access token (the text says what is
    /// missing, never the token).
    #[error("{0}")]
    Unauthorized(String),
}

/// Whoever owns the sandboxes `omabox serve` serves.
#[async_trait]
pub trait SandboxService: Send + Sync + 'static {
    /// Starts a sandbox.
    async fn create(&self, request: NewSandbox) -> Result<CreatedSandbox, SandboxServiceError>;
    /// Every running sandbox.
    fn list(&self) -> Vec<SandboxInfo>;
    /// One running sandbox and its access token.
    fn get(&self, sandbox_id: &str) -> Option<(SandboxInfo, SecretString)>;
    /// Kills a sandbox: its processes, cgroup and state directory are gone when this
    /// returned `Ok`.
    async fn kill(&self, sandbox_id: &str) -> Result<(), SandboxServiceError>;
    /// The sandbox now expires `timeout` from now (shorter or longer than before).
    fn set_timeout(&self, sandbox_id: &str, timeout: Duration) -> Result<(), SandboxServiceError>;
    /// The sandbox lives at least `duration` from now (never shortened).
    fn refresh(&self, sandbox_id: &str, duration: Duration) -> Result<(), SandboxServiceError>;
    /// The in-sandbox API of the running sandbox `sandbox_id`, when `access_token` is its
    /// token (compared in constant time): `NotFound` for no such sandbox, `Unauthorized`
    /// for a missing or wrong token.
    fn envd(
        &self,
        sandbox_id: &str,
        access_token: &str,
    ) -> Result<Arc<dyn SandboxEnvd>, SandboxServiceError>;
    /// A sample of the running sandbox's CPU, memory and disk use.
    async fn metrics(&self, sandbox_id: &str) -> Result<SandboxMetrics, SandboxServiceError> {
        let _ = sandbox_id;
        Err(not_offered("metrics"))
    }
    /// Replaces what the running sandbox may reach.
    async fn update_network(
        &self,
        sandbox_id: &str,
        update: NetworkUpdate,
    ) -> Result<(), SandboxServiceError> {
        let _ = (sandbox_id, update);
        Err(not_offered("a network update"))
    }
    /// Pauses the running sandbox: its files are kept, its timeout stops; with
    /// `keep_memory` (only asked of a service whose [`SandboxService::pauses_memory`]) its
    /// processes and memory are kept too and go on after the resume, else they end.
    /// `Ok(false)`: it was paused already.
    async fn pause(
        &self,
        sandbox_id: &str,
        keep_memory: bool,
    ) -> Result<bool, SandboxServiceError> {
        let _ = (sandbox_id, keep_memory);
        Err(not_offered("pause"))
    }
    /// Whether a pause can keep a sandbox's processes and memory (E2B's full pause), and
    /// so whether [`SandboxService::fork`] is offered.
    fn pauses_memory(&self) -> bool {
        false
    }
    /// `count` new sandboxes from the running sandbox's memory (checkpointed in place: it
    /// runs on under its id, token and end), each living `timeout`, each with a fresh id and
    /// token, or the error that kept it from starting.
    async fn fork(
        &self,
        sandbox_id: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Result<CreatedSandbox, SandboxServiceError>>, SandboxServiceError> {
        let _ = (sandbox_id, count, timeout);
        Err(not_offered("fork"))
    }
    /// The log of the sandbox `sandbox_id` (running, paused or recently ended), oldest
    /// first; bounded by the implementation.
    fn logs(&self, sandbox_id: &str) -> Result<Vec<SandboxLogEntry>, SandboxServiceError> {
        let _ = sandbox_id;
        Err(not_offered("sandbox logs"))
    }
    /// Who builds templates for this service (`None`: template building is not offered).
    fn templates(&self) -> Option<Arc<dyn crate::templates::TemplateService>> {
        None
    }
    /// Takes a snapshot of the running sandbox (it keeps running): its files, or with
    /// `memory` (only asked of a service whose [`SandboxService::pauses_memory`]) its
    /// processes and memory too; `name` (checked by the caller) replaces an earlier
    /// snapshot of that name.
    async fn create_snapshot(
        &self,
        sandbox_id: &str,
        name: Option<String>,
        memory: bool,
    ) -> Result<SnapshotInfo, SandboxServiceError> {
        let _ = (sandbox_id, name, memory);
        Err(not_offered("a snapshot"))
    }
    /// Every snapshot kept, newest first.
    fn snapshots(&self) -> Vec<SnapshotInfo> {
        Vec::new()
    }
    /// Removes the snapshot `snapshot_id` (its id or name, as `Sandbox.create` takes it);
    /// `Ok(false)`: there is none.
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool, SandboxServiceError> {
        let _ = snapshot_id;
        Ok(false)
    }
    /// Resumes a paused sandbox under its id and token with its files back, to live
    /// `timeout`; `Ok(None)` when it is not paused (running, or no such sandbox: the
    /// caller tells them apart).
    async fn resume(
        &self,
        sandbox_id: &str,
        timeout: Duration,
    ) -> Result<Option<CreatedSandbox>, SandboxServiceError> {
        let _ = (sandbox_id, timeout);
        Ok(None)
    }
}

/// `time` as RFC 3339 in UTC with milliseconds (`2026-12-05T20:54:11.123Z`); times before
/// 1970 print as the epoch.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 → (year, month, day) of the proleptic Gregorian calendar (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_millis(951_827_696_789);
        assert_eq!(rfc3339(leap), "2000-02-29T12:34:56.789Z");
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_428_800);
        assert_eq!(rfc3339(later), "2026-12-05T00:00:00.000Z");
    }
}
