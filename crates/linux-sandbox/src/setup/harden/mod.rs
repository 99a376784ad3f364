//! Hardening of the setup stage before it becomes the agent: rlimits, capabilities,
//! securebits, no_new_privs, dumpable, Landlock, seccomp. Applied in that order, seccomp
//! last, so each step still has the rights the next one needs.
//!
//! One file per concern: `caps` (capabilities, securebits, no_new_privs, dumpable),
//! `landlock_rules`, `seccomp` (which syscalls and arguments are refused) and `bpf` (the
//! hand-assembled parts of the filter and the filter as installed).

mod bpf;
mod caps;
mod landlock_rules;
mod seccomp;

use std::io;

use super::SetupError;
use crate::plan::SandboxPlan;
use crate::sys;

pub(super) use bpf::seccomp;
pub use bpf::{build_program, decode_program, encode_program};
pub(super) use caps::{RootPower, drop_capabilities, no_new_privs};
pub(super) use landlock_rules::landlock;
pub use landlock_rules::landlock_abi;
pub use seccomp::build_filter;

fn err(step: &str) -> impl FnOnce(io::Error) -> SetupError + '_ {
    move |source| SetupError::Step {
        step: step.to_owned(),
        source,
    }
}

/// POSIX message queue bytes the sandbox's user may hold (the kernel's default), so a
/// host whose own limit is higher does not hand that on.
const MSGQUEUE_BYTES: u64 = 800 << 10;
/// Queued signals (real-time ones included) the sandbox's user may have pending. The
/// count is per user: without a user namespace of its own, a sandbox would otherwise
/// fill the counter its host uid shares with host processes.
const SIGPENDING: u64 = 1024;

/// Lowers `RLIMIT_NOFILE` (fd exhaustion stays inside the sandbox), `RLIMIT_MSGQUEUE`,
/// `RLIMIT_SIGPENDING` and `RLIMIT_RTPRIO` (no real-time scheduling: a spinning
/// SCHED_FIFO task would starve host tasks on its CPU whatever the CPU quota), and
/// disables core dumps.
pub(super) fn rlimits(plan: &SandboxPlan) -> Result<(), SetupError> {
    for (resource, value, step) in [
        (
            libc::RLIMIT_NOFILE,
            plan.limits.nofile,
            "lower RLIMIT_NOFILE",
        ),
        (
            libc::RLIMIT_MSGQUEUE,
            MSGQUEUE_BYTES,
            "lower RLIMIT_MSGQUEUE",
        ),
        (
            libc::RLIMIT_SIGPENDING,
            SIGPENDING,
            "lower RLIMIT_SIGPENDING",
        ),
        (libc::RLIMIT_RTPRIO, 0, "lower RLIMIT_RTPRIO"),
        (libc::RLIMIT_CORE, 0, "lower RLIMIT_CORE"),
    ] {
        sys::lower_rlimit(resource, value).map_err(err(step))?;
    }
    Ok(())
}

/// SysV IPC and POSIX mqueue limits of the sandbox's own IPC namespace (the defaults
/// allow 32,000 queues and semaphore sets and 4,096 shared memory segments). Their
/// memory is charged to the sandbox's memory cgroup anyway; these keep the object
/// counts small too. Written through `/proc/sys`, which addresses the IPC namespace of
/// the writer: the setup stage's own, created by the clone.
pub(super) fn ipc_limits() -> Result<(), SetupError> {
    for (file, value) in [
        ("/proc/sys/kernel/shmmni", "256"),
        ("/proc/sys/kernel/msgmni", "256"),
        // semmsl semmns semopm semmni
        ("/proc/sys/kernel/sem", "250 8192 32 128"),
        ("/proc/sys/fs/mqueue/queues_max", "64"),
    ] {
        std::fs::write(file, value).map_err(err(file))?;
    }
    Ok(())
}
