//! Process groups: every process the sandbox starts leads its own group, so a signal reaches
//! its descendants too, and destroy can kill everything that is left.

use crate::error::LocalSandboxError;
use omabox_sandbox::ProcessSignal;
use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The process groups a sandbox started and has not yet seen disappear.
#[derive(Debug, Default)]
pub(crate) struct GroupRegistry {
    state: Mutex<RegistryState>,
}

#[derive(Debug, Default)]
struct RegistryState {
    groups: BTreeSet<i32>,
    closed: bool,
}

impl GroupRegistry {
    fn lock(&self) -> MutexGuard<'_, RegistryState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails once the sandbox was destroyed.
    pub(crate) fn check_open(&self) -> Result<(), LocalSandboxError> {
        if self.lock().closed {
            Err(LocalSandboxError::Destroyed)
        } else {
            Ok(())
        }
    }

    /// Tracks a freshly spawned group. If the sandbox was destroyed meanwhile, the group is
    /// killed at once and the call fails.
    pub(crate) fn register(&self, pgid: i32) -> Result<(), LocalSandboxError> {
        let mut state = self.lock();
        if state.closed {
            drop(state);
            signal_group(pgid, libc::SIGKILL);
            return Err(LocalSandboxError::Destroyed);
        }
        state.groups.insert(pgid);
        Ok(())
    }

    /// Called when a group's leader was reaped: forget the group once no member is left
    /// (so its id, which the kernel may now reuse, is never signalled again).
    pub(crate) fn leader_exited(&self, pgid: i32) {
        if !group_exists(pgid) {
            self.lock().groups.remove(&pgid);
        }
    }

    /// Refuses new processes and `SIGKILL`s every tracked group; returns the groups it
    /// signalled. Idempotent.
    pub(crate) fn close_and_kill_all(&self) -> Vec<i32> {
        let groups = {
            let mut state = self.lock();
            state.closed = true;
            std::mem::take(&mut state.groups)
        };
        for &pgid in &groups {
            signal_group(pgid, libc::SIGKILL);
        }
        groups.into_iter().collect()
    }
}

/// Sends `signal` to every process in group `pgid`. Gone groups are not an error.
pub(crate) fn signal_group(pgid: i32, signal: libc::c_int) {
    if pgid <= 1 {
        // Never signal "every process" (-1) or our own group (0).
        return;
    }
    // The group `pgid`, which this sandbox created with setpgid.
    let (Some(group), Some(signal)) = (
        rustix::process::Pid::from_raw(pgid),
        rustix::process::Signal::from_named_raw(signal),
    ) else {
        return;
    };
    let _ = rustix::process::kill_process_group(group, signal);
}

/// True while any process (zombies included) is in group `pgid`.
pub(crate) fn group_exists(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    let Some(group) = rustix::process::Pid::from_raw(pgid) else {
        return false;
    };
    // Signal 0 only checks that the group exists.
    match rustix::process::test_kill_process_group(group) {
        Ok(()) => true,
        Err(error) => error == rustix::io::Errno::PERM,
    }
}

/// The libc number of a contract signal.
pub(crate) fn signal_number(signal: ProcessSignal) -> libc::c_int {
    match signal {
        ProcessSignal::Term => libc::SIGTERM,
        ProcessSignal::Kill => libc::SIGKILL,
        ProcessSignal::Int => libc::SIGINT,
        ProcessSignal::Hup => libc::SIGHUP,
        ProcessSignal::Quit => libc::SIGQUIT,
        ProcessSignal::Usr1 => libc::SIGUSR1,
        ProcessSignal::Usr2 => libc::SIGUSR2,
    }
}

/// The conventional name of signal `number` (`"SIGKILL"`), as Node reports it.
pub(crate) fn signal_name(number: libc::c_int) -> String {
    omabox_contract::signals::signal_name(number)
        .map_or_else(|| format!("SIG{number}"), str::to_owned)
}
