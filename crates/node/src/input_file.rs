//! Files (and standard input) the user hands the CLI, read with a cap: a definition, a
//! profile, a configuration, a secret. Whatever the path names — `/dev/zero`, a 10 GiB
//! sparse file, a pipe that never ends — at most the cap (plus one byte, to tell) is read,
//! and a regular file's size is judged before anything is read. The error names the flag,
//! the file and the cap.
//!
//! What this must never do: read a user's file whole without knowing it is small.

use anyhow::Context as _;
use std::io::Read as _;
use std::path::Path;

/// The most a JSON or TOML document the CLI reads may hold (agent definitions, profiles,
/// session JSON, Environment configs, `--inference-config`).
pub const DOCUMENT_MAX: u64 = 1 << 20;

/// The most a secret read from standard input may hold (`omabox vault put`).
pub const SECRET_MAX: u64 = 1 << 20;

/// `n` bytes as people read it: `64 MiB`, `1 KiB`, `100 bytes`.
pub fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

fn too_large(what: &str, path: &Path, max: u64) -> anyhow::Error {
    anyhow::anyhow!("{what} {}: too large (max {})", path.display(), human(max))
}

/// Opens `path` for a capped read: refuses a directory, and a regular file over `max`
/// before reading any of it.
pub fn open(path: &Path, what: &str, max: u64) -> anyhow::Result<std::fs::File> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("{what} {}: cannot read it", path.display()))?;
    let metadata = file
        .metadata()
        .with_context(|| format!("{what} {}: cannot read it", path.display()))?;
    if metadata.is_dir() {
        anyhow::bail!("{what} {}: is a directory, not a file", path.display());
    }
    if metadata.is_file() && metadata.len() > max {
        return Err(too_large(what, path, max));
    }
    Ok(file)
}

/// At most `max` bytes of `reader`; more is an error made by `too_large`.
fn read_capped(
    reader: impl std::io::Read,
    max: u64,
    context: impl Fn() -> String,
    too_large: impl FnOnce() -> anyhow::Error,
) -> anyhow::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(max + 1)
        .read_to_end(&mut bytes)
        .with_context(context)?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// The bytes of `path` (the user's `what`, e.g. `--profile`), at most `max`.
pub fn read_bytes(path: &Path, what: &str, max: u64) -> anyhow::Result<Vec<u8>> {
    let file = open(path, what, max)?;
    read_capped(
        file,
        max,
        || format!("{what} {}: cannot read it", path.display()),
        || too_large(what, path, max),
    )
}

/// [`read_bytes`] as UTF-8 text.
pub fn read_text(path: &Path, what: &str, max: u64) -> anyhow::Result<String> {
    String::from_utf8(read_bytes(path, what, max)?)
        .map_err(|_| anyhow::anyhow!("{what} {}: not UTF-8 text", path.display()))
}

/// Standard input as UTF-8 text, at most `max` bytes (`what` says what it is for).
pub fn read_stdin_text(what: &str, max: u64) -> anyhow::Result<String> {
    let bytes = read_capped(
        std::io::stdin().lock(),
        max,
        || format!("cannot read {what} from standard input"),
        || anyhow::anyhow!("{what} on standard input: too large (max {})", human(max)),
    )?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{what} on standard input: not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_zero_and_a_huge_sparse_file_are_refused_without_being_read_whole() {
        let error = read_bytes(Path::new("/dev/zero"), "--profile", 4096).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--profile /dev/zero: too large (max 4 KiB)"
        );
        let dir = tempfile::tempdir().unwrap();
        let sparse = dir.path().join("sparse.json");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(10 << 30)
            .unwrap();
        let error = read_text(&sparse, "--agent-json", DOCUMENT_MAX).unwrap_err();
        assert!(
            error.to_string().ends_with("too large (max 1 MiB)"),
            "{error}"
        );
        let error = read_text(dir.path(), "--profile", DOCUMENT_MAX).unwrap_err();
        assert!(error.to_string().contains("is a directory"), "{error}");
        std::fs::write(&sparse, "{}").unwrap();
        assert_eq!(read_text(&sparse, "--profile", 2).unwrap(), "{}");
        assert!(read_text(&sparse, "--profile", 1).is_err());
    }

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(1000), "1000 bytes");
    }
}
