//! The table of every setting omabox reads: one row per setting, with its key (also its
//! configuration-file key), its command-line flag, its environment variable(s), its default,
//! its one-line description, whether it is a secret, who it is for, and its parser.
//!
//! This table is the only list: `omabox config` prints it with the values in effect,
//! `docs/configuration.md` is generated from it (`super::report::markdown`), the linux
//! backend's typed config is read from its `factory` rows (`NodeConfig::linux_config`; as an
//! env map, `NodeConfig::factory_env`), and a test checks that the linux factory reads no key
//! that is missing here. What this must
//! never do: read anything (it is data; the sources are `super::low`'s).

use omabox_backend_linux::factory as linux;

/// Who a setting is for: what `omabox config` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The operator's: always shown.
    Operator,
    /// A variable of the host's environment omabox derives defaults from: always shown.
    Host,
    /// Set by omabox itself for one run (honoured when set by hand): shown only when set.
    Internal,
    /// A test hook: shown only when set.
    Test,
}

/// A setting's default.
#[derive(Debug, Clone, Copy)]
pub enum SettingDefault {
    /// Unset unless given.
    None,
    /// This value.
    Value(&'static str),
    /// Computed from other settings (`super::NodeConfig::default_of`); `doc` says how.
    Computed(&'static str),
    /// Decided where the value is used (a backend, the host); `doc` says what it is.
    Described(&'static str),
}

impl SettingDefault {
    /// The default as the reference documents it.
    pub fn doc(self) -> Option<String> {
        match self {
            Self::None => None,
            Self::Value(value) => Some(format!("`{value}`")),
            Self::Computed(doc) | Self::Described(doc) => Some(doc.to_owned()),
        }
    }
}

/// The sections of the reference, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    /// Where omabox keeps its state and how it logs.
    General,
    /// `omabox run`.
    Runs,
    /// Model providers and the inference gateway.
    Inference,
    /// `omabox serve`.
    Serve,
    /// Images, the image cache and registries.
    Images,
    /// Linux sandboxes.
    Linux,
    /// The host's environment.
    Host,
    /// Test hooks and what omabox sets for itself.
    Test,
}

impl Group {
    /// The section title.
    pub fn title(self) -> &'static str {
        match self {
            Self::General => "General",
            Self::Runs => "Runs (`omabox run`)",
            Self::Inference => "Model providers and the inference gateway",
            Self::Serve => "The HTTP edge (`omabox serve`)",
            Self::Images => "Images and registries",
            Self::Linux => "Linux sandboxes",
            Self::Host => "The host's environment",
            Self::Test => "Test hooks and internal settings",
        }
    }
}

/// Checks a value; the reason names no setting (the caller adds name, value and source).
pub type Parser = fn(&str) -> Result<(), String>;

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// What the node's code asks for.
    pub key: Key,
    /// The configuration-file key and the name `omabox config` shows.
    pub name: &'static str,
    /// The command-line flag, with the commands that take it.
    pub flag: Option<&'static str>,
    /// Environment variables, the first set one wins.
    pub env: &'static [&'static str],
    /// What it is, on one line.
    pub doc: &'static str,
    /// Its default.
    pub default: SettingDefault,
    /// Its value is never printed.
    pub secret: bool,
    /// Who it is for.
    pub kind: Kind,
    /// Its reference section.
    pub group: Group,
    /// Read by the linux backend's config parser under the variable name.
    pub factory: bool,
    /// Checks a value.
    pub parse: Parser,
}

macro_rules! keys {
    ($($key:ident),* $(,)?) => {
        /// A setting of [`SETTINGS`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Key { $($key),* }
        impl Key {
            /// Every key, in table order.
            pub const ALL: &'static [Key] = &[$(Key::$key),*];
        }
    };
}

keys!(
    DataDir,
    Config,
    DatabaseUrl,
    BlobDir,
    Log,
    AgentCache,
    GcKeep,
    CheckpointMaxEntries,
    CheckpointMaxBytes,
    LeaseTtlMs,
    AcpInitializeTimeoutMs,
    AcpTurnTimeoutMs,
    InferenceGateway,
    AnthropicApiKey,
    AnthropicBaseUrl,
    OpenaiApiKey,
    OpenaiBaseUrl,
    SslCertFile,
    OperatorApiKey,
    ServeHeaderReadTimeoutMs,
    ServeKeepaliveTimeoutMs,
    ServeIdleTimeoutMs,
    ServeMaxConnections,
    ServeMaxBodyBytes,
    ServeMaxRuns,
    ServeWarmTtlMs,
    ServeWarmMax,
    ServeWarmMinAvailable,
    ServeUrl,
    Image,
    ImageCache,
    ImageMaxBytes,
    ImageMaxEntries,
    InsecureRegistries,
    RegistryAllowedHosts,
    PullTimeout,
    PullStallTimeout,
    DockerConfig,
    LinuxMemory,
    LinuxCpus,
    LinuxPids,
    LinuxExecTimeoutMs,
    LinuxNetwork,
    LinuxGateway,
    LinuxReadonlyBinds,
    LinuxRuntimeDir,
    LinuxCgroupParent,
    LinuxInit,
    Path,
    Home,
    XdgDataHome,
    XdgCacheHome,
    Tmpdir,
    TestMode,
    NodeEnv,
    FaultPoint,
    PausePoint,
    PauseFile,
    LinuxTestHosts,
    LinuxEnvLayer,
    LinuxMemoryMount,
    LinuxWorkspaceTmpfs,
);

impl Key {
    /// This key's row.
    pub fn setting(self) -> &'static Setting {
        &SETTINGS[self as usize]
    }

    /// The configuration-file key.
    pub fn name(self) -> &'static str {
        self.setting().name
    }

    /// The literal default, if the setting has one.
    pub fn default_value(self) -> Option<&'static str> {
        match self.setting().default {
            SettingDefault::Value(value) => Some(value),
            _ => None,
        }
    }
}

const fn row(key: Key, name: &'static str, doc: &'static str) -> Setting {
    Setting {
        key,
        name,
        flag: None,
        env: &[],
        doc,
        default: SettingDefault::None,
        secret: false,
        kind: Kind::Operator,
        group: Group::General,
        factory: false,
        parse: any,
    }
}

impl Setting {
    const fn flag(mut self, flag: &'static str) -> Self {
        self.flag = Some(flag);
        self
    }
    const fn env(mut self, env: &'static [&'static str]) -> Self {
        self.env = env;
        self
    }
    const fn default(mut self, default: SettingDefault) -> Self {
        self.default = default;
        self
    }
    const fn secret(mut self) -> Self {
        self.secret = true;
        self
    }
    const fn kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }
    const fn group(mut self, group: Group) -> Self {
        self.group = group;
        self
    }
    const fn factory(mut self) -> Self {
        self.factory = true;
        self
    }
    const fn parse(mut self, parse: Parser) -> Self {
        self.parse = parse;
        self
    }
}

use Group::{Host, Images, Inference, Linux, Runs, Serve, Test};
use SettingDefault::{Computed, Described, Value};

/// Every setting, in the order of [`Key`] (a test checks it).
pub static SETTINGS: &[Setting] = &[
    row(Key::DataDir, "data_dir", "Where omabox keeps its state: the store, blobs, binding dirs, memory stores, the file store.")
        .flag("--data-dir (every command)").env(&["OMABOX_DATA_DIR"])
        .default(Computed("`$XDG_DATA_HOME/omabox`, else `~/.local/share/omabox`")).parse(path),
    row(Key::Config, "config", "The node configuration file (TOML, keys as in this table); not a key of that file.")
        .flag("--config (before the command)").env(&["OMABOX_CONFIG"])
        .default(Computed("`<data_dir>/omabox.toml` when it exists")).parse(path),
    row(Key::DatabaseUrl, "database_url", "The PostgreSQL store several hosts share (`postgres://USER:PASSWORD@HOST:PORT/DATABASE`); every command that keeps state uses it.")
        .flag("--database-url (every command)").env(&["OMABOX_DATABASE_URL"]).secret()
        .default(Described("the embedded SQLite store `<data_dir>/omabox.db`")).parse(postgres_url),
    row(Key::BlobDir, "blob_dir", "Absolute directory of the content-addressed blob store, which several hosts may share (a network filesystem) with `database_url`, and `omabox files add`'s file store (`<blob_dir>/promoted`); `gc` and `reap` collect it only with `database_url` (the history every host publishes into).")
        .flag("--blob-dir (every command)").env(&["OMABOX_BLOB_DIR"])
        .default(Computed("`<data_dir>/blobs`")).parse(absolute_path),
    row(Key::Log, "log", "Which log lines go to stderr (a `tracing` filter).").env(&["OMABOX_LOG"])
        .default(Value("warn,omabox_host::runtime_host=error,omabox_backend_linux::env_layer=info")),
    row(Key::AgentCache, "agent_cache", "Absolute directory the ACP agents' npm packages are installed into (`omabox run --agent`).")
        .env(&["OMABOX_AGENT_CACHE"]).group(Runs).default(Computed("`<data_dir>/agents`")).parse(absolute_path),
    row(Key::GcKeep, "gc_keep", "Published revisions kept per session by `omabox gc` and `omabox reap`.")
        .flag("--keep (gc)").env(&["OMABOX_GC_KEEP"]).group(Runs).default(Value("5")).parse(at_least_1),
    row(Key::CheckpointMaxEntries, "checkpoint_max_entries", "Entries one workspace checkpoint may hold; a larger one fails the run.")
        .env(&["OMABOX_CHECKPOINT_MAX_ENTRIES"]).group(Runs).default(Value("1000000")).parse(at_least_1),
    row(Key::CheckpointMaxBytes, "checkpoint_max_bytes", "Bytes one workspace checkpoint may hold (K, M, G, T: powers of 1024).")
        .env(&["OMABOX_CHECKPOINT_MAX_BYTES"]).group(Runs).default(Value("64G")).parse(checkpoint_bytes),
    row(Key::LeaseTtlMs, "lease_ttl_ms", "Fence time to live in ms (tests shorten it).")
        .flag("--lease-ttl-ms (run, hidden)").env(&["OMABOX_LEASE_TTL_MS"]).group(Test).kind(Kind::Test)
        .default(Described("the host's work-item policy (30 s)")).parse(at_least_100),
    row(Key::AcpInitializeTimeoutMs, "acp_initialize_timeout_ms", "How long an ACP agent may take to answer `initialize` and set up its session, in ms.")
        .flag("--acp-initialize-timeout-ms (run, hidden)").env(&["OMABOX_ACP_INITIALIZE_TIMEOUT_MS"]).group(Runs)
        .default(Value("60000")).parse(at_least_100),
    row(Key::AcpTurnTimeoutMs, "acp_turn_timeout_ms", "How long an ACP agent's turn may take, in ms (then it is cancelled and the run fails).")
        .flag("--acp-turn-timeout-ms (run, hidden)").env(&["OMABOX_ACP_TURN_TIMEOUT_MS"]).group(Runs)
        .default(Value("1800000")).parse(at_least_100),
    row(Key::InferenceGateway, "inference_gateway", "The OpenMA gateway origin a run's harness reaches the hosted inference proxy at (then the provider keys are removed from its env).")
        .flag("--inference-gateway (run)").env(&["OMABOX_INFERENCE_GATEWAY"]).group(Inference).secret()
        .default(Described("an ACP run serves the proxy itself on the host's loopback")).parse(gateway_url),
    row(Key::AnthropicApiKey, "anthropic_api_key", "The Anthropic key the inference proxy forwards with (never given to a sandbox).")
        .env(&["ANTHROPIC_API_KEY"]).group(Inference).secret(),
    row(Key::AnthropicBaseUrl, "anthropic_base_url", "The Anthropic-compatible endpoint the proxy forwards to.")
        .env(&["ANTHROPIC_BASE_URL"]).group(Inference).default(Described("Anthropic's API")),
    row(Key::OpenaiApiKey, "openai_api_key", "The OpenAI key the proxy forwards `--agent codex`'s calls with.")
        .env(&["OPENAI_API_KEY"]).group(Inference).secret(),
    row(Key::OpenaiBaseUrl, "openai_base_url", "The OpenAI-compatible endpoint the proxy forwards to.")
        .env(&["OPENAI_BASE_URL"]).group(Inference).default(Described("OpenAI's API")),
    row(Key::SslCertFile, "ssl_cert_file", "CA bundle real servers are checked against under credential egress and git resources.")
        .env(&["SSL_CERT_FILE"]).group(Inference).default(Described("the system's roots")).parse(path),
    row(Key::OperatorApiKey, "operator_api_key", "The key operator routes of `omabox serve` require.")
        .env(&["OMABOX_API_KEY"]).group(Serve).secret()
        .default(Described("the serve configuration's, else generated once into `<data_dir>/serve-api-key`")),
    row(Key::ServeHeaderReadTimeoutMs, "serve_header_read_timeout_ms", "Time to receive a request head from its first byte (or from accept), in ms.")
        .flag("--header-read-timeout-ms (serve)").env(&["OMABOX_SERVE_HEADER_READ_TIMEOUT_MS"]).group(Serve)
        .default(Described("the serve configuration's `limits`, else `10000`")).parse(unsigned),
    row(Key::ServeKeepaliveTimeoutMs, "serve_keepalive_timeout_ms", "How long an idle connection is kept for its next request, in ms (the header-read timeout while the server is crowded).")
        .flag("--keepalive-timeout-ms (serve)").env(&["OMABOX_SERVE_KEEPALIVE_TIMEOUT_MS"]).group(Serve)
        .default(Described("the serve configuration's `limits`, else `610000`")).parse(unsigned),
    row(Key::ServeIdleTimeoutMs, "serve_idle_timeout_ms", "Close a connection on which no byte moved for this long, in ms.")
        .flag("--idle-timeout-ms (serve)").env(&["OMABOX_SERVE_IDLE_TIMEOUT_MS"]).group(Serve)
        .default(Described("the serve configuration's `limits`, else `300000`")).parse(unsigned),
    row(Key::ServeMaxConnections, "serve_max_connections", "Connections served at once; beyond it, accepting pauses.")
        .flag("--max-connections (serve)").env(&["OMABOX_SERVE_MAX_CONNECTIONS"]).group(Serve)
        .default(Described("the serve configuration's `limits`, else `1024`")).parse(unsigned),
    row(Key::ServeMaxBodyBytes, "serve_max_body_bytes", "Largest buffered request body in bytes (proxied bodies stream).")
        .flag("--max-body-bytes (serve)").env(&["OMABOX_SERVE_MAX_BODY_BYTES"]).group(Serve)
        .default(Described("the serve configuration's `limits`, else `1048576`")).parse(unsigned),
    row(Key::ServeMaxRuns, "serve_max_runs", "Queued runs (`POST /v1/sessions/{id}/runs`) this `omabox serve` runs at once; it claims no more from the shared queue.")
        .flag("--max-runs (serve)").env(&["OMABOX_SERVE_MAX_RUNS"]).group(Serve)
        .default(Value("4")).parse(at_least_1),
    row(Key::ServeWarmTtlMs, "serve_warm_ttl_ms", "How long an agent session's sandbox and ACP agent stay up after its turn on `omabox serve`, waiting for its next turn (a warm turn: one prompt on the live agent); `0` keeps none.")
        .env(&["OMABOX_SERVE_WARM_TTL_MS"]).group(Serve)
        .default(Value("300000")).parse(unsigned),
    row(Key::ServeWarmMax, "serve_warm_max", "Agent sessions `omabox serve` keeps warm at most; the least recently used one ends first; `0` keeps none.")
        .env(&["OMABOX_SERVE_WARM_MAX"]).group(Serve)
        .default(Value("8")).parse(unsigned),
    row(Key::ServeWarmMinAvailable, "serve_warm_min_available", "Below this much `MemAvailable` (`/proc/meminfo`; K, M, G suffixes), `omabox serve` ends its least recently used warm session, one a second; `0` never.")
        .env(&["OMABOX_SERVE_WARM_MIN_AVAILABLE"]).group(Serve)
        .default(Value("512M")).parse(memory_or_zero),
    row(Key::ServeUrl, "serve_url", "The `omabox serve` that `omabox sandbox create|ls|rm|timeout|pause|resume|fork|exec` talk to (plain `http://`).")
        .flag("--serve-url (sandbox create, ls, rm, timeout, exec)").env(&["OMABOX_SERVE_URL"]).group(Serve)
        .default(Value("http://127.0.0.1:8787")).parse(serve_url),
    row(Key::Image, "image", "The sandboxes' root filesystem: a rootfs directory or tarball, an OCI layout, or a registry reference (`SANDBOX_IMAGE`: OpenMA's name).")
        .flag("--image (sandbox run)").env(&[linux::IMAGE_ENV, linux::SANDBOX_IMAGE_ENV]).group(Images).factory()
        .default(Described("the host's `/usr`, `/bin`, `/lib*` read-only")).parse(image),
    row(Key::ImageCache, "image_cache", "Absolute directory images are unpacked into (environment layers below it).")
        .env(&[linux::IMAGE_CACHE_ENV]).group(Images).factory()
        .default(Computed("`/var/lib/omabox/images` as root, else `$XDG_CACHE_HOME/omabox/images`, else `~/.cache/omabox/images`"))
        .parse(absolute_path_or_empty),
    row(Key::ImageMaxBytes, "image_max_bytes", "Bytes of file data one image may unpack to (K, M, G, T suffixes).")
        .env(&[linux::MAX_BYTES_ENV]).group(Images).factory().default(Value("64G")).parse(unpack_bytes),
    row(Key::ImageMaxEntries, "image_max_entries", "Entries one image may unpack to.")
        .env(&[linux::MAX_ENTRIES_ENV]).group(Images).factory().default(Value("4000000")).parse(unpack_entries),
    row(Key::InsecureRegistries, "insecure_registries", "`host[:port],…`: registries pulled from over plain HTTP (loopback ones always are).")
        .env(&[linux::INSECURE_REGISTRIES_ENV]).group(Images).factory(),
    row(Key::RegistryAllowedHosts, "registry_allowed_hosts", "`REGISTRY=HOST,…`: hosts a registry may send a pull to besides itself (token realm, redirects).")
        .env(&[linux::ALLOWED_HOSTS_ENV]).group(Images).factory()
        .default(Described("built-in entries for Docker Hub, ghcr.io, quay.io, gcr.io, mcr.microsoft.com")).parse(allowed_hosts),
    row(Key::PullTimeout, "pull_timeout", "Seconds a registry pull may take in all.")
        .env(&[linux::PULL_TIMEOUT_ENV]).group(Images).factory().default(Value("3600")).parse(pull_timeout),
    row(Key::PullStallTimeout, "pull_stall_timeout", "Seconds within which a registry response must start, and deliver at least 1 KiB or end.")
        .env(&[linux::STALL_TIMEOUT_ENV]).group(Images).factory().default(Value("60")).parse(stall_timeout),
    row(Key::DockerConfig, "docker_config", "Docker's configuration directory (`config.json`: registry credentials and helpers).")
        .env(&[linux::DOCKER_CONFIG_ENV]).group(Images).factory().default(Computed("`$HOME/.docker`")).parse(path),
    row(Key::LinuxMemory, "linux_memory", "A sandbox's memory limit: bytes or K, M, G, T (binary), or `unlimited`.")
        .flag("--memory (sandbox run)").env(&[linux::MEMORY_ENV]).group(Linux).factory()
        .default(Described("`512M` (`--agent` runs: `2G`)")).parse(memory),
    row(Key::LinuxCpus, "linux_cpus", "A sandbox's CPU quota in CPUs (`1`, `0.5`), or `unlimited`.")
        .flag("--cpus (sandbox run)").env(&[linux::CPUS_ENV]).group(Linux).factory()
        .default(Described("2, or the host's CPU count if smaller")).parse(cpus),
    row(Key::LinuxPids, "linux_pids", "A sandbox's task limit (processes and threads), or `unlimited`.")
        .flag("--pids (sandbox run)").env(&[linux::PIDS_ENV]).group(Linux).factory().default(Value("512")).parse(pids),
    row(Key::LinuxExecTimeoutMs, "linux_exec_timeout_ms", "Default timeout of a command run in a sandbox, in ms.")
        .env(&[linux::EXEC_TIMEOUT_ENV]).group(Linux).factory().default(Value("120000")).parse(positive_or_empty),
    row(Key::LinuxNetwork, "linux_network", "What a sandbox reaches: `none`, `limited`, `unrestricted` or an Environment `networking` JSON object.")
        .flag("--network, --allow-host, --allow-package-managers (sandbox run)").env(&[linux::NETWORK_ENV]).group(Linux).factory()
        .default(Described("`omabox run`: `limited` (the gateway only); `omabox sandbox run`: `none`")).parse(network),
    row(Key::LinuxGateway, "linux_gateway", "`[NAME=]IP:PORT` where the omabox gateway listens as the host reaches it (`omabox run` sets it from `inference_gateway`).")
        .env(&[linux::GATEWAY_ENV]).group(Linux).factory().parse(gateway),
    row(Key::LinuxReadonlyBinds, "linux_readonly_binds", "`HOST_DIR:SANDBOX_DIR,…`: host directories mounted read-only into every sandbox.")
        .env(&[linux::READONLY_BINDS_ENV]).group(Linux).factory().parse(readonly_binds),
    row(Key::LinuxRuntimeDir, "linux_runtime_dir", "Absolute parent of the sandboxes' state dirs.")
        .env(&[linux::RUNTIME_DIR_ENV]).group(Linux).factory().default(Value("/run/omabox")).parse(absolute_path_or_empty),
    row(Key::LinuxCgroupParent, "linux_cgroup_parent", "The cgroup directory (below each hierarchy's root) holding the sandboxes' cgroups.")
        .env(&[linux::CGROUP_PARENT_ENV]).group(Linux).factory().default(Value("omabox")),
    row(Key::LinuxInit, "linux_init", "The `omabox-sandbox-init` binary.")
        .env(&[linux::INIT_ENV]).group(Linux).factory().default(Described("next to the running `omabox`, then `PATH`")),
    row(Key::Path, "path", "Directories searched for `omabox-sandbox-init` when it is not next to `omabox`.")
        .env(&[linux::PATH_ENV]).kind(Kind::Host).group(Host).factory(),
    row(Key::Home, "home", "The user's home: the data dir's, the image cache's and docker's defaults.")
        .env(&[linux::HOME_ENV]).kind(Kind::Host).group(Host).factory(),
    row(Key::XdgDataHome, "xdg_data_home", "The base of the default data dir.")
        .env(&["XDG_DATA_HOME"]).kind(Kind::Host).group(Host),
    row(Key::XdgCacheHome, "xdg_cache_home", "The base of the default image cache (non-root).")
        .env(&["XDG_CACHE_HOME"]).kind(Kind::Host).group(Host),
    row(Key::Tmpdir, "tmpdir", "Where `omabox sandbox run` makes temporary workspaces (and `omabox reap` finds abandoned ones).")
        .env(&["TMPDIR"]).kind(Kind::Host).group(Host).default(Value("/tmp")),
    row(Key::TestMode, "test_mode", "`1`: test mode (the `local` backend without isolation, test hooks).")
        .env(&[omabox_sandbox::TEST_MODE_ENV]).kind(Kind::Test).group(Test).factory(),
    row(Key::NodeEnv, "node_env", "`test`: OpenMA's test-mode switch, honoured like `test_mode`.")
        .env(&[omabox_sandbox::NODE_ENV]).kind(Kind::Test).group(Test).factory(),
    row(Key::FaultPoint, "fault_point", "Test mode: kill the process at the named step (read where the step is).")
        .env(&["OMABOX_FAULT_POINT"]).kind(Kind::Test).group(Test),
    row(Key::PausePoint, "pause_point", "Test mode: pause at the named step until `pause_file` exists.")
        .env(&["OMABOX_PAUSE_POINT"]).kind(Kind::Test).group(Test),
    row(Key::PauseFile, "pause_file", "Test mode: the go file of `pause_point`.")
        .env(&["OMABOX_PAUSE_FILE"]).kind(Kind::Test).group(Test),
    row(Key::LinuxTestHosts, "linux_test_hosts", "Test mode: `NAME=IP,…` answered before the host's resolver in sandboxes.")
        .env(&[linux::TEST_HOSTS_ENV]).kind(Kind::Test).group(Test).factory(),
    row(Key::LinuxEnvLayer, "linux_env_layer", "Set by `omabox run` from `--environment`: the environment layer to build and use.")
        .env(&[linux::ENV_LAYER_ENV]).kind(Kind::Internal).group(Test).factory(),
    row(Key::LinuxMemoryMount, "linux_memory_mount", "Set by `omabox run` for memory resources: `1` mounts a tmpfs at `/mnt/memory`.")
        .env(&[linux::MEMORY_MOUNT_ENV]).kind(Kind::Internal).group(Test).factory(),
    row(Key::LinuxWorkspaceTmpfs, "linux_workspace_tmpfs", "Set by `omabox sandbox run` without `--workspace`: `1` makes `/workspace` a tmpfs.")
        .env(&[linux::WORKSPACE_TMPFS_ENV]).kind(Kind::Internal).group(Test).factory(),
];

fn any(_: &str) -> Result<(), String> {
    Ok(())
}

fn path(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("is empty: name a path".into());
    }
    Ok(())
}

fn absolute_path(value: &str) -> Result<(), String> {
    if !std::path::Path::new(value).is_absolute() {
        return Err("must be an absolute path".into());
    }
    Ok(())
}

/// Absolute, or empty (which the linux factory takes for unset).
fn absolute_path_or_empty(value: &str) -> Result<(), String> {
    match value.trim() {
        "" => Ok(()),
        trimmed => absolute_path(trimmed),
    }
}

fn whole(value: &str, least: u64, what: &str) -> Result<(), String> {
    match value.trim().parse::<u64>() {
        Ok(n) if n >= least => Ok(()),
        _ => Err(format!("is not a whole number {what}")),
    }
}

fn unsigned(value: &str) -> Result<(), String> {
    whole(value, 0, "(0 or more)")
}

fn at_least_1(value: &str) -> Result<(), String> {
    whole(value, 1, "of at least 1")
}

fn at_least_100(value: &str) -> Result<(), String> {
    whole(value, 100, "of at least 100")
}

fn positive_or_empty(value: &str) -> Result<(), String> {
    match value.trim() {
        "" => Ok(()),
        trimmed => at_least_1(trimmed),
    }
}

fn checkpoint_bytes(value: &str) -> Result<(), String> {
    crate::checkpoint_limits::parse_bytes(value)
        .map(|_| ())
        .ok_or_else(|| "is not a positive size (bytes, or with K, M, G or T)".to_owned())
}

/// `unlimited`, empty (unset), or what `parse` accepts.
fn limit(value: &str, parse: fn(&str) -> Result<u64, String>) -> Result<(), String> {
    let value = value.trim();
    if value.is_empty() || value.eq_ignore_ascii_case("unlimited") {
        return Ok(());
    }
    parse(value).map(|_| ())
}

fn memory_or_zero(value: &str) -> Result<(), String> {
    match value.trim() {
        "0" => Ok(()),
        value => linux::parse_memory_size(value).map(|_| ()),
    }
}

fn memory(value: &str) -> Result<(), String> {
    limit(value, linux::parse_memory_size)
}

fn cpus(value: &str) -> Result<(), String> {
    limit(value, linux::parse_millicpus)
}

fn pids(value: &str) -> Result<(), String> {
    limit(value, |v| match v.parse::<u64>() {
        Ok(n) if n >= 2 => Ok(n),
        _ => Err("must be an integer of at least 2, or `unlimited`".into()),
    })
}

fn nonempty(value: &str) -> Option<&str> {
    Some(value.trim()).filter(|v| !v.is_empty())
}

fn network(value: &str) -> Result<(), String> {
    nonempty(value).map_or(Ok(()), |v| linux::parse_networking(v).map(|_| ()))
}

fn gateway(value: &str) -> Result<(), String> {
    nonempty(value).map_or(Ok(()), |v| linux::parse_gateway(v).map(|_| ()))
}

fn readonly_binds(value: &str) -> Result<(), String> {
    nonempty(value).map_or(Ok(()), |v| linux::parse_readonly_binds(v).map(|_| ()))
}

fn image(value: &str) -> Result<(), String> {
    nonempty(value).map_or(Ok(()), |v| {
        omabox_backend_linux::image::ImageSource::parse(v)
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

fn unpack_bytes(value: &str) -> Result<(), String> {
    omabox_backend_linux::image::UnpackLimits::parse(nonempty(value), None)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn unpack_entries(value: &str) -> Result<(), String> {
    omabox_backend_linux::image::UnpackLimits::parse(None, nonempty(value))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn allowed_hosts(value: &str) -> Result<(), String> {
    omabox_backend_linux::image::RegistryConfig::parse_allowed_hosts(nonempty(value))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn pull_timeout(value: &str) -> Result<(), String> {
    omabox_backend_linux::image::RegistryConfig::parse_timeouts(nonempty(value), None)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn stall_timeout(value: &str) -> Result<(), String> {
    omabox_backend_linux::image::RegistryConfig::parse_timeouts(None, nonempty(value))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn serve_url(value: &str) -> Result<(), String> {
    match value.strip_prefix("http://") {
        Some(rest)
            if rest
                .split('/')
                .next()
                .is_some_and(|host| host.contains('@')) =>
        {
            Err(
                "must carry no user name or password (the operator key is OMABOX_API_KEY)"
                    .to_owned(),
            )
        }
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        _ => Err("must be an http:// URL with a host (e.g. http://127.0.0.1:8787)".to_owned()),
    }
}

fn postgres_url(value: &str) -> Result<(), String> {
    // The message never quotes the value: it carries a password.
    if value.starts_with("postgres://") || value.starts_with("postgresql://") {
        Ok(())
    } else {
        Err("must be a postgres:// (or postgresql://) URL".to_owned())
    }
}

fn gateway_url(value: &str) -> Result<(), String> {
    omabox_contract::hosted_inference::build_hosted_inference_base_url(value, "probe")
        .map(|_| ())
        .ok_or_else(|| "must be an absolute URL (e.g. http://HOST:PORT/)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_key_order_with_unique_names_and_variables() {
        assert_eq!(SETTINGS.len(), Key::ALL.len());
        let mut names = std::collections::HashSet::new();
        let mut vars = std::collections::HashSet::new();
        for (index, setting) in SETTINGS.iter().enumerate() {
            assert_eq!(setting.key as usize, index, "{}", setting.name);
            assert!(names.insert(setting.name), "{}", setting.name);
            for var in setting.env {
                assert!(vars.insert(*var), "{var}");
            }
            assert!(
                setting
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{}",
                setting.name
            );
            assert!(!setting.doc.is_empty() && setting.doc.len() < 400);
        }
    }

    /// Every key the linux factory reads is a setting handed to it: the factory's env map is
    /// built from this table only.
    #[test]
    fn every_key_the_linux_factory_reads_is_a_factory_setting() {
        let factory: Vec<&str> = SETTINGS
            .iter()
            .filter(|s| s.factory)
            .flat_map(|s| s.env.iter().copied())
            .collect();
        for key in linux::ENV_KEYS
            .iter()
            .chain([&omabox_sandbox::TEST_MODE_ENV, &omabox_sandbox::NODE_ENV])
        {
            assert!(factory.contains(key), "{key} is not in the table");
        }
    }
}
