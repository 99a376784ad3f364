//! File and tar operations from the host's point of view. Content is always streamed in
//! window-sized chunks, never one giant frame.

use bytes::Bytes;
use tokio::io::AsyncRead;

use super::stream::{DataReader, DataWriter};
use super::{AgentClient, ClientError, Opened, decode_ok};
use crate::frame::channel;
use crate::message::{
    DirEntry, ErrorKind, Event, FileStat, MadeDir, Request, TarInDone, WriteDone,
};

/// The most [`AgentClient::read_file_bytes`], [`AgentClient::read_file`] and
/// [`AgentClient::tar_out_bytes`] hold in host memory: the sandbox decides how big its files
/// are, so a whole-file read is capped; the streaming forms have no cap.
pub const MAX_WHOLE_READ: usize = 64 * 1024 * 1024;

/// Options for writes.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Permission bits; `None` keeps an existing file's mode, else 0644.
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_parents: bool,
    /// Account (named in the sandbox's `/etc/passwd`) that owns the file and the parent
    /// directories the write creates; `None`: the agent's.
    pub owner: Option<String>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            mode: None,
            create_parents: true,
            owner: None,
        }
    }
}

/// A file being streamed from the agent.
#[derive(Debug)]
pub struct FileReader {
    /// Size when the agent opened it.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// The content.
    pub content: DataReader,
}

enum Source<'a> {
    Bytes(Bytes),
    Reader(&'a mut (dyn AsyncRead + Unpin + Send)),
}

impl AgentClient {
    fn reader_of(&self, o: Opened) -> (DataReader, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let reader = DataReader::new(
            self.clone(),
            o.id,
            channel::STDOUT,
            o.stdout,
            o.recv[usize::from(channel::STDOUT)].clone(),
            o.state,
            o.guard,
        );
        (reader, o.events)
    }

    /// Opens a file for streaming.
    pub async fn open_file(&self, path: &str) -> Result<FileReader, ClientError> {
        let opened = self.open(&Request::ReadFile {
            path: path.to_owned(),
        })?;
        let (content, mut events) = self.reader_of(opened);
        match self.next_event(&mut events).await? {
            Event::File { size, mode } => Ok(FileReader {
                size,
                mode,
                content,
            }),
            Event::Error(e) => Err(ClientError::Remote(e)),
            other => Err(ClientError::UnexpectedReply(format!("{other:?}"))),
        }
    }

    /// Reads a whole file as bytes, at most [`MAX_WHOLE_READ`] of them (a larger file fails
    /// with [`ClientError::TooLarge`]; stream it with [`AgentClient::open_file`] instead).
    pub async fn read_file_bytes(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let mut f = self.open_file(path).await?;
        f.content
            .read_to_end_within(MAX_WHOLE_READ)
            .await?
            .ok_or_else(|| ClientError::TooLarge {
                what: path.to_owned(),
                limit: MAX_WHOLE_READ,
            })
    }

    /// Reads a whole file as UTF-8 text.
    pub async fn read_file(&self, path: &str) -> Result<String, ClientError> {
        String::from_utf8(self.read_file_bytes(path).await?).map_err(|_| ClientError::NotUtf8 {
            path: path.to_owned(),
        })
    }

    async fn upload<T: serde::de::DeserializeOwned>(
        &self,
        req: &Request,
        src: Source<'_>,
    ) -> Result<T, ClientError> {
        let Opened {
            id,
            mut events,
            input,
            guard,
            ..
        } = self.open(req)?;
        let mut writer = DataWriter::new(self.clone(), id, input, guard);
        let sent = match src {
            Source::Bytes(b) => writer.send(b).await,
            Source::Reader(r) => writer.copy_from(r).await.map(|_| ()),
        };
        writer.close();
        // The agent's verdict wins over a local "broken pipe" (it ended the stream early
        // because it failed, and says why).
        let ev = self.next_event(&mut events).await?;
        if let (Err(e), Event::Ok { .. }) = (&sent, &ev) {
            return Err(ClientError::UnexpectedReply(format!(
                "agent accepted an upload the client could not finish: {e}"
            )));
        }
        decode_ok(ev)
    }

    /// Writes bytes to a file (atomically replaced); returns the absolute path.
    pub async fn write_file_bytes(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        opts: WriteOptions,
    ) -> Result<String, ClientError> {
        let req = Request::WriteFile {
            path: path.to_owned(),
            mode: opts.mode,
            create_parents: opts.create_parents,
            owner: opts.owner,
        };
        let done: WriteDone = self.upload(&req, Source::Bytes(data.into())).await?;
        Ok(done.path)
    }

    /// Writes text to a file; returns the absolute path.
    pub async fn write_file(&self, path: &str, content: &str) -> Result<String, ClientError> {
        self.write_file_bytes(
            path,
            Bytes::copy_from_slice(content.as_bytes()),
            WriteOptions::default(),
        )
        .await
    }

    /// Streams a local reader into a file; returns the absolute path.
    pub async fn write_file_from(
        &self,
        path: &str,
        src: &mut (dyn AsyncRead + Unpin + Send),
        opts: WriteOptions,
    ) -> Result<String, ClientError> {
        let req = Request::WriteFile {
            path: path.to_owned(),
            mode: opts.mode,
            create_parents: opts.create_parents,
            owner: opts.owner,
        };
        let done: WriteDone = self.upload(&req, Source::Reader(src)).await?;
        Ok(done.path)
    }

    /// Metadata of a path (a final symlink is not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat, ClientError> {
        self.call(&Request::Stat {
            path: path.to_owned(),
        })
        .await
    }

    /// Whether a path exists (a dangling symlink exists).
    pub async fn exists(&self, path: &str) -> Result<bool, ClientError> {
        match self.stat(path).await {
            Ok(_) => Ok(true),
            Err(e) if e.remote_kind() == Some(ErrorKind::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Directory entries sorted by name.
    pub async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, ClientError> {
        self.call(&Request::ListDir {
            path: path.to_owned(),
        })
        .await
    }

    /// Creates a directory and its missing parents (mode 0755), owned by the account
    /// `owner` names when given. `Ok(true)`: created; `Ok(false)`: it already was a
    /// directory; an existing non-directory fails with [`ErrorKind::AlreadyExists`].
    pub async fn make_dir(&self, path: &str, owner: Option<&str>) -> Result<bool, ClientError> {
        let done: MadeDir = self
            .call(&Request::MakeDir {
                path: path.to_owned(),
                owner: owner.map(str::to_owned),
            })
            .await?;
        Ok(done.created)
    }

    /// Renames a path (`rename(2)`: the new path's parent must exist).
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), ClientError> {
        self.call(&Request::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
        })
        .await
    }

    /// Removes a file, a symlink (not followed) or a directory with everything in it.
    pub async fn remove(&self, path: &str) -> Result<(), ClientError> {
        self.call(&Request::Remove {
            path: path.to_owned(),
        })
        .await
    }

    /// Streams a tar archive of a directory (modes, mtimes and symlinks preserved).
    pub fn tar_out(&self, path: &str) -> Result<DataReader, ClientError> {
        let opened = self.open(&Request::TarOut {
            path: path.to_owned(),
        })?;
        Ok(self.reader_of(opened).0)
    }

    /// A whole tar archive of a directory in memory, at most [`MAX_WHOLE_READ`] bytes (a larger
    /// one fails with [`ClientError::TooLarge`]; stream it with [`AgentClient::tar_out`]).
    pub async fn tar_out_bytes(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        self.tar_out(path)?
            .read_to_end_within(MAX_WHOLE_READ)
            .await?
            .ok_or_else(|| ClientError::TooLarge {
                what: format!("a tar archive of {path}"),
                limit: MAX_WHOLE_READ,
            })
    }

    /// Extracts a tar stream into a directory (created if missing). Entries that would
    /// leave the directory fail the whole call with [`ErrorKind::UnsafePath`].
    pub async fn tar_in(
        &self,
        path: &str,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<TarInDone, ClientError> {
        self.upload(
            &Request::TarIn {
                path: path.to_owned(),
            },
            Source::Reader(archive),
        )
        .await
    }

    /// Extracts an in-memory tar archive into a directory.
    pub async fn tar_in_bytes(
        &self,
        path: &str,
        archive: impl Into<Bytes>,
    ) -> Result<TarInDone, ClientError> {
        self.upload(
            &Request::TarIn {
                path: path.to_owned(),
            },
            Source::Bytes(archive.into()),
        )
        .await
    }
}

/// Bytes one watch event line may take (a path is at most 4096; with its entry, twice and
/// a symlink target).
const MAX_WATCH_LINE: usize = 64 * 1024;

/// A directory being watched ([`AgentClient::watch_dir`]); dropping it ends the watch.
#[derive(Debug)]
pub struct DirWatch {
    content: DataReader,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    client: AgentClient,
    pending: Vec<u8>,
}

impl DirWatch {
    /// The next change; `None` when the watch ended.
    pub async fn next(&mut self) -> Result<Option<crate::message::WatchEvent>, ClientError> {
        match self.line().await? {
            Some(line) => serde_json::from_slice(&line)
                .map(Some)
                .map_err(|e| ClientError::UnexpectedReply(format!("bad watch event: {e}"))),
            None => Ok(None),
        }
    }

    async fn line(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        loop {
            if let Some(at) = self.pending.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=at).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.pending.len() > MAX_WATCH_LINE {
                return Err(ClientError::UnexpectedReply(format!(
                    "a watch event longer than {MAX_WATCH_LINE} bytes"
                )));
            }
            match self.content.chunk().await? {
                Some(bytes) => self.pending.extend_from_slice(&bytes),
                None => {
                    return match self.client.next_event(&mut self.events).await? {
                        Event::Error(e) => Err(ClientError::Remote(e)),
                        _ => Ok(None),
                    };
                }
            }
        }
    }
}

impl AgentClient {
    /// Watches a directory (`recursive`: and every directory below it); returns once the
    /// watches are in place.
    pub async fn watch_dir(&self, path: &str, recursive: bool) -> Result<DirWatch, ClientError> {
        self.watch_dir_with(path, recursive, false).await
    }

    /// [`AgentClient::watch_dir`], each event carrying its path's metadata when
    /// `include_entry` (read by the agent; [`ClientError::Unsupported`] by an agent
    /// without the `watch_entry` feature).
    pub async fn watch_dir_with(
        &self,
        path: &str,
        recursive: bool,
        include_entry: bool,
    ) -> Result<DirWatch, ClientError> {
        if include_entry {
            self.require("watch_entry")?;
        }
        let opened = self.open(&Request::WatchDir {
            path: path.to_owned(),
            recursive,
            include_entry,
        })?;
        let (content, events) = self.reader_of(opened);
        let mut watch = DirWatch {
            content,
            events,
            client: self.clone(),
            pending: Vec::new(),
        };
        match watch.line().await? {
            Some(_started) => Ok(watch),
            None => Err(ClientError::UnexpectedReply(
                "the watch ended before it started".into(),
            )),
        }
    }
}
