//! `omabox config`: every setting with its value and where it came from; secrets hidden; bad
//! values named with their source; the node configuration file.

use serde_json::Value;
use std::process::{Command, Output};

/// `omabox ARGS` with nothing of this process's environment but what `vars` set.
fn omabox(args: &[&str], vars: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_omabox"))
        .env_clear()
        .envs(vars.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn rows(output: &Output) -> Vec<Value> {
    serde_json::from_slice::<Value>(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&output.stdout)))
        .as_array()
        .unwrap()
        .clone()
}

fn row<'a>(rows: &'a [Value], key: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no {key}"))
}

#[test]
fn every_setting_shows_its_value_and_source() {
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let file = data.path().join("omabox.toml");
    std::fs::write(&file, "linux_memory = \"1G\"\ngc_keep = 9\n").unwrap();
    let data_arg = data.path().to_str().unwrap();
    let output = omabox(
        &["--data-dir", data_arg, "config", "--json"],
        &[
            ("HOME", home.path().to_str().unwrap()),
            ("OMABOX_GC_KEEP", "3"),
            ("SANDBOX_IMAGE", "debian:12"),
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let rows = rows(&output);
    for row in &rows {
        let keys: Vec<&str> = row
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for key in ["key", "value", "source", "env", "flag", "secret", "doc"] {
            assert!(keys.contains(&key), "{row}");
        }
    }
    assert_eq!(row(&rows, "data_dir")["value"], data_arg);
    assert_eq!(row(&rows, "data_dir")["source"], "flag");
    assert_eq!(row(&rows, "gc_keep")["value"], "3");
    assert_eq!(row(&rows, "gc_keep")["source"], "env:OMABOX_GC_KEEP");
    assert_eq!(row(&rows, "linux_memory")["value"], "1G");
    assert_eq!(
        row(&rows, "linux_memory")["source"],
        format!("file:{}", file.display())
    );
    assert_eq!(row(&rows, "image")["value"], "debian:12");
    assert_eq!(row(&rows, "image")["source"], "env:SANDBOX_IMAGE");
    assert_eq!(row(&rows, "checkpoint_max_entries")["source"], "default");
    assert_eq!(row(&rows, "checkpoint_max_entries")["value"], "1000000");
    assert!(
        rows.iter().all(|r| r["key"] != "test_mode"),
        "hidden unless set"
    );

    // The human table: one line per setting, key, value and source.
    let output = omabox(
        &["--data-dir", data_arg, "config"],
        &[
            ("HOME", home.path().to_str().unwrap()),
            ("OMABOX_GC_KEEP", "3"),
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let table = text(&output.stdout);
    assert_eq!(table.lines().count(), rows.len(), "{table}");
    let line = table.lines().find(|l| l.starts_with("gc_keep ")).unwrap();
    assert!(line.ends_with("env:OMABOX_GC_KEEP"), "{line}");
    assert!(line.split_whitespace().nth(1) == Some("3"), "{line}");
}

#[test]
fn secrets_are_shown_as_set_and_hidden() {
    let home = tempfile::tempdir().unwrap();
    let secret = "sk-ant-this-must-never-show";
    for args in [&["config"][..], &["config", "--json"][..]] {
        let output = omabox(
            args,
            &[
                ("HOME", home.path().to_str().unwrap()),
                ("ANTHROPIC_API_KEY", secret),
                ("OPENAI_API_KEY", secret),
                ("OMABOX_API_KEY", secret),
                (
                    "OMABOX_INFERENCE_GATEWAY",
                    "https://user:pw-secret@gw.example/",
                ),
            ],
        );
        assert!(output.status.success(), "{}", text(&output.stderr));
        let all = format!("{}{}", text(&output.stdout), text(&output.stderr));
        assert!(!all.contains(secret), "{all}");
        assert!(!all.contains("pw-secret"), "{all}");
        assert_eq!(all.matches("(set, hidden)").count(), 4, "{all}");
    }
}

#[test]
fn a_bad_value_is_named_with_its_source_and_fails_the_command() {
    let home = tempfile::tempdir().unwrap();
    let output = omabox(
        &["config"],
        &[
            ("HOME", home.path().to_str().unwrap()),
            ("OMABOX_LINUX_MEMORY", "12Q"),
            ("OMABOX_LINUX_NETWORK", "\u{1b}]0;owned\u{7}"),
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("omabox: error: OMABOX_LINUX_MEMORY=\"12Q\" is invalid (env): "),
        "{stderr}"
    );
    assert!(stderr.contains("OMABOX_LINUX_NETWORK="), "{stderr}");
    // What the environment gave is escaped before the terminal sees it.
    let stdout = text(&output.stdout);
    assert!(
        !stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'),
        "{stdout}"
    );
    assert!(stdout.contains("\\u{1b}]0;owned\\u{7}"), "{stdout}");
}

#[test]
fn a_configuration_file_with_an_unknown_key_stops_every_command() {
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("omabox.toml"), "linux_memroy = \"1G\"\n").unwrap();
    for args in [&["sessions"][..], &["config"][..]] {
        let output = omabox(
            args,
            &[
                ("HOME", home.path().to_str().unwrap()),
                ("OMABOX_DATA_DIR", data.path().to_str().unwrap()),
            ],
        );
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains("unknown key linux_memroy"), "{stderr}");
        assert!(stderr.contains("omabox.toml"), "{stderr}");
    }
    // A file named by --config (before the command) takes the place of the data dir's.
    let named = home.path().join("node.toml");
    std::fs::write(&named, "gc_keep = 4\n").unwrap();
    let output = omabox(
        &["--config", named.to_str().unwrap(), "config", "--json"],
        &[
            ("HOME", home.path().to_str().unwrap()),
            ("OMABOX_DATA_DIR", data.path().to_str().unwrap()),
        ],
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        row(&rows(&output), "gc_keep")["source"],
        format!("file:{}", named.display())
    );
}

#[test]
fn the_markdown_reference_is_the_committed_one() {
    let output = omabox(&["config", "--markdown"], &[("HOME", "/nonexistent")]);
    assert!(output.status.success());
    let committed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md"),
    )
    .unwrap();
    assert_eq!(text(&output.stdout), committed);
}
