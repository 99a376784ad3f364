//! Memory snapshots that outlive a pause: [`GvisorImage`] keeps a paused sandbox's
//! checkpoint (hard links into `<dir>/images/<id>/checkpoint`, no copy) and its workspace
//! frozen into overlay layers (`layers.rs`; the image lists them in its own `ws/lowers`, so
//! no layer it stacks is collected); [`GvisorRuntime::start_from`] restores new sandboxes
//! from it, as a fork does.
//!
//! An image names its owner (`owner`, as a sandbox directory does): `reap` removes the
//! images of owners that are gone.
//!
//! Must never: let a restore write into the image (each sandbox restores from it read-only
//! and writes into its own upper); keep a half-made image (removed on error).

use std::path::{Path, PathBuf};

use crate::GvisorError;
use crate::sandbox::{GvisorRuntime, GvisorSandbox, State, blocking};

/// A memory snapshot of a gvisor sandbox (module doc). Removed by [`GvisorImage::remove`].
#[derive(Debug, Clone)]
pub struct GvisorImage {
    dir: PathBuf,
    user_home: bool,
    /// The sandbox's own image root (a restore needs the same).
    image_root: Option<PathBuf>,
}

impl GvisorImage {
    /// The image's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes the image and the layers nothing else stacks.
    pub fn remove(&self) -> Result<(), GvisorError> {
        let removed = match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(GvisorError::Io {
                what: format!("removing {}", self.dir.display()),
                source: e,
            }),
            _ => Ok(()),
        };
        if let Some(backend_dir) = self.dir.parent().and_then(Path::parent) {
            crate::layers::collect_bases(backend_dir);
        }
        removed
    }
}

impl GvisorSandbox {
    /// Keeps this paused sandbox's checkpoint and workspace as an image; it stays paused.
    /// Needs a workspace of its own (not a caller's directory).
    pub async fn keep_image(&self) -> Result<GvisorImage, GvisorError> {
        {
            let live = self.live.lock().await;
            if live.state != State::Paused {
                return Err(GvisorError::NotPaused { state: live.state });
            }
        }
        let bases = self.shared.dir.join("bases");
        let images = self.shared.dir.join("images");
        if !self.own_workspace
            || crate::layers::lowers(&self.dir).len() >= crate::layers::MAX_LAYERS
            || !crate::layers::nameable(&[&bases, &self.dir])
        {
            return Err(GvisorError::Io {
                what: "keeping an image of a sandbox whose workspace cannot be layered".into(),
                source: std::io::Error::from(std::io::ErrorKind::Unsupported),
            });
        }
        let (dir, checkpoint) = (self.dir.clone(), self.checkpoint_dir());
        let image = images.join(uuid::Uuid::new_v4().simple().to_string());
        let (user_home, image_root) = (self.user_home, self.image_root.clone());
        let made = image.clone();
        blocking(move || {
            let io = |what: &str| {
                let what = what.to_owned();
                move |e| GvisorError::Io { what, source: e }
            };
            let layers =
                crate::layers::freeze(&bases, &dir).map_err(io("freezing the workspace"))?;
            let kept = (|| {
                std::fs::create_dir_all(&made)?;
                std::fs::write(
                    made.join(crate::reap::OWNER_FILE),
                    omabox_sandbox::host_id::current(),
                )?;
                crate::layers::record(&made, &layers)?;
                crate::checkpoints::link_checkpoint(&checkpoint, &made.join("checkpoint"))
            })();
            if let Err(e) = kept {
                let _ = std::fs::remove_dir_all(&made);
                return Err(io("keeping the checkpoint as an image")(e));
            }
            Ok(())
        })
        .await?;
        Ok(GvisorImage {
            dir: image,
            user_home,
            image_root,
        })
    }
}

impl GvisorRuntime {
    /// A new sandbox restored from `image`: its processes go on from the image's memory,
    /// its workspace starts as the image's (an overlay of its own over the image's layers).
    pub async fn start_from(&self, image: &GvisorImage) -> Result<GvisorSandbox, GvisorError> {
        let mut sandbox = GvisorSandbox::layout(self.shared.clone())?;
        sandbox.user_home = image.user_home;
        sandbox.image_root.clone_from(&image.image_root);
        let (dir, layers) = (sandbox.dir.clone(), crate::layers::lowers(&image.dir));
        let mounted = blocking(move || {
            crate::layers::mount(&dir, &layers).map_err(|e| GvisorError::Io {
                what: "mounting the workspace of a sandbox from an image".into(),
                source: e,
            })
        })
        .await;
        if let Err(e) = mounted {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        sandbox
            .start_in_place(Some(image.dir.join("checkpoint")))
            .await
    }
}
