//! A template's linux config prepared once (image resolved, pulled and held; environment
//! layer built; the host checked), for [`SandboxHost`]'s linux sandboxes.

use super::{BASE_TEMPLATE, MAX_TEMPLATES, SandboxHost, context, internal, startup_error};
use omabox_backend_linux::factory::LinuxSandboxConfig;
use omabox_proxy::e2b::SandboxServiceError;
use std::sync::{Arc, PoisonError};
use tokio::sync::OnceCell;

/// Whether a template other than `base` may be taken for an image reference (or a path):
/// never a bare name (E2B's `code-interpreter-v1` is not taken for a Docker Hub image:
/// pulling one nobody meant would reach a registry nobody named), at most 512 bytes, no
/// control characters or spaces.
pub(super) fn image_reference(template: &str) -> Result<(), SandboxServiceError> {
    let shown: String = template.chars().take(64).collect();
    if !template.contains([':', '/', '@']) {
        return Err(SandboxServiceError::BadRequest(format!(
            "template {shown:?} is not known: use \"{BASE_TEMPLATE}\" or name an image with its tag or registry (NAME:TAG, REGISTRY/REPO:TAG, a path)"
        )));
    }
    if template.len() > 512
        || template
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(SandboxServiceError::BadRequest(format!(
            "template {shown:?} is not an image reference"
        )));
    }
    Ok(())
}

impl SandboxHost {
    /// The prepared config of `template` (image resolved, pulled and held; environment
    /// layer built) and the host checked, once per template.
    pub(super) async fn prepared(
        &self,
        template: &str,
    ) -> Result<LinuxSandboxConfig, SandboxServiceError> {
        if template == BASE_TEMPLATE {
            return self
                .prepare(&self.inner.prepared, self.inner.unprepared.clone())
                .await
                .cloned();
        }
        if let Some(built) = self.inner.builds.config_of(template) {
            return built;
        }
        let shown: String = template.chars().take(64).collect();
        let Some(image_config) = &self.inner.image_config else {
            return Err(SandboxServiceError::BadRequest(format!(
                "template {shown:?} is not known: this server serves only \"{BASE_TEMPLATE}\""
            )));
        };
        image_reference(template)?;
        let cell = {
            let mut templates = self
                .inner
                .templates
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !templates.contains_key(template) && templates.len() >= MAX_TEMPLATES {
                return Err(SandboxServiceError::Unavailable(format!(
                    "this server already keeps {MAX_TEMPLATES} templates"
                )));
            }
            Arc::clone(templates.entry(template.to_owned()).or_default())
        };
        let unprepared = image_config(template)
            .map_err(|e| SandboxServiceError::BadRequest(format!("template {shown:?}: {e}")))?;
        self.prepare(&cell, unprepared)
            .await
            .cloned()
            .map_err(|e| match e {
                SandboxServiceError::Internal(message) => {
                    SandboxServiceError::BadRequest(format!("template {shown:?}: {message}"))
                }
                other => other,
            })
    }

    pub(super) async fn prepare<'a>(
        &self,
        cell: &'a OnceCell<LinuxSandboxConfig>,
        unprepared: LinuxSandboxConfig,
    ) -> Result<&'a LinuxSandboxConfig, SandboxServiceError> {
        cell.get_or_try_init(|| async {
            let (factory, mut config) = (self.inner.factory.clone(), unprepared);
            let config = tokio::task::spawn_blocking(move || {
                factory.prepare_image(&mut config, &omabox_backend_linux::image::NoProgress)?;
                factory.check_host_config(&context("probe"), &config)?;
                Ok::<_, omabox_backend_linux::factory::LinuxFactoryError>(config)
            })
            .await
            .map_err(|e| internal(format!("the preparation task failed: {e}")))?;
            let mut config = config.map_err(|e| internal(startup_error(&e)))?;
            self.inner
                .factory
                .prepare_env_layer(&mut config)
                .await
                .map_err(|e| internal(startup_error(&e)))?;
            Ok(config)
        })
        .await
    }
}
