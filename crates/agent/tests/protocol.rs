//! Protocol abuse, handshake failures, and init duties (reaping, teardown).

mod common;

use std::path::Path;

use bytes::{BufMut, Bytes, BytesMut};
use common::{AGENT_BIN, Mode, eventually, pid_exists, proc_state, start};
use omabox_agent::frame::{Frame, FrameKind, FrameReader, PREAMBLE, channel};
use omabox_agent::message::{Event, HELLO_MAGIC, Hello, Role};
use omabox_agent::transport::{AGENT_FD, pass_fd, socketpair};
use omabox_agent::{
    Agent, AgentClient, AgentConfig, ClientError, ErrorKind, ExecRequest, RemoteError,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

fn client_hello(min: u16, max: u16) -> Hello {
    Hello {
        magic: HELLO_MAGIC.into(),
        role: Role::Client,
        min_version: min,
        max_version: max,
        software: "raw-test".into(),
        max_frame: 1 << 20,
        initial_window: 1 << 20,
        ops: vec![],
        pid: None,
    }
}

fn encode(frames: &[Frame]) -> BytesMut {
    let mut b = BytesMut::new();
    for f in frames {
        f.encode(&mut b);
    }
    b
}

/// A hand-driven peer: writes raw bytes, reads frames.
struct Raw<S> {
    w: tokio::io::WriteHalf<S>,
    r: FrameReader<tokio::io::ReadHalf<S>>,
}

impl<S: AsyncRead + AsyncWrite> Raw<S> {
    async fn new(stream: S) -> (Self, Hello) {
        let (r, w) = tokio::io::split(stream);
        let mut r = FrameReader::new(r, 1 << 20);
        r.read_preamble().await.unwrap();
        let hello: Hello = r
            .next_frame()
            .await
            .unwrap()
            .unwrap()
            .decode_json("hello")
            .unwrap();
        (Self { w, r }, hello)
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).await.unwrap();
        self.w.flush().await.unwrap();
    }

    async fn handshake(&mut self) {
        let mut b = BytesMut::from(&PREAMBLE[..]);
        Frame::json(0, FrameKind::Hello, &client_hello(1, 1)).encode(&mut b);
        self.send(&b).await;
    }

    /// Next frame that is not a data/eof/window frame.
    async fn next_control(&mut self) -> Option<Frame> {
        loop {
            match self.r.next_frame().await {
                Ok(Some(f)) if matches!(f.kind, FrameKind::Control | FrameKind::Goaway) => {
                    return Some(f);
                }
                Ok(Some(_)) => {}
                _ => return None,
            }
        }
    }

    async fn goaway(&mut self) -> RemoteError {
        let f = self.next_control().await.expect("a goaway before close");
        assert_eq!(f.kind, FrameKind::Goaway);
        let e: RemoteError = f.decode_json("goaway").unwrap();
        // ...and then the agent closes the connection.
        assert!(matches!(self.r.next_frame().await, Ok(None) | Err(_)));
        e
    }
}

fn open(id: u32, body: &str) -> Frame {
    Frame {
        stream: id,
        kind: FrameKind::Open,
        flags: 0,
        body: Bytes::copy_from_slice(body.as_bytes()),
    }
}

/// In-process: serve one raw connection; returns the agent for a follow-up connection.
async fn inproc_raw() -> (
    Agent,
    Raw<tokio::io::DuplexStream>,
    tokio::task::JoinHandle<Result<(), omabox_agent::AgentError>>,
) {
    let agent = Agent::new(AgentConfig::default()).unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let serving = agent.clone();
    let task = tokio::spawn(async move { serving.serve(a).await });
    let (raw, hello) = Raw::new(b).await;
    assert_eq!(hello.role, Role::Agent);
    assert!(hello.ops.iter().any(|o| o == "spawn"));
    (agent, raw, task)
}

async fn agent_still_serves(agent: &Agent) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let serving = agent.clone();
    tokio::spawn(async move { serving.serve(a).await });
    let client = AgentClient::connect(b).await.unwrap();
    assert_eq!(client.exec("echo again").await.unwrap().combined(), "again");
}

#[tokio::test]
async fn garbage_bytes_get_a_goaway_and_the_agent_serves_again() {
    let (agent, mut raw, task) = inproc_raw().await;
    raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let why = raw.goaway().await;
    assert_eq!(why.kind, ErrorKind::Protocol);
    assert!(why.message.contains("preamble"), "{}", why.message);
    assert!(task.await.unwrap().is_err());
    agent_still_serves(&agent).await;
}

#[tokio::test]
async fn oversized_frame_without_a_stream_closes_the_connection() {
    let (agent, mut raw, task) = inproc_raw().await;
    raw.handshake().await;
    let mut b = BytesMut::new();
    b.put_u32(u32::MAX);
    b.put_u32(77);
    b.put_u8(FrameKind::Data as u8);
    b.put_u8(0);
    raw.send(&b).await;
    let why = raw.goaway().await;
    assert_eq!(why.kind, ErrorKind::FrameTooLarge);
    assert!(
        why.message.contains("exceeds the maximum"),
        "{}",
        why.message
    );
    let err = task.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("connection ended"));
    agent_still_serves(&agent).await;
}

#[tokio::test]
async fn unknown_frame_kind_closes_the_connection() {
    let (_agent, mut raw, _task) = inproc_raw().await;
    raw.handshake().await;
    let mut b = BytesMut::new();
    b.put_u32(0);
    b.put_u32(1);
    b.put_u8(99);
    b.put_u8(0);
    raw.send(&b).await;
    let why = raw.goaway().await;
    assert!(
        why.message.contains("unknown frame kind 99"),
        "{}",
        why.message
    );
}

#[tokio::test]
async fn stream_level_errors_keep_the_connection() {
    let (_agent, mut raw, _task) = inproc_raw().await;
    raw.handshake().await;
    // Malformed JSON, an unknown op and a bad argument each fail only their stream.
    raw.send(&encode(&[
        open(1, "{not json"),
        open(3, r#"{"op":"teleport"}"#),
        open(5, r#"{"op":"stat"}"#),
    ]))
    .await;
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let f = raw.next_control().await.unwrap();
        let Event::Error(e) = f.decode_json::<Event>("event").unwrap() else {
            panic!("expected an error event on stream {}", f.stream);
        };
        kinds.push((f.stream, e.kind));
    }
    kinds.sort_by_key(|k| k.0);
    assert_eq!(
        kinds,
        vec![
            (1, ErrorKind::InvalidRequest),
            (3, ErrorKind::Unsupported),
            (5, ErrorKind::InvalidRequest)
        ]
    );

    // An oversized data frame on a live process stream resets that stream only (the body
    // is skipped, the process is killed)...
    raw.send(&encode(&[open(
        7,
        r#"{"op":"spawn","command":{"kind":"shell","script":"exec cat"},"stdin":true}"#,
    )]))
    .await;
    let started = raw.next_control().await.unwrap();
    assert!(matches!(
        started.decode_json::<Event>("e").unwrap(),
        Event::Started { .. }
    ));
    let mut big = BytesMut::new();
    big.put_u32((1 << 20) + 1);
    big.put_u32(7);
    big.put_u8(FrameKind::Data as u8);
    big.put_u8(channel::INPUT);
    big.resize(big.len() + (1 << 20) + 1, b'z');
    raw.send(&big).await;
    let reset = raw.next_control().await.unwrap();
    assert_eq!(reset.stream, 7);
    let Event::Error(e) = reset.decode_json::<Event>("e").unwrap() else {
        panic!()
    };
    assert_eq!(e.kind, ErrorKind::FrameTooLarge);

    // ...and exceeding the window resets a stream too.
    raw.send(&encode(&[open(
        9,
        r#"{"op":"spawn","command":{"kind":"shell","script":"exec sleep 300"},"stdin":true}"#,
    )]))
    .await;
    assert_eq!(raw.next_control().await.unwrap().stream, 9); // started
    let chunk = Bytes::from(vec![0u8; 1 << 19]);
    let frames: Vec<Frame> = (0..3)
        .map(|_| Frame::data(9, channel::INPUT, chunk.clone()))
        .collect();
    raw.send(&encode(&frames)).await;
    let reset = raw.next_control().await.unwrap();
    let Event::Error(e) = reset.decode_json::<Event>("e").unwrap() else {
        panic!()
    };
    assert_eq!((reset.stream, e.kind), (9, ErrorKind::Protocol));
    assert!(e.message.contains("flow control"), "{}", e.message);

    // The connection still works.
    raw.send(&encode(&[open(11, r#"{"op":"ping"}"#)])).await;
    let pong = raw.next_control().await.unwrap();
    assert_eq!(pong.stream, 11);
    assert!(matches!(
        pong.decode_json::<Event>("e").unwrap(),
        Event::Ok { .. }
    ));
}

#[tokio::test]
async fn agent_refuses_a_client_with_no_common_version() {
    let (agent, mut raw, task) = inproc_raw().await;
    let mut b = BytesMut::from(&PREAMBLE[..]);
    Frame::json(0, FrameKind::Hello, &client_hello(7, 9)).encode(&mut b);
    raw.send(&b).await;
    let why = raw.goaway().await;
    assert_eq!(why.kind, ErrorKind::VersionMismatch);
    assert!(why.message.contains("7..=9"), "{}", why.message);
    assert!(task.await.unwrap().is_err());
    agent_still_serves(&agent).await;
}

#[tokio::test]
async fn client_refuses_an_agent_with_no_common_version() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (_r, mut w) = tokio::io::split(a);
        let mut hello = client_hello(5, 6);
        hello.role = Role::Agent;
        hello.software = "omabox-agent/9.9.9".into();
        let mut buf = BytesMut::from(&PREAMBLE[..]);
        Frame::json(0, FrameKind::Hello, &hello).encode(&mut buf);
        w.write_all(&buf).await.unwrap();
        std::future::pending::<()>().await;
    });
    let err = AgentClient::connect(b).await.unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::VersionMismatch {
                theirs_min: 5,
                theirs_max: 6,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("omabox-agent/9.9.9"), "{err}");
}

#[tokio::test]
async fn client_refuses_a_peer_that_is_not_an_agent() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (_r, mut w) = tokio::io::split(a);
        w.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").await.unwrap();
        std::future::pending::<()>().await;
    });
    let err = AgentClient::connect(b).await.unwrap_err();
    assert!(matches!(err, ClientError::Handshake(_)), "{err}");
    let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(text.contains("bad preamble"), "{text}");
}

/// Starts the agent binary on a socketpair and returns (child, host end).
async fn spawn_binary() -> (tokio::process::Child, tokio::net::UnixStream) {
    let (host, agent_end) = socketpair().unwrap();
    let mut cmd = std::process::Command::new(AGENT_BIN);
    cmd.arg("--fd").arg(AGENT_FD.to_string());
    pass_fd(&mut cmd, &agent_end, AGENT_FD);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stderr(std::process::Stdio::piped()).kill_on_drop(true);
    let child = cmd.spawn().unwrap();
    drop(agent_end);
    (child, host)
}

#[tokio::test]
async fn agent_binary_reports_malformed_input_and_exits_without_panicking() {
    let (child, host) = spawn_binary().await;
    let (mut raw, hello) = Raw::new(host).await;
    assert!(hello.software.starts_with("omabox-agent/"));
    raw.handshake().await;
    raw.send(&[0xff; 64]).await;
    let why = raw.goaway().await;
    assert_eq!(why.kind, ErrorKind::Protocol);
    assert!(
        why.message.contains("unknown frame kind 255"),
        "{}",
        why.message
    );
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown frame kind 255"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn orphans_are_reaped_by_the_agent() {
    let h = start(Mode::Child).await;
    // The inner shell backgrounds a short sleep and exits at once: the sleep is orphaned
    // and reparented to the agent (its subreaper), which must reap it when it exits.
    let out = h
        .client
        .exec(r#"sh -c 'sleep 0.3 >/dev/null 2>&1 </dev/null & echo $!'"#)
        .await
        .unwrap();
    let orphan: u32 = out.combined().parse().unwrap();
    if let Some((_, ppid)) = common::proc_state(orphan) {
        assert_eq!(
            ppid, h.agent_pid,
            "orphan should be reparented to the agent"
        );
    }
    eventually("the orphan is reaped (no zombie left)", || async move {
        !pid_exists(orphan)
    })
    .await;
    // A double fork storm: no zombies remain under the agent.
    let out = h
        .client
        .exec(r#"for i in 1 2 3 4 5 6 7 8 9 10; do (sh -c 'exit 0' &) ; done; echo ok"#)
        .await
        .unwrap();
    assert_eq!(out.combined(), "ok");
    let agent_pid = h.agent_pid;
    eventually("no zombies under the agent", || async move {
        common::zombies_of(agent_pid).is_empty()
    })
    .await;
}

#[tokio::test]
async fn closing_the_connection_kills_everything_and_the_agent_exits() {
    let mut h = start(Mode::Child).await;
    let bg = h.client.start_background("exec sleep 300").await.unwrap();
    let stray = h
        .client
        .exec("sleep 300 >/dev/null 2>&1 & echo $!")
        .await
        .unwrap();
    let stray: u32 = stray.combined().parse().unwrap();
    let duplex = h
        .client
        .spawn(ExecRequest::shell("exec sleep 300"))
        .await
        .unwrap();
    let pids = [bg.pid(), stray, duplex.pid()];
    assert!(pids.iter().all(|p| pid_exists(*p)));
    let mut child = h.child.take().unwrap();
    drop((bg, duplex, h.client));
    drop(child.client);
    let status = child.child.wait().await.unwrap();
    assert_eq!(status.code(), Some(0));
    for pid in pids {
        eventually(
            "a process of the closed connection is gone",
            || async move { !pid_exists(pid) },
        )
        .await;
    }
}

#[tokio::test]
async fn sigterm_is_forwarded_to_children() {
    let h = start(Mode::Child).await;
    let mut p = h
        .client
        .spawn(ExecRequest::shell(
            "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done",
        ))
        .await
        .unwrap();
    let mut stdout = p.stdout.take().unwrap();
    let first = stdout.chunk().await.unwrap().unwrap();
    assert_eq!(&first[..], b"ready\n");
    let agent_pid = h.agent_pid as i32;
    // SAFETY: plain kill(2) on the agent child we started.
    unsafe {
        libc::kill(agent_pid, libc::SIGTERM);
    }
    let rest = stdout.read_to_end().await.unwrap();
    assert_eq!(rest, b"got-term\n");
    assert_eq!(p.wait().await.unwrap().code, Some(7));
}

#[tokio::test]
async fn stdio_transport_works() {
    let mut child = tokio::process::Command::new(Path::new(AGENT_BIN))
        .arg("--stdio")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let io = tokio::io::join(child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = AgentClient::connect(io).await.unwrap();
    assert_eq!(
        client.exec("echo via-stdio").await.unwrap().combined(),
        "via-stdio"
    );
    drop(client);
    assert_eq!(child.wait().await.unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_terminals_host_eof_writes_nothing_and_later_input_still_arrives() {
    let (_agent, mut raw, _task) = inproc_raw().await;
    raw.handshake().await;
    let spawn =
        r#"{"op":"spawn","command":{"kind":"argv","argv":["cat"]},"pty":{"cols":80,"rows":24}}"#;
    raw.send(&encode(&[
        open(1, spawn),
        Frame::eof(1, channel::INPUT),
        Frame::data(1, channel::INPUT, Bytes::from_static(b"after-eof\n")),
    ]))
    .await;
    // The terminal echoes the line and cat (still running: nothing ended its input)
    // writes it back.
    let mut text = String::new();
    let read = async {
        while !text.contains("after-eof\r\nafter-eof\r\n") {
            let f = raw.r.next_frame().await.unwrap().expect("a frame");
            assert_eq!(f.stream, 1);
            match f.kind {
                FrameKind::Data => {
                    assert_eq!(f.flags, channel::STDOUT);
                    text.push_str(&String::from_utf8_lossy(&f.body));
                }
                FrameKind::Control => {
                    let ev: Event = f.decode_json("event").unwrap();
                    assert!(matches!(ev, Event::Started { .. }), "{ev:?}");
                }
                other => panic!("unexpected {other:?} frame; output so far {text:?}"),
            }
        }
    };
    // Bounds a hang only.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), read).await;
    assert!(
        ended.is_ok(),
        "input after eof never came back; got {text:?}"
    );
}

/// A detached connection kills nothing it started (a checkpointing backend reconnects
/// later); a closed one still kills its processes.
#[tokio::test]
async fn detach_ends_the_connection_and_leaves_its_processes_running() {
    let agent = Agent::new(AgentConfig::default()).unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let serving = agent.clone();
    let task = tokio::spawn(async move { serving.serve_detachable(a).await });
    let client = AgentClient::connect(b).await.unwrap();
    assert!(client.supports("detach"));
    let out = client
        .exec("sleep 300 >/dev/null 2>&1 & echo $!")
        .await
        .unwrap();
    let pid: u32 = out.combined().trim().parse().unwrap();
    // A process still streaming its output when the host detaches runs on: its output is
    // dropped from then on, never blocked or cut (no SIGPIPE), and its stdin stays open.
    let chatty = client
        .spawn("while :; do echo line; sleep 0.02; done")
        .await
        .unwrap();
    let chatty_pid = chatty.pid();
    client.detach().await.unwrap();
    let served = task.await.unwrap().unwrap();
    assert_eq!(served, omabox_agent::Served::Detached);
    drop(chatty);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        pid_exists(chatty_pid) && !matches!(proc_state(chatty_pid), Some(('Z', _))),
        "a streaming process ended with its detached connection"
    );

    // A later connection is served, and closing it (not detaching) kills its processes.
    let (a, b) = tokio::io::duplex(64 * 1024);
    let serving = agent.clone();
    let task = tokio::spawn(async move { serving.serve_detachable(a).await });
    let client = AgentClient::connect(b).await.unwrap();
    // Still alive, not killed: it comes back to sleeping (a loaded machine may show it
    // running for a moment); a killed one would be a zombie or gone, never asleep again.
    client.ping().await.unwrap();
    eventually("the detached connection's process sleeps on", || async {
        matches!(proc_state(pid), Some(('S', _)))
    })
    .await;
    let out = client
        .exec("sleep 300 >/dev/null 2>&1 & echo $!")
        .await
        .unwrap();
    let second: u32 = out.combined().trim().parse().unwrap();
    drop(client);
    assert_eq!(task.await.unwrap().unwrap(), omabox_agent::Served::Closed);
    eventually("the closed connection's process is killed", || async {
        !pid_exists(second)
    })
    .await;
    assert!(
        pid_exists(chatty_pid),
        "the detached connection's streaming process was killed with the next connection"
    );
    agent.kill_all();
    // SAFETY: plain kill(2) of pids this test started.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
        libc::kill(chatty_pid as i32, libc::SIGKILL);
    }
}
