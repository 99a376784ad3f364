//! The operator key of `omabox serve`'s operator routes: given by the operator, or generated
//! on first start into `<data-dir>/serve-api-key` (mode 0600, created with `O_EXCL` so two
//! starts never race to different keys) and reused afterwards.
//!
//! Must never: log the key, read a key file that other users can read or that is a symlink,
//! or weaken an existing file's mode.

use omabox_contract::SecretString;
use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The key file's name in the data dir.
pub const KEY_FILE: &str = "serve-api-key";

/// Why the key file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorKeyError {
    /// Reading or creating it failed.
    #[error("cannot use the operator key file {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// It exists but is not a private regular file of this user with a key in it.
    #[error(
        "the operator key file {path} must be a regular file of mode 0600 owned by this user holding one key; fix or delete it"
    )]
    Unsafe {
        /// The file.
        path: PathBuf,
    },
}

/// Where the key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    /// Generated now (print it once).
    Generated,
    /// Read from an earlier start.
    Existing,
}

/// The key in `<data_dir>/serve-api-key`, generated if absent.
pub fn load_or_create(data_dir: &Path) -> Result<(SecretString, KeyOrigin), OperatorKeyError> {
    let path = data_dir.join(KEY_FILE);
    let io_error = |source| OperatorKeyError::Io {
        path: path.clone(),
        source,
    };
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path);
    match created {
        Ok(mut file) => {
            let key = new_key();
            file.write_all(format!("{key}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(io_error)?;
            Ok((SecretString::new(key), KeyOrigin::Generated))
        }
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            Ok((read_existing(&path)?, KeyOrigin::Existing))
        }
        Err(error) => Err(io_error(error)),
    }
}

/// The key serve generated into `<data_dir>/serve-api-key`, never creating it (`None`: no
/// such file); checked like a key serve reuses.
pub fn load(data_dir: &Path) -> Result<Option<SecretString>, OperatorKeyError> {
    let path = data_dir.join(KEY_FILE);
    match std::fs::symlink_metadata(&path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        _ => read_existing(&path).map(Some),
    }
}

fn read_existing(path: &Path) -> Result<SecretString, OperatorKeyError> {
    let unsafe_file = || OperatorKeyError::Unsafe {
        path: path.to_owned(),
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|_| unsafe_file())?;
    let meta = file.metadata().map_err(|_| unsafe_file())?;
    let uid = rustix::process::geteuid().as_raw();
    if !meta.is_file() || meta.permissions().mode() & 0o077 != 0 || meta.uid() != uid {
        return Err(unsafe_file());
    }
    let mut text = String::new();
    file.take(4096)
        .read_to_string(&mut text)
        .map_err(|_| unsafe_file())?;
    let key = text.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(unsafe_file());
    }
    Ok(SecretString::new(key))
}

/// `omk_` + 64 hex digits (256 random bits).
fn new_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("omk_{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (key, origin) = load_or_create(dir.path()).unwrap();
        assert_eq!(origin, KeyOrigin::Generated);
        assert!(key.expose().starts_with("omk_") && key.expose().len() == 68);
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, origin) = load_or_create(dir.path()).unwrap();
        assert_eq!(origin, KeyOrigin::Existing);
        assert_eq!(again.expose(), key.expose());
    }

    #[test]
    fn a_readable_or_linked_key_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        std::fs::write(&path, "omk_x\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_or_create(dir.path()).unwrap_err();
        assert!(matches!(error, OperatorKeyError::Unsafe { .. }));
        assert!(!error.to_string().contains("omk_x"));
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert!(load_or_create(dir.path()).is_err());
    }
}
