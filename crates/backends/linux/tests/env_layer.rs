//! Environment layers built by a hostile build step: whatever the dockerfile's `RUN` leaves
//! in the layer's upper dir (links where the host works afterwards, a process still
//! rewriting it), the host touches none of its own files through it.
//!
//! Needs root (a build sandbox on an image root in its own user namespace); skips with a
//! reason elsewhere, fails under `CI=true`.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{can_run, runtime, test_plan};
use omabox_backend_linux::RootfsSource;
use omabox_backend_linux::env_layer::{EnvLayers, LayerSpec};

/// A rootfs of the host's dash as `/bin/sh` and the few coreutils a build step needs here,
/// with the libraries they link.
fn tools_rootfs(dir: &Path) {
    let copy = |from: &Path, to: PathBuf| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap();
    };
    let tools = ["sh", "ln", "rm", "mkdir", "mv", "sleep", "cat"];
    for tool in tools {
        let host = std::fs::canonicalize(Path::new("/bin").join(tool)).unwrap();
        copy(&host, dir.join("bin").join(tool));
        let ldd = std::process::Command::new("ldd")
            .arg(&host)
            .output()
            .unwrap();
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            let lib = line
                .split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from);
            if let Some(lib) = lib {
                copy(&lib, dir.join(lib.strip_prefix("/").unwrap()));
            }
        }
    }
    // The mount targets, as an image has them (else the setup makes them in the upper dir).
    for target in [
        "etc",
        "proc",
        "dev",
        "tmp",
        "workspace",
        "mnt/session/outputs",
    ] {
        std::fs::create_dir_all(dir.join(target)).unwrap();
    }
}

/// Host files a build step aims at: `resolv.conf`, `hostname` and `hosts` (the names the
/// host removes from a layer's `/etc`) in a directory of their own.
struct Victim {
    dir: tempfile::TempDir,
}

impl Victim {
    const NAMES: [&'static str; 3] = ["resolv.conf", "hostname", "hosts"];

    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for name in Self::NAMES {
            let path = dir.path().join(name);
            std::fs::write(&path, "the host's own\n").unwrap();
            std::os::unix::fs::lchown(&path, Some(4242), Some(4242)).unwrap();
        }
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Asserts every file is as made: there, same content, same owner.
    fn assert_untouched(&self, case: &str) {
        for name in Self::NAMES {
            let path = self.path().join(name);
            let meta = std::fs::symlink_metadata(&path)
                .unwrap_or_else(|e| panic!("{case}: the host's {name} is gone: {e}"));
            assert_eq!(
                (meta.uid(), meta.gid()),
                (4242, 4242),
                "{case}: {name}'s owner"
            );
            assert_eq!(
                std::fs::read_to_string(&path).unwrap(),
                "the host's own\n",
                "{case}: {name}'s content"
            );
        }
    }
}

/// Builds the layer of `dockerfile` over `rootfs` in a cache under `cache`.
async fn build(
    rootfs: &Path,
    cache: &Path,
    dockerfile: &str,
) -> Result<omabox_backend_linux::env_layer::EnvLayer, String> {
    let spec = LayerSpec::new(Vec::new(), Some(dockerfile), BTreeMap::new())
        .unwrap()
        .unwrap();
    let mut plan = test_plan();
    plan.rootfs = RootfsSource::Directory {
        path: rootfs.to_path_buf(),
    };
    EnvLayers::in_image_cache(cache)
        .ensure(
            &runtime(),
            &plan,
            &spec,
            Arc::new(omabox_egress::SystemResolver),
        )
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_layer_builds_remove_and_chown_nothing_of_the_host_through_links() {
    if !can_run() {
        return;
    }
    let image = tempfile::tempdir().unwrap();
    tools_rootfs(image.path());
    let cache = tempfile::tempdir().unwrap();
    let victim = Victim::new();
    let target = victim.path().display().to_string();
    // From the upper dir (`<cache>/env-layers/.partial-<key>/upper`) a relative link climbs
    // to `/` with enough `..` (extra ones stay at `/`).
    let relative = format!("{}{}", "../".repeat(24), target.trim_start_matches('/'));
    let cases = [
        (
            "/etc an absolute link",
            format!("RUN rm -rf /etc && ln -s {target} /etc"),
            "etc",
        ),
        (
            "/etc a relative link",
            format!("RUN rm -rf /etc && ln -s {relative} /etc"),
            "etc",
        ),
        (
            "/etc/<name> links (the last component)",
            format!(
                "RUN for n in resolv.conf hostname hosts; do rm -f /etc/$n; ln -s {target}/$n /etc/$n; done; ln -s {target}/hosts /etc/kept"
            ),
            "etc/kept",
        ),
        (
            "a link in the middle of paths the walk takes: /usr",
            format!("RUN mkdir -p /usr/lib && rm -rf /usr && ln -s {target} /usr"),
            "usr",
        ),
    ];
    for (case, dockerfile, link) in cases {
        let layer = build(image.path(), cache.path(), &dockerfile)
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        victim.assert_untouched(case);
        // The links are the layer's own, kept as links (resolved inside a sandbox only).
        let kept = std::fs::symlink_metadata(layer.dir.join(link)).unwrap();
        assert!(kept.file_type().is_symlink(), "{case}: {link}");
        assert_eq!((kept.uid(), kept.gid()), (0, 0), "{case}: shifted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_layer_build_steps_left_running_are_gone_before_the_host_walks_the_layer() {
    if !can_run() {
        return;
    }
    let image = tempfile::tempdir().unwrap();
    tools_rootfs(image.path());
    let cache = tempfile::tempdir().unwrap();
    let victim = Victim::new();
    let target = victim.path().display().to_string();
    // A background loop keeps swapping /etc between a directory and a link to the host
    // dir while the build finishes, then while the host tears it down and walks the layer.
    let dockerfile = format!(
        "RUN (while :; do rm -rf /etc; ln -s {target} /etc; rm -f /etc; mkdir /etc; ln -s {target}/hosts /etc/hosts; done) </dev/null >/dev/null 2>&1 &\nRUN sleep 0.5"
    );
    for round in 0..3 {
        let cache = cache.path().join(round.to_string());
        match build(image.path(), &cache, &dockerfile).await {
            Ok(layer) => assert!(layer.built),
            Err(error) => assert!(error.contains("environment layer"), "{error}"),
        }
        victim.assert_untouched(&format!("round {round}"));
    }
}

/// A layer used later is only ever an overlay lower: its links are resolved by the kernel
/// inside the sandbox, and the setup, which runs as host root before `pivot_root`, refuses
/// a mount target that is a link rather than following it onto the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_layer_links_at_mount_targets_are_refused_when_the_layer_is_used() {
    if !can_run() {
        return;
    }
    let image = tempfile::tempdir().unwrap();
    tools_rootfs(image.path());
    let cache = tempfile::tempdir().unwrap();
    let victim = Victim::new();
    let target = victim.path().display().to_string();
    // The workspace's target as a link; the outputs' target below a link (`/mnt`) and as
    // one (`/mnt/session/outputs`).
    for (dir, step) in [
        (
            "/workspace",
            "RUN rm -rf /workspace && ln -s {target} /workspace",
        ),
        ("/mnt", "RUN rm -rf /mnt && ln -s {target} /mnt"),
        (
            "/mnt/session/outputs",
            "RUN rm -rf /mnt/session/outputs && ln -s {target} /mnt/session/outputs",
        ),
    ] {
        let layer = build(
            image.path(),
            cache.path(),
            &step.replace("{target}", &target),
        )
        .await
        .unwrap_or_else(|e| panic!("{dir}: {e}"));
        let (workspace, outputs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut plan = test_plan();
        plan.rootfs = RootfsSource::Directory {
            path: image.path().to_path_buf(),
        };
        plan.root_layers = vec![layer.dir.clone()];
        plan.workspace = Some(workspace.path().to_path_buf());
        plan.outputs = Some(outputs.path().to_path_buf());
        let iso = common::Isolated::new();
        let error = iso.runtime().start(&plan).unwrap_err();
        assert!(
            matches!(&error, omabox_backend_linux::StartError::Setup(m) if m.contains("symlink")),
            "{dir}: {error}"
        );
        iso.assert_empty();
        victim.assert_untouched(dir);
        assert_eq!(
            std::fs::read_dir(victim.path()).unwrap().count(),
            Victim::NAMES.len(),
            "{dir}: nothing was made in the host dir"
        );
    }
}

/// A build step nesting directories deeper than a layer may hold: refused, and its build
/// dir removed (by a remover that neither recurses nor holds a directory fd per level).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_layer_builds_nested_too_deep_are_refused_and_leave_nothing() {
    if !can_run() {
        return;
    }
    let image = tempfile::tempdir().unwrap();
    tools_rootfs(image.path());
    let cache = tempfile::tempdir().unwrap();
    let error = build(
        image.path(),
        cache.path(),
        "RUN i=0; while [ $i -lt 300 ]; do mkdir d && cd d; i=$((i+1)); done",
    )
    .await
    .unwrap_err();
    assert!(
        error.contains("nested deeper than 256 directories"),
        "{error}"
    );
    let left: Vec<_> = std::fs::read_dir(cache.path().join("env-layers"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
