//! [`GvisorSandbox::fork`]: sandboxes restored from a paused one's checkpoint, their
//! workspaces shared through overlay layers (`layers.rs`) or copied (`copy.rs`).

use crate::GvisorError;
use crate::copy::copy_tree;
use crate::sandbox::{GvisorRuntime, GvisorSandbox, State, blocking};

impl GvisorSandbox {
    /// `count` new sandboxes restored from this paused sandbox's checkpoint, each with
    /// its own copy of the workspace and its own id; this one stays paused.
    pub async fn fork(
        &self,
        runtime: &GvisorRuntime,
        count: usize,
    ) -> Result<Vec<GvisorSandbox>, GvisorError> {
        {
            let live = self.live.lock().await;
            if live.state != State::Paused {
                return Err(GvisorError::NotPaused { state: live.state });
            }
        }
        // The workspace is shared through overlay layers where it can be (the sandbox's own,
        // not too deep, paths overlayfs can name), else copied.
        let bases = self.shared.dir.join("bases");
        let layered = self.own_workspace
            && crate::layers::lowers(&self.dir).len() < crate::layers::MAX_LAYERS
            && crate::layers::nameable(&[&bases, &self.dir]);
        let layers = if layered {
            let (bases, dir) = (bases.clone(), self.dir.clone());
            Some(
                blocking(move || {
                    crate::layers::freeze(&bases, &dir).map_err(|e| GvisorError::Io {
                        what: "freezing the workspace into a layer".into(),
                        source: e,
                    })
                })
                .await?,
            )
        } else {
            None
        };
        // Each fork's directory, workspace and network first, one after the other (disk
        // bound); then every restore at once (runsc's restores are CPU and latency bound).
        let mut forks = Vec::with_capacity(count);
        let mut failed = None;
        for _ in 0..count {
            let mut fork = match GvisorSandbox::layout(runtime.shared.clone()) {
                Ok(fork) => fork,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            // The checkpoint's mounts: a restore needs the same ones.
            fork.user_home = self.user_home;
            fork.image_root.clone_from(&self.image_root);
            forks.push(fork);
            let fork = forks.last().expect("just pushed");
            let (from, to) = (self.workspace(), fork.workspace());
            let (dir, layers) = (fork.dir.clone(), layers.clone());
            let made = blocking(move || match layers {
                Some(layers) => crate::layers::mount(&dir, &layers).map_err(|e| GvisorError::Io {
                    what: "mounting a fork's workspace".into(),
                    source: e,
                }),
                None => copy_tree(&from, &to),
            });
            let copied = match made.await {
                Ok(()) => fork.serve_network(),
                Err(e) => Err(e),
            };
            if let Err(e) = copied {
                failed = Some(e);
                break;
            }
        }
        if failed.is_none() {
            let image = self.checkpoint_dir();
            let booted =
                futures::future::join_all(forks.iter().map(|f| f.boot(Some(image.clone())))).await;
            failed = booted.into_iter().find_map(Result::err);
        }
        if let Some(e) = failed {
            for f in &forks {
                let _ = f.destroy().await;
            }
            return Err(e);
        }
        Ok(forks)
    }
}
