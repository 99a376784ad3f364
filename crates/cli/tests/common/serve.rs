//! A running `omabox serve` for the tests that drive it over HTTP.
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// A running `omabox serve` with every stderr line it wrote kept. Dropping it stops serve
/// with SIGTERM, so a test that failed half-way still has serve kill its sandboxes.
pub struct Serve {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Serve {
    /// Spawns `command` (an `omabox serve --listen 127.0.0.1:0 …`) and waits for the
    /// address it prints.
    pub fn start(mut command: Command) -> Self {
        let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let addr = loop {
            let mut line = String::new();
            assert_ne!(
                stderr.read_line(&mut line).unwrap(),
                0,
                "serve exited: {:?}",
                log.lock().unwrap()
            );
            log.lock().unwrap().push(line.clone());
            if let Some(addr) = line
                .trim()
                .strip_prefix("omabox serve: listening on http://")
            {
                break addr.to_owned();
            }
        };
        // Drained (and kept) so serve never blocks on a full pipe.
        let lines = Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in stderr.lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            addr,
            log,
            reader: Some(reader),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The child, e.g. to `kill -9` it.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// SIGTERM, wait (serve must exit 0); every stderr line.
    pub fn stop(mut self) -> Vec<String> {
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0);
        let status = self.child.wait().unwrap();
        self.reader.take().unwrap().join().unwrap();
        let log = self.log.lock().unwrap().clone();
        assert!(status.success(), "{log:#?}");
        log
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: plain kill(2) on our own child's pid, not yet waited for.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

/// The directories right under `dir` (a runtime dir's sandbox state dirs, a cgroup
/// parent's sandbox cgroups); none when it does not exist.
pub fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// serve on a free loopback port, its key generated into the data dir (no `OMABOX_API_KEY`).
pub fn start_with_key_file(dirs: &super::TestDirs) -> Serve {
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
    command.env_remove("OMABOX_API_KEY");
    Serve::start(command)
}

/// `omabox sandbox ARGS…` against `url`, the key from the data dir's file (or `key`).
pub fn sandbox_command(
    dirs: &super::TestDirs,
    url: &str,
    key: Option<&str>,
    args: &[&str],
) -> Command {
    let mut command = dirs.command(&["sandbox"]);
    command
        .args(args)
        .env("OMABOX_SERVE_URL", url)
        .env_remove("OMABOX_API_KEY");
    if let Some(key) = key {
        command.env("OMABOX_API_KEY", key);
    }
    command
}

/// One HTTP/1.0 request to `addr` with `host` as its Host and, with `key`, the operator key
/// as a bearer token → (status code, body).
pub fn http_request(
    addr: &str,
    host: &str,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let auth = key.map_or(String::new(), |key| {
        format!("authorization: Bearer {key}\r\n")
    });
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nhost: {host}\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}
