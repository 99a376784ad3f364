//! The `omabox` binary driven as a user would: real process, real data directory.

use omabox_contract::{
    EnqueueRuntimeOrphanInput, ManagedSandboxLease, PortError, RuntimeOrphanPort,
    RuntimeResourceScope, TerminationReason,
};
use omabox_store::SqliteStore;
use std::path::Path;
use std::process::{Command, Output};

fn omabox(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .expect("the omabox binary runs")
}

fn stdout_json(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "omabox failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON document")
}

#[test]
fn catalog_json_lists_the_twelve_openma_providers_then_omaboxs_own_with_every_column() {
    let dir = tempfile::tempdir().unwrap();
    let rows = stdout_json(&omabox(dir.path(), &["catalog", "--json"]));
    let rows = rows.as_array().expect("an array of rows");
    let ids: Vec<&str> = rows.iter().map(|row| row["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "node-docker",
            "cloudflare",
            "cloudflare-bridge",
            "e2b",
            "daytona",
            "litebox",
            "boxrun",
            "blaxel",
            "sprites",
            "vercel",
            "modal",
            "superserve",
            "linux",
            "local",
            "docker",
            "gvisor"
        ]
    );
    for row in rows {
        for column in [
            "managedRuntime",
            "status",
            "driverLanes",
            "lifecycle",
            "workspace",
            "outputs",
            "runtimeCheckpoints",
            "sandboxPortFacts",
        ] {
            assert!(row.get(column).is_some(), "{} lacks {column}", row["id"]);
        }
    }
}

#[test]
fn catalog_prints_a_readable_table() {
    let dir = tempfile::tempdir().unwrap();
    let output = omabox(dir.path(), &["catalog"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(text.lines().count(), 17, "{text}");
    assert!(text.contains("superserve"));
    assert!(
        text.lines().any(|line| line.starts_with("linux ")),
        "{text}"
    );
    assert!(
        text.lines().any(|line| line.starts_with("local ")),
        "{text}"
    );
    assert!(
        text.lines().any(|line| line.starts_with("docker ")),
        "{text}"
    );
    assert!(
        text.lines().any(|line| line.starts_with("gvisor ")),
        "{text}"
    );
}

#[tokio::test]
async fn reap_keeps_an_orphan_of_an_unknown_provider_queued_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SqliteStore::open(dir.path().join("omabox.db")).unwrap();
        store
            .enqueue(EnqueueRuntimeOrphanInput {
                scope: RuntimeResourceScope::new("w", "e", "s", "k"),
                generation: 3,
                owner_id: "owner".into(),
                sandbox: ManagedSandboxLease {
                    provider: "nowhere".into(),
                    runtime_id: "rt-1".into(),
                    metadata: None,
                },
                reason: TerminationReason::Failed,
                error: PortError::new("terminate failed"),
            })
            .await
            .unwrap();
    }
    for attempt in 1..=2 {
        let report = stdout_json(&omabox(dir.path(), &["reap", "--json"]));
        assert_eq!(report["inspected"], 1);
        assert_eq!(report["resolved"], 0);
        assert_eq!(report["remaining"], 1);
        let queued = &report["queued"][0];
        assert_eq!(queued["sandbox"]["runtimeId"], "rt-1");
        assert_eq!(queued["attempts"], attempt);
        assert_eq!(
            queued["lastError"],
            "No sandbox backend is registered for provider nowhere"
        );
    }
}

#[test]
fn reap_rejects_a_zero_limit() {
    let dir = tempfile::tempdir().unwrap();
    let output = omabox(dir.path(), &["reap", "--limit", "0"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--limit"));
}

#[test]
fn data_dir_defaults_under_xdg_data_home() {
    let xdg = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .env_remove("OMABOX_DATA_DIR")
        .env("XDG_DATA_HOME", xdg.path())
        .args(["reap", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(xdg.path().join("omabox/omabox.db").exists());
}

/// `.cargo/config.toml` links omabox's executables as static PIEs: loaded at a random
/// address, with no dynamic loader or shared library to map (SECURITY.md has the trade-off).
/// Fails if the config is lost.
#[test]
fn the_executables_are_static_pies() {
    let omabox = Path::new(env!("CARGO_BIN_EXE_omabox")).to_path_buf();
    // The linux backend's binary: built next to it when the whole workspace is.
    let init = omabox.with_file_name("omabox-sandbox-init");
    for exe in std::iter::once(omabox).chain(init.is_file().then_some(init)) {
        let elf = std::fs::read(&exe).unwrap();
        let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
        let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
        assert_eq!(
            &elf[..5],
            b"\x7fELF\x02",
            "{}: a 64-bit ELF file",
            exe.display()
        );
        const ET_DYN: usize = 3;
        assert_eq!(
            u16_at(0x10),
            ET_DYN,
            "{} is not position-independent",
            exe.display()
        );
        let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
        let headers: Vec<(u32, usize, usize)> = (0..phnum)
            .map(|i| {
                let at = phoff + i * phentsize;
                let kind = u32::from_le_bytes(elf[at..at + 4].try_into().unwrap());
                (kind, u64_at(at + 8), u64_at(at + 32))
            })
            .collect();
        const PT_DYNAMIC: u32 = 2;
        const PT_INTERP: u32 = 3;
        assert!(
            headers.iter().all(|(kind, ..)| *kind != PT_INTERP),
            "{} names a dynamic loader",
            exe.display()
        );
        // A static PIE's dynamic section holds its relocations only: no shared library.
        const DT_NEEDED: usize = 1;
        for (_, offset, size) in headers.iter().filter(|(kind, ..)| *kind == PT_DYNAMIC) {
            let needed = (*offset..offset + size)
                .step_by(16)
                .any(|at| u64_at(at) == DT_NEEDED);
            assert!(!needed, "{} needs a shared library", exe.display());
        }
    }
}

/// x86-64 musl: `omabox` starts at `omabox_start` (`src/entry.rs`), which has the kernel
/// copy the pages the static PIE's self-relocation writes in one call, before the C
/// library's `_start`. Fails if `build.rs` stops naming it the entry point.
#[test]
#[cfg(all(target_arch = "x86_64", target_env = "musl"))]
fn omabox_starts_at_its_populating_entry_point() {
    let elf = std::fs::read(env!("CARGO_BIN_EXE_omabox")).unwrap();
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let entry = u64_at(0x18);
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let section = |i: usize| shoff + i * shentsize;
    const SHT_SYMTAB: usize = 2;
    let symtab = (0..shnum)
        .map(section)
        .find(|&at| u32_at(at + 4) == SHT_SYMTAB)
        .expect("a symbol table");
    let (offset, size, strtab) = (
        u64_at(symtab + 24),
        u64_at(symtab + 32),
        u32_at(symtab + 40),
    );
    let names = u64_at(section(strtab) + 24);
    let name = |at: usize| {
        let from = names + u32_at(at);
        let len = elf[from..].iter().position(|b| *b == 0).unwrap();
        &elf[from..from + len]
    };
    let start = (offset..offset + size)
        .step_by(24)
        .find(|&at| name(at) == b"omabox_start")
        .map(|at| u64_at(at + 8))
        .expect("an omabox_start symbol");
    assert_eq!(entry, start, "the entry point is not omabox_start");
    // And a process started there runs as before.
    let out = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
}
