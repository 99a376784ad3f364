//! Docker credential helpers: the programs `config.json` names in `credHelpers` (per
//! registry) and `credsStore` (every other registry), run as docker runs them:
//! `docker-credential-<name> get` from `PATH`, the server URL on stdin, a JSON
//! `{"Username", "Secret"}` on stdout.
//!
//! Must never: put what the helper printed into an error (it may be a secret), wait on a
//! hung helper forever ([`HELPER_TIMEOUT`]), or read more than [`MAX_OUTPUT`] of it.

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::credentials::RegistryCredential;

/// How long a helper may take (a keychain prompt included).
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of a helper's stdout read.
pub const MAX_OUTPUT: u64 = 64 * 1024;

/// Where helpers are looked up: the search path the caller's configuration gives (its
/// `PATH` setting); none given, no helper is found. The process environment is never read
/// here: the node decides which environment counts.
#[derive(Debug, Clone, Default)]
pub struct HelperPath(pub Option<OsString>);

impl HelperPath {
    /// `docker-credential-<name>` in the first directory that has it as a file.
    fn find(&self, name: &str) -> Option<PathBuf> {
        let path = self.0.as_ref()?;
        let program = format!("docker-credential-{name}");
        std::env::split_paths(path)
            .map(|dir| dir.join(&program))
            .find(|p| p.is_file())
    }
}

/// Asks helper `name` for `server`'s credential. `Ok(None)`: the helper has none (it
/// says "credentials not found", as docker's helpers do). An error names the helper and
/// its exit, never its output.
pub fn get(
    name: &str,
    server: &str,
    path: &HelperPath,
) -> Result<Option<RegistryCredential>, String> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !valid {
        return Err(format!(
            "docker config: credential helper name {name:?} is not a plain name"
        ));
    }
    let program = format!("docker-credential-{name}");
    let Some(binary) = path.find(name) else {
        return Err(format!("credential helper {program} is not on PATH"));
    };
    let mut child = Command::new(&binary)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run credential helper {program}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A helper that exits without reading gets EPIPE here; its exit tells.
        let _ = stdin.write_all(server.as_bytes());
    }
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let read = (&mut stdout).take(MAX_OUTPUT).read_to_end(&mut out);
        let _ = tx.send(read.map(|_| out));
    });
    let out = match rx.recv_timeout(HELPER_TIMEOUT) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("cannot read credential helper {program}: {e}"));
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "credential helper {program} did not answer within {}s",
                HELPER_TIMEOUT.as_secs()
            ));
        }
    };
    let status = child
        .wait()
        .map_err(|e| format!("credential helper {program}: {e}"))?;
    if !status.success() {
        if String::from_utf8_lossy(&out).contains("credentials not found") {
            return Ok(None);
        }
        return Err(format!("credential helper {program} failed ({status})"));
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        username: String,
        secret: String,
    }
    let answer: Answer = serde_json::from_slice(&out).map_err(|_| {
        format!("credential helper {program} did not print a {{\"Username\", \"Secret\"}} object")
    })?;
    Ok(Some(RegistryCredential::new(
        answer.username,
        answer.secret,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn helper(dir: &std::path::Path, name: &str, script: &str) {
        let path = dir.join(format!("docker-credential-{name}"));
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_helper_answers_declines_or_fails_without_its_output_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = HelperPath(Some(dir.path().as_os_str().to_owned()));
        // Answers with the server it was asked for in the user name.
        helper(
            dir.path(),
            "good",
            r#"[ "$1" = get ] || exit 3; read -r s; printf '{"ServerURL":"%s","Username":"u-%s","Secret":"helper-S3cret"}' "$s" "$s""#,
        );
        let c = get("good", "reg.example:5000", &path).unwrap().unwrap();
        assert_eq!(c.username, "u-reg.example:5000");
        assert_eq!(c.expose_password(), "helper-S3cret");

        helper(
            dir.path(),
            "none",
            "echo 'credentials not found in native keychain'; exit 1",
        );
        assert!(get("none", "h", &path).unwrap().is_none());

        helper(dir.path(), "bad", "echo leaked-S3cret; exit 4");
        let e = get("bad", "h", &path).unwrap_err();
        assert!(e.contains("docker-credential-bad failed"), "{e}");
        assert!(!e.contains("leaked"), "{e}");
        helper(dir.path(), "junk", "echo leaked-S3cret");
        let e = get("junk", "h", &path).unwrap_err();
        assert!(!e.contains("leaked"), "{e}");

        let e = get("missing", "h", &path).unwrap_err();
        assert!(
            e.contains("docker-credential-missing is not on PATH"),
            "{e}"
        );
        let e = get("../x", "h", &path).unwrap_err();
        assert!(e.contains("not a plain name"), "{e}");
    }
}
