//! The foreground runsc of a sandbox, shared between the sandbox and its port.

use std::sync::Arc;

/// How long a lost connection's account waits for runsc's exit to be waitable.
const EXIT_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// The foreground runsc of a sandbox, shared between the sandbox and its port.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunscSlot(Arc<std::sync::Mutex<RunscState>>);

#[derive(Debug, Default)]
struct RunscState {
    child: Option<std::process::Child>,
    /// Set once omabox itself ends the container.
    ending: bool,
}

impl RunscSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunscState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn set(&self, child: std::process::Child) {
        let mut state = self.lock();
        state.child = Some(child);
        state.ending = false;
    }

    pub(crate) fn take(&self) -> Option<std::process::Child> {
        let mut state = self.lock();
        state.ending = true;
        state.child.take()
    }

    /// Whether runsc ended by SIGKILL without omabox ending the container. Asked when the
    /// agent's connection was lost: runsc holds the container's stdout, so it is ending
    /// then, though its exit may not be waitable yet (its files close before it becomes a
    /// zombie): waits up to [`EXIT_SETTLE`] for it.
    pub(crate) fn killed_from_outside(&self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let deadline = std::time::Instant::now() + EXIT_SETTLE;
        loop {
            let mut state = self.lock();
            if state.ending {
                return false;
            }
            let Some(child) = state.child.as_mut() else {
                return false;
            };
            match child.try_wait() {
                Ok(Some(s)) => {
                    return s.code() == Some(137) || s.signal() == Some(libc::SIGKILL);
                }
                Ok(None) if std::time::Instant::now() < deadline => {}
                _ => return false,
            }
            drop(state);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
