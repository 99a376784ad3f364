//! E2B's user `user` in a sandbox whose root is an image (docker's containers, gvisor's
//! image roots): added to the image's `/etc/passwd` and `/etc/group` when they do not list
//! it, with its home `/home/user`, all through the agent. The image's files are read and
//! written inside the sandbox, never by the host.

use omabox_agent::account;
use omabox_agent::client::{AgentClient, ClientError};

pub use omabox_agent::account::USER_HOME;

/// What failed, and on which file (never the file's content).
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {path} for the user account")]
pub struct UserAccountError {
    /// The step: `read`, `write`, `make`.
    pub op: &'static str,
    /// The file or directory.
    pub path: &'static str,
    /// The agent's error.
    #[source]
    pub source: ClientError,
}

/// Adds `user` (uid and gid 1000) where the image lacks it, and makes [`USER_HOME`] (owned
/// by it; left as it is when it exists).
pub async fn add_user_account(client: &AgentClient) -> Result<(), UserAccountError> {
    let failed = |op, path| move |source| UserAccountError { op, path, source };
    let prefix = format!("{}:", account::USER);
    let accounts = [
        ("/etc/passwd", account::passwd_line("/bin/sh")),
        ("/etc/group", account::group_line()),
    ];
    for (path, line) in accounts {
        let mut text = if client.exists(path).await.map_err(failed("read", path))? {
            client.read_file(path).await.map_err(failed("read", path))?
        } else {
            String::new()
        };
        if text.lines().any(|listed| listed.starts_with(&prefix)) {
            continue;
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&line);
        text.push('\n');
        client
            .write_file(path, &text)
            .await
            .map_err(failed("write", path))?;
    }
    client
        .make_dir(USER_HOME, Some(account::USER))
        .await
        .map_err(failed("make", USER_HOME))?;
    Ok(())
}
