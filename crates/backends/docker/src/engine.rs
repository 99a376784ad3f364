//! [`Engine`]: one Docker Engine, reached through bollard at `DOCKER_HOST` (or a given
//! address), the API version negotiated once. Images are made present here (pulled through
//! the engine, which keeps them); must never send a registry credential (none is
//! configured yet: a registry wanting one fails the pull with the engine's words).

use std::collections::HashMap;

use bollard::query_parameters::{
    CreateImageOptions, ListContainersOptions, RemoveContainerOptions,
};
use bollard::{ClientVersion, Docker};
use futures::StreamExt as _;

use crate::error::DockerError;

/// The socket the docker CLI uses when `DOCKER_HOST` is unset.
pub const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";

/// `DOCKER_HOST`, else [`DEFAULT_HOST`]: the one read of the process environment in this
/// crate.
fn env_host() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| DEFAULT_HOST.to_owned())
}

/// A connected Docker Engine. Cheap to clone (one connection pool).
#[derive(Debug, Clone)]
pub struct Engine {
    docker: Docker,
    host: String,
}

/// One container the engine lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedContainer {
    /// The engine's container id.
    pub id: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
}

impl Engine {
    /// The engine at `DOCKER_HOST`, else at [`DEFAULT_HOST`].
    pub async fn from_env() -> Result<Self, DockerError> {
        Self::connect(&env_host()).await
    }

    /// [`from_env`](Self::from_env) without a round trip ([`connect_pinned`](Self::connect_pinned)).
    pub fn from_env_pinned() -> Result<Self, DockerError> {
        Self::connect_pinned(&env_host())
    }

    /// The engine at `host` without a round trip, for a caller that cannot wait (a lease
    /// resolver): the API version is pinned to 1.41, Docker 20.10's, which every later
    /// engine serves. Nothing is sent until the first request.
    pub fn connect_pinned(host: &str) -> Result<Self, DockerError> {
        const PINNED: ClientVersion = ClientVersion {
            major_version: 1,
            minor_version: 41,
        };
        const TIMEOUT_S: u64 = 120;
        let docker = if host.starts_with("unix://") {
            Docker::connect_with_unix(host, TIMEOUT_S, &PINNED)
        } else {
            Docker::connect_with_http(host, TIMEOUT_S, &PINNED)
        }
        .map_err(|source| DockerError::Reach {
            host: host.to_owned(),
            source,
        })?;
        Ok(Self {
            docker,
            host: host.to_owned(),
        })
    }

    /// The engine at `host` (`unix:///path`, `tcp://host:port`, `http://host:port`), its
    /// API version negotiated (an older daemon refuses a newer client's version).
    pub async fn connect(host: &str) -> Result<Self, DockerError> {
        let reach = |source| DockerError::Reach {
            host: host.to_owned(),
            source,
        };
        let docker = Docker::connect_with_host(host).map_err(reach)?;
        let docker = docker.negotiate_version().await.map_err(reach)?;
        Ok(Self {
            docker,
            host: host.to_owned(),
        })
    }

    /// The bollard client.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// The engine's address.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Makes `image` present: a reference the engine has is used as is, any other is
    /// pulled through the engine.
    pub async fn ensure_image(&self, image: &str) -> Result<(), DockerError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(source) => {
                return Err(DockerError::Engine {
                    op: "inspect the image",
                    target: image.to_owned(),
                    source,
                });
            }
        }
        let options = CreateImageOptions {
            from_image: Some(image.to_owned()),
            ..Default::default()
        };
        let mut progress = self.docker.create_image(Some(options), None, None);
        while let Some(step) = progress.next().await {
            step.map_err(|source| DockerError::Engine {
                op: "pull",
                target: image.to_owned(),
                source,
            })?;
        }
        Ok(())
    }

    /// Every container (running or not) carrying `label` (`key` or `key=value`).
    pub async fn containers_labelled(
        &self,
        label: &str,
    ) -> Result<Vec<ListedContainer>, DockerError> {
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![label.to_owned()],
            )])),
            ..Default::default()
        };
        let listed = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|source| DockerError::Engine {
                op: "list the containers labelled",
                target: label.to_owned(),
                source,
            })?;
        Ok(listed
            .into_iter()
            .filter_map(|c| {
                Some(ListedContainer {
                    id: c.id?,
                    labels: c.labels.unwrap_or_default(),
                })
            })
            .collect())
    }

    /// Whether container `name` runs (`None`: the engine has no such container).
    pub async fn container_running(&self, name: &str) -> Result<Option<bool>, DockerError> {
        match self.docker.inspect_container(name, None).await {
            Ok(inspected) => Ok(Some(
                inspected
                    .state
                    .and_then(|state| state.running)
                    .unwrap_or(false),
            )),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(source) => Err(DockerError::Engine {
                op: "inspect the container",
                target: name.to_owned(),
                source,
            }),
        }
    }

    /// The host pid of container `name`'s first process (`None`: not running).
    pub async fn container_pid(&self, name: &str) -> Result<Option<u32>, DockerError> {
        let inspected = self
            .docker
            .inspect_container(name, None)
            .await
            .map_err(|source| DockerError::Engine {
                op: "inspect the container",
                target: name.to_owned(),
                source,
            })?;
        Ok(inspected
            .state
            .and_then(|state| state.pid)
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|pid| *pid > 0))
    }

    /// Removes container `id` (killed first when running) with its anonymous volumes. A
    /// container already gone is success: removal is idempotent.
    pub async fn remove_container(&self, id: &str) -> Result<(), DockerError> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        match self.docker.remove_container(id, Some(options)).await {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            // 409: a removal of this container is already in progress.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(()),
            Err(source) => Err(DockerError::Engine {
                op: "remove the container",
                target: id.to_owned(),
                source,
            }),
        }
    }
}
