//! The scripted agent the end-to-end tests use speaks ACP: it answers `initialize` with
//! `loadSession`. (This test also makes cargo build the binary with this crate's tests, so
//! the CLI's tests find it next to `omabox`.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

#[test]
fn the_fake_agent_answers_initialize_with_load_session() {
    let mut agent = Command::new(env!("CARGO_BIN_EXE_omabox-fake-acp-agent"))
        .arg("normal")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = agent.stdin.take().unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":1}}}}"#
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(agent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    drop(stdin);
    let _ = agent.kill();
    let _ = agent.wait();
    let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(
        answer["result"]["agentCapabilities"]["loadSession"], true,
        "{answer}"
    );
}
