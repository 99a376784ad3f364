//! Every operation, against the agent in-process and as a child process.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{Harness, eventually, pid_exists};
use omabox_agent::{BackgroundStatus, ErrorKind, ExecRequest, FileKind, WriteOptions};

async fn exec_output_and_exit_code(h: Harness) {
    let out = h
        .client
        .exec("echo hi; echo err >&2; exit 3")
        .await
        .unwrap();
    assert_eq!(out.stdout, b"hi\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.exit.code, Some(3));
    assert_eq!(out.exit.signal, None);
    assert_eq!(out.combined(), "hi\n\nerr");
    let ready = h
        .client
        .exec("echo __OPENMA_RUNTIME_READY__")
        .await
        .unwrap();
    assert!(ready.success());
    assert_eq!(ready.combined(), "__OPENMA_RUNTIME_READY__");
    let argv = h
        .client
        .exec(ExecRequest::argv(["printf", "%s|%s", "a b", "c"]))
        .await
        .unwrap();
    assert_eq!(argv.stdout, b"a b|c");
    let cwd = h.client.exec("pwd").await.unwrap();
    assert_eq!(
        cwd.combined(),
        h.dir.path().canonicalize().unwrap().to_string_lossy()
    );
}
both_modes!(exec_output_and_exit_code);

async fn a_bad_cwd_is_named(h: Harness) {
    for cwd in ["no/such/dir", "/no/such/absolute"] {
        let out = h
            .client
            .exec(ExecRequest::shell("true").cwd(cwd))
            .await
            .unwrap();
        assert_eq!(out.exit.code, Some(127));
        let text = out.combined();
        assert!(
            text.contains("working directory") && text.contains(cwd),
            "{text}"
        );
        let err = h
            .client
            .spawn(ExecRequest::shell("true").cwd(cwd))
            .await
            .unwrap_err();
        assert_eq!(err.remote_kind(), Some(ErrorKind::SpawnFailed), "{err}");
        assert!(err.to_string().contains(cwd), "{err}");
    }
    // A relative cwd says what it is relative to.
    let out = h
        .client
        .exec(ExecRequest::shell("true").cwd("missing"))
        .await
        .unwrap();
    assert!(out.combined().contains("relative to"), "{}", out.combined());
    // A file is not a working directory either.
    std::fs::write(h.dir.path().join("file"), "x").unwrap();
    let out = h
        .client
        .exec(ExecRequest::shell("true").cwd("file"))
        .await
        .unwrap();
    assert!(
        out.combined().contains("working directory"),
        "{}",
        out.combined()
    );
}
both_modes!(a_bad_cwd_is_named);

async fn exec_missing_binary(h: Harness) {
    let out = h
        .client
        .exec(ExecRequest::program("/definitely/not/here"))
        .await
        .unwrap();
    assert_eq!(out.exit.code, Some(127));
    assert!(out.combined().contains("not/here"), "{}", out.combined());
    let sh = h.client.exec("no-such-command-omabox").await.unwrap();
    assert_eq!(sh.exit.code, Some(127));
    let err = h
        .client
        .spawn(ExecRequest::program("/definitely/not/here"))
        .await
        .unwrap_err();
    assert_eq!(err.remote_kind(), Some(ErrorKind::SpawnFailed), "{err}");
}
both_modes!(exec_missing_binary);

async fn exec_timeout_kills_the_group(h: Harness) {
    let out = h
        .client
        .exec(
            ExecRequest::shell("sleep 300 & echo $!; sleep 300")
                .timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert!(out.exit.timed_out);
    assert_eq!(out.exit.signal.as_deref(), Some("SIGKILL"));
    let grandchild: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    eventually("the background sleep dies with its group", || async move {
        common::proc_state(grandchild).is_none_or(|(s, _)| s == 'Z')
    })
    .await;
}
both_modes!(exec_timeout_kills_the_group);

async fn many_concurrent_processes(h: Harness) {
    let runs = (0..64).map(|i| {
        let c = h.client.clone();
        async move {
            let out = c
                .exec(format!("echo out{i}; echo err{i} >&2; exit {}", i % 7))
                .await
                .unwrap();
            assert_eq!(out.stdout, format!("out{i}\n").into_bytes());
            assert_eq!(out.stderr, format!("err{i}\n").into_bytes());
            assert_eq!(out.exit.code, Some(i % 7));
        }
    });
    futures::future::join_all(runs).await;
}
both_modes!(many_concurrent_processes);

async fn chatty_process_does_not_starve_others(h: Harness) {
    const BIG: u64 = 50 * 1024 * 1024;
    // Nobody reads this one's stdout for now: its window fills and it blocks on its pipe.
    let mut big = h
        .client
        .spawn(ExecRequest::shell(format!(
            "head -c {BIG} /dev/zero; echo done >&2"
        )))
        .await
        .unwrap();
    // Other streams keep flowing meanwhile.
    for i in 0..5 {
        let out = h.client.exec(format!("echo small{i}")).await.unwrap();
        assert_eq!(out.combined(), format!("small{i}"));
    }
    let pong = h.client.ping().await.unwrap();
    assert!(pong.software.starts_with("omabox-agent/"));
    // The big one cannot have finished: 50 MiB exceed every window and pipe buffer.
    let mut stderr = big.stderr.take().unwrap();
    let stderr_task = tokio::spawn(async move { stderr.read_to_end().await });
    let mut stdout = big.stdout.take().unwrap();
    assert_eq!(stdout.drain().await.unwrap(), BIG);
    assert_eq!(stderr_task.await.unwrap().unwrap(), b"done\n");
    let exit = big.wait().await.unwrap();
    assert_eq!(exit.code, Some(0));
    assert!(!exit.output_truncated);
}
both_modes!(chatty_process_does_not_starve_others);

async fn duplex_stdin_echo_with_eof(h: Harness) {
    let mut cat = h.client.spawn(ExecRequest::program("cat")).await.unwrap();
    let mut stdin = cat.stdin.take().unwrap();
    let payload: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024 + 7).collect();
    let mut stdout = cat.stdout.take().unwrap();
    let reader = tokio::spawn(async move { stdout.read_to_end().await });
    stdin.write_all(&payload).await.unwrap();
    stdin.close(); // EOF: cat exits only because of this
    assert_eq!(reader.await.unwrap().unwrap(), payload);
    let exit = cat.wait().await.unwrap();
    assert_eq!(exit.code, Some(0));

    // AsyncWrite/AsyncRead adapters, and env removal in a duplex spec.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let spec = ExecRequest::shell("echo ${HOME:-unset}; cat")
        .envs(BTreeMap::from([("HOME".to_owned(), None)]));
    let mut p = h.client.spawn(spec).await.unwrap();
    let mut w = p.stdin.take().unwrap();
    w.write_all(b"line\n").await.unwrap();
    w.shutdown().await.unwrap();
    let mut text = String::new();
    p.stdout
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .await
        .unwrap();
    assert_eq!(text, "unset\nline\n");
    assert!(p.wait().await.unwrap().success());
}
both_modes!(duplex_stdin_echo_with_eof);

async fn exit_reported_only_after_all_output(h: Harness) {
    for _ in 0..50 {
        let out = h
            .client
            .exec("head -c 1000000 /dev/zero; exit 3")
            .await
            .unwrap();
        assert_eq!(out.stdout.len(), 1_000_000);
        assert_eq!(out.exit.code, Some(3));
        assert!(!out.exit.output_truncated);
    }
}
both_modes!(exit_reported_only_after_all_output);

async fn kill_reports_the_signal(h: Harness) {
    let mut p = h
        .client
        .spawn(ExecRequest::program("sleep").args(["300"]))
        .await
        .unwrap();
    let pid = p.pid();
    drop(p.stdin.take());
    p.kill("SIGKILL").unwrap();
    let exit = p.wait().await.unwrap();
    assert_eq!(exit.code, None);
    assert_eq!(exit.signal.as_deref(), Some("SIGKILL"));
    eventually(
        "the killed process is gone",
        || async move { !pid_exists(pid) },
    )
    .await;
    // Idempotent after exit; a bogus signal is refused locally.
    p.kill("SIGTERM").unwrap();
    assert!(p.kill("SIGNOPE").is_err());

    let mut t = h
        .client
        .spawn(ExecRequest::shell("sleep 300"))
        .await
        .unwrap();
    t.killer().kill("SIGTERM").unwrap();
    assert_eq!(t.wait().await.unwrap().signal.as_deref(), Some("SIGTERM"));
}
both_modes!(kill_reports_the_signal);

async fn dropping_a_process_kills_it(h: Harness) {
    let p = h
        .client
        .spawn(ExecRequest::shell("echo $$; exec sleep 300"))
        .await
        .unwrap();
    let pid = p.pid();
    drop(p);
    eventually("an abandoned process is killed", || async move {
        common::proc_state(pid).is_none_or(|(s, _)| s == 'Z')
    })
    .await;
    assert!(h.client.ping().await.is_ok());
}
both_modes!(dropping_a_process_kills_it);

async fn files_are_binary_safe(h: Harness) {
    let all: Vec<u8> = (0..=255u8).collect();
    let path = h.path("nested/dir/all.bin");
    let written = h
        .client
        .write_file_bytes(
            &path,
            all.clone(),
            WriteOptions {
                mode: Some(0o640),
                create_parents: true,
                owner: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(written, path);
    assert_eq!(h.client.read_file_bytes(&path).await.unwrap(), all);
    assert_eq!(std::fs::read(&path).unwrap(), all);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    // Text, relative path (resolved against the workdir), and a non-UTF-8 refusal.
    h.client.write_file("rel.txt", "héllo\n").await.unwrap();
    assert_eq!(
        h.client.read_file(&h.path("rel.txt")).await.unwrap(),
        "héllo\n"
    );
    assert!(matches!(
        h.client.read_file(&path).await,
        Err(omabox_agent::ClientError::NotUtf8 { .. })
    ));
    let missing = h.client.read_file_bytes(&h.path("nope")).await.unwrap_err();
    assert_eq!(missing.remote_kind(), Some(ErrorKind::NotFound));
    // No parents and not allowed to create them.
    let no_parent = h
        .client
        .write_file_bytes(
            &h.path("x/y/z"),
            vec![1u8],
            WriteOptions {
                mode: None,
                create_parents: false,
                owner: None,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        no_parent.remote_kind(),
        Some(ErrorKind::NotFound),
        "{no_parent}"
    );
}
both_modes!(files_are_binary_safe);

async fn large_file_streams(h: Harness) {
    let mut data = vec![0u8; 20 * 1024 * 1024];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in &mut data {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let path = h.path("big.bin");
    h.client
        .write_file_bytes(&path, data.clone(), WriteOptions::default())
        .await
        .unwrap();
    let back = h.client.read_file_bytes(&path).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data);
    let mut f = h.client.open_file(&path).await.unwrap();
    assert_eq!(f.size, data.len() as u64);
    assert_eq!(f.content.drain().await.unwrap(), data.len() as u64);
    // Streaming upload from a reader.
    let mut src = &data[..1_000_001];
    h.client
        .write_file_from(&h.path("part.bin"), &mut src, WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(h.local("part.bin")).unwrap(),
        &data[..1_000_001]
    );
}
both_modes!(large_file_streams);

async fn tar_round_trip_keeps_modes_and_symlinks(h: Harness) {
    let src = h.local("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("plain.txt"), b"plain").unwrap();
    std::fs::write(src.join("sub/run.sh"), b"#!/bin/sh\necho run\n").unwrap();
    std::fs::write(
        src.join("sub/deeper/secret"),
        (0..=255u8).collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::set_permissions(
        src.join("sub/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(
        src.join("sub/deeper/secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(
        src.join("sub/deeper"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    std::os::unix::fs::symlink("sub/run.sh", src.join("link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", src.join("abs-link")).unwrap();

    let archive = h.client.tar_out_bytes(&h.path("src")).await.unwrap();
    let done = h
        .client
        .tar_in_bytes(&h.path("dst"), archive)
        .await
        .unwrap();
    assert_eq!(done.entries, 7);
    let dst = h.local("dst");
    let mode = |p: &str| {
        std::fs::symlink_metadata(dst.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("sub/run.sh"), 0o755);
    assert_eq!(mode("sub/deeper/secret"), 0o600);
    assert_eq!(mode("sub/deeper"), 0o750);
    assert_eq!(std::fs::read(dst.join("plain.txt")).unwrap(), b"plain");
    assert_eq!(
        std::fs::read_link(dst.join("link")).unwrap().to_str(),
        Some("sub/run.sh")
    );
    assert_eq!(
        std::fs::read_link(dst.join("abs-link")).unwrap().to_str(),
        Some("/etc/hostname")
    );
    let run = h
        .client
        .exec(ExecRequest::shell("./link").cwd("dst"))
        .await
        .unwrap();
    assert_eq!(run.combined(), "run");

    // Streamed tar out into a streamed tar in.
    let mut reader = h.client.tar_out(&h.path("dst")).unwrap();
    let again = h.client.tar_in(&h.path("dst2"), &mut reader).await.unwrap();
    assert_eq!(again.entries, 7);
    assert_eq!(
        std::fs::read(h.local("dst2/sub/deeper/secret"))
            .unwrap()
            .len(),
        256
    );
}
both_modes!(tar_round_trip_keeps_modes_and_symlinks);

fn raw_entry(
    builder: &mut tar::Builder<Vec<u8>>,
    name: &[u8],
    kind: tar::EntryType,
    link: Option<&[u8]>,
    data: &[u8],
) {
    let mut header = tar::Header::new_old();
    {
        let old = header.as_old_mut();
        old.name[..name.len()].copy_from_slice(name);
        if let Some(l) = link {
            old.linkname[..l.len()].copy_from_slice(l);
        }
    }
    header.set_entry_type(kind);
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append(&header, data).unwrap();
}

/// (name, type, link target) of a hand-made tar entry.
type RawEntry<'a> = (&'a [u8], tar::EntryType, Option<&'a [u8]>);

fn archive(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, link) in entries {
        let data: &[u8] = if *kind == tar::EntryType::Regular {
            b"pwned"
        } else {
            b""
        };
        raw_entry(&mut b, name, *kind, *link, data);
    }
    b.into_inner().unwrap()
}

async fn tar_traversal_is_rejected(h: Harness) {
    use tar::EntryType::{Directory, Link, Regular, Symlink};
    let outside = h.local("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let outside_s = outside.to_string_lossy().into_owned();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dot-dot", archive(&[(b"../evil", Regular, None)])),
        (
            "nested dot-dot",
            archive(&[(b"a/../../evil", Regular, None)]),
        ),
        (
            "absolute",
            archive(&[(format!("{outside_s}/evil").as_bytes(), Regular, None)]),
        ),
        (
            "write through a symlink",
            archive(&[
                (b"link", Symlink, Some(outside_s.as_bytes())),
                (b"link/evil", Regular, None),
            ]),
        ),
        (
            "directory through a symlink",
            archive(&[
                (b"link", Symlink, Some(outside_s.as_bytes())),
                (b"link/sub", Directory, None),
            ]),
        ),
        (
            "hard link out",
            archive(&[(b"hl", Link, Some(b"../outside/target"))]),
        ),
    ];
    std::fs::write(outside.join("target"), b"keep").unwrap();
    for (what, bytes) in cases {
        let target = h.path(&format!("t-{}", what.replace(' ', "-")));
        let err = h.client.tar_in_bytes(&target, bytes).await.unwrap_err();
        assert_eq!(
            err.remote_kind(),
            Some(ErrorKind::UnsafePath),
            "{what}: {err}"
        );
        assert!(!outside.join("evil").exists(), "{what} escaped");
        assert!(!outside.join("sub").exists(), "{what} escaped");
        assert!(!h.local("evil").exists(), "{what} escaped");
    }
    assert_eq!(std::fs::read(outside.join("target")).unwrap(), b"keep");
    // A pre-existing symlink at an entry's own path is replaced, not followed.
    let dst = h.local("replace");
    std::fs::create_dir_all(&dst).unwrap();
    std::os::unix::fs::symlink(outside.join("target"), dst.join("f")).unwrap();
    h.client
        .tar_in_bytes(&h.path("replace"), archive(&[(b"f", Regular, None)]))
        .await
        .unwrap();
    assert_eq!(std::fs::read(outside.join("target")).unwrap(), b"keep");
    assert_eq!(std::fs::read(dst.join("f")).unwrap(), b"pwned");
    assert!(h.client.ping().await.is_ok());
}
both_modes!(tar_traversal_is_rejected);

async fn stat_and_list(h: Harness) {
    std::fs::create_dir(h.local("d")).unwrap();
    std::fs::write(h.local("d/b.txt"), b"12345").unwrap();
    std::fs::create_dir(h.local("d/a")).unwrap();
    std::os::unix::fs::symlink("b.txt", h.local("d/c")).unwrap();
    let st = h.client.stat(&h.path("d/b.txt")).await.unwrap();
    assert_eq!((st.kind, st.size), (FileKind::File, 5));
    let link = h.client.stat(&h.path("d/c")).await.unwrap();
    assert_eq!(link.kind, FileKind::Symlink);
    assert_eq!(link.link_target.as_deref(), Some("b.txt"));
    let names: Vec<(String, FileKind)> = h
        .client
        .list_dir(&h.path("d"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert_eq!(
        names,
        vec![
            ("a".into(), FileKind::Dir),
            ("b.txt".into(), FileKind::File),
            ("c".into(), FileKind::Symlink)
        ]
    );
    assert!(!h.client.exists(&h.path("nope")).await.unwrap());
    assert!(h.client.exists(&h.path("d")).await.unwrap());
}
both_modes!(stat_and_list);

async fn env_applies_to_later_processes(h: Harness) {
    h.client
        .set_env([("OMABOX_T1", Some("one")), ("OMABOX_T2", Some("two"))])
        .await
        .unwrap();
    let out = h.client.exec("echo $OMABOX_T1-$OMABOX_T2").await.unwrap();
    assert_eq!(out.combined(), "one-two");
    let per_call = h
        .client
        .exec(
            ExecRequest::shell("echo ${OMABOX_T1:-none}-$OMABOX_T3")
                .env_remove("OMABOX_T1")
                .env("OMABOX_T3", "three"),
        )
        .await
        .unwrap();
    assert_eq!(per_call.combined(), "none-three");
    h.client
        .set_env([("OMABOX_T2", None::<String>)])
        .await
        .unwrap();
    let out = h.client.exec("echo ${OMABOX_T2:-gone}").await.unwrap();
    assert_eq!(out.combined(), "gone");
}
both_modes!(env_applies_to_later_processes);

async fn background_processes(h: Harness) {
    let bg = h
        .client
        .start_background("echo out; echo err >&2; exec sleep 300")
        .await
        .unwrap();
    assert!(bg.pid() > 0);
    assert_eq!(bg.status().await.unwrap(), BackgroundStatus::Running);
    eventually("background output is retained", || {
        let bg = bg.clone();
        async move {
            let logs = bg.logs().await.unwrap();
            logs.stdout == "out\n" && logs.stderr == "err\n"
        }
    })
    .await;
    bg.kill("SIGTERM").await.unwrap();
    eventually("killed status", || {
        let bg = bg.clone();
        async move { bg.status().await.unwrap() == BackgroundStatus::Killed }
    })
    .await;
    bg.kill("SIGKILL").await.unwrap(); // idempotent after exit
    assert_eq!(bg.status().await.unwrap().as_str(), "killed");

    let ok = h.client.start_background("exit 0").await.unwrap();
    let bad = h.client.start_background("exit 4").await.unwrap();
    eventually("completed and error", || {
        let (ok, bad) = (ok.clone(), bad.clone());
        async move {
            ok.status().await.unwrap() == BackgroundStatus::Completed
                && bad.status().await.unwrap() == BackgroundStatus::Error
        }
    })
    .await;
    assert_eq!(bad.info().await.unwrap().exit.unwrap().code, Some(4));

    // Retention is bounded: the tail is kept and the dropped bytes are counted.
    let loud = h
        .client
        .start_background("head -c 3000000 /dev/zero | tr '\\0' x; echo END")
        .await
        .unwrap();
    eventually("loud finishes", || {
        let loud = loud.clone();
        async move { loud.status().await.unwrap() == BackgroundStatus::Completed }
    })
    .await;
    let logs = loud.logs().await.unwrap();
    assert!(logs.stdout.ends_with("xEND\n"));
    assert!(logs.stdout_dropped > 0);
    assert_eq!(logs.stdout.len() as u64 + logs.stdout_dropped, 3_000_004);

    let missing = h.client.background("bg-999", 0).status().await.unwrap_err();
    assert_eq!(missing.remote_kind(), Some(ErrorKind::NotFound));
}
both_modes!(background_processes);

async fn pipes_held_by_a_grandchild_are_reported_not_hung(h: Harness) {
    // The background sleep keeps stdout open after the shell exits: the agent drains for
    // a bounded silence, then reports the exit with `output_truncated` (never silently).
    let out = h.client.exec("sleep 300 & echo $!").await.unwrap();
    let sleeper = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(sleeper.parse::<u32>().is_ok(), "{:?}", out.stdout);
    assert_eq!(out.exit.code, Some(0));
    assert!(out.exit.output_truncated);
    // Ended here: in the host mode nothing else would (it is in no sandbox).
    let killed = h
        .client
        .exec(format!("kill {sleeper}").as_str())
        .await
        .unwrap();
    assert_eq!(killed.exit.code, Some(0), "{}", killed.combined());
    // Output that arrives while the leader is alive is never cut.
    let out = h.client.exec("echo a; sleep 0.2; echo b").await.unwrap();
    assert_eq!(out.combined(), "a\nb");
    assert!(!out.exit.output_truncated);
}
both_modes!(pipes_held_by_a_grandchild_are_reported_not_hung);

async fn oversized_replies_fail_only_their_stream(h: Harness) {
    let dir = h.local("many");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..12_000 {
        std::fs::write(
            dir.join(format!(
                "a-rather-long-file-name-to-grow-the-listing-{i:05}"
            )),
            b"",
        )
        .unwrap();
    }
    let err = h.client.list_dir(&h.path("many")).await.unwrap_err();
    assert_eq!(err.remote_kind(), Some(ErrorKind::FrameTooLarge), "{err}");
    assert!(h.client.ping().await.is_ok());
}
both_modes!(oversized_replies_fail_only_their_stream);
