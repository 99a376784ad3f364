//! serve's template builds ([`TemplateService`] for [`SandboxHost`]): templates by name,
//! each with its builds, the archives its `COPY` steps uploaded and, once a build
//! finished, the prepared config its sandboxes start from. A build is an environment
//! layer (`template_recipe`) over the template's base, built once per image and content
//! in a build sandbox, as `omabox run --environment` builds one.
//!
//! Bounded: [`MAX_BUILT_TEMPLATES`] templates, [`MAX_BUILDS`] builds kept per template,
//! [`MAX_FILES`] uploads per template of at most `MAX_TEMPLATE_FILE_BYTES` each and
//! [`MAX_STORED_BYTES`] in all, [`MAX_BUILD_LOG`] log entries per build. State lives in
//! serve's memory; uploads in `<data-dir>/template-files/serve-<pid>/`, removed when serve
//! stops.
//!
//! Must never: unpack an uploaded archive on the host (it is staged into the build sandbox
//! as bytes, its hash checked, and unpacked there); name a host path after the caller's text (ids are ours,
//! hashes letters and digits); log or answer an upload token but in its slot.

use super::template_recipe::{self, Base, Recipe};
use super::{SandboxHost, internal, new_sandbox_id, tokens_match};
use async_trait::async_trait;
use omabox_backend_linux::env_layer::{CopyFile, LayerSpec};
use omabox_backend_linux::factory::{EnvLayerChoice, EnvLayerSetting, LinuxSandboxConfig};
use omabox_contract::SecretString;
use omabox_proxy::e2b::{LogLevel, SandboxServiceError};
use omabox_proxy::envd::UploadBody;
use omabox_proxy::templates::{
    BuildLogEntry, BuildState, BuildStatus, FileSlot, TemplateBuildRequest, TemplateBuildSpec,
    TemplateBuildTicket, TemplateService,
};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Templates one serve builds and keeps.
pub const MAX_BUILT_TEMPLATES: usize = 32;
/// Builds kept per template (the oldest finished ones forgotten beyond it).
pub const MAX_BUILDS: usize = 16;
/// Uploaded archives per template.
pub const MAX_FILES: usize = 256;
/// Bytes of uploaded archives one serve keeps in all.
pub const MAX_STORED_BYTES: u64 = 1 << 30;
/// Log entries one build keeps.
pub const MAX_BUILD_LOG: usize = 1000;

/// Every template built here (module doc).
#[derive(Default)]
pub(super) struct TemplateBuilds {
    state: Mutex<State>,
    /// Where uploads go (`None`: template building is not offered).
    pub(super) files_dir: Option<PathBuf>,
    /// The image cache layers are kept in, when the base image names none.
    pub(super) image_cache: Option<PathBuf>,
    stored: AtomicU64,
}

#[derive(Default)]
struct State {
    by_id: HashMap<String, Template>,
    /// Names to ids.
    names: HashMap<String, String>,
}

struct Template {
    name: String,
    files: HashMap<String, Slot>,
    builds: Vec<(String, Arc<Build>)>,
    /// The last finished build's recipe and prepared config.
    ready: Option<(Recipe, LinuxSandboxConfig)>,
}

enum Slot {
    Waiting(SecretString),
    Stored(CopyFile),
}

#[derive(Default)]
struct Build {
    status: Mutex<Option<BuildStatus>>,
}

impl Build {
    fn log(&self, level: LogLevel, message: &str) {
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(status) = status.as_mut()
            && status.log.len() < MAX_BUILD_LOG
        {
            status.log.push(BuildLogEntry {
                timestamp: SystemTime::now(),
                level,
                message: super::logs::clean(message),
            });
        }
    }

    fn finish(&self, state: BuildState, reason: Option<String>) {
        if let Some(status) = self
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            status.state = state;
            status.reason = reason;
        }
    }
}

impl TemplateBuilds {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The prepared config of the template `name` (`NAME`, `NAME:TAG` or its id): `None`
    /// when no template has that name; an error when it has no finished build.
    pub(super) fn config_of(
        &self,
        name: &str,
    ) -> Option<Result<LinuxSandboxConfig, SandboxServiceError>> {
        let state = self.state();
        let plain = name.split_once(':').map_or(name, |(plain, _)| plain);
        let id = state
            .names
            .get(name)
            .or_else(|| state.names.get(plain))
            .cloned()
            .or_else(|| state.by_id.contains_key(name).then(|| name.to_owned()))?;
        let template = state.by_id.get(&id)?;
        Some(match &template.ready {
            Some((_, config)) => Ok(config.clone()),
            None => Err(SandboxServiceError::BadRequest(format!(
                "template {:?} has no finished build yet",
                template.name
            ))),
        })
    }

    /// Removes every upload (serve is stopping).
    pub(super) fn remove_files(&self) {
        if let Some(dir) = &self.files_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    fn template_mut<'a>(
        state: &'a mut State,
        template_id: &str,
    ) -> Result<&'a mut Template, SandboxServiceError> {
        state.by_id.get_mut(template_id).ok_or_else(|| {
            SandboxServiceError::NotFound(format!(
                "template {}",
                template_id.chars().take(64).collect::<String>()
            ))
        })
    }
}

fn not_offered() -> SandboxServiceError {
    SandboxServiceError::BadRequest("template building is not offered by this server".into())
}

#[async_trait]
impl TemplateService for SandboxHost {
    async fn request_build(
        &self,
        request: TemplateBuildRequest,
    ) -> Result<TemplateBuildTicket, SandboxServiceError> {
        let builds = &self.inner.builds;
        if builds.files_dir.is_none() {
            return Err(not_offered());
        }
        let mut state = builds.state();
        let id = match state.names.get(&request.name) {
            Some(id) => id.clone(),
            None => {
                if state.by_id.len() >= MAX_BUILT_TEMPLATES {
                    return Err(SandboxServiceError::Unavailable(format!(
                        "this server already keeps {MAX_BUILT_TEMPLATES} built templates"
                    )));
                }
                let id = new_sandbox_id();
                state.names.insert(request.name.clone(), id.clone());
                state.by_id.insert(
                    id.clone(),
                    Template {
                        name: request.name.clone(),
                        files: HashMap::new(),
                        builds: Vec::new(),
                        ready: None,
                    },
                );
                id
            }
        };
        let template = TemplateBuilds::template_mut(&mut state, &id)?;
        let build_id = new_sandbox_id();
        if template.builds.len() >= MAX_BUILDS {
            let finished = template.builds.iter().position(|(_, b)| {
                b.status
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .is_none_or(|s| matches!(s.state, BuildState::Ready | BuildState::Error))
            });
            match finished {
                Some(oldest) => drop(template.builds.remove(oldest)),
                None => {
                    return Err(SandboxServiceError::Unavailable(format!(
                        "template {:?} already has {MAX_BUILDS} builds in progress",
                        template.name
                    )));
                }
            }
        }
        let build = Arc::new(Build::default());
        *build.status.lock().unwrap_or_else(PoisonError::into_inner) = Some(BuildStatus {
            state: BuildState::Waiting,
            log: Vec::new(),
            reason: None,
        });
        build.log(
            LogLevel::Info,
            &format!("build {build_id} of template {} requested", template.name),
        );
        template.builds.push((build_id.clone(), build));
        let tags = if request.tags.is_empty() {
            vec!["default".to_owned()]
        } else {
            request.tags
        };
        Ok(TemplateBuildTicket {
            template_id: id,
            build_id,
            name: template.name.clone(),
            tags,
        })
    }

    fn file_slot(&self, template_id: &str, hash: &str) -> Result<FileSlot, SandboxServiceError> {
        let mut state = self.inner.builds.state();
        let template = TemplateBuilds::template_mut(&mut state, template_id)?;
        if !template.files.contains_key(hash) && template.files.len() >= MAX_FILES {
            return Err(SandboxServiceError::Unavailable(format!(
                "template {:?} already has {MAX_FILES} uploads",
                template.name
            )));
        }
        let slot = template
            .files
            .entry(hash.to_owned())
            .or_insert_with(|| Slot::Waiting(super::new_access_token()));
        Ok(match slot {
            Slot::Stored(_) => FileSlot {
                present: true,
                upload_token: None,
            },
            Slot::Waiting(token) => FileSlot {
                present: false,
                upload_token: Some(token.clone()),
            },
        })
    }

    async fn upload_file(
        &self,
        template_id: &str,
        hash: &str,
        token: &str,
        body: UploadBody<'_>,
    ) -> Result<(), SandboxServiceError> {
        let builds = &self.inner.builds;
        let dir = builds.files_dir.clone().ok_or_else(not_offered)?;
        // The route checked it too; it names a file below.
        if hash.is_empty() || hash.len() > 128 || !hash.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(SandboxServiceError::BadRequest(
                "a files hash is 1 to 128 letters and digits".into(),
            ));
        }
        {
            let mut state = builds.state();
            let template = TemplateBuilds::template_mut(&mut state, template_id)?;
            match template.files.get(hash) {
                Some(Slot::Waiting(expected)) if tokens_match(expected.expose(), token) => {}
                Some(Slot::Stored(_)) => return Ok(()),
                _ => {
                    return Err(SandboxServiceError::Unauthorized(
                        "X-Omabox-Upload-Token is not this upload's token".into(),
                    ));
                }
            }
        }
        // `template_id` named a template of ours (letters and digits), `hash` was checked
        // by the route (letters and digits): the path is ours.
        let dir = dir.join(template_id);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| internal(format!("cannot keep the upload: {e}")))?;
        let part = dir.join(format!("{hash}.part"));
        let mut file = tokio::fs::File::create(&part)
            .await
            .map_err(|e| internal(format!("cannot keep the upload: {e}")))?;
        let mut digest = Sha256::new();
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        let copied: Result<(), String> = async {
            loop {
                let n = body
                    .read(&mut buf)
                    .await
                    .map_err(|e| format!("the upload failed: {e}"))?;
                if n == 0 {
                    return Ok(());
                }
                total += n as u64;
                let kept = builds.stored.fetch_add(n as u64, Ordering::AcqRel) + n as u64;
                if kept > MAX_STORED_BYTES {
                    return Err(format!(
                        "this server already keeps {} MiB of template uploads",
                        MAX_STORED_BYTES >> 20
                    ));
                }
                digest.update(&buf[..n]);
                file.write_all(&buf[..n])
                    .await
                    .map_err(|e| format!("cannot keep the upload: {e}"))?;
            }
        }
        .await;
        if let Err(message) = copied {
            builds.stored.fetch_sub(total, Ordering::AcqRel);
            let _ = tokio::fs::remove_file(&part).await;
            return Err(SandboxServiceError::BadRequest(message));
        }
        file.flush().await.map_err(|e| internal(e.to_string()))?;
        let path = dir.join(hash);
        tokio::fs::rename(&part, &path)
            .await
            .map_err(|e| internal(format!("cannot keep the upload: {e}")))?;
        let sha256 = hex::encode(digest.finalize());
        let mut state = builds.state();
        if let Ok(template) = TemplateBuilds::template_mut(&mut state, template_id) {
            template
                .files
                .insert(hash.to_owned(), Slot::Stored(CopyFile { path, sha256 }));
        }
        Ok(())
    }

    async fn start_build(
        &self,
        template_id: &str,
        build_id: &str,
        spec: TemplateBuildSpec,
    ) -> Result<(), SandboxServiceError> {
        let (build, recipe, name) = {
            let mut state = self.inner.builds.state();
            let parent = spec
                .from_template
                .as_deref()
                .filter(|name| *name != template_recipe::BASE)
                .and_then(|name| {
                    let id = state.names.get(name)?;
                    state.by_id.get(id)?.ready.as_ref().map(|(r, _)| r.clone())
                });
            let template = TemplateBuilds::template_mut(&mut state, template_id)?;
            let build = template
                .builds
                .iter()
                .find(|(id, _)| id == build_id)
                .map(|(_, b)| Arc::clone(b))
                .ok_or_else(|| {
                    SandboxServiceError::NotFound(format!(
                        "build {}",
                        build_id.chars().take(64).collect::<String>()
                    ))
                })?;
            let files = |hash: &str| match template.files.get(hash) {
                Some(Slot::Stored(file)) => Some(file.clone()),
                _ => None,
            };
            let recipe = template_recipe::recipe_of(&spec, parent.as_ref(), &files)
                .map_err(SandboxServiceError::BadRequest)?;
            let mut status = build.status.lock().unwrap_or_else(PoisonError::into_inner);
            match status.as_mut() {
                Some(status) if status.state == BuildState::Waiting => {
                    status.state = BuildState::Building;
                }
                _ => {
                    return Err(SandboxServiceError::BadRequest(format!(
                        "build {build_id} was started already"
                    )));
                }
            }
            drop(status);
            (build, recipe, template.name.clone())
        };
        build.log(
            LogLevel::Info,
            &format!(
                "building {} dockerfile lines over {}",
                recipe.lines.len(),
                match &recipe.base {
                    Base::Node => "the node's base root".to_owned(),
                    Base::Image(image) => format!("image {image}"),
                }
            ),
        );
        let host = self.clone();
        let template_id = template_id.to_owned();
        tokio::spawn(async move {
            match host.template_config(&recipe).await {
                Ok(config) => {
                    let mut state = host.inner.builds.state();
                    if let Some(template) = state.by_id.get_mut(&template_id) {
                        template.ready = Some((recipe, config));
                    }
                    drop(state);
                    build.log(LogLevel::Info, &format!("template {name} is ready"));
                    build.finish(BuildState::Ready, None);
                }
                Err(error) => {
                    let message = error.to_string();
                    build.log(LogLevel::Error, &message);
                    build.finish(BuildState::Error, Some(super::logs::clean(&message)));
                }
            }
        });
        Ok(())
    }

    fn template_id(&self, name: &str) -> Option<String> {
        self.inner.builds.state().names.get(name).cloned()
    }

    fn build_status(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<BuildStatus, SandboxServiceError> {
        let mut state = self.inner.builds.state();
        let template = TemplateBuilds::template_mut(&mut state, template_id)?;
        template
            .builds
            .iter()
            .find(|(id, _)| id == build_id)
            .and_then(|(_, b)| {
                b.status
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            })
            .ok_or_else(|| {
                SandboxServiceError::NotFound(format!(
                    "build {}",
                    build_id.chars().take(64).collect::<String>()
                ))
            })
    }
}

impl SandboxHost {
    /// The prepared config of `recipe`: its base with the recipe's environment layer built.
    async fn template_config(
        &self,
        recipe: &Recipe,
    ) -> Result<LinuxSandboxConfig, SandboxServiceError> {
        let mut unprepared = match &recipe.base {
            Base::Node => self.inner.unprepared.clone(),
            Base::Image(image) => {
                let image_config = self.inner.image_config.as_ref().ok_or_else(not_offered)?;
                image_config(image).map_err(SandboxServiceError::BadRequest)?
            }
        };
        if let Some(dockerfile) = recipe.dockerfile() {
            if !unprepared.has_image() {
                return Err(SandboxServiceError::BadRequest(
                    "a template's steps need an image root filesystem (OMABOX_LINUX_IMAGE, or fromImage): the default root shows the host's /usr read-only".into(),
                ));
            }
            if unprepared.env_layer.is_some() {
                return Err(SandboxServiceError::BadRequest(
                    "a template's steps cannot go over the node's own environment layer".into(),
                ));
            }
            let spec = LayerSpec::new(Vec::new(), Some(&dockerfile), recipe.files.clone())
                .map_err(SandboxServiceError::BadRequest)?;
            let image_cache = match unprepared.pending_image() {
                Some(pending) => pending.cache_dir.clone(),
                None => self
                    .inner
                    .builds
                    .image_cache
                    .clone()
                    .ok_or_else(not_offered)?,
            };
            unprepared.env_layer =
                spec.map(|spec| EnvLayerChoice::Pending(EnvLayerSetting { spec, image_cache }));
        }
        // The build sandbox is a plain one: a `/workspace` tmpfs or `/home/user` would leave
        // their mount points, owned by the host's root, in the layer (which refuses them).
        let (workspace_tmpfs, user_home) = (unprepared.workspace_tmpfs, unprepared.user_home);
        unprepared.workspace_tmpfs = false;
        unprepared.user_home = false;
        let cell = tokio::sync::OnceCell::new();
        let mut config = self
            .prepare(&cell, unprepared)
            .await
            .cloned()
            .map_err(|e| match e {
                SandboxServiceError::Internal(message) => {
                    SandboxServiceError::BadRequest(format!("the build failed: {message}"))
                }
                other => other,
            })?;
        config.workspace_tmpfs = workspace_tmpfs;
        config.user_home = user_home;
        Ok(config)
    }
}
