//! The docker tests' rig: an engine of the test's own, a registry on loopback and the
//! busybox image pushed to it.
#![allow(dead_code)]

use omabox_backend_docker::config::locate_agent;
use omabox_backend_docker::{DockerConfig, Engine};
use omabox_test_support::dockerd::TestDockerd;
use omabox_test_support::registry::{TestRegistry, tar_layer};

const BUSYBOX: &str = "/bin/busybox";

pub fn missing() -> Option<String> {
    TestRegistry::missing()
        .or_else(|| {
            let static_busybox = std::fs::read(BUSYBOX)
                .map(|b| !b.windows(14).any(|w| w == b"/lib64/ld-linu"))
                .unwrap_or(false);
            (!static_busybox).then(|| {
                format!("{BUSYBOX} is not a static busybox (apt-get install busybox-static)")
            })
        })
        .or_else(|| {
            locate_agent(None).err().map(|tried| {
                format!("omabox-agent is not built (tried {tried}; cargo build -p omabox-agent)")
            })
        })
        .or_else(TestDockerd::missing)
}

/// An engine, a registry, and the busybox image pushed to it (its reference).
pub struct Rig {
    pub engine: Engine,
    pub image: String,
    _dockerd: TestDockerd,
    _registry: TestRegistry,
}

pub async fn rig() -> Rig {
    let registry = TestRegistry::start();
    let busybox = std::fs::read(BUSYBOX).unwrap();
    registry.push_image(
        "test/busybox",
        "1",
        &[tar_layer(&[
            ("bin/busybox", 0o755, &busybox),
            ("bin/sh", 0o755, &busybox),
            ("tmp/.keep", 0o644, b""),
        ])],
    );
    let dockerd = TestDockerd::start();
    let engine = Engine::connect(&dockerd.host()).await.unwrap();
    Rig {
        engine,
        image: format!("{}/test/busybox:1", registry.host()),
        _dockerd: dockerd,
        _registry: registry,
    }
}

pub fn config(rig: &Rig, host: &str) -> DockerConfig {
    DockerConfig {
        agent_binary: locate_agent(None).unwrap(),
        ..DockerConfig::new(rig.image.clone(), host)
    }
}
