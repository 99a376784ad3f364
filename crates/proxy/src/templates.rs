//! E2B's template building as a port: what the SDKs' `Template.build` asks of serve
//! (`routes/e2b_templates.rs`, shapes from E2B's `spec/openapi.yml`): a template and a
//! build are requested, the files its `COPY` steps take are uploaded (each once, by the
//! SDK's hash of them), the build is started with its steps, and its status and log are
//! polled. The node implements [`TemplateService`] (it decides which steps omabox can
//! honour); a template built is then a `templateID` for `POST /sandboxes`.
//!
//! Must never: carry an upload token anywhere but [`FileSlot::upload_token`] and the
//! upload's own check; keep an upload past [`MAX_TEMPLATE_FILE_BYTES`].

use crate::e2b::{LogLevel, SandboxServiceError};
use crate::envd::UploadBody;
use async_trait::async_trait;
use omabox_contract::SecretString;
use std::time::SystemTime;

/// Bytes one uploaded file archive (one `COPY` step's files) may hold.
pub const MAX_TEMPLATE_FILE_BYTES: u64 = 64 << 20;
/// Steps one build may have.
pub const MAX_TEMPLATE_STEPS: usize = 256;
/// Build log entries one status answer carries at most (E2B's page).
pub const MAX_STATUS_LOG_ENTRIES: usize = 100;
/// The tag a build gets when none is named, and the one a name without a tag means
/// (`Sandbox.create("NAME")` starts from `NAME:default`).
pub const DEFAULT_TAG: &str = "default";

/// `POST /v3/templates`: a template (by name) and a build of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateBuildRequest {
    /// Its name (`Sandbox.create(template=NAME)`), as given.
    pub name: String,
    /// Tags to give the build (none: `default`).
    pub tags: Vec<String>,
}

/// The template and build [`TemplateService::request_build`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateBuildTicket {
    /// The template's id.
    pub template_id: String,
    /// The build's id.
    pub build_id: String,
    /// The template's name.
    pub name: String,
    /// The build's tags.
    pub tags: Vec<String>,
}

/// Whether a `COPY` step's files are there, and where to upload them when not.
#[derive(Debug, Clone)]
pub struct FileSlot {
    /// Uploaded already.
    pub present: bool,
    /// The token an upload must carry (`X-Omabox-Upload-Token`), when not present.
    pub upload_token: Option<SecretString>,
}

/// One step of a build, as the SDK sent it (`TemplateStep`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateStep {
    /// `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`, …
    pub kind: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// A `COPY`'s files, by the SDK's hash of them.
    pub files_hash: Option<String>,
}

/// `POST /v2/templates/{id}/builds/{build}` (`TemplateBuildStartV2`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TemplateBuildSpec {
    /// The image the template starts from.
    pub from_image: Option<String>,
    /// The template it starts from (`base`, or one built before).
    pub from_template: Option<String>,
    /// Registry credentials were given (`fromImageRegistry`).
    pub registry_credentials: bool,
    /// The steps, in order.
    pub steps: Vec<TemplateStep>,
    /// A command the template's sandboxes start with.
    pub start_cmd: Option<String>,
    /// A command that says when the start command is ready.
    pub ready_cmd: Option<String>,
}

/// Where a build is (`TemplateBuildStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildState {
    /// Requested, not started.
    Waiting,
    /// Running.
    Building,
    /// Done: the template can be used.
    Ready,
    /// Failed ([`BuildStatus::reason`] says why).
    Error,
}

impl BuildState {
    /// E2B's name of the state.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Building => "building",
            Self::Ready => "ready",
            Self::Error => "error",
        }
    }
}

/// One line of a build's log (`BuildLogEntry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildLogEntry {
    /// When.
    pub timestamp: SystemTime,
    /// How much it matters.
    pub level: LogLevel,
    /// What happened.
    pub message: String,
}

/// A build's state and its whole (bounded) log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildStatus {
    /// Where it is.
    pub state: BuildState,
    /// Its log, oldest first.
    pub log: Vec<BuildLogEntry>,
    /// Why it failed.
    pub reason: Option<String>,
}

/// A template as `GET /templates` and `GET /templates/{id}` show it (`Template`,
/// `TemplateWithBuilds`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateInfo {
    /// Its id.
    pub template_id: String,
    /// Its name.
    pub name: String,
    /// When its first build was requested.
    pub created_at: SystemTime,
    /// When a build of it was last requested or finished.
    pub updated_at: SystemTime,
    /// When a sandbox last started from it.
    pub last_spawned_at: Option<SystemTime>,
    /// Sandboxes started from it.
    pub spawn_count: u64,
    /// CPUs and memory (MiB) of its sandboxes (0: not limited).
    pub cpu_count: u32,
    /// See `cpu_count`.
    pub memory_mb: u64,
    /// Its builds kept, newest first.
    pub builds: Vec<TemplateBuildInfo>,
}

/// One build of a template (`TemplateBuild`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateBuildInfo {
    /// Its id (a UUID, as E2B's).
    pub build_id: String,
    /// Where it is.
    pub state: BuildState,
    /// When it was requested.
    pub created_at: SystemTime,
    /// When it ended, ready or failed.
    pub finished_at: Option<SystemTime>,
}

/// A tag of a template: the build it names (`TemplateTag`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateTag {
    /// The tag.
    pub tag: String,
    /// The build it names.
    pub build_id: String,
    /// When it was given.
    pub created_at: SystemTime,
}

/// Whoever builds serve's templates.
#[async_trait]
pub trait TemplateService: Send + Sync + 'static {
    /// Makes (or finds, by name) a template and a new build of it.
    async fn request_build(
        &self,
        request: TemplateBuildRequest,
    ) -> Result<TemplateBuildTicket, SandboxServiceError>;
    /// Whether the files of `hash` were uploaded for the template.
    fn file_slot(&self, template_id: &str, hash: &str) -> Result<FileSlot, SandboxServiceError>;
    /// Stores an upload of the files of `hash` (`token`: the slot's, compared in constant
    /// time); at most [`MAX_TEMPLATE_FILE_BYTES`].
    async fn upload_file(
        &self,
        template_id: &str,
        hash: &str,
        token: &str,
        body: UploadBody<'_>,
    ) -> Result<(), SandboxServiceError>;
    /// Starts the build: a step omabox cannot honour is refused here, naming it.
    async fn start_build(
        &self,
        template_id: &str,
        build_id: &str,
        spec: TemplateBuildSpec,
    ) -> Result<(), SandboxServiceError>;
    /// The id of the template named `name`, if there is one.
    fn template_id(&self, name: &str) -> Option<String>;
    /// Where the build is, and its log.
    fn build_status(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<BuildStatus, SandboxServiceError>;
    /// Every template built here, oldest first.
    fn list(&self) -> Vec<TemplateInfo>;
    /// The template of that id or name (`NotFound` when none).
    fn info(&self, id_or_name: &str) -> Result<TemplateInfo, SandboxServiceError>;
    /// Forgets the template of that id or name: its builds, tags and uploads (sandboxes
    /// started from it run on). `Ok(false)`: there is none.
    async fn delete(&self, id_or_name: &str) -> Result<bool, SandboxServiceError>;
    /// Gives `tags` to the finished build `target` names (`NAME:TAG`, or `NAME` for its
    /// [`DEFAULT_TAG`]), moving any of them from another build; answers that build's id.
    fn assign_tags(&self, target: &str, tags: &[String]) -> Result<String, SandboxServiceError>;
    /// Takes `tags` off the template `name` (`NotFound` naming the first it lacks; none
    /// is removed then).
    fn remove_tags(&self, name: &str, tags: &[String]) -> Result<(), SandboxServiceError>;
    /// The tags of the template of that id or name, by tag.
    fn tags(&self, id_or_name: &str) -> Result<Vec<TemplateTag>, SandboxServiceError>;
}
