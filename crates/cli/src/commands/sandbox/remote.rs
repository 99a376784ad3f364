//! `omabox sandbox create|ls|rm|timeout|pause|resume|fork|exec`: the long-lived sandboxes of a running
//! `omabox serve`, docker-style, over its E2B-compatible control plane (docs/http-api.md);
//! `exec` (`exec.rs`) runs a command through the sandbox's envd.
//!
//! Serve is at the `serve_url` setting (`--serve-url`, `OMABOX_SERVE_URL`, default
//! `http://127.0.0.1:8787`); the operator key is where serve takes it: `OMABOX_API_KEY`,
//! else `<data-dir>/serve-api-key`.
//!
//! Must never: print the operator key or a sandbox's access token (the latter only in
//! `create --json`, the API's own answer), or print text the server chose unescaped.

use crate::terminal_safe::one_line;
use anyhow::{Context as _, anyhow, bail};
use clap::{Args, Subcommand};
use omabox_contract::SecretString;
use omabox_node::NodeConfig;
use omabox_node::config::{Flags, Key};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

/// How long one request to serve may take (creating a sandbox included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long connecting to serve may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read from serve.
const MAX_ANSWER: usize = 4 << 20;

/// The subcommands on a running serve.
#[derive(Debug, Subcommand)]
pub enum RemoteCommand {
    /// Create a long-lived sandbox in the running `omabox serve`; prints its id.
    Create(CreateArgs),
    /// List the running serve's sandboxes: id, template, started, ends.
    Ls(ListArgs),
    /// Kill sandboxes of the running serve (their state is removed).
    Rm(RemoveArgs),
    /// Set a sandbox's remaining lifetime to SECS from now.
    Timeout(TimeoutArgs),
    /// Pause a sandbox: nothing of it runs and its timeout stops until `resume`. On a
    /// `serve --backend gvisor` its processes and memory are kept (they go on after the
    /// resume); on linux its files only.
    Pause(PauseArgs),
    /// Resume a paused sandbox (E2B's connect) for SECS more.
    Resume(ResumeArgs),
    /// Start copies of a running sandbox from its memory (`serve --backend gvisor`); prints
    /// each new id. The sandbox runs on.
    Fork(ForkArgs),
    /// Run a command in a sandbox of the running serve, like `docker exec`; exits with its
    /// exit code.
    Exec(super::exec::ExecArgs),
}

/// Where serve is.
#[derive(Debug, Args)]
pub(super) struct ServeFlag {
    /// The `omabox serve` to talk to (plain http://; setting `serve_url`, OMABOX_SERVE_URL;
    /// default http://127.0.0.1:8787). The key: OMABOX_API_KEY, else
    /// `<data-dir>/serve-api-key`.
    #[arg(long, value_name = "URL")]
    serve_url: Option<String>,
}

/// Options of `omabox sandbox create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    serve: ServeFlag,
    /// The E2B template id (every template runs the configured image).
    #[arg(long, default_value = "base", value_name = "NAME")]
    template: String,
    /// Seconds until serve kills the sandbox (default: serve's, 15, as E2B's API).
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Metadata to attach (repeatable).
    #[arg(long, value_name = "K=V", value_parser = pair)]
    metadata: Vec<(String, String)>,
    /// An environment variable of the sandbox (repeatable).
    #[arg(long, value_name = "K=V", value_parser = pair)]
    env: Vec<(String, String)>,
    /// Print the API's JSON answer (it holds the sandbox's access token).
    #[arg(long)]
    json: bool,
}

/// Options of `omabox sandbox ls`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    serve: ServeFlag,
    /// Print the API's JSON list.
    #[arg(long)]
    json: bool,
}

/// Options of `omabox sandbox rm`.
#[derive(Debug, Args)]
pub struct RemoveArgs {
    #[command(flatten)]
    serve: ServeFlag,
    /// The sandboxes to kill.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,
    /// Print one JSON object per id: `{"sandboxID", "removed", "error"?}`, as an array.
    #[arg(long)]
    json: bool,
}

/// Options of `omabox sandbox timeout`.
#[derive(Debug, Args)]
pub struct TimeoutArgs {
    #[command(flatten)]
    serve: ServeFlag,
    /// The sandbox.
    id: String,
    /// Its new remaining lifetime in seconds.
    secs: u64,
}

/// Options of `omabox sandbox pause`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    serve: ServeFlag,
    /// The sandbox.
    id: String,
    /// Keep its files only: its processes end (E2B's `mode="filesystem"`). Default: what
    /// the server keeps (processes and memory under gvisor, files under linux).
    #[arg(long, conflicts_with = "memory")]
    filesystem: bool,
    /// Keep its processes and memory, or fail (E2B's `mode="full"`; needs
    /// `serve --backend gvisor`).
    #[arg(long)]
    memory: bool,
}

/// Options of `omabox sandbox resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    serve: ServeFlag,
    /// The sandbox.
    id: String,
    /// Seconds it lives after the resume (serve's default, 15, as E2B's API).
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
}

/// Options of `omabox sandbox fork`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    #[command(flatten)]
    serve: ServeFlag,
    /// The sandbox to copy.
    id: String,
    /// How many copies (1 to 20).
    #[arg(long, default_value = "1", value_parser = clap::value_parser!(u64).range(1..=20))]
    count: u64,
    /// Seconds each copy lives (serve's default, 15, as E2B's API).
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Print the API's JSON answer (it holds the copies' access tokens).
    #[arg(long)]
    json: bool,
}

fn pair(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("expected K=V, got {text:?}"))
}

impl RemoteCommand {
    /// The flags that are settings: `--serve-url`.
    pub fn flags(&self, flags: Flags) -> Flags {
        let serve = match self {
            Self::Create(args) => &args.serve,
            Self::Ls(args) => &args.serve,
            Self::Rm(args) => &args.serve,
            Self::Timeout(args) => &args.serve,
            Self::Pause(args) => &args.serve,
            Self::Resume(args) => &args.serve,
            Self::Fork(args) => &args.serve,
            Self::Exec(args) => &args.serve,
        };
        flags.with_some(Key::ServeUrl, serve.serve_url.clone())
    }
}

/// Runs one subcommand against serve.
pub fn run(command: RemoteCommand, config: &NodeConfig) -> anyhow::Result<ExitCode> {
    crate::init_tracing(Some(config));
    let client = Client::new(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match command {
            RemoteCommand::Create(args) => create(&client, args).await,
            RemoteCommand::Ls(args) => list(&client, args.json).await,
            RemoteCommand::Rm(args) => remove(&client, &args.ids, args.json).await,
            RemoteCommand::Timeout(args) => {
                let path = format!("/sandboxes/{}/timeout", segment(&args.id));
                client
                    .call(
                        reqwest::Method::POST,
                        &path,
                        Some(json!({"timeout": args.secs})),
                    )
                    .await
                    .map_err(|e| e.named(&args.id))?;
                Ok(ExitCode::SUCCESS)
            }
            RemoteCommand::Pause(args) => {
                let path = format!("/sandboxes/{}/pause", segment(&args.id));
                let body = match (args.filesystem, args.memory) {
                    (true, _) => Some(json!({"memory": false})),
                    (_, true) => Some(json!({"memory": true})),
                    _ => None,
                };
                client
                    .call(reqwest::Method::POST, &path, body)
                    .await
                    .map_err(|e| e.named(&args.id))?;
                outln!("{}", one_line(&args.id));
                Ok(ExitCode::SUCCESS)
            }
            RemoteCommand::Resume(args) => {
                let path = format!("/sandboxes/{}/connect", segment(&args.id));
                let body = args
                    .timeout
                    .map_or_else(|| json!({}), |secs| json!({"timeout": secs}));
                client
                    .call(reqwest::Method::POST, &path, Some(body))
                    .await
                    .map_err(|e| e.named(&args.id))?;
                outln!("{}", one_line(&args.id));
                Ok(ExitCode::SUCCESS)
            }
            RemoteCommand::Fork(args) => fork(&client, args).await,
            RemoteCommand::Exec(args) => super::exec::exec(&client, args).await,
        }
    })
}

async fn create(client: &Client, args: CreateArgs) -> anyhow::Result<ExitCode> {
    let mut body = json!({
        "templateID": args.template,
        "metadata": args.metadata.into_iter().collect::<BTreeMap<_, _>>(),
        "envVars": args.env.into_iter().collect::<BTreeMap<_, _>>(),
    });
    if let Some(secs) = args.timeout {
        body["timeout"] = secs.into();
    }
    let created = client
        .call(reqwest::Method::POST, "/sandboxes", Some(body))
        .await?;
    if args.json {
        outln!("{created}");
        return Ok(ExitCode::SUCCESS);
    }
    let id = created["sandboxID"]
        .as_str()
        .ok_or_else(|| anyhow!("serve at {} answered without a sandboxID", client.base))?;
    outln!("{}", one_line(id));
    Ok(ExitCode::SUCCESS)
}

/// Prints each fork's id (a failed one's error on stderr: exit 1).
async fn fork(client: &Client, args: ForkArgs) -> anyhow::Result<ExitCode> {
    let path = format!("/sandboxes/{}/fork", segment(&args.id));
    let mut body = json!({ "count": args.count });
    if let Some(secs) = args.timeout {
        body["timeout"] = secs.into();
    }
    let forks = client
        .call(reqwest::Method::POST, &path, Some(body))
        .await
        .map_err(|e| e.named(&args.id))?;
    if args.json {
        outln!("{forks}");
        return Ok(ExitCode::SUCCESS);
    }
    let Some(forks) = forks.as_array() else {
        bail!(
            "serve at {} answered a fork that is not an array",
            client.base
        );
    };
    let mut failed = false;
    for fork in forks {
        match fork["sandbox"]["sandboxID"].as_str() {
            Some(id) => outln!("{}", one_line(id)),
            None => {
                failed = true;
                let message = fork["error"]["message"].as_str().unwrap_or("(no message)");
                errln!("omabox: error: a fork failed: {}", one_line(message));
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn list(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let listed = client
        .call(reqwest::Method::GET, "/sandboxes", None)
        .await?;
    let Some(sandboxes) = listed.as_array() else {
        bail!(
            "serve at {} answered a list that is not an array",
            client.base
        );
    };
    if json {
        outln!("{listed}");
        return Ok(ExitCode::SUCCESS);
    }
    let field =
        |sandbox: &Value, name: &str| one_line(sandbox[name].as_str().unwrap_or("-")).into_owned();
    let rows: Vec<[String; 4]> = sandboxes
        .iter()
        .map(|s| {
            [
                field(s, "sandboxID"),
                field(s, "templateID"),
                field(s, "startedAt"),
                field(s, "endAt"),
            ]
        })
        .collect();
    let width = |column: usize, title: &str| {
        rows.iter()
            .map(|row| row[column].chars().count())
            .chain([title.len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (width(0, "ID"), width(1, "TEMPLATE"), width(2, "STARTED"));
    outln!("{:w0$}  {:w1$}  {:w2$}  ENDS", "ID", "TEMPLATE", "STARTED");
    for [id, template, started, ends] in &rows {
        outln!("{id:w0$}  {template:w1$}  {started:w2$}  {ends}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Kills every id; each failure is reported and the others are still removed.
async fn remove(client: &Client, ids: &[String], json: bool) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    let mut results = Vec::new();
    for id in ids {
        let path = format!("/sandboxes/{}", segment(id));
        match client.call(reqwest::Method::DELETE, &path, None).await {
            Ok(_) => {
                results.push(json!({"sandboxID": id, "removed": true}));
                if !json {
                    outln!("{}", one_line(id));
                }
            }
            Err(error) => {
                failed = true;
                let error = error.named(id);
                errln!("omabox: error: {error:#}");
                results.push(
                    json!({"sandboxID": id, "removed": false, "error": format!("{error:#}")}),
                );
            }
        }
    }
    if json {
        outln!("{}", Value::Array(results));
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// An id as one path segment: only what E2B ids are made of passes unescaped.
pub(super) fn segment(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Why a call failed: serve said no (with its status), or it could not be asked.
#[derive(Debug)]
pub(super) enum CallError {
    /// A 404: the sandbox is not there.
    NotFound(String),
    /// Anything else.
    Other(anyhow::Error),
}

impl CallError {
    /// As an error naming the sandbox `id` when serve does not know it.
    pub(super) fn named(self, id: &str) -> anyhow::Error {
        match self {
            Self::NotFound(base) => anyhow!("no sandbox {} in the serve at {base}", one_line(id)),
            Self::Other(error) => error,
        }
    }
}

impl From<CallError> for anyhow::Error {
    fn from(error: CallError) -> Self {
        match error {
            CallError::NotFound(base) => anyhow!("serve at {base} answered 404"),
            CallError::Other(error) => error,
        }
    }
}

/// Serve's address and the operator key.
pub(super) struct Client {
    http: reqwest::Client,
    pub(super) base: String,
    key: SecretString,
    /// Where the key came from, for a 401.
    key_origin: String,
}

impl Client {
    fn new(config: &NodeConfig) -> anyhow::Result<Self> {
        let base = config
            .value(Key::ServeUrl)
            .unwrap_or_else(|| "http://127.0.0.1:8787".to_owned())
            .trim_end_matches('/')
            .to_owned();
        let (key, key_origin) = match config.secret(Key::OperatorApiKey) {
            Some(key) if !key.expose().is_empty() => {
                (key, format!("{}", config.source(Key::OperatorApiKey)))
            }
            _ => {
                let data_dir = config.data_dir()?;
                let path = data_dir.operator_key();
                let key = omabox_proxy::operator_key::load(data_dir.root())?.ok_or_else(|| {
                    anyhow!(
                        "no operator key: set OMABOX_API_KEY, or start `omabox serve` with this data directory so it writes {}",
                        path.display()
                    )
                })?;
                (key, path.display().to_string())
            }
        };
        // reqwest is built without a crypto provider of its own (the workspace's features):
        // ring, as everywhere else, though only plain http is spoken here.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .context("cannot make an HTTP client")?;
        Ok(Self {
            http,
            base,
            key,
            key_origin,
        })
    }

    /// One call; a 2xx answer's JSON (`Null` when empty).
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, CallError> {
        let base = &self.base;
        let mut request = self
            .http
            .request(method, format!("{base}{path}"))
            .header("x-api-key", self.key.expose());
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let mut response = request.send().await.map_err(|error| {
            let why = if error.is_connect() {
                "connection refused".to_owned()
            } else if error.is_timeout() {
                "timed out".to_owned()
            } else {
                format!("{error}")
            };
            CallError::Other(anyhow!(
                "no omabox serve at {base}: {why}; start it with `omabox serve`"
            ))
        })?;
        let status = response.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|error| {
            CallError::Other(anyhow!("the answer of serve at {base} broke off: {error}"))
        })? {
            if bytes.len() + chunk.len() > MAX_ANSWER {
                return Err(CallError::Other(anyhow!(
                    "the answer of serve at {base} is over {MAX_ANSWER} bytes"
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        let value: Option<Value> = serde_json::from_slice(&bytes).ok();
        if status.is_success() {
            return match value {
                Some(value) => Ok(value),
                None if bytes.is_empty() => Ok(Value::Null),
                None => Err(CallError::Other(anyhow!(
                    "serve at {base} answered {status} with a body that is not JSON"
                ))),
            };
        }
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(CallError::Other(anyhow!(
                "serve at {base} refused the operator key (401): the key from {} is not the one serve uses",
                self.key_origin
            )));
        }
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(CallError::NotFound(base.clone()));
        }
        let message = value
            .as_ref()
            .and_then(|v| v["message"].as_str())
            .map(|m| one_line(&m.chars().take(512).collect::<String>()).into_owned())
            .unwrap_or_else(|| "no message".to_owned());
        Err(CallError::Other(anyhow!(
            "serve at {base} answered {status}: {message}"
        )))
    }
}
