//! serve's template builds ([`TemplateService`] for [`SandboxHost`]): templates by name,
//! each with its builds, the archives its `COPY` steps uploaded and, once a build
//! finished, the prepared config its sandboxes start from. A build is an environment
//! layer (`template_recipe`) over the template's base, built once per image and content
//! in a build sandbox, as `omabox run --environment` builds one.
//!
//! Tags (E2B's): a build gets the tags it was requested with (`NAME:TAG`, `tags`; none:
//! [`DEFAULT_TAG`]) once it is ready, moving them from an older build; `NAME` means
//! `NAME:default`. Tags can be given to a ready build later and taken off. A template can
//! be deleted: its builds, tags and uploads are forgotten, sandboxes started from it run
//! on, and its environment layer stays in the image cache (content-addressed: a later
//! build of the same steps finds it; `omabox image rm|prune` removes it with its image).
//!
//! Bounded: [`MAX_BUILT_TEMPLATES`] templates, [`MAX_BUILDS`] builds kept per template
//! (the oldest finished one no tag names is forgotten), [`MAX_TAGS`] tags per template,
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
    BuildLogEntry, BuildState, BuildStatus, DEFAULT_TAG, FileSlot, TemplateBuildInfo,
    TemplateBuildRequest, TemplateBuildSpec, TemplateBuildTicket, TemplateInfo, TemplateService,
    TemplateTag,
};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
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
/// Tags one template keeps.
pub const MAX_TAGS: usize = 64;

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
    created_at: SystemTime,
    updated_at: SystemTime,
    files: HashMap<String, Slot>,
    /// Oldest first.
    builds: Vec<(String, Arc<Build>)>,
    /// Each tag's build id, and when it was given.
    tags: BTreeMap<String, (String, SystemTime)>,
    spawn_count: u64,
    last_spawned_at: Option<SystemTime>,
}

impl Template {
    fn build(&self, build_id: &str) -> Option<&Arc<Build>> {
        self.builds
            .iter()
            .find(|(id, _)| id == build_id)
            .map(|(_, build)| build)
    }

    /// The recipe and prepared config of the ready build `tag` names.
    fn tagged(&self, tag: &str) -> Option<(Recipe, LinuxSandboxConfig)> {
        let (build_id, _) = self.tags.get(tag)?;
        self.build(build_id)?.progress().ready.clone()
    }

    /// Why `tag` starts no sandbox.
    fn untagged(&self, tag: &str) -> SandboxServiceError {
        let any_ready = self
            .builds
            .iter()
            .any(|(_, build)| build.progress().ready.is_some());
        SandboxServiceError::BadRequest(if any_ready {
            format!("template {:?} has no build tagged {tag:?}", self.name)
        } else {
            format!("template {:?} has no finished build yet", self.name)
        })
    }
}

enum Slot {
    Waiting(SecretString),
    Stored(CopyFile),
}

struct Build {
    created_at: SystemTime,
    /// The tags it gets once ready.
    tags: Vec<String>,
    progress: Mutex<Progress>,
}

struct Progress {
    status: BuildStatus,
    finished_at: Option<SystemTime>,
    /// Once ready: its recipe and the prepared config its sandboxes start from.
    ready: Option<(Recipe, LinuxSandboxConfig)>,
}

impl Build {
    fn new(tags: Vec<String>) -> Self {
        Self {
            created_at: SystemTime::now(),
            tags,
            progress: Mutex::new(Progress {
                status: BuildStatus {
                    state: BuildState::Waiting,
                    log: Vec::new(),
                    reason: None,
                },
                finished_at: None,
                ready: None,
            }),
        }
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn finished(&self) -> bool {
        matches!(
            self.progress().status.state,
            BuildState::Ready | BuildState::Error
        )
    }

    fn log(&self, level: LogLevel, message: &str) {
        let mut progress = self.progress();
        if progress.status.log.len() < MAX_BUILD_LOG {
            progress.status.log.push(BuildLogEntry {
                timestamp: SystemTime::now(),
                level,
                message: super::logs::clean(message),
            });
        }
    }

    fn finish(&self, ready: Result<(Recipe, LinuxSandboxConfig), String>) {
        let mut progress = self.progress();
        progress.finished_at = Some(SystemTime::now());
        match ready {
            Ok(ready) => {
                progress.status.state = BuildState::Ready;
                progress.ready = Some(ready);
            }
            Err(reason) => {
                progress.status.state = BuildState::Error;
                progress.status.reason = Some(reason);
            }
        }
    }

    fn info(&self, build_id: &str) -> TemplateBuildInfo {
        let progress = self.progress();
        TemplateBuildInfo {
            build_id: build_id.to_owned(),
            state: progress.status.state,
            created_at: self.created_at,
            finished_at: progress.finished_at,
        }
    }
}

impl State {
    /// The template `name` names (`NAME`, `NAME:TAG`, or its id with or without `:TAG`)
    /// and the tag it means.
    fn find<'a>(&self, name: &'a str) -> Option<(String, &'a str)> {
        let (plain, tag) = name.rsplit_once(':').unwrap_or((name, DEFAULT_TAG));
        let id = match self.names.get(plain) {
            Some(id) => id.clone(),
            None => self.by_id.contains_key(plain).then(|| plain.to_owned())?,
        };
        Some((id, tag))
    }

    fn named(&self, name: &str) -> Result<(String, &Template), SandboxServiceError> {
        self.find(name)
            .and_then(|(id, _)| self.by_id.get(&id).map(|template| (id, template)))
            .ok_or_else(|| not_found(name))
    }
}

fn not_found(name: &str) -> SandboxServiceError {
    SandboxServiceError::Missing(format!(
        "template {:?} not found",
        name.chars().take(64).collect::<String>()
    ))
}

impl TemplateBuilds {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The prepared config a sandbox of the template `name` (`NAME`, `NAME:TAG` or its id)
    /// starts from, counted as a start: `None` when no template has that name; an error
    /// when the tag names no ready build.
    pub(super) fn config_of(
        &self,
        name: &str,
    ) -> Option<Result<LinuxSandboxConfig, SandboxServiceError>> {
        let mut state = self.state();
        let (id, tag) = state.find(name)?;
        let template = state.by_id.get_mut(&id)?;
        Some(match template.tagged(tag) {
            Some((_, config)) => {
                template.spawn_count += 1;
                template.last_spawned_at = Some(SystemTime::now());
                Ok(config)
            }
            None => Err(template.untagged(tag)),
        })
    }

    /// Marks `build` ready with its recipe and config and gives it its tags (moved from an
    /// older build), at once: a status poll that saw `ready` finds the tags. A template
    /// deleted meanwhile gets nothing.
    fn make_ready(
        &self,
        template_id: &str,
        build_id: &str,
        build: &Build,
        ready: (Recipe, LinuxSandboxConfig),
    ) {
        let mut state = self.state();
        build.finish(Ok(ready));
        if let Some(template) = state.by_id.get_mut(template_id) {
            let now = SystemTime::now();
            for tag in &build.tags {
                template
                    .tags
                    .insert(tag.clone(), (build_id.to_owned(), now));
            }
            template.updated_at = now;
        }
    }

    /// Whether a template built here has the name or id `name` (with or without a tag).
    pub(super) fn knows(&self, name: &str) -> bool {
        self.state().find(name).is_some()
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
        state
            .by_id
            .get_mut(template_id)
            .ok_or_else(|| not_found(template_id))
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
                let now = SystemTime::now();
                state.names.insert(request.name.clone(), id.clone());
                state.by_id.insert(
                    id.clone(),
                    Template {
                        name: request.name.clone(),
                        created_at: now,
                        updated_at: now,
                        files: HashMap::new(),
                        builds: Vec::new(),
                        tags: BTreeMap::new(),
                        spawn_count: 0,
                        last_spawned_at: None,
                    },
                );
                id
            }
        };
        let template = TemplateBuilds::template_mut(&mut state, &id)?;
        // E2B's build ids are UUIDs (the SDKs parse them as such).
        let build_id = uuid::Uuid::new_v4().to_string();
        if template.builds.len() >= MAX_BUILDS {
            let forgettable = template.builds.iter().position(|(id, build)| {
                build.finished() && !template.tags.values().any(|(tagged, _)| tagged == id)
            });
            match forgettable {
                Some(oldest) => drop(template.builds.remove(oldest)),
                None => {
                    return Err(SandboxServiceError::Unavailable(format!(
                        "template {:?} already keeps {MAX_BUILDS} builds in progress or tagged",
                        template.name
                    )));
                }
            }
        }
        let tags = if request.tags.is_empty() {
            vec![DEFAULT_TAG.to_owned()]
        } else {
            request.tags
        };
        let build = Arc::new(Build::new(tags.clone()));
        build.log(
            LogLevel::Info,
            &format!("build {build_id} of template {} requested", template.name),
        );
        template.builds.push((build_id.clone(), build));
        template.updated_at = SystemTime::now();
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
                    let (id, tag) = state.find(name)?;
                    state.by_id.get(&id)?.tagged(tag).map(|(recipe, _)| recipe)
                });
            let template = TemplateBuilds::template_mut(&mut state, template_id)?;
            let build = template
                .build(build_id)
                .map(Arc::clone)
                .ok_or_else(|| build_not_found(build_id))?;
            let files = |hash: &str| match template.files.get(hash) {
                Some(Slot::Stored(file)) => Some(file.clone()),
                _ => None,
            };
            let recipe = template_recipe::recipe_of(&spec, parent.as_ref(), &files)
                .map_err(SandboxServiceError::BadRequest)?;
            let mut progress = build.progress();
            if progress.status.state != BuildState::Waiting {
                return Err(SandboxServiceError::BadRequest(format!(
                    "build {build_id} was started already"
                )));
            }
            progress.status.state = BuildState::Building;
            drop(progress);
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
        let (template_id, build_id) = (template_id.to_owned(), build_id.to_owned());
        tokio::spawn(async move {
            match host.template_config(&recipe).await {
                Ok(config) => {
                    build.log(LogLevel::Info, &format!("template {name} is ready"));
                    host.inner
                        .builds
                        .make_ready(&template_id, &build_id, &build, (recipe, config));
                }
                Err(error) => {
                    let message = error.to_string();
                    build.log(LogLevel::Error, &message);
                    build.finish(Err(super::logs::clean(&message)));
                }
            }
        });
        Ok(())
    }

    fn template_id(&self, name: &str) -> Option<String> {
        self.inner.builds.state().find(name).map(|(id, _)| id)
    }

    fn build_status(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<BuildStatus, SandboxServiceError> {
        let mut state = self.inner.builds.state();
        let template = TemplateBuilds::template_mut(&mut state, template_id)?;
        template
            .build(build_id)
            .map(|build| build.progress().status.clone())
            .ok_or_else(|| build_not_found(build_id))
    }

    fn list(&self) -> Vec<TemplateInfo> {
        let state = self.inner.builds.state();
        let mut templates: Vec<TemplateInfo> = state
            .by_id
            .iter()
            .map(|(id, template)| info_of(id, template))
            .collect();
        templates
            .sort_by(|a, b| (a.created_at, &a.template_id).cmp(&(b.created_at, &b.template_id)));
        templates
    }

    fn info(&self, id_or_name: &str) -> Result<TemplateInfo, SandboxServiceError> {
        let state = self.inner.builds.state();
        let (id, template) = state.named(id_or_name)?;
        Ok(info_of(&id, template))
    }

    async fn delete(&self, id_or_name: &str) -> Result<bool, SandboxServiceError> {
        let builds = &self.inner.builds;
        let removed = {
            let mut state = builds.state();
            let Some((id, _)) = state.find(id_or_name) else {
                return Ok(false);
            };
            let Some(template) = state.by_id.remove(&id) else {
                return Ok(false);
            };
            state.names.remove(&template.name);
            (id, template)
        };
        let (id, template) = removed;
        // Its uploads: their bytes no longer count against the server's cap.
        let stored: u64 = template
            .files
            .values()
            .filter_map(|slot| match slot {
                Slot::Stored(file) => std::fs::metadata(&file.path).ok().map(|m| m.len()),
                Slot::Waiting(_) => None,
            })
            .sum();
        if let Some(dir) = &builds.files_dir {
            // `id` is ours (letters and digits).
            match tokio::fs::remove_dir_all(dir.join(&id)).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(internal(format!("cannot remove the uploads: {e}"))),
            }
        }
        // Saturating in one atomic step (a load, then a sub, could race another removal).
        let _ = builds
            .stored
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |kept| {
                Some(kept.saturating_sub(stored))
            });
        Ok(true)
    }

    fn assign_tags(&self, target: &str, tags: &[String]) -> Result<String, SandboxServiceError> {
        let mut state = self.inner.builds.state();
        let (id, tag) = state.find(target).ok_or_else(|| not_found(target))?;
        let template = TemplateBuilds::template_mut(&mut state, &id)?;
        let (build_id, _) = template.tags.get(tag).cloned().ok_or_else(|| {
            SandboxServiceError::Missing(format!(
                "template {:?} has no build tagged {:?}",
                template.name,
                tag.chars().take(64).collect::<String>()
            ))
        })?;
        let new = tags
            .iter()
            .filter(|t| !template.tags.contains_key(*t))
            .count();
        if template.tags.len() + new > MAX_TAGS {
            return Err(SandboxServiceError::Unavailable(format!(
                "template {:?} may have at most {MAX_TAGS} tags",
                template.name
            )));
        }
        let now = SystemTime::now();
        for tag in tags {
            template.tags.insert(tag.clone(), (build_id.clone(), now));
        }
        template.updated_at = now;
        Ok(build_id)
    }

    fn remove_tags(&self, name: &str, tags: &[String]) -> Result<(), SandboxServiceError> {
        let mut state = self.inner.builds.state();
        let (id, _) = state.find(name).ok_or_else(|| not_found(name))?;
        let template = TemplateBuilds::template_mut(&mut state, &id)?;
        if let Some(missing) = tags.iter().find(|tag| !template.tags.contains_key(*tag)) {
            return Err(SandboxServiceError::Missing(format!(
                "template {:?} has no tag {:?}",
                template.name,
                missing.chars().take(64).collect::<String>()
            )));
        }
        for tag in tags {
            template.tags.remove(tag);
        }
        template.updated_at = SystemTime::now();
        Ok(())
    }

    fn tags(&self, id_or_name: &str) -> Result<Vec<TemplateTag>, SandboxServiceError> {
        let state = self.inner.builds.state();
        let (_, template) = state.named(id_or_name)?;
        Ok(template
            .tags
            .iter()
            .map(|(tag, (build_id, created_at))| TemplateTag {
                tag: tag.clone(),
                build_id: build_id.clone(),
                created_at: *created_at,
            })
            .collect())
    }
}

fn build_not_found(build_id: &str) -> SandboxServiceError {
    SandboxServiceError::Missing(format!(
        "build {:?} not found",
        build_id.chars().take(64).collect::<String>()
    ))
}

/// What the API shows of a template: its shape is its newest ready build's.
fn info_of(id: &str, template: &Template) -> TemplateInfo {
    let newest_ready = template.builds.iter().rev().find_map(|(_, build)| {
        build
            .progress()
            .ready
            .as_ref()
            .map(|(_, c)| c.limits.clone())
    });
    TemplateInfo {
        template_id: id.to_owned(),
        name: template.name.clone(),
        created_at: template.created_at,
        updated_at: template.updated_at,
        last_spawned_at: template.last_spawned_at,
        spawn_count: template.spawn_count,
        cpu_count: newest_ready
            .as_ref()
            .map_or(0, |limits| super::backend::cpu_count(limits.cpu.as_ref())),
        memory_mb: newest_ready
            .as_ref()
            .and_then(|limits| limits.memory_bytes)
            .map_or(0, |bytes| bytes >> 20),
        builds: template
            .builds
            .iter()
            .rev()
            .map(|(id, build)| build.info(id))
            .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_backend_linux::factory::LinuxSandboxFactory;

    fn host(files: &std::path::Path) -> SandboxHost {
        let mut host =
            SandboxHost::with_config(LinuxSandboxFactory::new(), LinuxSandboxConfig::default());
        Arc::get_mut(&mut host.inner)
            .expect("not shared yet")
            .builds
            .files_dir = Some(files.to_owned());
        host
    }

    fn request(tags: &[&str]) -> TemplateBuildRequest {
        TemplateBuildRequest {
            name: "tpl".into(),
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    /// What the build task does when the layer is built.
    fn build_ready(host: &SandboxHost, ticket: &TemplateBuildTicket) {
        let builds = &host.inner.builds;
        let build = builds.state().by_id[&ticket.template_id]
            .build(&ticket.build_id)
            .map(Arc::clone)
            .expect("the build");
        let recipe = Recipe {
            base: Base::Node,
            lines: vec![format!("RUN echo {}", ticket.build_id)],
            files: Default::default(),
        };
        builds.make_ready(
            &ticket.template_id,
            &ticket.build_id,
            &build,
            (recipe, LinuxSandboxConfig::default()),
        );
    }

    fn tagged(host: &SandboxHost) -> Vec<(String, String)> {
        host.tags("tpl")
            .expect("the template")
            .into_iter()
            .map(|t| (t.tag, t.build_id))
            .collect()
    }

    #[tokio::test]
    async fn tags_name_ready_builds_and_only_untagged_finished_builds_are_forgotten() {
        let files = tempfile::tempdir().expect("tempdir");
        let host = host(files.path());
        let first = host.request_build(request(&[])).await.expect("a build");
        assert_eq!(first.tags, ["default"]);
        assert!(
            uuid::Uuid::parse_str(&first.build_id).is_ok(),
            "E2B's build ids are UUIDs"
        );
        // Not ready: no tag yet, and a start says why.
        assert!(tagged(&host).is_empty());
        let error = host
            .inner
            .builds
            .config_of("tpl")
            .expect("known")
            .unwrap_err();
        assert!(error.to_string().contains("no finished build"), "{error}");
        build_ready(&host, &first);
        let v1 = host.request_build(request(&["v1"])).await.expect("a build");
        build_ready(&host, &v1);
        assert_eq!(
            tagged(&host),
            [
                ("default".to_owned(), first.build_id.clone()),
                ("v1".to_owned(), v1.build_id.clone())
            ]
        );
        // `NAME` is `NAME:default`, counted as a start; an unknown tag starts nothing.
        assert!(host.inner.builds.config_of("tpl").expect("known").is_ok());
        assert!(
            host.inner
                .builds
                .config_of("tpl:v1")
                .expect("known")
                .is_ok()
        );
        let error = host
            .inner
            .builds
            .config_of("tpl:v9")
            .expect("known")
            .unwrap_err();
        assert!(
            error.to_string().contains("no build tagged \"v9\""),
            "{error}"
        );
        assert_eq!(host.info("tpl").expect("the template").spawn_count, 2);

        // Tags move between builds; a removal naming a missing tag removes none.
        let moved = host
            .assign_tags("tpl:v1", &["default".into()])
            .expect("assigned");
        assert_eq!(moved, v1.build_id);
        let error = host
            .remove_tags("tpl", &["v1".into(), "nope".into()])
            .unwrap_err();
        assert!(matches!(error, SandboxServiceError::Missing(_)), "{error}");
        assert_eq!(tagged(&host).len(), 2);
        assert!(matches!(
            host.assign_tags("tpl:nope", &["x".into()]),
            Err(SandboxServiceError::Missing(_))
        ));

        // 16 builds kept: the first (finished, no tag names it now) is forgotten for the
        // 17th; then every kept build is tagged or in progress, and an 18th is refused.
        for _ in 0..14 {
            host.request_build(request(&[])).await.expect("a build");
        }
        assert_eq!(
            host.info("tpl").expect("the template").builds.len(),
            MAX_BUILDS
        );
        host.request_build(request(&[]))
            .await
            .expect("the first is forgotten");
        assert!(matches!(
            host.build_status(&first.template_id, &first.build_id),
            Err(SandboxServiceError::Missing(_))
        ));
        let error = host.request_build(request(&[])).await.unwrap_err();
        assert!(
            matches!(error, SandboxServiceError::Unavailable(ref m) if m.contains("in progress or tagged")),
            "{error}"
        );
        assert_eq!(
            tagged(&host),
            [
                ("default".to_owned(), v1.build_id.clone()),
                ("v1".to_owned(), v1.build_id.clone())
            ]
        );

        // Deleted: gone by name, its uploads' directory with it.
        std::fs::create_dir_all(files.path().join(&first.template_id)).expect("uploads");
        assert!(host.delete("tpl").await.expect("deleted"));
        assert!(!files.path().join(&first.template_id).exists());
        assert!(host.list().is_empty());
        assert!(!host.delete("tpl").await.expect("absent is false"));
        assert!(host.inner.builds.config_of("tpl").is_none());
    }
}
