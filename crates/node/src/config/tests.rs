use super::report::{HIDDEN, markdown, rows};
use super::*;
use std::os::unix::fs::PermissionsExt as _;

fn env(vars: &[(&str, &str)]) -> Environment {
    vars.iter().copied().collect()
}

/// A data dir of this user with `text` as its `omabox.toml`.
fn data_dir_with_file(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("omabox.toml"), text).unwrap();
    dir
}

#[test]
fn a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default() {
    let dir = data_dir_with_file("gc_keep = 7\nlinux_memory = \"1G\"\nlinux_pids = 64\n");
    let data = dir.path().to_str().unwrap();
    let flags = Flags::new().with(Key::LinuxMemory, "2G");
    let config = NodeConfig::from_sources(
        &flags,
        env(&[
            ("OMABOX_DATA_DIR", data),
            ("OMABOX_LINUX_MEMORY", "3G"),
            ("OMABOX_LINUX_PIDS", "99"),
        ]),
    )
    .unwrap();
    let file = dir.path().join("omabox.toml");
    assert_eq!(config.file(), Some(file.as_path()));
    assert_eq!(config.given(Key::LinuxMemory), Some("2G"));
    assert_eq!(config.source(Key::LinuxMemory), Source::Flag);
    assert_eq!(config.given(Key::LinuxPids), Some("99"));
    assert_eq!(
        config.source(Key::LinuxPids),
        Source::Env("OMABOX_LINUX_PIDS")
    );
    assert_eq!(config.given(Key::GcKeep), Some("7"));
    assert_eq!(config.source(Key::GcKeep), Source::File(file.clone()));
    assert_eq!(config.gc_keep().unwrap(), 7);
    assert_eq!(config.given(Key::CheckpointMaxEntries), None);
    assert_eq!(config.source(Key::CheckpointMaxEntries), Source::Default);
    assert_eq!(
        config.value(Key::CheckpointMaxEntries).as_deref(),
        Some("1000000")
    );
    assert_eq!(
        config.source(Key::DataDir).to_string(),
        "env:OMABOX_DATA_DIR"
    );
    assert_eq!(
        config.source(Key::GcKeep).to_string(),
        format!("file:{}", file.display())
    );
}

/// The linux backend's typed config is read from the settings directly (no env map): a
/// flag, a variable and the node's image cache land in their fields, and a bad value names
/// the variable it came from.
#[test]
fn the_linux_config_is_read_from_the_settings_and_names_their_variables() {
    use omabox_backend_linux::factory::{LinuxSandboxFactory, SandboxImage};
    let flags = Flags::new()
        .with(Key::Image, "alpine:3")
        .with(Key::LinuxMemory, "1G");
    let config = NodeConfig::from_sources(
        &flags,
        env(&[
            ("HOME", "/nonexistent"),
            ("PATH", "/opt/bin:/usr/bin"),
            ("OMABOX_LINUX_RUNTIME_DIR", "/run/x"),
            ("OMABOX_LINUX_PIDS", "64"),
        ]),
    )
    .unwrap();
    let linux = config.linux_config(&LinuxSandboxFactory::new()).unwrap();
    assert_eq!(linux.limits.memory_bytes, Some(1 << 30));
    assert_eq!(linux.limits.pids_max, Some(64));
    assert_eq!(linux.runtime.runtime_dir, Path::new("/run/x"));
    assert_eq!(
        linux.runtime.init_search_path,
        [Path::new("/opt/bin"), Path::new("/usr/bin")]
    );
    let SandboxImage::Pending(pending) = &linux.image else {
        panic!(
            "a registry image is pending until prepared: {:?}",
            linux.image
        );
    };
    assert_eq!(pending.cache_dir, config.image_cache().unwrap());
    assert_eq!(
        pending.registry.as_ref().unwrap().reference.canonical(),
        "docker.io/library/alpine:3"
    );
    let config = NodeConfig::from_sources(
        &Flags::new(),
        env(&[("HOME", "/nonexistent"), ("SANDBOX_IMAGE", "./relative")]),
    )
    .unwrap();
    let error = config
        .linux_config(&LinuxSandboxFactory::new())
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("SANDBOX_IMAGE=\"./relative\""), "{error}");
}

#[test]
fn the_first_variable_set_wins_and_the_factory_gets_it_under_its_own_name() {
    let home = ("HOME", "/nonexistent");
    let config =
        NodeConfig::from_sources(&Flags::new(), env(&[home, ("SANDBOX_IMAGE", "debian:12")]))
            .unwrap();
    assert_eq!(config.source(Key::Image), Source::Env("SANDBOX_IMAGE"));
    let factory = config.factory_env();
    assert_eq!(factory.get("SANDBOX_IMAGE"), Some("debian:12"));
    assert_eq!(factory.get("OMABOX_LINUX_IMAGE"), None);
    let both = env(&[
        home,
        ("SANDBOX_IMAGE", "debian:12"),
        ("OMABOX_LINUX_IMAGE", "/srv/rootfs"),
    ]);
    let config = NodeConfig::from_sources(&Flags::new(), both).unwrap();
    assert_eq!(config.given(Key::Image), Some("/srv/rootfs"));
    // A flag's value goes under the setting's first variable; only given values go, and
    // only the factory's settings.
    let flags = Flags::new().with(Key::Image, "alpine:3");
    let config = NodeConfig::from_sources(
        &flags,
        env(&[
            home,
            ("SANDBOX_IMAGE", "debian:12"),
            ("OMABOX_GC_KEEP", "3"),
        ]),
    )
    .unwrap();
    let factory = config.factory_env();
    assert_eq!(factory.get("OMABOX_LINUX_IMAGE"), Some("alpine:3"));
    assert_eq!(factory.get("SANDBOX_IMAGE"), None);
    assert_eq!(
        factory.keys().collect::<Vec<_>>(),
        ["HOME", "OMABOX_LINUX_IMAGE", "OMABOX_LINUX_IMAGE_CACHE"]
    );
    // The image cache the node resolved, so the factory derives none of its own.
    assert_eq!(
        factory.get("OMABOX_LINUX_IMAGE_CACHE").map(Path::new),
        Some(config.image_cache().unwrap().as_path())
    );
}

#[test]
fn unknown_file_keys_are_refused_naming_them() {
    let dir = data_dir_with_file("gc_keep = 2\nlinux_memroy = \"1G\"\nimage_cash = \"/x\"\n");
    let error = NodeConfig::from_sources(
        &Flags::new(),
        env(&[("OMABOX_DATA_DIR", dir.path().to_str().unwrap())]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("unknown keys image_cash, linux_memroy"),
        "{error}"
    );
    assert!(error.contains("omabox.toml"), "{error}");
    for (text, says) in [
        ("config = \"/x\"", "unknown key config"),
        (
            "data_dir = \"/elsewhere\"",
            "data_dir cannot be set in the data directory's own file",
        ),
        (
            "gc_keep = [1]",
            "gc_keep must be a string, a number or a boolean",
        ),
        ("gc_keep = ", "not TOML"),
    ] {
        let dir = data_dir_with_file(text);
        let error = NodeConfig::from_sources(
            &Flags::new(),
            env(&[("OMABOX_DATA_DIR", dir.path().to_str().unwrap())]),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains(says), "{text}: {error}");
    }
}

#[test]
fn a_named_file_may_move_the_data_dir_and_must_exist() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.toml");
    std::fs::write(&file, "data_dir = \"/srv/omabox\"\n").unwrap();
    let config = NodeConfig::from_sources(
        &Flags::new().with(Key::Config, file.to_str().unwrap()),
        env(&[("HOME", "/nonexistent")]),
    )
    .unwrap();
    assert_eq!(config.data_dir_choice().unwrap(), Path::new("/srv/omabox"));
    let missing = dir.path().join("missing.toml");
    let error = NodeConfig::from_sources(
        &Flags::new(),
        env(&[("OMABOX_CONFIG", missing.to_str().unwrap())]),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("missing.toml: cannot read it"), "{error}");
}

#[test]
fn a_file_others_can_write_is_refused() {
    let dir = data_dir_with_file("gc_keep = 2\n");
    let file = dir.path().join("omabox.toml");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let error = NodeConfig::from_sources(
        &Flags::new(),
        env(&[("OMABOX_DATA_DIR", dir.path().to_str().unwrap())]),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("writable by other users"), "{error}");
    // The data dir itself is checked as every command checks it.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let error = NodeConfig::from_sources(
        &Flags::new(),
        env(&[("OMABOX_DATA_DIR", dir.path().to_str().unwrap())]),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("writable by other users"), "{error}");
}

#[test]
fn a_bad_value_is_reported_with_its_name_value_and_source() {
    let config = NodeConfig::from_sources(
        &Flags::new().with(Key::GcKeep, "0"),
        env(&[("HOME", "/h"), ("OMABOX_LINUX_MEMORY", "12Q")]),
    )
    .unwrap();
    let problems: Vec<String> = config.problems().iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(
        problems[0],
        "--keep=\"0\" is invalid (flag): not a whole number of at least 1"
    );
    assert!(
        problems[1].starts_with(
            "OMABOX_LINUX_MEMORY=\"12Q\" is invalid (env): \"12Q\" has an unknown unit"
        ),
        "{}",
        problems[1]
    );
    assert!(config.gc_keep().is_err());
    let dir = data_dir_with_file("checkpoint_max_bytes = \"lots\"\n");
    let config = NodeConfig::from_sources(
        &Flags::new(),
        env(&[("OMABOX_DATA_DIR", dir.path().to_str().unwrap())]),
    )
    .unwrap();
    let error = config.checkpoint_limits().unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "checkpoint_max_bytes=\"lots\" is invalid (file {}): not a positive size (bytes, or with K, M, G or T)",
            dir.path().join("omabox.toml").display()
        )
    );
}

#[test]
fn secrets_are_never_shown() {
    let key = "sk-ant-very-secret";
    let config = NodeConfig::from_sources(
        &Flags::new().with(Key::InferenceGateway, "not a url with a secret-token"),
        env(&[
            ("HOME", "/h"),
            ("ANTHROPIC_API_KEY", key),
            ("OMABOX_API_KEY", key),
        ]),
    )
    .unwrap();
    let shown = rows(&config);
    for name in ["anthropic_api_key", "operator_api_key", "inference_gateway"] {
        let row = shown.iter().find(|r| r.key == name).unwrap();
        assert!(row.secret);
        assert_eq!(row.value.as_deref(), Some(HIDDEN), "{name}");
    }
    let openai = shown.iter().find(|r| r.key == "openai_api_key").unwrap();
    assert_eq!(openai.value, None);
    let everything = format!(
        "{}{:?}",
        serde_json::to_string(&shown).unwrap(),
        config.problems()
    );
    assert!(!everything.contains(key), "{everything}");
    assert!(!everything.contains("secret-token"), "{everything}");
    assert!(
        everything.contains("--inference-gateway=(set, hidden) is invalid (flag)"),
        "{everything}"
    );
    assert!(!format!("{config:?}").contains(key));
    assert_eq!(config.secret(Key::AnthropicApiKey).unwrap().expose(), key);
    assert_eq!(
        config.source(Key::OperatorApiKey),
        Source::Env("OMABOX_API_KEY")
    );
    // Secrets are read when asked for, never at load: nothing of them is kept.
    assert_eq!(config.given(Key::AnthropicApiKey), None);
}

/// A password written into a URL setting (`http://user:PASSWORD@host`) is shown by no
/// report and no error; `serve_url` refuses user information outright.
#[test]
fn a_password_in_a_url_setting_is_never_shown() {
    let password = "url-password-7f3e";
    let config = NodeConfig::from_sources(
        &Flags::new(),
        env(&[
            ("HOME", "/h"),
            (
                "OMABOX_SERVE_URL",
                &format!("http://op:{password}@127.0.0.1:8787"),
            ),
            (
                "ANTHROPIC_BASE_URL",
                &format!("https://u:{password}@llm.example/v1"),
            ),
        ]),
    )
    .unwrap();
    let everything = format!(
        "{}{:?}",
        serde_json::to_string(&rows(&config)).unwrap(),
        config.problems()
    );
    assert!(!everything.contains(password), "{everything}");
    assert!(
        everything.contains("https://(hidden)@llm.example/v1"),
        "{everything}"
    );
    assert!(
        everything.contains("must carry no user name or password"),
        "{everything}"
    );
    assert_eq!(
        crate::config::report::without_url_credentials("a http://x@h/p and ftp://y:z@k:1 b"),
        "a http://(hidden)@h/p and ftp://(hidden)@k:1 b"
    );
}

#[test]
fn a_secret_in_a_file_is_refused() {
    let dir = data_dir_with_file("anthropic_api_key = \"sk-ant\"\n");
    let error = NodeConfig::from_sources(
        &Flags::new(),
        env(&[("OMABOX_DATA_DIR", dir.path().to_str().unwrap())]),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("anthropic_api_key is a secret: give it in the environment (ANTHROPIC_API_KEY), never in a file"), "{error}");
    assert!(!error.contains("sk-ant"), "{error}");
}

#[test]
fn test_hooks_and_internal_settings_show_only_when_set() {
    let config = NodeConfig::from_sources(&Flags::new(), env(&[("HOME", "/h")])).unwrap();
    let names: Vec<&str> = rows(&config).iter().map(|r| r.key).collect();
    assert!(names.contains(&"linux_memory") && names.contains(&"home"));
    for hidden in [
        "test_mode",
        "fault_point",
        "linux_env_layer",
        "lease_ttl_ms",
    ] {
        assert!(!names.contains(&hidden), "{hidden}");
    }
    let config = NodeConfig::from_sources(
        &Flags::new(),
        env(&[
            ("HOME", "/h"),
            ("OMABOX_TEST_MODE", "1"),
            ("OMABOX_FAULT_POINT", "x"),
        ]),
    )
    .unwrap();
    let names: Vec<&str> = rows(&config).iter().map(|r| r.key).collect();
    assert!(names.contains(&"test_mode") && names.contains(&"fault_point"));
    assert!(config.is_test_mode());
}

#[test]
fn computed_defaults_follow_the_host_variables() {
    let config = NodeConfig::from_sources(
        &Flags::new(),
        env(&[
            ("HOME", "/h"),
            ("XDG_DATA_HOME", "/xd"),
            ("TMPDIR", "/scratch"),
        ]),
    )
    .unwrap();
    assert_eq!(config.value(Key::DataDir).as_deref(), Some("/xd/omabox"));
    assert_eq!(
        config.value(Key::AgentCache).as_deref(),
        Some("/xd/omabox/agents")
    );
    assert_eq!(
        config.value(Key::DockerConfig).as_deref(),
        Some("/h/.docker")
    );
    assert_eq!(config.tmp_dir(), Path::new("/scratch"));
    let cache = config.image_cache().unwrap();
    if rustix::process::geteuid().is_root() {
        assert_eq!(cache, Path::new("/var/lib/omabox/images"));
    } else {
        assert_eq!(cache, Path::new("/h/.cache/omabox/images"));
    }
    let config = NodeConfig::from_sources(
        &Flags::new(),
        env(&[("OMABOX_LINUX_IMAGE_CACHE", "/c"), ("OMABOX_DATA_DIR", "")]),
    )
    .unwrap();
    assert_eq!(config.image_cache().unwrap(), Path::new("/c"));
    let error = config.data_dir_choice().unwrap_err().to_string();
    assert!(
        error.starts_with("OMABOX_DATA_DIR=\"\" is invalid (env): empty"),
        "{error}"
    );
}

/// `docs/configuration.md` is what the table generates: edit the table, then run
/// `omabox config --markdown > docs/configuration.md`.
#[test]
fn the_committed_reference_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == markdown(),
        "{} is stale: regenerate it with `omabox config --markdown > docs/configuration.md`",
        path.display()
    );
}

#[test]
fn every_reference_cell_is_at_most_80_words() {
    for line in markdown().lines().filter(|l| l.starts_with("| `")) {
        for cell in line.split(" | ") {
            let words = cell.split_whitespace().count();
            assert!(words <= 80, "{words} words: {cell}");
        }
    }
}
