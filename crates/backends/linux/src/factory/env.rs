//! The factory's env settings: the keys it reads and the pure parsers of their values.
//! Must never touch the system (no file, no probe): settings are checked before anything
//! is created.

/// `OMABOX_LINUX_IMAGE`: a local image artifact or a registry reference.
pub const IMAGE_ENV: &str = "OMABOX_LINUX_IMAGE";
/// `SANDBOX_IMAGE`: OpenMA's image key, read when [`IMAGE_ENV`] is unset.
pub const SANDBOX_IMAGE_ENV: &str = "SANDBOX_IMAGE";
/// `OMABOX_LINUX_IMAGE_CACHE`: where image artifacts are unpacked.
pub const IMAGE_CACHE_ENV: &str = "OMABOX_LINUX_IMAGE_CACHE";
/// `OMABOX_REGISTRY_ALLOWED_HOSTS`: hosts a registry may send a pull to besides itself.
pub use crate::image::ALLOWED_HOSTS_ENV;
/// `OMABOX_INSECURE_REGISTRIES`: registries pulled from over plain HTTP.
pub use crate::image::INSECURE_REGISTRIES_ENV;
/// `OMABOX_IMAGE_MAX_BYTES`, `OMABOX_IMAGE_MAX_ENTRIES`: what one image may unpack to.
pub use crate::image::{MAX_BYTES_ENV, MAX_ENTRIES_ENV};
/// `OMABOX_PULL_TIMEOUT`, `OMABOX_PULL_STALL_TIMEOUT`: a registry pull's deadline and
/// stall window, in seconds.
pub use crate::image::{PULL_TIMEOUT_ENV, STALL_TIMEOUT_ENV};
/// `DOCKER_CONFIG`: docker's configuration directory (registry credentials).
pub const DOCKER_CONFIG_ENV: &str = "DOCKER_CONFIG";
/// `HOME`: read only to find `~/.docker/config.json` when `DOCKER_CONFIG` is unset.
pub const HOME_ENV: &str = "HOME";
/// `OMABOX_LINUX_MEMORY`: memory limit.
pub const MEMORY_ENV: &str = "OMABOX_LINUX_MEMORY";
/// `OMABOX_LINUX_CPUS`: CPU quota.
pub const CPUS_ENV: &str = "OMABOX_LINUX_CPUS";
/// `OMABOX_LINUX_PIDS`: task limit.
pub const PIDS_ENV: &str = "OMABOX_LINUX_PIDS";
/// `OMABOX_LINUX_EXEC_TIMEOUT_MS`: default exec timeout.
pub const EXEC_TIMEOUT_ENV: &str = "OMABOX_LINUX_EXEC_TIMEOUT_MS";
/// `OMABOX_LINUX_RUNTIME_DIR`: parent of the state dirs.
pub const RUNTIME_DIR_ENV: &str = "OMABOX_LINUX_RUNTIME_DIR";
/// `OMABOX_LINUX_CGROUP_PARENT`: cgroup parent directory name.
pub const CGROUP_PARENT_ENV: &str = "OMABOX_LINUX_CGROUP_PARENT";
/// `OMABOX_LINUX_INIT`: the setup-stage binary.
pub const INIT_ENV: &str = "OMABOX_LINUX_INIT";
/// `PATH`: read only to find the setup-stage binary when `OMABOX_LINUX_INIT` is unset and
/// it is not next to the running executable.
pub const PATH_ENV: &str = "PATH";

/// `OMABOX_LINUX_READONLY_BINDS`: host directories bound read-only into the sandbox.
pub const READONLY_BINDS_ENV: &str = "OMABOX_LINUX_READONLY_BINDS";

/// `OMABOX_LINUX_ENV_LAYER`: `{"apt":[…],"dockerfile":"…","files":{ID:{"path","sha256"}}}`
/// (`files`: what the dockerfile's `COPY` takes), what the sandbox's image gets
/// as an environment layer, built once per image and content (`crate::env_layer`).
pub const ENV_LAYER_ENV: &str = "OMABOX_LINUX_ENV_LAYER";

/// Parses [`ENV_LAYER_ENV`] (`None`: nothing to build).
pub fn parse_env_layer(text: &str) -> Result<Option<crate::env_layer::LayerSpec>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Wire {
        #[serde(default)]
        apt: Vec<String>,
        #[serde(default)]
        dockerfile: Option<String>,
        #[serde(default)]
        files: std::collections::BTreeMap<String, crate::env_layer::CopyFile>,
    }
    let wire: Wire = serde_json::from_str(text).map_err(|e| {
        format!("must be a JSON object {{\"apt\":[…],\"dockerfile\":\"…\",\"files\":{{…}}}}: {e}")
    })?;
    crate::env_layer::LayerSpec::new(wire.apt, wire.dockerfile.as_deref(), wire.files)
}

/// `OMABOX_LINUX_MEMORY_MOUNT`: `1` gives the sandbox a writable tmpfs at `/mnt/memory`
/// (where memory stores are copied in).
pub const MEMORY_MOUNT_ENV: &str = "OMABOX_LINUX_MEMORY_MOUNT";

/// `OMABOX_LINUX_WORKSPACE_TMPFS`: `1` makes `/workspace` a tmpfs of the sandbox's own
/// instead of the context's workdir ([`crate::plan::SandboxPlan::workspace_tmpfs`]).
pub const WORKSPACE_TMPFS_ENV: &str = "OMABOX_LINUX_WORKSPACE_TMPFS";

/// `OMABOX_LINUX_NETWORK`: the sandbox's networking config.
pub const NETWORK_ENV: &str = "OMABOX_LINUX_NETWORK";
/// `OMABOX_LINUX_GATEWAY`: where the omabox gateway listens, as the host reaches it.
pub const GATEWAY_ENV: &str = "OMABOX_LINUX_GATEWAY";

/// `OMABOX_LINUX_TEST_HOSTS`: test mode only, fixed names for the sandboxes' networks.
pub const TEST_HOSTS_ENV: &str = "OMABOX_LINUX_TEST_HOSTS";

/// Every key the factory reads, in documentation order.
pub const ENV_KEYS: &[&str] = &[
    IMAGE_ENV,
    SANDBOX_IMAGE_ENV,
    IMAGE_CACHE_ENV,
    INSECURE_REGISTRIES_ENV,
    ALLOWED_HOSTS_ENV,
    PULL_TIMEOUT_ENV,
    STALL_TIMEOUT_ENV,
    MAX_BYTES_ENV,
    MAX_ENTRIES_ENV,
    DOCKER_CONFIG_ENV,
    HOME_ENV,
    MEMORY_ENV,
    CPUS_ENV,
    PIDS_ENV,
    EXEC_TIMEOUT_ENV,
    READONLY_BINDS_ENV,
    ENV_LAYER_ENV,
    MEMORY_MOUNT_ENV,
    WORKSPACE_TMPFS_ENV,
    NETWORK_ENV,
    GATEWAY_ENV,
    TEST_HOSTS_ENV,
    RUNTIME_DIR_ENV,
    CGROUP_PARENT_ENV,
    INIT_ENV,
    PATH_ENV,
];

/// Parses [`READONLY_BINDS_ENV`]: `HOST_DIR:SANDBOX_DIR` pairs separated by `,` (both
/// absolute, without `..`; the host side must exist when the sandbox starts; the sandbox
/// side may not be `/`, `/proc`, `/dev` or `/tmp`, checked with the plan). Each is mounted
/// read-only, nosuid, nodev, idmapped like the workspace.
pub fn parse_readonly_binds(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut binds = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((host, inside)) = entry.split_once(':') else {
            return Err(format!("`{entry}` is not HOST_DIR:SANDBOX_DIR"));
        };
        for (what, path) in [("host", host), ("sandbox", inside)] {
            if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
                return Err(format!(
                    "the {what} path of `{entry}` must be absolute, without `..`"
                ));
            }
        }
        binds.push((host.to_owned(), inside.to_owned()));
    }
    Ok(binds)
}

/// Parses [`NETWORK_ENV`]: `none`, `unrestricted`, `limited` (nothing but the gateway), or
/// an Environment `networking` JSON object (`{"type":"limited","allowed_hosts":[...]}`).
/// Host entries are checked here, so a bad one fails before anything starts.
pub fn parse_networking(
    text: &str,
) -> Result<omabox_contract::networking::NetworkingConfig, String> {
    use omabox_contract::networking::{NetworkPolicy, NetworkingConfig};
    let text = text.trim();
    let config = match text {
        "none" => NetworkingConfig::None,
        "unrestricted" => NetworkingConfig::Unrestricted,
        "limited" => NetworkingConfig::Limited {
            allowed_hosts: Vec::new(),
            allow_package_managers: false,
            allow_mcp_servers: false,
        },
        json if json.starts_with('{') => {
            serde_json::from_str(json).map_err(|e| format!("not a networking object: {e}"))?
        }
        _ => {
            return Err("must be none, limited, unrestricted or a networking JSON object".into());
        }
    };
    NetworkPolicy::compile(&config, &[]).map_err(|e| e.to_string())?;
    Ok(config)
}

/// Parses [`GATEWAY_ENV`]: `IP:PORT` (`127.0.0.1:8787`, `[::1]:8787`), or `NAME=IP:PORT`
/// when the sandbox knows the gateway by a host name (its URL's host), which the sandbox's
/// DNS then answers with its own loopback.
pub fn parse_gateway(text: &str) -> Result<(std::net::SocketAddr, Option<String>), String> {
    let text = text.trim();
    let (name, addr) = match text.split_once('=') {
        Some((name, addr)) => {
            let name = omabox_contract::networking::normalize_name(name)
                .ok_or_else(|| format!("{name:?} is not a host name"))?;
            (Some(name), addr)
        }
        None => (None, text),
    };
    let addr = addr
        .parse()
        .map_err(|_| "must be IP:PORT or NAME=IP:PORT, such as 127.0.0.1:8787".to_owned())?;
    Ok((addr, name))
}

/// Parses a CPU count with at most three decimals (`2`, `0.5`, `1.25`) into
/// thousandths of a CPU; at least 0.01 (the kernel's smallest quota is 1 ms per 100 ms).
pub fn parse_millicpus(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a CPU count; expected e.g. 1, 0.5 or 2.25");
    let t = text.trim();
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
        return Err(bad());
    }
    if frac.len() > 3 {
        return Err(format!("{text:?}: at most three decimals"));
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let frac: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
    let milli = whole
        .checked_mul(1000)
        .and_then(|w| w.checked_add(frac))
        .filter(|m| *m <= 1 << 20)
        .ok_or_else(|| format!("{text:?} is too many CPUs"))?;
    if milli < 10 {
        return Err(format!("{text:?} is below the smallest quota of 0.01 CPU"));
    }
    Ok(milli)
}

/// Parses a memory size: bytes, or a number with a binary `K`, `M`, `G` or `T` suffix
/// (optionally followed by `B` or `iB`; case-insensitive). Zero is refused.
pub fn parse_memory_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a size; expected bytes or a number with K, M, G or T (e.g. 512M, 1G)"
        ));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {suffix:?}; use K, M, G or T (e.g. 512M, 1G)"
            ));
        }
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is too large"))?;
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err("a memory limit of 0 bytes leaves no room to run anything".into());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_linux_sandbox::CpuLimit;

    #[test]
    fn readonly_binds_are_pairs_of_absolute_paths() {
        assert_eq!(
            parse_readonly_binds(" /var/cache/a:/opt/a , /b:/opt/b,"),
            Ok(vec![
                ("/var/cache/a".to_owned(), "/opt/a".to_owned()),
                ("/b".to_owned(), "/opt/b".to_owned()),
            ])
        );
        assert_eq!(parse_readonly_binds(""), Ok(vec![]));
        for bad in ["/a", "a:/b", "/a:b", "/a/..:/b", "/a:/b/../c"] {
            assert!(parse_readonly_binds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn networking_takes_a_name_or_the_environment_json() {
        use omabox_contract::networking::NetworkingConfig;
        assert_eq!(parse_networking(" none "), Ok(NetworkingConfig::None));
        assert_eq!(
            parse_networking("unrestricted"),
            Ok(NetworkingConfig::Unrestricted)
        );
        assert_eq!(
            parse_networking("limited"),
            Ok(NetworkingConfig::Limited {
                allowed_hosts: vec![],
                allow_package_managers: false,
                allow_mcp_servers: false
            })
        );
        assert_eq!(
            parse_networking(r#"{"type":"limited","allowed_hosts":["pypi.org:443"]}"#),
            Ok(NetworkingConfig::Limited {
                allowed_hosts: vec!["pypi.org:443".into()],
                allow_package_managers: false,
                allow_mcp_servers: false
            })
        );
        assert!(
            parse_networking("open")
                .unwrap_err()
                .contains("must be none")
        );
        assert!(
            parse_networking(r#"{"type":"limited","allowed_hosts":["10.0.0.1"]}"#)
                .unwrap_err()
                .contains("10.0.0.1")
        );
        assert!(
            parse_networking(r#"{"type":"limited","hosts":[]}"#)
                .unwrap_err()
                .contains("not a networking object")
        );
        assert_eq!(
            parse_gateway("127.0.0.1:8787"),
            Ok(("127.0.0.1:8787".parse().unwrap(), None))
        );
        assert_eq!(
            parse_gateway("Gw.Example=10.0.0.5:443"),
            Ok(("10.0.0.5:443".parse().unwrap(), Some("gw.example".into())))
        );
        assert!(parse_gateway("localhost:8787").is_err());
        assert!(parse_gateway("bad name=10.0.0.5:443").is_err());
    }

    #[test]
    fn memory_sizes_take_binary_suffixes() {
        assert_eq!(parse_memory_size("1024"), Ok(1024));
        assert_eq!(parse_memory_size("512M"), Ok(512 << 20));
        assert_eq!(parse_memory_size("1g"), Ok(1 << 30));
        assert_eq!(parse_memory_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_memory_size("64kb"), Ok(64 << 10));
        assert!(parse_memory_size("0").is_err());
        assert!(
            parse_memory_size("lots")
                .unwrap_err()
                .contains("not a size")
        );
        assert!(
            parse_memory_size("5X")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(
            parse_memory_size("99999999999T")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn cpu_counts_parse_to_thousandths() {
        for (text, milli) in [
            ("1", 1000),
            ("0.5", 500),
            ("2.25", 2250),
            (".01", 10),
            ("3.", 3000),
        ] {
            assert_eq!(parse_millicpus(text), Ok(milli), "{text}");
        }
        for text in [
            "",
            ".",
            "0",
            "0.001",
            "1.2345",
            "-1",
            "1e3",
            "two",
            "99999999999",
        ] {
            assert!(parse_millicpus(text).is_err(), "{text}");
        }
        // SAFETY: cpu_set_t is plain data, which sched_getaffinity fills and CPU_COUNT reads.
        let host = unsafe {
            let mut mask: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut mask), 0);
            libc::CPU_COUNT(&mask)
        } as u64;
        assert_eq!(
            CpuLimit::default_quota(),
            CpuLimit::millicpus(host.min(2) * 1000)
        );
    }
}
