//! A real PostgreSQL server for tests, started from the installed binaries: `initdb` into a
//! private temporary directory, `postgres` on a free loopback port with its unix socket in
//! that directory, password (SCRAM) authentication over TCP for a random password.
//!
//! PostgreSQL refuses to run as root; when the tests run as root the rig runs `initdb` and
//! `postgres` as the unprivileged `nobody` (its directory chowned to it), else as the current
//! user. The server is stopped (`pg_ctl stop -m immediate`, then killed if still alive) and
//! its directory removed when the [`TestPostgres`] is dropped.
//!
//! Gate a test with `require_capability(TestPostgres::missing())`, or use
//! [`TestPostgres::start_or_skip`]. Never used outside tests: the password is random, the
//! server keeps no data past the test (`fsync=off`).

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's `postgresql-15` package installs its server binaries.
pub const POSTGRES_BIN_DIR: &str = "/usr/lib/postgresql/15/bin";

/// The superuser the rig creates.
pub const SUPERUSER: &str = "omabox";

/// How long the server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running PostgreSQL server on `127.0.0.1:<port>`.
#[derive(Debug)]
pub struct TestPostgres {
    child: Option<Child>,
    port: u16,
    tls: bool,
    password: String,
    bin: PathBuf,
    data: PathBuf,
    run_as: Option<(u32, u32)>,
    // Dropped last: the server must be stopped before its directory goes.
    dir: tempfile::TempDir,
}

impl TestPostgres {
    /// Why a PostgreSQL server cannot run here (`None`: it can).
    pub fn missing() -> Option<String> {
        let bin = Path::new(POSTGRES_BIN_DIR);
        for binary in ["initdb", "postgres", "pg_ctl", "pg_isready", "createdb"] {
            if !bin.join(binary).exists() {
                return Some(format!(
                    "{}/{binary} is missing (apt-get install postgresql-15)",
                    bin.display()
                ));
            }
        }
        if running_as_root() && nobody_ids().is_none() {
            return Some(
                "running as root and /etc/passwd has no user `nobody` to run PostgreSQL as".into(),
            );
        }
        None
    }

    /// Starts a server, or returns `None` after the capability gate said why it cannot (a
    /// failure under `CI=true`, a printed skip elsewhere).
    pub fn start_or_skip() -> Option<Self> {
        if !crate::require_capability(Self::missing()) {
            return None;
        }
        Some(Self::start().unwrap_or_else(|error| panic!("cannot start PostgreSQL: {error}")))
    }

    /// `initdb` and start a server. The error says which step failed, with its output.
    pub fn start() -> Result<Self, String> {
        Self::start_with(None)
    }

    /// [`TestPostgres::start_or_skip`] with TLS on (`ssl=on`): the server presents
    /// `cert_pem` (a chain, PEM) with the private key `key_pem`, and refuses a TCP login
    /// without TLS (`hostssl`; the rig's own tools use the unix socket).
    pub fn start_with_tls_or_skip(cert_pem: &str, key_pem: &str) -> Option<Self> {
        if !crate::require_capability(Self::missing()) {
            return None;
        }
        let tls = (cert_pem.to_owned(), key_pem.to_owned());
        Some(
            Self::start_with(Some(tls))
                .unwrap_or_else(|error| panic!("cannot start PostgreSQL: {error}")),
        )
    }

    fn start_with(tls: Option<(String, String)>) -> Result<Self, String> {
        let bin = PathBuf::from(POSTGRES_BIN_DIR);
        let dir = tempfile::Builder::new()
            .prefix("omabox-pg-")
            .tempdir()
            .map_err(|error| format!("temp dir: {error}"))?;
        let run_as = if running_as_root() {
            Some(nobody_ids().ok_or("no user `nobody`")?)
        } else {
            None
        };
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|error| format!("chown {}: {error}", dir.path().display()))?;
        }
        let password = random_password()?;
        let password_file = dir.path().join("password");
        std::fs::write(&password_file, format!("{password}\n"))
            .map_err(|error| format!("password file: {error}"))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&password_file, Some(uid), Some(gid))
                .map_err(|error| format!("chown password file: {error}"))?;
        }
        let data = dir.path().join("data");
        let mut initdb = command(&bin.join("initdb"), run_as);
        initdb
            .arg("--pgdata")
            .arg(&data)
            .args(["--username", SUPERUSER, "--auth-local=trust"])
            .args(["--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C"])
            .arg("--no-sync")
            .arg(format!("--pwfile={}", password_file.display()));
        run(&mut initdb, "initdb")?;
        let _ = std::fs::remove_file(&password_file);
        if let Some((cert, key)) = &tls {
            // TCP logins must come over TLS (`hostssl`), so a test sees a plain one refused.
            let hba = data.join("pg_hba.conf");
            let rules =
                std::fs::read_to_string(&hba).map_err(|error| format!("pg_hba: {error}"))?;
            let rules: String = rules
                .lines()
                .map(|line| match line.strip_prefix("host ") {
                    Some(rest) => format!("hostssl {rest}\n"),
                    None => format!("{line}\n"),
                })
                .collect();
            std::fs::write(&hba, rules).map_err(|error| format!("pg_hba: {error}"))?;
            // The server reads them as its own user and refuses a key others can read.
            for (name, pem) in [("server.crt", cert), ("server.key", key)] {
                let path = data.join(name);
                std::fs::write(&path, pem).map_err(|error| format!("{name}: {error}"))?;
                std::fs::set_permissions(
                    &path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
                .map_err(|error| format!("chmod {name}: {error}"))?;
                if let Some((uid, gid)) = run_as {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                        .map_err(|error| format!("chown {name}: {error}"))?;
                }
            }
        }

        let mut server = Self {
            child: None,
            port: 0,
            tls: tls.is_some(),
            password,
            bin,
            data,
            run_as,
            dir,
        };
        // A free port can be taken between probing and binding: try a few.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = self.dir.path().join("postgres.log");
        let log_file = std::fs::File::create(&log).map_err(|error| format!("log: {error}"))?;
        if let Some((uid, gid)) = self.run_as {
            let _ = std::os::unix::fs::chown(&log, Some(uid), Some(gid));
        }
        let stderr = log_file
            .try_clone()
            .map_err(|error| format!("log: {error}"))?;
        let mut postgres = command(&self.bin.join("postgres"), self.run_as);
        postgres
            .arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=100", "-c", "shared_buffers=16MB"])
            .args(["-c", if self.tls { "ssl=on" } else { "ssl=off" }])
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(stderr);
        let mut child = postgres
            .spawn()
            .map_err(|error| format!("spawn postgres: {error}"))?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("postgres exited with {status}: {log}"));
            }
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                self.child = Some(child);
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("postgres not ready after {START_TIMEOUT:?}: {log}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The superuser's password (random per server).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Creates database `name` (owned by the superuser) and returns its URL, password
    /// included: `postgres://omabox:<password>@127.0.0.1:<port>/<name>`.
    pub fn create_database(&self, name: &str) -> Result<String, String> {
        let mut createdb = command(&self.bin.join("createdb"), self.run_as);
        createdb
            .args(["-h", &self.dir.path().display().to_string()])
            .args(["-p", &self.port.to_string(), "-U", SUPERUSER, name]);
        run(&mut createdb, "createdb")?;
        Ok(self.url(name))
    }

    /// [`TestPostgres::create_database`] with the ICU collation `icu_locale` (e.g. `en-US`,
    /// where `a` sorts before `B`, unlike the server's default byte order).
    pub fn create_database_icu(&self, name: &str, icu_locale: &str) -> Result<String, String> {
        let mut createdb = command(&self.bin.join("createdb"), self.run_as);
        createdb
            .args(["-h", &self.dir.path().display().to_string()])
            .args(["-p", &self.port.to_string(), "-U", SUPERUSER])
            .args(["--template=template0", "--locale-provider=icu"])
            .arg(format!("--icu-locale={icu_locale}"))
            .arg(name);
        run(&mut createdb, "createdb")?;
        Ok(self.url(name))
    }

    /// The URL of database `name`, password included.
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgres://{SUPERUSER}:{}@127.0.0.1:{}/{name}",
            self.password, self.port
        )
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let mut stop = command(&self.bin.join("pg_ctl"), self.run_as);
        stop.arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "30"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let stopped = stop.status().is_ok_and(|status| status.success());
        if !stopped {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// `binary` run as `run_as` (uid, gid) when given. Std drops the supplementary groups when it
/// changes the uid of a root process.
fn command(binary: &Path, run_as: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(binary);
    if let Some((uid, gid)) = run_as {
        command.uid(uid).gid(gid);
    }
    command.env_remove("PGPASSWORD").env("LC_ALL", "C");
    command
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("{what}: {error}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// The effective user of this process is root (`/proc/self` belongs to it).
fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// `nobody`'s uid and gid from `/etc/passwd`.
fn nobody_ids() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&"nobody") && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|error| format!("free port: {error}"))
}

/// 32 hex digits from the kernel's CSPRNG.
fn random_password() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut bytes))
        .map_err(|error| format!("/dev/urandom: {error}"))?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_starts_accepts_a_database_and_stops() {
        let Some(server) = TestPostgres::start_or_skip() else {
            return;
        };
        let url = server.create_database("rig_check").unwrap();
        assert!(url.ends_with("/rig_check"));
        let data = server.data.clone();
        let dir = server.dir.path().to_owned();
        drop(server);
        assert!(
            !data.exists() && !dir.exists(),
            "{} left behind",
            dir.display()
        );
    }
}
