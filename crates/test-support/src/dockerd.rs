//! A Docker Engine of the test's own: Debian's `dockerd` (package `docker.io`, installed with
//! apt when missing and the test runs as root) with its own data root, exec root, pid file,
//! containerd namespace and unix socket in a temporary directory, no iptables and no bridge
//! (containers get network mode `none` or nothing), so it touches nothing of the machine's
//! and any number of tests can each have one. A registry on loopback needs no flag: the
//! engine treats `127.0.0.0/8` as an insecure (plain HTTP) registry by default.
//!
//! Gate a test with `require_capability(TestDockerd::missing())`. The engine is stopped
//! (SIGTERM, which stops its containers and containerd; SIGKILL after 20 s) and its
//! directory removed when the [`TestDockerd`] is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's `docker.io` puts the daemon.
pub const DOCKERD: &str = "/usr/sbin/dockerd";

/// A running `dockerd` on `unix://<tmp>/docker.sock`.
#[derive(Debug)]
pub struct TestDockerd {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl TestDockerd {
    /// Why an engine cannot run here (`None`: it can). Installs `docker.io` with apt when
    /// `dockerd` is missing and this process is root.
    pub fn missing() -> Option<String> {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if !root {
            return Some("dockerd needs root".into());
        }
        if !Path::new(DOCKERD).exists() {
            let installed = Command::new("apt-get")
                // Tests run in parallel: wait for another one's install, not fail on it.
                .args(["-o", "DPkg::Lock::Timeout=600", "install", "-y"])
                .args(["--no-install-recommends", "docker.io"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !installed || !Path::new(DOCKERD).exists() {
                return Some(format!(
                    "{DOCKERD} is missing and apt-get install docker.io failed"
                ));
            }
        }
        None
    }

    /// Starts an engine and waits (up to 60 s) until it answers on its socket.
    pub fn start() -> Self {
        // Short: containerd's sockets live under the exec root (108-byte path limit).
        let dir = tempfile::Builder::new()
            .prefix("omabox-dockerd-")
            .tempdir_in("/tmp")
            .expect("dockerd tempdir");
        let path = dir.path();
        let namespace = format!("omabox-test-{}", std::process::id());
        let log = std::fs::File::create(path.join("dockerd.log")).expect("dockerd log");
        let child = Command::new(DOCKERD)
            .arg("--data-root")
            .arg(path.join("data"))
            .arg("--exec-root")
            .arg(path.join("exec"))
            .arg("--pidfile")
            .arg(path.join("dockerd.pid"))
            .arg("--host")
            .arg(format!("unix://{}", path.join("docker.sock").display()))
            .args([
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--bridge=none",
                "--userland-proxy=false",
                "--log-level=warn",
            ])
            .arg("--containerd-namespace")
            .arg(&namespace)
            .arg("--containerd-plugins-namespace")
            .arg(format!("{namespace}-plugins"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start dockerd");
        let engine = Self {
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !engine.answers() {
            assert!(
                Instant::now() < deadline,
                "dockerd did not answer on {}: {}",
                engine.host(),
                engine.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        engine
    }

    /// `unix://<tmp>/docker.sock`, the engine's `DOCKER_HOST`.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// The engine's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    /// The engine's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }

    /// `GET /_ping` answered `OK`.
    fn answers(&self) -> bool {
        use std::io::{Read as _, Write as _};
        let Ok(mut stream) = std::os::unix::net::UnixStream::connect(self.socket()) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        if stream
            .write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        answer.starts_with(b"HTTP/1.1 200")
    }
}

impl Drop for TestDockerd {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
