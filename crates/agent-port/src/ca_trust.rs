//! [`trust_ca`]: makes a sandbox trust a credential egress binding's CA, the same way on every
//! backend whose sandbox runs the omabox agent: the sandbox's root bundle plus that CA
//! written to [`SANDBOX_CA_FILE`], and the usual CA variables pointed at it for every process
//! the agent starts afterwards.
//!
//! Never: read more than [`CA_BUNDLE_MAX`] of a bundle inside a sandbox (an image is not
//! ours), or write anywhere but [`SANDBOX_CA_FILE`].

use bytes::Bytes;
use omabox_agent::client::{AgentClient, WriteOptions};

use crate::AgentFailure;

/// Where a sandbox trusts a credential egress binding's CA: its root's bundle plus that CA.
pub const SANDBOX_CA_FILE: &str = "/tmp/.omabox/ca-certificates.crt";
/// The largest root CA bundle read inside a sandbox (Debian's is about 200 KiB).
pub const CA_BUNDLE_MAX: usize = 4 << 20;

/// The bundle a sandbox's trust starts from.
#[derive(Debug)]
pub enum RootBundle<'a> {
    /// Bytes the host read (the sandbox's root is the host's).
    Host(Vec<u8>),
    /// A file inside the sandbox (an image's), read through the agent; a missing one is an
    /// empty bundle.
    InSandbox(&'a str),
}

/// Why [`trust_ca`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CaTrustError {
    /// The sandbox's bundle is larger than [`CA_BUNDLE_MAX`].
    #[error("the sandbox's CA bundle {path} is larger than {max} bytes")]
    BundleTooLarge {
        /// The bundle.
        path: String,
        /// The cap.
        max: usize,
    },
    /// An agent request failed.
    #[error(transparent)]
    Agent(#[from] AgentFailure),
}

/// Writes `root` plus `ca_pem` to [`SANDBOX_CA_FILE`] and sets each of `vars` to that path
/// for the processes the agent starts afterwards.
pub async fn trust_ca(
    client: &AgentClient,
    root: RootBundle<'_>,
    ca_pem: &str,
    vars: &[&str],
) -> Result<(), CaTrustError> {
    let mut bundle = match root {
        RootBundle::Host(bytes) => bytes,
        RootBundle::InSandbox(path) => {
            let bytes = client.read_file_bytes(path).await.unwrap_or_default();
            if bytes.len() > CA_BUNDLE_MAX {
                return Err(CaTrustError::BundleTooLarge {
                    path: path.to_owned(),
                    max: CA_BUNDLE_MAX,
                });
            }
            bytes
        }
    };
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(ca_pem.as_bytes());
    let failed = |op, target: &str| {
        let target = target.to_owned();
        move |source| AgentFailure { op, target, source }
    };
    client
        .write_file_bytes(
            SANDBOX_CA_FILE,
            Bytes::from(bundle),
            WriteOptions::default(),
        )
        .await
        .map_err(failed("write file", SANDBOX_CA_FILE))?;
    let vars = vars
        .iter()
        .map(|key| ((*key).to_owned(), Some(SANDBOX_CA_FILE.to_owned())));
    client
        .set_env(vars)
        .await
        .map_err(failed("set env vars", "CA variables"))?;
    Ok(())
}
