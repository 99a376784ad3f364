//! The one owner of `waitpid`.
//!
//! Spawning and registering a child happen under the same lock the reaper takes to call
//! `waitpid`, so no exit can be reaped before its pid is registered (the "spawn guard").
//! SIGCHLD coalesces, so every wake-up loops until nothing is left to reap.

use std::collections::HashMap;
use std::io;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

use super::lock;
use crate::sys::{self, RawExit};

/// Who the reaper waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReapMode {
    /// Only children this agent spawned (`waitpid(pid)`): for an agent embedded in a
    /// process that has other children of its own (tests, a host-side helper).
    #[default]
    OwnChildren,
    /// Every child (`waitpid(-1)`): for the agent as PID 1 or as a child subreaper, where
    /// orphaned descendants are reparented to it and must be reaped. Exit statuses of
    /// registered children are dispatched to their owners; orphans are discarded.
    AllChildren,
}

type Table = HashMap<i32, oneshot::Sender<RawExit>>;

#[derive(Debug)]
struct Inner {
    mode: ReapMode,
    table: Mutex<Table>,
}

#[derive(Debug)]
pub(crate) struct Reaper {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Reaper {
    pub(crate) fn start(mode: ReapMode) -> io::Result<Self> {
        let mut sigchld = signal(SignalKind::child())?;
        let inner = Arc::new(Inner {
            mode,
            table: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&inner);
        let task = tokio::spawn(async move {
            loop {
                match weak.upgrade() {
                    Some(inner) => inner.reap(),
                    None => return,
                }
                if sigchld.recv().await.is_none() {
                    return;
                }
            }
        });
        Ok(Self { inner, task })
    }

    /// Spawns `cmd` and registers its pid before the reaper can look at it.
    pub(crate) fn spawn(
        &self,
        cmd: &mut Command,
    ) -> io::Result<(Child, oneshot::Receiver<RawExit>)> {
        let mut table = lock(&self.inner.table);
        let child = cmd.spawn()?;
        let (tx, rx) = oneshot::channel();
        table.insert(child.id() as i32, tx);
        Ok((child, rx))
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Inner {
    fn reap(&self) {
        let mut table = lock(&self.table);
        match self.mode {
            // Stops at "nothing ready" and at ECHILD (no children at all).
            ReapMode::AllChildren => {
                while let Ok(Some((pid, exit))) = sys::waitpid_nohang(-1) {
                    if let Some(tx) = table.remove(&pid) {
                        let _ = tx.send(exit);
                    } else {
                        tracing::debug!(pid, ?exit, "reaped an orphan");
                    }
                }
            }
            ReapMode::OwnChildren => {
                let pids: Vec<i32> = table.keys().copied().collect();
                for pid in pids {
                    match sys::waitpid_nohang(pid) {
                        Ok(Some((_, exit))) => {
                            if let Some(tx) = table.remove(&pid) {
                                let _ = tx.send(exit);
                            }
                        }
                        Ok(None) => {}
                        // ECHILD: someone else reaped it; the owner sees a dropped sender.
                        Err(_) => {
                            table.remove(&pid);
                        }
                    }
                }
            }
        }
    }
}
