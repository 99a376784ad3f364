//! `omabox-gvisor-init --subreaper`: what it runs, and what that leaves behind, ends with
//! the process that started it. Needs no runsc: the program it runs is a shell.

use std::process::Command;
use std::time::{Duration, Instant};

const INIT: &str = env!("CARGO_BIN_EXE_omabox-gvisor-init");

/// Processes whose command line holds `marker`.
fn running(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

fn wait_for_none(marker: &str) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = running(marker);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn what_the_subreaper_runs_dies_with_its_parent_even_what_was_orphaned() {
    let marker = format!("9{}.25", std::process::id());
    // sh is the subreaper's parent and exits at once; below the subreaper, a shell starts
    // a sleep in the background (orphaned to the subreaper when that shell ends) and a
    // second shell that sleeps in the foreground.
    let script = format!(
        "{INIT} --subreaper /bin/sh -c 'sleep {marker} & exec sh -c \"sleep {marker}\"' >/dev/null 2>&1 </dev/null &
         sleep 0.3; echo started"
    );
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n");
    let left = wait_for_none(&marker);
    assert!(
        left.is_empty(),
        "still running after their owner died: {left:?}"
    );
}

#[test]
fn the_subreaper_reaps_what_it_runs_and_exits_with_its_status_while_its_parent_lives() {
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("orphan-done");
    let status = Command::new(INIT)
        .args(["--subreaper", "/bin/sh", "-c"])
        .arg(format!(
            "(sleep 0.3; echo done > {}) & exit 7",
            done.display()
        ))
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7), "runsc's status is the subreaper's");
    // It waited for the orphaned subshell too: it reaps every child until none is left.
    assert_eq!(
        std::fs::read_to_string(&done).unwrap_or_default(),
        "done\n",
        "the subreaper exited before the orphan it was to reap"
    );
}
