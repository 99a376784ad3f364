//! Events of removed epoll registrations never reach tokio.
//!
//! runsc 0.0~20240729 (Debian 13's) brings back, on restore, epoll registrations that
//! were removed before the checkpoint: its `EpollInstance.ReadEvents` leaves the interests
//! it examined linked to one another after dropping them from its ready list, so a removed
//! interest stays reachable from a live one, is saved with it, and is made ready again by
//! `epollInterest.afterLoad`. The first `epoll_wait` after the restore then reports it,
//! with the user data it was added with: for tokio, a pointer to a registration it freed
//! when the descriptor was closed (seen with runsc's strace: `EPOLLHUP` for two pipes of a
//! command that had ended before the pause). tokio then writes through a dangling pointer:
//! the restored init hung on a futex, panicked on a debug assertion, or crashed.
//!
//! So every `epoll_ctl` and `epoll_wait` of this process goes through here (the linker's
//! `--wrap`, build.rs): the data of each added descriptor is remembered, a removal moves
//! that data to the removed set, and `epoll_wait` drops events carrying removed data. On
//! Linux such an event is never delivered, so nothing real is dropped; data added again
//! (the allocator reuses the address) leaves the removed set.
//!
//! The init has one epoll instance (tokio's; mio polls it through a duplicate descriptor),
//! so registrations are keyed by the registered descriptor alone.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

/// Removed data kept at most (the allocator reuses addresses, so the set stays small; past
/// this a removal is no longer remembered).
const MAX_REMOVED: usize = 1 << 16;

#[derive(Default)]
struct Registrations {
    /// Registered descriptor → its data.
    data: HashMap<i32, u64>,
    /// Data of removed registrations.
    removed: HashSet<u64>,
}

static REGISTRATIONS: Mutex<Option<Registrations>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Registrations) -> T) -> T {
    let mut guard = REGISTRATIONS.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(Registrations::default))
}

unsafe extern "C" {
    fn __real_epoll_ctl(
        epfd: libc::c_int,
        op: libc::c_int,
        fd: libc::c_int,
        event: *mut libc::epoll_event,
    ) -> libc::c_int;
    fn __real_epoll_wait(
        epfd: libc::c_int,
        events: *mut libc::epoll_event,
        maxevents: libc::c_int,
        timeout: libc::c_int,
    ) -> libc::c_int;
}

/// `epoll_ctl`, remembering what is added and removed.
///
/// # Safety
/// As `epoll_ctl(2)`: `event` is valid for ADD and MOD.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __wrap_epoll_ctl(
    epfd: libc::c_int,
    op: libc::c_int,
    fd: libc::c_int,
    event: *mut libc::epoll_event,
) -> libc::c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let rc = unsafe { __real_epoll_ctl(epfd, op, fd, event) };
    if rc != 0 {
        return rc;
    }
    match op {
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD if !event.is_null() => {
            // SAFETY: the kernel just read the same event.
            let data = unsafe { (*event).u64 };
            with(|r| {
                r.removed.remove(&data);
                r.data.insert(fd, data);
            });
        }
        libc::EPOLL_CTL_DEL => with(|r| {
            if let Some(data) = r.data.remove(&fd)
                && r.removed.len() < MAX_REMOVED
            {
                r.removed.insert(data);
            }
        }),
        _ => {}
    }
    rc
}

/// `epoll_wait`, without the events of removed registrations.
///
/// # Safety
/// As `epoll_wait(2)`: `events` is valid for `maxevents` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __wrap_epoll_wait(
    epfd: libc::c_int,
    events: *mut libc::epoll_event,
    maxevents: libc::c_int,
    timeout: libc::c_int,
) -> libc::c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let n = unsafe { __real_epoll_wait(epfd, events, maxevents, timeout) };
    if n <= 0 {
        return n;
    }
    // SAFETY: the kernel wrote `n` (≤ maxevents) events there.
    let got = unsafe { std::slice::from_raw_parts_mut(events, n as usize) };
    let kept = with(|r| {
        if r.removed.is_empty() {
            return got.len();
        }
        let mut kept = 0;
        for i in 0..got.len() {
            let data = got[i].u64;
            if !r.removed.contains(&data) {
                got[kept] = got[i];
                kept += 1;
            }
        }
        kept
    });
    kept as libc::c_int
}
