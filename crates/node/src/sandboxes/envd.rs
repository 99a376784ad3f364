//! One serve sandbox's E2B in-sandbox API ([`SandboxEnvd`]) over its agent: processes
//! started through it (a table by pid, each with a pump task that fans its output out to the
//! streams attached to it) and file operations, all run by the agent inside the sandbox.
//!
//! A process's output goes to the streams attached at the time it is written (its start
//! stream and any `connect`s); with none attached it is read and dropped, so a process
//! never blocks on a client that went away. An attached stream that does not read slows
//! the process, as a pipe would: every channel is bounded.
//!
//! Relative paths (and `~/…`) are the user's home's: `/root` for `root`, `/home/NAME` for
//! anyone else.
//!
//! Must never: resolve or open a sandbox path on the host (every file operation is the
//! agent's, inside the sandbox); keep a process in the table after its end was sent.

use super::logs::SandboxLog;
use async_trait::async_trait;
use bytes::Bytes;
use omabox_agent::{
    AgentClient, ClientError, DataWriter, ErrorKind, FileKind, ProcessExit, WatchEvent,
};
use omabox_agent::{DuplexProcess, ExecRequest, ProcessKiller, WriteOptions};
use omabox_proxy::e2b::LogLevel;
use omabox_proxy::envd::{
    DEFAULT_USER, EntryInfo, EnvdError, FileDownload, FileType, FsEvent, FsEventKind, FsEvents,
    MAX_PROCESSES, MAX_SUBSCRIBERS, MAX_WATCHER_EVENTS, MAX_WATCHERS, ProcessEnd, ProcessEvent,
    ProcessEvents, ProcessListing, ProcessSelector, PtySize, SandboxEnvd, StartProcess, UploadBody,
    WatchOptions,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// Events queued per attached stream before the process waits for its reader.
const STREAM_QUEUE: usize = 8;
/// Entries one `ListDir` answers at most (a deep listing of a huge tree is refused).
const MAX_LISTED: usize = 100_000;
/// Characters of an agent error message passed on.
const MAX_MESSAGE: usize = 1000;

/// A sandbox's processes and files (module doc).
pub(super) struct Envd {
    /// Where process starts and ends are logged.
    log: Arc<SandboxLog>,
    client: AgentClient,
    processes: Arc<Table>,
    watchers: Mutex<HashMap<String, Arc<Watcher>>>,
}

/// A watch whose events wait for `GetWatcherEvents`.
struct Watcher {
    kept: Arc<Mutex<Kept>>,
    task: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Kept {
    events: Vec<FsEvent>,
    failed: Option<String>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A watcher's id: 16 random bytes, hex.
fn new_watcher_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

fn fs_event(event: WatchEvent) -> Option<FsEvent> {
    let kind = match event.op.as_str() {
        "create" => FsEventKind::Create,
        "write" => FsEventKind::Write,
        "remove" => FsEventKind::Remove,
        "rename" => FsEventKind::Rename,
        "chmod" => FsEventKind::Chmod,
        _ => return None,
    };
    Some(FsEvent {
        name: event.name,
        kind,
        entry: event.entry.map(entry_info),
    })
}

/// Processes by pid.
type Table = Mutex<HashMap<u32, Arc<Proc>>>;

fn locked(table: &Table) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Proc>>> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One process started through the API.
struct Proc {
    listing: ProcessListing,
    pty: bool,
    stdin: tokio::sync::Mutex<Option<DataWriter>>,
    killer: ProcessKiller,
    watchers: Mutex<Watchers>,
}

#[derive(Default)]
struct Watchers {
    streams: Vec<mpsc::Sender<ProcessEvent>>,
    ended: Option<ProcessEnd>,
}

impl Proc {
    fn watchers(&self) -> std::sync::MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `event` to every attached stream, waiting for slow readers; streams whose
    /// reader went away are dropped.
    async fn fan_out(&self, event: ProcessEvent) {
        let streams = self.watchers().streams.clone();
        let mut gone = Vec::new();
        for stream in &streams {
            if stream.send(event.clone()).await.is_err() {
                gone.push(stream.clone());
            }
        }
        if !gone.is_empty() {
            self.watchers()
                .streams
                .retain(|s| !gone.iter().any(|g| g.same_channel(s)));
        }
    }
}

impl Envd {
    pub(super) fn new(client: AgentClient, log: Arc<SandboxLog>) -> Arc<Self> {
        Arc::new(Self {
            log,
            client,
            processes: Arc::new(Mutex::new(HashMap::new())),
            watchers: Mutex::new(HashMap::new()),
        })
    }

    fn watchers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Watcher>>> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Proc>>> {
        locked(&self.processes)
    }

    fn find(&self, selector: &ProcessSelector) -> Result<Arc<Proc>, EnvdError> {
        let table = self.table();
        let found = match selector {
            ProcessSelector::Pid(pid) => table.get(pid).cloned(),
            ProcessSelector::Tag(tag) => table
                .values()
                .find(|p| p.listing.tag.as_deref() == Some(tag.as_str()))
                .cloned(),
        };
        found.ok_or_else(|| EnvdError::NotFound(format!("{selector} not found")))
    }
}

/// Reads the process's output until both streams end, then reports its end (and logs it)
/// and forgets it.
async fn pump(
    table: Arc<Table>,
    proc: Arc<Proc>,
    mut process: DuplexProcess,
    log: Arc<SandboxLog>,
) {
    let (mut stdout, mut stderr) = (process.stdout.take(), process.stderr.take());
    loop {
        let event = tokio::select! {
            chunk = next_chunk(&mut stdout), if stdout.is_some() => match chunk {
                Some(bytes) if proc.pty => ProcessEvent::Pty(bytes),
                Some(bytes) => ProcessEvent::Stdout(bytes),
                None => { stdout = None; continue; }
            },
            chunk = next_chunk(&mut stderr), if stderr.is_some() => match chunk {
                Some(bytes) => ProcessEvent::Stderr(bytes),
                None => { stderr = None; continue; }
            },
            else => break,
        };
        proc.fan_out(event).await;
    }
    proc.stdin.lock().await.take();
    let end = end_of(process.wait().await);
    log_end(&log, proc.listing.pid, &end);
    let streams = {
        let mut watchers = proc.watchers();
        watchers.ended = Some(end.clone());
        std::mem::take(&mut watchers.streams)
    };
    locked(&table).remove(&proc.listing.pid);
    for stream in streams {
        let end = ProcessEvent::End(end.clone());
        // A reader that stopped reading must not hold the others' ends back.
        tokio::spawn(async move { stream.send(end).await });
    }
}

impl Envd {
    /// The absolute form of `path` for `user`.
    fn absolute(path: &str, user: Option<&str>) -> Result<String, EnvdError> {
        if path.is_empty() {
            return Err(EnvdError::InvalidArgument("path is required".into()));
        }
        if path.contains('\0') {
            return Err(EnvdError::InvalidArgument(
                "path contains a NUL byte".into(),
            ));
        }
        if path.starts_with('/') {
            return Ok(path.to_owned());
        }
        let home = home_of(user.unwrap_or(DEFAULT_USER));
        let rest = path
            .strip_prefix('~')
            .map_or(path, |r| r.trim_start_matches('/'));
        Ok(if rest.is_empty() {
            home
        } else {
            format!("{home}/{rest}")
        })
    }

    async fn entry(&self, path: &str) -> Result<EntryInfo, EnvdError> {
        let stat = self.client.stat(path).await.map_err(envd_error)?;
        Ok(entry_info(stat))
    }
}

/// An agent's `stat` as E2B's `EntryInfo`.
fn entry_info(stat: omabox_agent::FileStat) -> EntryInfo {
    EntryInfo {
        name: file_name(&stat.path),
        kind: file_type(stat.kind),
        size: stat.size,
        mode: stat.mode & 0o7777,
        owner: stat.owner.unwrap_or_else(|| stat.uid.to_string()),
        group: stat.group.unwrap_or_else(|| stat.gid.to_string()),
        modified: modified(stat.mtime_ms),
        symlink_target: stat.link_target,
        path: stat.path,
    }
}

fn modified(mtime_ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(mtime_ms).unwrap_or(0))
}

fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or_default().to_owned()
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::File,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        _ => FileType::Other,
    }
}

async fn next_chunk(reader: &mut Option<omabox_agent::DataReader>) -> Option<Bytes> {
    match reader.as_mut()?.chunk().await {
        Ok(Some(bytes)) => Some(bytes),
        Ok(None) | Err(_) => None,
    }
}

/// Go's name of a signal (`signal: killed`), which E2B's status shows.
fn signal_text(signal: &str) -> String {
    match signal {
        "SIGKILL" => "killed".into(),
        "SIGTERM" => "terminated".into(),
        "SIGINT" => "interrupt".into(),
        "SIGHUP" => "hangup".into(),
        "SIGPIPE" => "broken pipe".into(),
        "SIGSEGV" => "segmentation fault".into(),
        "SIGABRT" => "aborted".into(),
        other => other.to_lowercase(),
    }
}

fn end_of(exit: Result<ProcessExit, ClientError>) -> ProcessEnd {
    match exit {
        Ok(exit) => {
            let error = if exit.output_truncated {
                Some("a child kept the output open after the process exited; the rest of its output was not read".to_owned())
            } else {
                None
            };
            match (exit.code, exit.signal) {
                (Some(code), _) => ProcessEnd {
                    exit_code: code,
                    exited: true,
                    status: format!("exit status {code}"),
                    error,
                },
                (None, signal) => ProcessEnd {
                    exit_code: -1,
                    exited: false,
                    status: format!(
                        "signal: {}",
                        signal_text(signal.as_deref().unwrap_or("unknown"))
                    ),
                    error,
                },
            }
        }
        Err(error) => ProcessEnd {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some(capped(&error.to_string())),
        },
    }
}

/// Logs a process's start: its command and the names (never the values) of its variables.
fn log_start(log: &SandboxLog, listing: &ProcessListing, user: &str) {
    let config = &listing.config;
    let command = std::iter::once(config.cmd.as_str())
        .chain(config.args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    let names: Vec<&str> = config.envs.keys().map(String::as_str).collect();
    let mut fields = vec![
        ("event", "process_start".to_owned()),
        ("pid", listing.pid.to_string()),
        ("cmd", command.clone()),
        ("user", user.to_owned()),
        ("envNames", names.join(",")),
    ];
    if let Some(tag) = &listing.tag {
        fields.push(("tag", tag.clone()));
    }
    let message = format!("process {} started as {user}: {command}", listing.pid);
    log.push(LogLevel::Info, &message, &fields);
}

/// Logs a process's end: its exit code, or the signal that ended it.
fn log_end(log: &SandboxLog, pid: u32, end: &ProcessEnd) {
    let (level, message) = if end.exited {
        let level = if end.exit_code == 0 {
            LogLevel::Info
        } else {
            LogLevel::Warn
        };
        (
            level,
            format!("process {pid} exited with code {}", end.exit_code),
        )
    } else {
        (
            LogLevel::Warn,
            format!("process {pid} ended: {}", end.status),
        )
    };
    let fields = [
        ("event", "process_end".to_owned()),
        ("pid", pid.to_string()),
        ("exitCode", end.exit_code.to_string()),
        ("status", end.status.clone()),
    ];
    log.push(level, &message, &fields);
}

fn capped(text: &str) -> String {
    let mut shown: String = text.chars().take(MAX_MESSAGE).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

/// The envd error of an agent failure (its message capped: the agent runs inside the
/// sandbox).
fn envd_error(error: ClientError) -> EnvdError {
    let message = match &error {
        ClientError::Remote(remote) => capped(&remote.message),
        other => capped(&other.to_string()),
    };
    match (error.remote_kind(), &error) {
        (Some(ErrorKind::NotFound), _) => EnvdError::NotFound(message),
        (Some(ErrorKind::PermissionDenied), _) => EnvdError::PermissionDenied(message),
        (Some(ErrorKind::AlreadyExists), _) => EnvdError::AlreadyExists(message),
        (Some(ErrorKind::InvalidRequest | ErrorKind::UnsafePath), _) => {
            EnvdError::InvalidArgument(message)
        }
        (Some(ErrorKind::NoSpace), _) => EnvdError::NoSpace(message),
        (Some(ErrorKind::Unsupported), _) => EnvdError::Unimplemented(message),
        (_, ClientError::ConnectionLost { .. }) => EnvdError::Unavailable(message),
        (_, ClientError::Unsupported { .. }) => EnvdError::Unimplemented(message),
        _ => EnvdError::Internal(message),
    }
}

#[async_trait]
impl SandboxEnvd for Envd {
    async fn start(&self, request: StartProcess) -> Result<ProcessEvents, EnvdError> {
        if self.table().len() >= MAX_PROCESSES {
            return Err(EnvdError::ResourceExhausted(format!(
                "this sandbox already runs {MAX_PROCESSES} processes started through the API"
            )));
        }
        let config = request.config.clone();
        let user = request.user.as_deref().unwrap_or(DEFAULT_USER);
        let envs = config
            .envs
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())));
        let argv = std::iter::once(config.cmd.clone()).chain(config.args.clone());
        let mut exec = ExecRequest::argv(argv).envs(envs.collect()).user(user);
        if let Some(size) = request.pty {
            exec = exec.pty(size.cols, size.rows);
        }
        // Without a cwd the agent starts it in the user's home.
        if let Some(cwd) = &config.cwd {
            exec = exec.cwd(Self::absolute(cwd, Some(user))?);
        }
        let mut process = self.client.spawn(exec).await.map_err(envd_error)?;
        // A terminal always takes input (its stdin is the terminal).
        let stdin = process
            .stdin
            .take()
            .filter(|_| request.stdin || request.pty.is_some());
        let pid = process.pid();
        let (sender, events) = mpsc::channel(STREAM_QUEUE);
        let _ = sender.try_send(ProcessEvent::Start { pid });
        let proc = Arc::new(Proc {
            listing: ProcessListing {
                config,
                pid,
                tag: request.tag,
            },
            pty: request.pty.is_some(),
            stdin: tokio::sync::Mutex::new(stdin),
            killer: process.killer(),
            watchers: Mutex::new(Watchers {
                streams: vec![sender],
                ended: None,
            }),
        });
        self.table().insert(pid, Arc::clone(&proc));
        log_start(&self.log, &proc.listing, user);
        tokio::spawn(pump(
            Arc::clone(&self.processes),
            proc,
            process,
            Arc::clone(&self.log),
        ));
        Ok(events)
    }

    async fn connect(&self, selector: ProcessSelector) -> Result<ProcessEvents, EnvdError> {
        let proc = self.find(&selector)?;
        let (sender, events) = mpsc::channel(STREAM_QUEUE);
        let _ = sender.try_send(ProcessEvent::Start {
            pid: proc.listing.pid,
        });
        let mut watchers = proc.watchers();
        if let Some(end) = &watchers.ended {
            let _ = sender.try_send(ProcessEvent::End(end.clone()));
            return Ok(events);
        }
        if watchers.streams.len() >= MAX_SUBSCRIBERS {
            return Err(EnvdError::ResourceExhausted(format!(
                "{selector} already has {MAX_SUBSCRIBERS} streams attached"
            )));
        }
        watchers.streams.push(sender);
        Ok(events)
    }

    fn list(&self) -> Vec<ProcessListing> {
        let mut listed: Vec<ProcessListing> = self
            .table()
            .values()
            .filter(|p| p.watchers().ended.is_none())
            .map(|p| p.listing.clone())
            .collect();
        listed.sort_by_key(|p| p.pid);
        listed
    }

    async fn send_input(
        &self,
        selector: ProcessSelector,
        data: Bytes,
        _pty: bool,
    ) -> Result<(), EnvdError> {
        let proc = self.find(&selector)?;
        let mut stdin = proc.stdin.lock().await;
        let writer = stdin.as_mut().ok_or_else(|| {
            EnvdError::InvalidArgument(format!(
                "{selector} has no open stdin (start it with stdin, and do not close it)"
            ))
        })?;
        writer.send(data).await.map_err(envd_error)
    }

    async fn close_stdin(&self, selector: ProcessSelector) -> Result<(), EnvdError> {
        let proc = self.find(&selector)?;
        if let Some(mut writer) = proc.stdin.lock().await.take() {
            writer.close();
        }
        Ok(())
    }

    fn send_signal(&self, selector: ProcessSelector, kill: bool) -> Result<(), EnvdError> {
        let proc = self.find(&selector)?;
        let signal = if kill { "SIGKILL" } else { "SIGTERM" };
        proc.killer.kill(signal).map_err(envd_error)
    }

    fn resize(&self, selector: ProcessSelector, size: PtySize) -> Result<(), EnvdError> {
        let proc = self.find(&selector)?;
        if !proc.pty {
            return Err(EnvdError::InvalidArgument(format!(
                "{selector} does not run in a terminal"
            )));
        }
        proc.killer.resize(size.cols, size.rows).map_err(envd_error)
    }

    async fn stat(&self, path: &str, user: Option<&str>) -> Result<EntryInfo, EnvdError> {
        self.entry(&Self::absolute(path, user)?).await
    }

    async fn make_dir(
        &self,
        path: &str,
        user: Option<&str>,
    ) -> Result<Option<EntryInfo>, EnvdError> {
        let path = Self::absolute(path, user)?;
        let owner = user.unwrap_or(DEFAULT_USER);
        let created = self
            .client
            .make_dir(&path, Some(owner))
            .await
            .map_err(envd_error)?;
        if !created {
            return Ok(None);
        }
        self.entry(&path).await.map(Some)
    }

    async fn rename(
        &self,
        from: &str,
        to: &str,
        user: Option<&str>,
    ) -> Result<EntryInfo, EnvdError> {
        let (from, to) = (Self::absolute(from, user)?, Self::absolute(to, user)?);
        self.client.rename(&from, &to).await.map_err(envd_error)?;
        self.entry(&to).await
    }

    async fn list_dir(
        &self,
        path: &str,
        depth: u32,
        user: Option<&str>,
    ) -> Result<Vec<EntryInfo>, EnvdError> {
        let root = Self::absolute(path, user)?;
        let mut listed = Vec::new();
        let mut pending = vec![(root.trim_end_matches('/').to_owned(), 1u32)];
        while let Some((dir, level)) = pending.pop() {
            let entries = self
                .client
                .list_dir(if dir.is_empty() { "/" } else { &dir })
                .await;
            let entries = entries.map_err(envd_error)?;
            for entry in entries {
                let path = format!("{dir}/{}", entry.name);
                let kind = file_type(entry.kind);
                if kind == FileType::Directory && level < depth {
                    pending.push((path.clone(), level + 1));
                }
                listed.push(EntryInfo {
                    name: entry.name,
                    kind,
                    path,
                    size: entry.size,
                    mode: entry.mode & 0o7777,
                    owner: entry.owner.unwrap_or_else(|| entry.uid.to_string()),
                    group: entry.group.unwrap_or_else(|| entry.gid.to_string()),
                    modified: modified(entry.mtime_ms),
                    symlink_target: entry.link_target,
                });
                if listed.len() > MAX_LISTED {
                    return Err(EnvdError::ResourceExhausted(format!(
                        "more than {MAX_LISTED} entries: list fewer levels"
                    )));
                }
            }
        }
        Ok(listed)
    }

    async fn remove(&self, path: &str, user: Option<&str>) -> Result<(), EnvdError> {
        let path = Self::absolute(path, user)?;
        self.client.remove(&path).await.map_err(envd_error)
    }

    async fn watch_dir(
        &self,
        path: &str,
        options: WatchOptions,
        user: Option<&str>,
    ) -> Result<FsEvents, EnvdError> {
        let path = Self::absolute(path, user)?;
        let mut watch = self
            .client
            .watch_dir_with(&path, options.recursive, options.include_entry)
            .await
            .map_err(envd_error)?;
        let (sender, events) = mpsc::channel(STREAM_QUEUE * 8);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = watch.next() => next,
                    () = sender.closed() => return,
                };
                let item = match next {
                    Ok(Some(event)) => match fs_event(event) {
                        Some(event) => Ok(event),
                        None => continue,
                    },
                    Ok(None) => return,
                    Err(error) => Err(envd_error(error)),
                };
                let failed = item.is_err();
                if sender.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(events)
    }

    async fn create_watcher(
        &self,
        path: &str,
        options: WatchOptions,
        user: Option<&str>,
    ) -> Result<String, EnvdError> {
        if self.watchers().len() >= MAX_WATCHERS {
            return Err(EnvdError::ResourceExhausted(format!(
                "this sandbox already has {MAX_WATCHERS} watchers: remove one first"
            )));
        }
        let mut events = self.watch_dir(path, options, user).await?;
        let kept = Arc::new(Mutex::new(Kept::default()));
        let filling = Arc::clone(&kept);
        let task = tokio::spawn(async move {
            while let Some(item) = events.recv().await {
                let mut kept = filling.lock().unwrap_or_else(PoisonError::into_inner);
                match item {
                    Ok(_) if kept.events.len() >= MAX_WATCHER_EVENTS => {
                        kept.failed = Some(format!(
                            "more than {MAX_WATCHER_EVENTS} events were not fetched; the watcher stopped"
                        ));
                        return;
                    }
                    Ok(event) => kept.events.push(event),
                    Err(error) => {
                        kept.failed = Some(error.to_string());
                        return;
                    }
                }
            }
        })
        .abort_handle();
        let id = new_watcher_id();
        self.watchers()
            .insert(id.clone(), Arc::new(Watcher { kept, task }));
        Ok(id)
    }

    fn watcher_events(&self, watcher_id: &str) -> Result<Vec<FsEvent>, EnvdError> {
        let watcher = self.watchers().get(watcher_id).cloned().ok_or_else(|| {
            EnvdError::NotFound(format!("watcher {:?} not found", capped(watcher_id)))
        })?;
        let mut kept = watcher.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(failed) = kept.failed.take() {
            drop(kept);
            self.watchers().remove(watcher_id);
            return Err(EnvdError::Internal(failed));
        }
        Ok(std::mem::take(&mut kept.events))
    }

    fn remove_watcher(&self, watcher_id: &str) -> Result<(), EnvdError> {
        self.watchers().remove(watcher_id).map(drop).ok_or_else(|| {
            EnvdError::NotFound(format!("watcher {:?} not found", capped(watcher_id)))
        })
    }

    async fn read_file(&self, path: &str, user: Option<&str>) -> Result<FileDownload, EnvdError> {
        let path = Self::absolute(path, user)?;
        let file = self.client.open_file(&path).await.map_err(envd_error)?;
        let content = futures::stream::unfold(Some(file.content), |reader| async move {
            let mut reader = reader?;
            match reader.chunk().await {
                Ok(Some(bytes)) => Some((Ok(bytes), Some(reader))),
                Ok(None) => None,
                Err(error) => Some((Err(envd_error(error)), None)),
            }
        });
        Ok(FileDownload {
            size: file.size,
            content: Box::pin(content),
        })
    }

    async fn write_file(
        &self,
        path: &str,
        user: Option<&str>,
        body: UploadBody<'_>,
    ) -> Result<EntryInfo, EnvdError> {
        let path = Self::absolute(path, user)?;
        let written = self
            .client
            .write_file_from(
                &path,
                body,
                WriteOptions {
                    owner: Some(user.unwrap_or(DEFAULT_USER).to_owned()),
                    ..WriteOptions::default()
                },
            )
            .await
            .map_err(envd_error)?;
        self.entry(&written).await
    }
}
