//! Workspace checkpoint and restore on a large tree: full checkpoint, checkpoint with nothing
//! changed, incremental checkpoint with one changed file, restore into a new binding, the
//! first checkpoint of a restored binding, and seeding a new session from the tree (beside
//! that session's first checkpoint, which captures the seeded copy).
//!
//! Prints figures only; never asserts a time. Goal (issue 4): incremental checkpoint with one
//! changed file ≤ 100 ms on a 1 GiB workspace.
//!
//! Then a tree of many small files (`OMABOX_BENCH_SMALL_FILES`, default 50,000 of 0.2–4 KiB in
//! 500 directories): full checkpoint, restore and seed beside `cp -a` of the same tree, the floor a
//! user compares with, and beside `cp -a` then `sync -f`, the floor of a durable copy.
//!
//! ```text
//! cargo bench -p omabox-persistence --bench workspace
//! OMABOX_BENCH_WORKSPACE_MIB=64 cargo bench -p omabox-persistence --bench workspace   # quick
//! OMABOX_BENCH_DIR=/some/disk ...                                                     # default /var/tmp
//! ```
//!
//! The tree is `<MiB>` files of 1 MiB of pseudo-random bytes in 32 directories plus 256 small
//! files. The data directory lives under `OMABOX_BENCH_DIR` (not /tmp, which may be a small
//! tmpfs). Blobs are fsynced as in production; the page cache is warm.

use omabox_contract::{
    AbortSignal, AttachWorkspaceInput, CheckpointWorkspaceInput, ManagedSandboxLease,
    MaterializeWorkspaceInput, RuntimeResourceFence, RuntimeResourceScope, SecretString,
    WorkspaceBinding, WorkspaceCheckpointCandidate, WorkspacePersistencePort, WorkspaceStrategy,
};
use omabox_persistence::{CheckpointReport, FilesystemWorkspacePort, binding_host_path};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("bench", "env", "session", "work")
}

fn fence(generation: u64) -> RuntimeResourceFence {
    let scope = scope();
    RuntimeResourceFence {
        workspace_id: scope.workspace_id,
        environment_id: scope.environment_id,
        session_id: scope.session_id,
        work_id: scope.work_id,
        owner_id: "bench".into(),
        generation,
        token: SecretString::new("bench-token"),
        expires_at: "2099-01-01T00:00:00.000Z".into(),
    }
}

fn lease() -> ManagedSandboxLease {
    ManagedSandboxLease {
        provider: "local".into(),
        runtime_id: "bench".into(),
        metadata: None,
    }
}

fn materialize_input(
    generation: u64,
    active: Option<omabox_contract::RuntimePublicationCandidate>,
) -> MaterializeWorkspaceInput {
    MaterializeWorkspaceInput {
        scope: scope(),
        fence: fence(generation),
        strategy: WorkspaceStrategy::CheckpointRestore,
        active_checkpoint: active,
        idempotency_key: format!("work:{generation}:workspace-materialize"),
        signal: AbortSignal::never(),
    }
}

fn checkpoint_input(
    generation: u64,
    binding: &WorkspaceBinding,
    key: &str,
) -> CheckpointWorkspaceInput {
    CheckpointWorkspaceInput {
        scope: scope(),
        fence: fence(generation),
        strategy: WorkspaceStrategy::CheckpointRestore,
        binding: binding.clone(),
        sandbox: lease(),
        idempotency_key: format!("work:{generation}:workspace-checkpoint-{key}"),
        signal: AbortSignal::never(),
    }
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn big_file(workspace: &Path, index: u64) -> PathBuf {
    workspace.join(format!("data/d{:02}/file-{index:04}.bin", index % 32))
}

fn build(workspace: &Path, mib: u64) -> u64 {
    let mut bytes = 0;
    for dir in 0..32 {
        std::fs::create_dir_all(workspace.join(format!("data/d{dir:02}"))).expect("mkdir");
    }
    for index in 0..mib {
        std::fs::write(big_file(workspace, index), noise(index + 1, MIB as usize)).expect("write");
        bytes += MIB;
    }
    for index in 0..256u64 {
        let dir = workspace.join(format!("src/module{:02}", index % 16));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let len = 100 + (index as usize * 37) % 4000;
        std::fs::write(
            dir.join(format!("part{index}.rs")),
            noise(10_000 + index, len),
        )
        .expect("write");
        bytes += len as u64;
    }
    bytes
}

fn rate(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{:.0}", bytes as f64 / MIB as f64 / secs)
}

fn print_checkpoint(name: &str, elapsed: Duration, report: &CheckpointReport) {
    println!(
        "{name:<34} {:>9.1} ms {:>9} MiB/s   files {:>5}  hashed {:>5} ({:>6} MiB)  cache hits {:>5}  new blobs {:>5}",
        elapsed.as_secs_f64() * 1000.0,
        rate(report.bytes, elapsed),
        report.files,
        report.files_hashed,
        report.bytes_hashed / MIB,
        report.cache_hits,
        report.blobs_stored,
    );
}

/// Checkpoints `binding` (of fence `generation`; the idempotency key is `label`), prints it as
/// `label`, and returns the candidate and the time it took.
async fn timed_checkpoint(
    port: &FilesystemWorkspacePort,
    generation: u64,
    binding: &WorkspaceBinding,
    label: &str,
) -> (WorkspaceCheckpointCandidate, Duration) {
    let started = Instant::now();
    let (candidate, report) = port
        .checkpoint_with_report(&checkpoint_input(generation, binding, label))
        .await
        .unwrap_or_else(|error| panic!("{label}: {error}"));
    let elapsed = started.elapsed();
    print_checkpoint(label, elapsed, &report);
    (candidate, elapsed)
}

/// The floor a checkpoint is measured against: reading every file of `workspace` (from the
/// page cache) and hashing it with SHA-256, one thread, as `sha256sum` would. Prints it.
fn hash_floor(workspace: &Path) -> Duration {
    use sha2::Digest as _;
    use std::io::Read as _;
    let started = Instant::now();
    let mut bytes = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut dirs = vec![workspace.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let entry = entry.expect("entry");
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                let mut file = std::fs::File::open(entry.path()).expect("open");
                let mut hasher = sha2::Sha256::new();
                loop {
                    let n = file.read(&mut buf).expect("read");
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                    bytes += n as u64;
                }
                std::hint::black_box(hasher.finalize());
            }
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{:<34} {:>9.1} ms {:>9} MiB/s   (read + SHA-256, one thread)",
        "hash floor",
        elapsed.as_secs_f64() * 1000.0,
        rate(bytes, elapsed)
    );
    elapsed
}

async fn run(mib: u64, base: PathBuf) {
    let temp = tempfile::Builder::new()
        .prefix("omabox-bench-")
        .tempdir_in(&base)
        .expect("temp dir under OMABOX_BENCH_DIR");
    let data = temp.path().join("data");
    let port = FilesystemWorkspacePort::new(&data).expect("port");
    println!(
        "workspace benchmark: {mib} MiB in {mib} files of 1 MiB + 256 small files; data dir {}",
        data.display()
    );

    let binding = port
        .materialize(materialize_input(1, None))
        .await
        .expect("materialize");
    let workspace = binding_host_path(binding.metadata.as_ref()).expect("hostPath");
    let started = Instant::now();
    let total = build(&workspace, mib);
    let elapsed = started.elapsed();
    println!(
        "{:<34} {:>9.1} ms {:>9} MiB/s",
        "generate tree",
        elapsed.as_secs_f64() * 1000.0,
        rate(total, elapsed)
    );
    // Let the last writes age past the racy margin, as a harness's writes normally have.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let floor = hash_floor(&workspace);

    let (_, full_elapsed) = timed_checkpoint(&port, 1, &binding, "checkpoint, full").await;
    timed_checkpoint(&port, 1, &binding, "checkpoint, nothing changed").await;

    std::fs::write(big_file(&workspace, mib / 2), noise(u64::MAX, MIB as usize)).expect("change");
    let (incremental, incremental_elapsed) =
        timed_checkpoint(&port, 1, &binding, "checkpoint, one 1 MiB file changed").await;

    let started = Instant::now();
    let (restored, restore) = port
        .materialize_with_report(&materialize_input(
            2,
            Some(incremental.to_publication_candidate()),
        ))
        .await
        .expect("restore");
    let restore_elapsed = started.elapsed();
    let restore = restore.expect("restored");
    println!(
        "{:<34} {:>9.1} ms {:>9} MiB/s   files {:>5}  (content verified)",
        "restore into a new binding",
        restore_elapsed.as_secs_f64() * 1000.0,
        rate(restore.bytes, restore_elapsed),
        restore.files
    );

    let started = Instant::now();
    port.attach(AttachWorkspaceInput {
        scope: scope(),
        fence: fence(2),
        strategy: WorkspaceStrategy::CheckpointRestore,
        binding: restored.clone(),
        sandbox: lease(),
        signal: AbortSignal::never(),
    })
    .await
    .expect("attach");
    println!(
        "{:<34} {:>9.1} ms",
        "attach (settles the restore cache)",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let (again, _) =
        timed_checkpoint(&port, 2, &restored, "checkpoint of restored, unchanged").await;
    assert_eq!(
        again.id, incremental.id,
        "a restore round trip must reproduce the checkpoint"
    );

    let (seed_elapsed, first_elapsed) =
        seed_and_first_checkpoint(&workspace, temp.path().join("seed-data")).await;

    let ratio = |elapsed: Duration| elapsed.as_secs_f64() / floor.as_secs_f64();
    println!(
        "goal: seeding <= 1.5x the hash floor: {:.2}x ({})",
        ratio(seed_elapsed),
        if ratio(seed_elapsed) <= 1.5 {
            "met"
        } else {
            "NOT met"
        },
    );
    println!(
        "the seeded session's first checkpoint (a full one): {:.2}x the hash floor",
        ratio(first_elapsed)
    );
    println!(
        "goal: full checkpoint <= 1.5x the hash floor: {:.2}x ({}); restore <= 2x: {:.2}x ({})",
        ratio(full_elapsed),
        if ratio(full_elapsed) <= 1.5 {
            "met"
        } else {
            "NOT met"
        },
        ratio(restore_elapsed),
        if ratio(restore_elapsed) <= 2.0 {
            "met"
        } else {
            "NOT met"
        },
    );
    println!(
        "goal: incremental checkpoint with one changed file <= 100 ms: {:.1} ms ({})",
        incremental_elapsed.as_secs_f64() * 1000.0,
        if incremental_elapsed <= Duration::from_millis(100) {
            "met"
        } else {
            "NOT met"
        }
    );
    let _ = port.release(&scope(), &fence(1), &binding).await;
    let _ = port.release(&scope(), &fence(2), &restored).await;
}

/// `count` small files in 500 directories; their bytes.
/// Seeds a new session from `workspace` (`omabox run --workspace DIR`) with a fresh data dir
/// `data`, so every blob is new, then checkpoints the seeded binding: a seed lists and copies
/// the tree and hashes nothing, so that session's first checkpoint is a full one. Prints and
/// returns both times.
async fn seed_and_first_checkpoint(workspace: &Path, data: PathBuf) -> (Duration, Duration) {
    let port = FilesystemWorkspacePort::new(data).expect("port");
    port.seed_new_session(scope(), workspace);
    let started = Instant::now();
    let (seeded, report) = port
        .materialize_with_report(&materialize_input(1, None))
        .await
        .expect("seed");
    let seed = started.elapsed();
    let bytes = report.map_or(0, |report| report.bytes);
    println!(
        "{:<34} {:>9.1} ms {:>9} MiB/s   (listed and copied; nothing hashed)",
        "seed a new session (--workspace)",
        seed.as_secs_f64() * 1000.0,
        rate(bytes, seed)
    );
    let (_, first) = timed_checkpoint(&port, 1, &seeded, "first checkpoint of the seed").await;
    let _ = port.release(&scope(), &fence(1), &seeded).await;
    (seed, first)
}

fn build_small(workspace: &Path, count: u64) -> u64 {
    let mut bytes = 0;
    for index in 0..count {
        let dir = workspace.join(format!("tree/d{:03}", index % 500));
        if index < 500 {
            std::fs::create_dir_all(&dir).expect("mkdir");
        }
        let len = 200 + (index as usize * 7919) % 4000;
        std::fs::write(dir.join(format!("f{index}.txt")), noise(index + 7, len)).expect("write");
        bytes += len as u64;
    }
    bytes
}

async fn run_small(count: u64, base: &Path) {
    let temp = tempfile::Builder::new()
        .prefix("omabox-bench-small-")
        .tempdir_in(base)
        .expect("temp dir under OMABOX_BENCH_DIR");
    let port = FilesystemWorkspacePort::new(temp.path().join("data")).expect("port");
    let binding = port
        .materialize(materialize_input(1, None))
        .await
        .expect("materialize");
    let workspace = binding_host_path(binding.metadata.as_ref()).expect("hostPath");
    let bytes = build_small(&workspace, count);
    println!(
        "\nsmall files: {count} files, {} KiB in 500 directories",
        bytes >> 10
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    let copy = temp.path().join("cp-copy");
    let started = Instant::now();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&workspace)
        .arg(&copy)
        .status()
        .expect("cp");
    let cp = started.elapsed();
    assert!(status.success(), "cp -a failed");
    println!(
        "{:<34} {:>9.1} ms",
        "cp -a of the tree (floor)",
        cp.as_secs_f64() * 1000.0
    );
    // A checkpoint is durable when it returns; `cp -a` is not until a sync. `sync -f` is a
    // syncfs of the copy's filesystem (it also waits for other writers' dirty data there).
    let status = std::process::Command::new("sync")
        .arg("-f")
        .arg(&copy)
        .status()
        .expect("sync");
    let cp_sync = started.elapsed();
    assert!(status.success(), "sync -f failed");
    println!(
        "{:<34} {:>9.1} ms",
        "cp -a, then sync -f (durable)",
        cp_sync.as_secs_f64() * 1000.0
    );

    let (full, checkpoint) = timed_checkpoint(&port, 1, &binding, "checkpoint, full").await;
    let started = Instant::now();
    let (restored, _) = port
        .materialize_with_report(&materialize_input(2, Some(full.to_publication_candidate())))
        .await
        .expect("restore");
    let restore = started.elapsed();
    println!(
        "{:<34} {:>9.1} ms",
        "restore into a new binding",
        restore.as_secs_f64() * 1000.0
    );
    let (seed, _) = seed_and_first_checkpoint(&workspace, temp.path().join("seed-data")).await;
    let ratio = |elapsed: Duration| elapsed.as_secs_f64() / cp.as_secs_f64();
    println!(
        "small files against cp -a: checkpoint {:.2}x, restore {:.2}x, seed {:.2}x; checkpoint against cp -a + sync: {:.2}x",
        ratio(checkpoint),
        ratio(restore),
        ratio(seed),
        checkpoint.as_secs_f64() / cp_sync.as_secs_f64()
    );
    let _ = port.release(&scope(), &fence(1), &binding).await;
    let _ = port.release(&scope(), &fence(2), &restored).await;
}

fn main() {
    let mib = std::env::var("OMABOX_BENCH_WORKSPACE_MIB")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1024u64);
    let base = std::env::var_os("OMABOX_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let small = std::env::var("OMABOX_BENCH_SMALL_FILES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(50_000u64);
    runtime.block_on(async {
        run(mib, base.clone()).await;
        if small > 0 {
            run_small(small, &base).await;
        }
    });
}

/// The `omabox` binary's allocator (`crates/cli/src/main.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
