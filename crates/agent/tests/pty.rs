//! Processes in a pseudo-terminal (`ExecRequest::pty`), against the agent in-process and
//! as a child process: a terminal on stdin/stdout/stderr, one output stream, typed input,
//! resize, kill, size limits, and the master never reaching a process.

mod common;

use std::time::Duration;

use common::Harness;
use omabox_agent::{ClientError, DataReader, ErrorKind, ExecRequest};

/// Reads `out` until it holds `want` (or ends); returns everything read.
async fn read_until(out: &mut DataReader, want: &str) -> String {
    let mut text = String::new();
    let read = async {
        while !text.contains(want) {
            match out.chunk().await.expect("read") {
                Some(b) => text.push_str(&String::from_utf8_lossy(&b)),
                None => break,
            }
        }
    };
    // Bounds a hang only; nothing asserts how fast the output came.
    let _ = tokio::time::timeout(Duration::from_secs(30), read).await;
    assert!(text.contains(want), "waited for {want:?}, got {text:?}");
    text
}

async fn a_terminal_process_has_a_terminal(h: Harness) {
    assert!(h.client.supports("pty"), "{:?}", h.client.agent_hello().ops);
    let script = "tty; stty size; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-three-ttys; \
                  set -- $(cat /proc/$$/stat); [ $1 = $5 ] && [ $1 = $6 ] && echo session-leader; \
                  echo TERM=$TERM; echo to-stderr >&2; echo hi";
    let out = h
        .client
        .exec(ExecRequest::shell(script).pty(80, 24))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.success(), "{text}");
    for want in [
        "/dev/pts/",
        "24 80",
        "all-three-ttys",
        "session-leader",
        "TERM=xterm-256color",
        "to-stderr",
        "hi\r\n",
    ] {
        assert!(text.contains(want), "no {want:?} in {text:?}");
    }
    assert!(out.stderr.is_empty(), "{:?}", out.stderr);

    // The request's TERM wins over the default.
    let out = h
        .client
        .exec(
            ExecRequest::shell("echo TERM=$TERM")
                .pty(100, 30)
                .env("TERM", "vt100"),
        )
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("TERM=vt100"));

    // Without `pty` nothing changed: pipes, separate stderr, no TERM forced.
    let out = h
        .client
        .exec(ExecRequest::shell("tty; echo TERM=${TERM-unset}; echo err >&2").env_remove("TERM"))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"not a tty\nTERM=unset\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.exit.code, Some(0));
}
both_modes!(a_terminal_process_has_a_terminal);

async fn typed_input_comes_back_and_closing_stdin_sends_nothing(h: Harness) {
    let mut cat = h
        .client
        .spawn(ExecRequest::program("cat").pty(80, 24))
        .await
        .unwrap();
    let mut stdin = cat.stdin.take().unwrap();
    let mut stdout = cat.stdout.take().unwrap();
    let mut stderr = cat.stderr.take().unwrap();
    stdin.write_all(b"typed\n").await.unwrap();
    // The terminal echoes the line, then cat writes it back.
    let text = read_until(&mut stdout, "typed\r\ntyped\r\n").await;
    assert_eq!(text, "typed\r\ntyped\r\n");
    // A terminal has no eof: closing stdin leaves cat running until it is killed.
    stdin.close();
    cat.kill("SIGKILL").unwrap();
    assert!(stdout.read_to_end().await.unwrap().is_empty());
    assert!(stderr.read_to_end().await.unwrap().is_empty());
    let exit = cat.wait().await.unwrap();
    assert_eq!(exit.signal.as_deref(), Some("SIGKILL"), "{exit:?}");

    // ^D is the terminal's end of file.
    let mut cat = h
        .client
        .spawn(ExecRequest::program("cat").pty(80, 24))
        .await
        .unwrap();
    let mut stdin = cat.stdin.take().unwrap();
    stdin.write_all(b"\x04").await.unwrap();
    let exit = cat.wait().await.unwrap();
    assert_eq!(exit.code, Some(0), "{exit:?}");
}
both_modes!(typed_input_comes_back_and_closing_stdin_sends_nothing);

async fn all_of_a_terminals_output_arrives_before_the_exit(h: Harness) {
    // The master is read until the kernel says every holder closed the terminal (EIO);
    // nothing the process wrote just before exiting is lost.
    for _ in 0..20 {
        let out = h
            .client
            .exec(ExecRequest::shell("seq 1 100000; exit 3").pty(80, 24))
            .await
            .unwrap();
        assert_eq!(out.exit.code, Some(3), "{:?}", out.exit);
        assert!(!out.exit.output_truncated);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().count(), 100_000);
        assert!(
            text.ends_with("\n99999\r\n100000\r\n"),
            "{:?}",
            &text[text.len() - 40..]
        );
    }
}
both_modes!(all_of_a_terminals_output_arrives_before_the_exit);

async fn a_resize_reaches_the_terminal(h: Harness) {
    let mut sh = h
        .client
        .spawn(ExecRequest::shell("stty size; read a; stty size; read b; stty size").pty(80, 24))
        .await
        .unwrap();
    let mut stdin = sh.stdin.take().unwrap();
    let mut stdout = sh.stdout.take().unwrap();
    read_until(&mut stdout, "24 80").await;
    // The resize is applied before the next input reaches the terminal (one ordered
    // queue per stream), so the `stty size` this line releases sees it.
    let killer = sh.killer();
    killer.resize(132, 43).unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    read_until(&mut stdout, "43 132").await;

    // Out-of-range sizes are refused before they are sent; the process lives on.
    for (cols, rows) in [(0, 10), (10, 0), (1001, 10), (10, 1001)] {
        let err = killer.resize(cols, rows).unwrap_err();
        assert!(
            matches!(err, ClientError::InvalidPtySize { .. }),
            "{cols}x{rows}: {err}"
        );
    }
    sh.resize(1000, 1).unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    read_until(&mut stdout, "1 1000").await;
    assert!(sh.wait().await.unwrap().success());

    // The kernel tells the terminal's foreground group (SIGWINCH).
    let mut sh = h
        .client
        .spawn(
            ExecRequest::shell(
                "trap 'echo winch; stty size' WINCH; echo ready; while :; do sleep 1; done",
            )
            .pty(80, 24),
        )
        .await
        .unwrap();
    let mut stdout = sh.stdout.take().unwrap();
    read_until(&mut stdout, "ready").await;
    sh.resize(90, 33).unwrap();
    read_until(&mut stdout, "winch\r\n33 90").await;
    sh.kill("SIGKILL").unwrap();
    sh.wait().await.unwrap();

    // A resize of a process without a terminal is ignored.
    let mut cat = h.client.spawn(ExecRequest::program("cat")).await.unwrap();
    cat.resize(100, 50).unwrap();
    let mut stdin = cat.stdin.take().unwrap();
    stdin.write_all(b"still here\n").await.unwrap();
    stdin.close();
    let out = cat.stdout.take().unwrap().read_to_end().await.unwrap();
    assert_eq!(out, b"still here\n");
    assert!(cat.wait().await.unwrap().success());
}
both_modes!(a_resize_reaches_the_terminal);

async fn a_terminal_process_is_killed_and_times_out(h: Harness) {
    let mut p = h
        .client
        .spawn(ExecRequest::shell("sleep 300").pty(80, 24))
        .await
        .unwrap();
    p.killer().kill("SIGTERM").unwrap();
    let exit = p.wait().await.unwrap();
    assert_eq!(exit.signal.as_deref(), Some("SIGTERM"), "{exit:?}");

    let out = h
        .client
        .exec(
            ExecRequest::shell("echo started; sleep 300")
                .pty(80, 24)
                .timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert!(out.exit.timed_out, "{:?}", out.exit);
    assert!(String::from_utf8_lossy(&out.stdout).contains("started"));

    let p = h
        .client
        .spawn(ExecRequest::shell("echo $$; exec sleep 300").pty(80, 24))
        .await
        .unwrap();
    let pid = p.pid();
    drop(p);
    common::eventually("an abandoned terminal process is killed", || async move {
        common::proc_state(pid).is_none_or(|(s, _)| s == 'Z')
    })
    .await;
}
both_modes!(a_terminal_process_is_killed_and_times_out);

async fn out_of_range_sizes_and_background_terminals_are_refused(h: Harness) {
    for (cols, rows) in [(0, 24), (80, 0), (1001, 24), (80, 1001)] {
        let err = h
            .client
            .spawn(ExecRequest::program("true").pty(cols, rows))
            .await
            .unwrap_err();
        assert_eq!(err.remote_kind(), Some(ErrorKind::InvalidRequest), "{err}");
        assert!(err.to_string().contains("1..=1000"), "{err}");
    }
    let err = h
        .client
        .start_background(ExecRequest::program("true").pty(80, 24))
        .await
        .unwrap_err();
    assert_eq!(err.remote_kind(), Some(ErrorKind::InvalidRequest), "{err}");
    assert!(h.client.ping().await.is_ok());
}
both_modes!(out_of_range_sizes_and_background_terminals_are_refused);

async fn the_master_reaches_no_process(h: Harness) {
    // While a terminal is open in the agent, neither the terminal's own process nor any
    // other process started meanwhile holds its master (`/dev/ptmx`).
    let mut cat = h
        .client
        .spawn(ExecRequest::program("cat").pty(80, 24))
        .await
        .unwrap();
    let fds = "ls -l /proc/self/fd/";
    let plain = h.client.exec(fds).await.unwrap();
    let text = plain.combined();
    assert!(plain.success() && !text.contains("ptmx"), "{text}");
    let in_pty = h
        .client
        .exec(ExecRequest::shell(fds).pty(80, 24))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&in_pty.stdout);
    assert!(
        in_pty.success() && text.contains("/dev/pts/") && !text.contains("ptmx"),
        "{text}"
    );
    cat.kill("SIGKILL").unwrap();
    cat.wait().await.unwrap();
}
both_modes!(the_master_reaches_no_process);

async fn an_interactive_shell_gets_job_control(h: Harness) {
    // What E2B's `pty.create` runs: an interactive bash. With the terminal as its
    // controlling terminal it takes job control (else it says "no job control").
    let mut bash = h
        .client
        .spawn(
            ExecRequest::argv(["bash", "--norc", "--noprofile", "-i"])
                .pty(80, 24)
                .env("PS1", "prompt$ "),
        )
        .await
        .unwrap();
    let mut stdin = bash.stdin.take().unwrap();
    let mut stdout = bash.stdout.take().unwrap();
    stdin
        .write_all(b"case $- in *m*) echo monitor-on;; esac; exit 7\n")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&stdout.read_to_end().await.unwrap()).into_owned();
    assert!(!text.contains("job control"), "{text}");
    assert!(text.contains("prompt$ "), "{text}");
    assert!(text.contains("monitor-on\r\n"), "{text}");
    let exit = bash.wait().await.unwrap();
    assert_eq!(exit.code, Some(7), "{exit:?}: {text}");
    assert!(!exit.output_truncated);
}
both_modes!(an_interactive_shell_gets_job_control);

async fn killing_a_terminal_ends_its_shells_background_jobs(h: Harness) {
    // An interactive shell puts each job in a process group of its own: a kill of the
    // terminal's process group alone would leave them running.
    let mut bash = h
        .client
        .spawn(
            ExecRequest::argv(["bash", "--norc", "--noprofile", "-i"])
                .pty(80, 24)
                .env("PS1", "prompt$ "),
        )
        .await
        .unwrap();
    let mut stdin = bash.stdin.take().unwrap();
    let mut stdout = bash.stdout.take().unwrap();
    stdin
        // Markers computed by the shell, so the terminal's echo of the line never matches.
        .write_all(
            b"sleep 300 & set -- $(cat /proc/$!/stat); echo J$((1+1))=$! G$((1+1))=$5 E$((1+1))\n",
        )
        .await
        .unwrap();
    let text = read_until(&mut stdout, "E2").await;
    let field = |name: &str| -> i32 {
        let start = text.find(name).unwrap() + name.len();
        let digits: String = text[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    let (job, group) = (field("J2="), field("G2="));
    assert_eq!(job, group, "the job leads a group of its own: {text}");
    assert_ne!(group as u32, bash.pid(), "{text}");
    bash.killer().kill("SIGKILL").unwrap();
    let exit = bash.wait().await.unwrap();
    assert_eq!(exit.signal.as_deref(), Some("SIGKILL"), "{exit:?}");
    common::eventually(
        "the shell's background job is killed with it",
        || async move { common::proc_state(job as u32).is_none_or(|(s, _)| s == 'Z') },
    )
    .await;
}
both_modes!(killing_a_terminal_ends_its_shells_background_jobs);
