//! The environment package installer (`Environment.config.packages`; contract "Environment
//! packages", reference §6): one shell script run through [`SandboxPort::exec`], so every
//! backend that runs commands in `/workspace` gets it.
//!
//! ```text
//! probe (15 s): /tmp/.oma-setup-warm == full hash        → warm: nothing to do
//!               /workspace/.oma-setup-restored == lang hash → restored: apt only (180 s)
//!               otherwise (or the probe failed)          → fresh: everything (600 s)
//! success → both markers written; failure → no marker, the error names the step and ends
//!           with the last 300 characters of the package manager's output
//! ```
//!
//! Hashes are 32-bit FNV-1a (8 hex digits) of the JSON `{apt,pip,npm,cargo,go}` (full) and
//! `{pip,npm,cargo,go}` (lang), absent lists as `[]`. Language packages live under
//! `/workspace`, so a workspace restore brings them back: pip into the venv
//! `/workspace/.venv` (`python3 -m venv` + its pip; the reference uses `uv`, which omabox's
//! sandboxes do not ship), npm globals under `/workspace/.npm-global`, cargo under
//! `/workspace/.cargo`, go under `/workspace/.go`. apt installs into the sandbox's root. gem
//! is accepted and skipped. `/workspace/.oma-env` exports PATH (and the cargo/go homes) for
//! shells; [`TOOL_PATH`] is what a harness's `PATH` gets prepended. Package names are
//! single-quoted for the shell.

use crate::SandboxPort;
use omabox_contract::PortError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The warm marker (a sandbox-local file: a new sandbox has none).
pub const WARM_MARKER: &str = "/tmp/.oma-setup-warm";
/// The restored marker (in the workspace: a restore brings it back).
pub const RESTORED_MARKER: &str = "/workspace/.oma-setup-restored";
/// In a root whose environment layer installed the apt packages already (omabox's
/// extension, `omabox_backend_linux::env_layer`): their hash ([`EnvironmentPackages::apt_hash`]).
/// When it matches, neither path runs apt.
pub const APT_LAYER_MARKER: &str = "/etc/omabox/apt-layer";
/// The tool directories a harness's PATH is prefixed with.
pub const TOOL_PATH: &str =
    "/workspace/.venv/bin:/workspace/.npm-global/bin:/workspace/.cargo/bin:/workspace/.go/bin";

const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
const APT_TIMEOUT: Duration = Duration::from_secs(180);
const FULL_TIMEOUT: Duration = Duration::from_secs(600);
/// How much of a failed install's output the error keeps.
const ERROR_TAIL_CHARS: usize = 300;

/// `config.packages`: package names per manager. Read in the public Environment API's
/// shape: an optional `"type": "packages"`, each list a list of names, absent or `null`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "PackagesWire")]
pub struct EnvironmentPackages {
    /// Debian packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apt: Option<Vec<String>>,
    /// Python packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pip: Option<Vec<String>>,
    /// npm packages (installed globally under `/workspace/.npm-global`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npm: Option<Vec<String>>,
    /// Crates (`cargo install`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cargo: Option<Vec<String>>,
    /// Ruby gems: accepted and skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gem: Option<Vec<String>>,
    /// Go packages (`go install`, one per package).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub go: Option<Vec<String>>,
}

/// [`EnvironmentPackages`] as the public API spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PackagesWire {
    /// `"packages"` (the only value the API has), or absent / `null`.
    #[serde(rename = "type", default)]
    _kind: Option<PackagesKind>,
    #[serde(default)]
    apt: Option<Vec<String>>,
    #[serde(default)]
    pip: Option<Vec<String>>,
    #[serde(default)]
    npm: Option<Vec<String>>,
    #[serde(default)]
    cargo: Option<Vec<String>>,
    #[serde(default)]
    gem: Option<Vec<String>>,
    #[serde(default)]
    go: Option<Vec<String>>,
}

/// The `type` of a packages object.
#[derive(Deserialize)]
enum PackagesKind {
    #[serde(rename = "packages")]
    Packages,
}

impl From<PackagesWire> for EnvironmentPackages {
    fn from(wire: PackagesWire) -> Self {
        let PackagesWire {
            _kind,
            apt,
            pip,
            npm,
            cargo,
            gem,
            go,
        } = wire;
        Self {
            apt,
            pip,
            npm,
            cargo,
            gem,
            go,
        }
    }
}

/// Which setup a sandbox needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SetupPath {
    /// The warm marker matched: nothing ran.
    Warm,
    /// Only the restored marker matched: apt ran again.
    Restored,
    /// Everything ran.
    Fresh,
}

/// What [`ensure_environment_packages`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SetupOutcome {
    /// The path taken.
    pub path: SetupPath,
    /// How long it took.
    pub duration_ms: u64,
    /// The apt packages came with the root (its environment layer): apt did not run.
    pub apt_from_layer: bool,
}

/// Why the install failed (the session fails with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PackageSetupError {
    /// The sandbox could not run the script.
    #[error("environment packages: {0}")]
    Sandbox(String),
    /// The script failed: `apt_install_failed exit=<n>: …` or `full_setup_failed exit=<n>: …`.
    #[error("environment packages: {0}")]
    Failed(String),
    /// A name would not be a package name (empty, a control character, or starting with
    /// `-`: an option to the package manager).
    #[error("environment packages: invalid {manager} package name {name:?}")]
    InvalidName {
        /// The manager's list it is in.
        manager: &'static str,
        /// The name.
        name: String,
    },
}

impl From<PackageSetupError> for PortError {
    fn from(error: PackageSetupError) -> Self {
        PortError::new(error.to_string())
    }
}

fn list(packages: &Option<Vec<String>>) -> &[String] {
    packages.as_deref().unwrap_or_default()
}

fn json_list(packages: &Option<Vec<String>>) -> String {
    serde_json::to_string(list(packages)).unwrap_or_else(|_| "[]".to_owned())
}

impl EnvironmentPackages {
    /// Whether no manager (gem aside) has a package.
    pub fn is_empty(&self) -> bool {
        [&self.apt, &self.pip, &self.npm, &self.cargo, &self.go]
            .iter()
            .all(|l| list(l).is_empty())
    }

    /// Checks every name (see [`PackageSetupError::InvalidName`]).
    pub fn validate(&self) -> Result<(), PackageSetupError> {
        for (manager, names) in [
            ("apt", &self.apt),
            ("pip", &self.pip),
            ("npm", &self.npm),
            ("cargo", &self.cargo),
            ("go", &self.go),
        ] {
            for name in list(names) {
                if name.trim().is_empty()
                    || name.starts_with('-')
                    || name.chars().any(char::is_control)
                {
                    return Err(PackageSetupError::InvalidName {
                        manager,
                        name: name.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The full hash (every manager but gem).
    pub fn full_hash(&self) -> String {
        fnv1a32(&format!(
            "{{\"apt\":{},{}",
            json_list(&self.apt),
            &self.lang_json()[1..]
        ))
    }

    /// The language hash (apt and gem aside).
    pub fn lang_hash(&self) -> String {
        fnv1a32(&self.lang_json())
    }

    /// `{"pip":[…],"npm":[…],"cargo":[…],"go":[…]}` in the reference's key order (its
    /// `JSON.stringify` keeps insertion order), so markers written by OpenMA match.
    fn lang_json(&self) -> String {
        format!(
            "{{\"pip\":{},\"npm\":{},\"cargo\":{},\"go\":{}}}",
            json_list(&self.pip),
            json_list(&self.npm),
            json_list(&self.cargo),
            json_list(&self.go)
        )
    }

    /// The apt section (`None` without apt packages).
    fn apt_section(&self) -> Option<String> {
        let apt = list(&self.apt);
        (!apt.is_empty()).then(|| {
            format!(
                "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq --no-install-recommends {}",
                quoted(apt)
            )
        })
    }

    /// The hash of the apt list alone (`None` without apt packages): what an environment
    /// layer's [`APT_LAYER_MARKER`] holds.
    pub fn apt_hash(&self) -> Option<String> {
        (!list(&self.apt).is_empty()).then(|| fnv1a32(&json_list(&self.apt)))
    }

    /// An environment layer's apt part (the builder runs it under `set -e`): the apt
    /// section, then the marker.
    pub fn apt_layer_script(&self) -> Option<String> {
        let (apt, hash) = (self.apt_section()?, self.apt_hash()?);
        Some(format!(
            "{apt}\nmkdir -p /etc/omabox && printf '%s' '{hash}' > {APT_LAYER_MARKER}"
        ))
    }

    /// The restored path's script (apt only).
    pub fn apt_script(&self) -> Option<String> {
        self.apt_section().map(|apt| format!("set +e; {apt}"))
    }

    /// The fresh path's script: apt, pip, npm, cargo, go, then `/workspace/.oma-env`; each
    /// section stops the script at its first failure.
    pub fn full_script(&self) -> String {
        // Caches go to /tmp: the sandbox's HOME may be read-only, and a cache is no state.
        let mut sections = vec![
            "set -e\nexport PIP_CACHE_DIR=/tmp/.oma-cache/pip npm_config_cache=/tmp/.oma-cache/npm"
                .to_owned(),
        ];
        sections.extend(self.apt_section());
        let pip = list(&self.pip);
        if !pip.is_empty() {
            sections.push(format!(
                "mkdir -p /workspace\n[ -x /workspace/.venv/bin/python ] || python3 -m venv /workspace/.venv\n/workspace/.venv/bin/python -m pip install -q --disable-pip-version-check {}",
                quoted(pip)
            ));
        }
        let npm = list(&self.npm);
        if !npm.is_empty() {
            sections.push(format!(
                "mkdir -p /workspace/.npm-global\nnpm install -g --loglevel=error --no-audit --no-fund --no-update-notifier --prefix /workspace/.npm-global {}",
                quoted(npm)
            ));
        }
        let cargo = list(&self.cargo);
        if !cargo.is_empty() {
            sections.push(format!(
                "export CARGO_HOME=/workspace/.cargo\nmkdir -p \"$CARGO_HOME\"\ncargo install --quiet {}",
                quoted(cargo)
            ));
        }
        let go = list(&self.go);
        if !go.is_empty() {
            let mut go_section = "export GOPATH=/workspace/.go GOMODCACHE=/workspace/.go/pkg/mod GOBIN=/workspace/.go/bin\nmkdir -p \"$GOBIN\"".to_owned();
            for package in go {
                go_section.push_str(&format!(
                    "\ngo install {}",
                    quoted(std::slice::from_ref(package))
                ));
            }
            sections.push(go_section);
        }
        sections.push(format!(
            "cat > /workspace/.oma-env <<'OMA_ENV'\nexport PATH=\"{TOOL_PATH}:$PATH\"\nexport CARGO_HOME=/workspace/.cargo\nexport GOPATH=/workspace/.go\nexport GOMODCACHE=/workspace/.go/pkg/mod\nOMA_ENV"
        ));
        sections.join("\n")
    }
}

/// Installs `packages` in `sandbox` as the module doc says. Empty packages: `Warm`-free
/// no-op reported as `Warm` without running anything.
pub async fn ensure_environment_packages(
    sandbox: &dyn SandboxPort,
    packages: &EnvironmentPackages,
) -> Result<SetupOutcome, PackageSetupError> {
    let started = std::time::Instant::now();
    let mut apt_from_layer = false;
    let done = |path, apt_from_layer| SetupOutcome {
        path,
        duration_ms: started.elapsed().as_millis() as u64,
        apt_from_layer,
    };
    packages.validate()?;
    if packages.is_empty() {
        return Ok(done(SetupPath::Warm, false));
    }
    let (full, lang) = (packages.full_hash(), packages.lang_hash());
    let probe = format!(
        "printf 'WARM=%s\\nREST=%s\\nLAYER=%s\\n' \"$(cat {WARM_MARKER} 2>/dev/null || echo MISSING)\" \"$(cat {RESTORED_MARKER} 2>/dev/null || echo MISSING)\" \"$(cat {APT_LAYER_MARKER} 2>/dev/null || echo MISSING)\""
    );
    let probed = sandbox
        .exec(&probe, Some(PROBE_TIMEOUT.as_millis() as u64))
        .await
        .unwrap_or_default();
    let value = |key: &str| {
        probed
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .map(str::trim)
            .map(str::to_owned)
    };
    let path = if value("WARM=").as_deref() == Some(full.as_str()) {
        return Ok(done(SetupPath::Warm, false));
    } else if value("REST=").as_deref() == Some(lang.as_str()) {
        SetupPath::Restored
    } else {
        SetupPath::Fresh
    };
    // The root's environment layer has the apt packages: the scripts leave apt out (the
    // markers keep the full set's hashes).
    let mut scripted = packages.clone();
    if packages.apt_hash().is_some() && value("LAYER=") == packages.apt_hash() {
        scripted.apt = None;
        apt_from_layer = true;
    }
    let (script, timeout, label) = match path {
        SetupPath::Restored => match scripted.apt_script() {
            Some(script) => (script, APT_TIMEOUT, "apt_install_failed"),
            None => (String::from("true"), APT_TIMEOUT, "apt_install_failed"),
        },
        _ => (scripted.full_script(), FULL_TIMEOUT, "full_setup_failed"),
    };
    let output = sandbox
        .exec(&script, Some(timeout.as_millis() as u64))
        .await
        .map_err(|error| PackageSetupError::Sandbox(error.message().to_owned()))?;
    if let Some(code) = exit_status(&output) {
        let body = output.rsplit_once("\n[exit ").map_or("", |(body, _)| body);
        let tail: String = {
            let chars: Vec<char> = body.chars().collect();
            chars[chars.len().saturating_sub(ERROR_TAIL_CHARS)..]
                .iter()
                .collect()
        };
        // Sandbox output: one line, no control characters (no terminal escapes).
        let tail: String = tail
            .trim()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let code: String = code.chars().filter(|c| !c.is_control()).take(32).collect();
        return Err(PackageSetupError::Failed(format!(
            "{label} exit={code}: {tail}"
        )));
    }
    let markers =
        format!("printf '%s' '{full}' > {WARM_MARKER} && printf '%s' '{lang}' > {RESTORED_MARKER}");
    let written = sandbox
        .exec(&markers, Some(PROBE_TIMEOUT.as_millis() as u64))
        .await
        .map_err(|error| PackageSetupError::Sandbox(error.message().to_owned()))?;
    if exit_status(&written).is_some() {
        return Err(PackageSetupError::Sandbox(format!(
            "cannot write the setup markers: {}",
            written.trim()
        )));
    }
    Ok(done(path, apt_from_layer))
}

/// Installs `packages` in the sandbox of `lease` (a no-op for empty packages): what every
/// harness lane does after attach and before its process starts. A failed install fails
/// the run (nothing is published).
async fn install_for_lane(
    runtime: &crate::managed::ProviderManagedRuntime,
    lease: &omabox_contract::ManagedSandboxLease,
    signal: &omabox_contract::AbortSignal,
    packages: &EnvironmentPackages,
) -> Result<(), PortError> {
    if packages.is_empty() {
        return Ok(());
    }
    signal.throw_if_aborted()?;
    let sandbox = runtime.sandbox(lease).await?;
    let outcome = ensure_environment_packages(&*sandbox, packages).await?;
    tracing::info!(path = ?outcome.path, ms = outcome.duration_ms, apt_from_layer = outcome.apt_from_layer, "environment packages");
    Ok(())
}

/// The `ama_worker` lane with the environment's packages installed first (in the lease's
/// sandbox, after attach), then the harness process's `PATH` gets [`TOOL_PATH`] in front.
/// The `openma_supervised` lane is [`PackagesSupervisorTransport`]: the host projects a
/// provider's supervisor transport into that lane itself, past any harness driver.
pub struct PackagesHarnessDriver {
    inner: std::sync::Arc<dyn omabox_contract::SandboxHarnessDriverPort>,
    runtime: std::sync::Arc<crate::managed::ProviderManagedRuntime>,
    packages: EnvironmentPackages,
}

impl std::fmt::Debug for PackagesHarnessDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackagesHarnessDriver")
            .field("packages", &self.packages)
            .finish_non_exhaustive()
    }
}

impl PackagesHarnessDriver {
    /// `inner` with `packages` installed before it runs, in `runtime`'s sandboxes.
    pub fn new(
        inner: std::sync::Arc<dyn omabox_contract::SandboxHarnessDriverPort>,
        runtime: std::sync::Arc<crate::managed::ProviderManagedRuntime>,
        packages: EnvironmentPackages,
    ) -> Self {
        Self {
            inner,
            runtime,
            packages,
        }
    }
}

/// The PATH a process gets when it declares none (the sandboxes' default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `process` with [`TOOL_PATH`] in front of its PATH.
fn with_tool_path(process: &mut omabox_contract::RuntimeProcessDeclaration) {
    let env = process.env.get_or_insert_with(Default::default);
    let path = env
        .get("PATH")
        .cloned()
        .unwrap_or_else(|| DEFAULT_PATH.to_owned());
    env.insert("PATH".to_owned(), format!("{TOOL_PATH}:{path}"));
}

#[async_trait::async_trait]
impl omabox_contract::SandboxHarnessDriverPort for PackagesHarnessDriver {
    async fn driver_capabilities(
        &self,
        scope: &omabox_contract::RuntimeResourceScope,
    ) -> Result<omabox_contract::SandboxHarnessDriverCapabilities, PortError> {
        self.inner.driver_capabilities(scope).await
    }

    async fn run(
        &self,
        mut input: omabox_contract::RunHarnessInput,
    ) -> Result<omabox_contract::ManagedWorkExecutionResult, PortError> {
        use omabox_contract::HarnessDriverDeclaration;
        install_for_lane(&self.runtime, &input.sandbox, &input.signal, &self.packages).await?;
        if !self.packages.is_empty() {
            match &mut input.driver {
                HarnessDriverDeclaration::AmaWorker { process } => with_tool_path(process),
                HarnessDriverDeclaration::OpenmaSupervised { supervisor, .. } => {
                    with_tool_path(supervisor)
                }
            }
        }
        self.inner.run(input).await
    }
}

/// The `openma_supervised` lane's transport with the environment's packages installed
/// before the supervisor is spawned, and [`TOOL_PATH`] in front of the supervisor's `PATH`.
pub struct PackagesSupervisorTransport {
    inner: std::sync::Arc<dyn omabox_contract::HarnessSupervisorTransportPort>,
    runtime: std::sync::Arc<crate::managed::ProviderManagedRuntime>,
    packages: EnvironmentPackages,
}

impl std::fmt::Debug for PackagesSupervisorTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackagesSupervisorTransport")
            .field("packages", &self.packages)
            .finish_non_exhaustive()
    }
}

impl PackagesSupervisorTransport {
    /// `inner` with `packages` installed before each supervisor, in `runtime`'s sandboxes.
    pub fn new(
        inner: std::sync::Arc<dyn omabox_contract::HarnessSupervisorTransportPort>,
        runtime: std::sync::Arc<crate::managed::ProviderManagedRuntime>,
        packages: EnvironmentPackages,
    ) -> Self {
        Self {
            inner,
            runtime,
            packages,
        }
    }
}

#[async_trait::async_trait]
impl omabox_contract::HarnessSupervisorTransportPort for PackagesSupervisorTransport {
    async fn open(
        &self,
        mut input: omabox_contract::OpenSupervisorInput,
    ) -> Result<Box<dyn omabox_contract::HarnessSupervisorChannel>, PortError> {
        install_for_lane(&self.runtime, &input.sandbox, &input.signal, &self.packages).await?;
        if !self.packages.is_empty() {
            with_tool_path(&mut input.process);
        }
        self.inner.open(input).await
    }
}

/// The exit status of an [`SandboxPort::exec`] output that did not exit 0.
fn exit_status(output: &str) -> Option<String> {
    let last = output.rsplit('\n').next()?;
    let status = last.strip_prefix("[exit ")?.strip_suffix(']')?;
    Some(status.strip_prefix("exit=").unwrap_or(status).to_owned())
}

/// Names single-quoted for the shell, space-separated.
fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|name| format!("'{}'", name.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// 32-bit FNV-1a of `text`'s UTF-8 bytes, as 8 hex digits.
fn fnv1a32(text: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in text.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{hash:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::sync::Mutex;

    fn packages(json: &str) -> EnvironmentPackages {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn hashes_are_fnv1a_of_the_lists_with_absent_ones_empty() {
        assert_eq!(fnv1a32(""), "811c9dc5");
        assert_eq!(fnv1a32("a"), "e40c292c");
        let p = packages(r#"{"pip":["six"],"gem":["rake"]}"#);
        assert_eq!(
            p.full_hash(),
            fnv1a32(r#"{"apt":[],"pip":["six"],"npm":[],"cargo":[],"go":[]}"#)
        );
        assert_eq!(
            p.lang_hash(),
            fnv1a32(r#"{"pip":["six"],"npm":[],"cargo":[],"go":[]}"#)
        );
        // apt changes the full hash only.
        let with_apt = packages(r#"{"pip":["six"],"apt":["jq"]}"#);
        assert_ne!(with_apt.full_hash(), p.full_hash());
        assert_eq!(with_apt.lang_hash(), p.lang_hash());
    }

    #[test]
    fn names_are_quoted_and_options_refused() {
        assert_eq!(quoted(&["a b".into(), "it's".into()]), "'a b' 'it'\\''s'");
        for bad in [
            r#"{"pip":["--index-url=http://x"]}"#,
            r#"{"npm":[""]}"#,
            r#"{"apt":["a\nb"]}"#,
        ] {
            assert!(packages(bad).validate().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<EnvironmentPackages>(r#"{"brew":[]}"#).is_err());
    }

    /// The public Environment API's `packages`: its response (every list, `"type":
    /// "packages"`) and its request params (lists absent or `null`).
    #[test]
    fn the_public_apis_packages_shape_is_read() {
        let response = packages(
            r#"{"type":"packages","apt":["jq"],"cargo":[],"gem":["rake"],"go":[],"npm":["typescript@5.0.0"],"pip":["pandas==2.2.0"]}"#,
        );
        assert_eq!(response.apt.as_deref(), Some(&["jq".to_owned()][..]));
        assert_eq!(
            response.pip.as_deref(),
            Some(&["pandas==2.2.0".to_owned()][..])
        );
        assert_eq!(
            response.full_hash(),
            packages(r#"{"apt":["jq"],"npm":["typescript@5.0.0"],"pip":["pandas==2.2.0"]}"#)
                .full_hash()
        );
        let params = packages(
            r#"{"type":"packages","apt":null,"cargo":null,"gem":null,"go":null,"npm":null,"pip":["six"]}"#,
        );
        assert_eq!(
            params,
            EnvironmentPackages {
                pip: Some(vec!["six".into()]),
                ..EnvironmentPackages::default()
            }
        );
        assert_eq!(packages(r#"{"type":null}"#), EnvironmentPackages::default());
        for bad in [r#"{"type":"pkgs"}"#, r#"{"type":"packages","brew":[]}"#] {
            assert!(
                serde_json::from_str::<EnvironmentPackages>(bad).is_err(),
                "{bad}"
            );
        }
        // Written back without the tag, read again the same.
        let text = serde_json::to_string(&params).unwrap();
        assert_eq!(packages(&text), params);
    }

    #[test]
    fn the_full_script_installs_under_the_workspace_in_order() {
        let script =
            packages(r#"{"apt":["jq"],"pip":["six"],"npm":["is-number"],"go":["x/y@v1"]}"#)
                .full_script();
        let at = |needle: &str| {
            script
                .find(needle)
                .unwrap_or_else(|| panic!("{needle}: {script}"))
        };
        assert!(at("apt-get install") < at("/workspace/.venv"));
        assert!(at("/workspace/.venv") < at("--prefix /workspace/.npm-global 'is-number'"));
        assert!(at("npm install") < at("go install 'x/y@v1'"));
        assert!(at("go install") < at("/workspace/.oma-env"));
        assert!(script.starts_with("set -e"));
    }

    /// Runs scripted answers and records the commands.
    struct Scripted {
        answers: Mutex<Vec<String>>,
        commands: Mutex<Vec<String>>,
    }

    impl Scripted {
        fn new(answers: &[&str]) -> Self {
            Self {
                answers: Mutex::new(answers.iter().rev().map(|a| (*a).to_owned()).collect()),
                commands: Mutex::default(),
            }
        }
        fn commands(&self) -> Vec<String> {
            self.commands.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl SandboxPort for Scripted {
        async fn exec(&self, command: &str, _: Option<u64>) -> Result<String, PortError> {
            self.commands.lock().unwrap().push(command.to_owned());
            Ok(self.answers.lock().unwrap().pop().unwrap_or_default())
        }
        async fn read_file(&self, _: &str) -> Result<String, PortError> {
            Ok(String::new())
        }
        async fn write_file(&self, path: &str, _: &str) -> Result<String, PortError> {
            Ok(path.to_owned())
        }
    }

    #[tokio::test]
    async fn markers_choose_the_path() {
        let p = packages(r#"{"apt":["jq"],"pip":["six"]}"#);
        let warm = Scripted::new(&[&format!("WARM={}\nREST=MISSING", p.full_hash())]);
        let outcome = ensure_environment_packages(&warm, &p).await.unwrap();
        assert_eq!(outcome.path, SetupPath::Warm);
        assert_eq!(warm.commands().len(), 1);

        let restored = Scripted::new(&[&format!("WARM=MISSING\nREST={}", p.lang_hash()), "", ""]);
        let outcome = ensure_environment_packages(&restored, &p).await.unwrap();
        assert_eq!(outcome.path, SetupPath::Restored);
        let commands = restored.commands();
        assert!(commands[1].contains("apt-get install") && !commands[1].contains("pip"));
        assert!(commands[2].contains(WARM_MARKER) && commands[2].contains(RESTORED_MARKER));

        let fresh = Scripted::new(&["WARM=MISSING\nREST=MISSING", "", ""]);
        let outcome = ensure_environment_packages(&fresh, &p).await.unwrap();
        assert_eq!(outcome.path, SetupPath::Fresh);
        assert!(fresh.commands()[1].contains("pip install"));
    }

    #[tokio::test]
    async fn a_failed_install_names_the_step_and_writes_no_marker() {
        let p = packages(r#"{"pip":["no-such-package-xyz"]}"#);
        let long = "x".repeat(400);
        let output = format!("{long}\x1b]0;pwned\x07\nERROR: No matching distribution\n[exit 1]");
        let sandbox = Scripted::new(&["", &output]);
        let error = ensure_environment_packages(&sandbox, &p).await.unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with("environment packages: full_setup_failed exit=1: "),
            "{text}"
        );
        assert!(text.ends_with("ERROR: No matching distribution"), "{text}");
        assert!(text.len() < 400, "the tail is bounded: {text}");
        assert!(!text.chars().any(char::is_control), "no escapes: {text:?}");
        assert_eq!(sandbox.commands().len(), 2, "no marker written");
    }

    #[tokio::test]
    async fn empty_packages_run_nothing() {
        let sandbox = Scripted::new(&[]);
        let p = packages(r#"{"gem":["rake"]}"#);
        assert_eq!(
            ensure_environment_packages(&sandbox, &p)
                .await
                .unwrap()
                .path,
            SetupPath::Warm
        );
        assert!(sandbox.commands().is_empty());
    }
}
