//! `github_repository` resources (any git HTTP(S) host): `git clone` in the sandbox, through
//! the sandbox's own network path, then a detached checkout for a commit.

use super::{mount_path, sanitize, shell_quote};
use crate::port::SandboxPort;
use omabox_contract::{AbortSignal, PortError, RuntimeSessionResourceSnapshot};

/// The clone's timeout (reference: 120 000 ms).
pub const CLONE_TIMEOUT_MS: u64 = 120_000;
/// The detached checkout's timeout (reference: 60 000 ms).
pub const CHECKOUT_TIMEOUT_MS: u64 = 60_000;
/// How much of a failing git's output an error keeps.
const OUTPUT_TAIL: usize = 200;

/// A validated repository resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GitClone {
    pub url: String,
    pub dir: String,
    pub branch: Option<String>,
    pub commit: Option<String>,
}

impl GitClone {
    /// Checks the resource with the reference's texts (plus: no credentials in the URL —
    /// credentials are injected on the host).
    pub fn parse(resource: &RuntimeSessionResourceSnapshot) -> Result<Self, PortError> {
        let raw = resource.str_field("url").unwrap_or_default();
        let url = url::Url::parse(raw)
            .map_err(|_| PortError::new("Session github_repository resource has an invalid URL"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(PortError::new(
                "Session github_repository resource URL must use HTTP(S)",
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(PortError::new(
                "Session github_repository resource URL must not carry credentials: bind them \
                 with credential egress",
            ));
        }
        let dir = mount_path(resource)?.to_owned();
        let checkout = resource.fields.get("checkout");
        let kind = checkout
            .and_then(|c| c.get("type"))
            .and_then(serde_json::Value::as_str);
        let text = |key: &str| {
            checkout
                .and_then(|c| c.get(key))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        let (branch, commit) = match kind {
            Some("branch") => (text("name").filter(|name| !name.is_empty()), None),
            Some("commit") => {
                let sha = text("sha").filter(|sha| valid_sha(sha)).ok_or_else(|| {
                    PortError::new("Session github_repository commit checkout is invalid")
                })?;
                (None, Some(sha))
            }
            _ => (None, None),
        };
        Ok(Self {
            url: raw.to_owned(),
            dir,
            branch,
            commit,
        })
    }

    /// `git clone [--branch '<b>'] -- '<url>' '<dir>'`.
    pub fn clone_command(&self) -> String {
        let branch = self
            .branch
            .as_deref()
            .map(|b| format!("--branch {} ", shell_quote(b)))
            .unwrap_or_default();
        format!(
            "GIT_TERMINAL_PROMPT=0 git clone {branch}-- {} {}",
            shell_quote(&self.url),
            shell_quote(&self.dir)
        )
    }

    /// `git -C '<dir>' checkout --detach '<sha>'`.
    pub fn checkout_command(&self) -> Option<String> {
        self.commit.as_deref().map(|sha| {
            format!(
                "GIT_TERMINAL_PROMPT=0 git -C {} checkout --detach {}",
                shell_quote(&self.dir),
                shell_quote(sha)
            )
        })
    }
}

/// `^[0-9a-f]{7,64}$`, case-insensitive.
pub(super) fn valid_sha(sha: &str) -> bool {
    (7..=64).contains(&sha.len()) && sha.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Clones (and checks out) in the sandbox.
pub(super) async fn clone(
    sandbox: &dyn SandboxPort,
    clone: &GitClone,
    signal: &AbortSignal,
) -> Result<(), PortError> {
    let output = sandbox
        .exec(&clone.clone_command(), Some(CLONE_TIMEOUT_MS))
        .await?;
    check("git clone", &output)?;
    signal.throw_if_aborted()?;
    if let Some(command) = clone.checkout_command() {
        let output = sandbox.exec(&command, Some(CHECKOUT_TIMEOUT_MS)).await?;
        check("git checkout", &output)?;
    }
    Ok(())
}

/// A non-zero exit (the `[exit ` line of the exec convention) is a failure.
fn check(what: &str, output: &str) -> Result<(), PortError> {
    let failed = output
        .lines()
        .last()
        .is_some_and(|line| line.starts_with("[exit "));
    if !failed {
        return Ok(());
    }
    let flat: String = output.split_whitespace().collect::<Vec<_>>().join(" ");
    let tail: String = {
        let chars: Vec<char> = flat.chars().collect();
        chars[chars.len().saturating_sub(OUTPUT_TAIL)..]
            .iter()
            .collect()
    };
    Err(PortError::new(format!(
        "{what} failed: {}",
        sanitize(&tail)
    )))
}

/// The URL as errors show it: scheme, host, port and path only.
pub(super) fn display_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(url) => {
            let mut shown = format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""));
            if let Some(port) = url.port() {
                shown.push_str(&format!(":{port}"));
            }
            shown.push_str(url.path());
            shown
        }
        Err(_) => "(invalid URL)".to_owned(),
    }
}
