//! Content digests of image artifacts: sha256 while streaming, of files, and the
//! checks that a blob name or descriptor is one. Must never accept a digest that is not
//! 64 lowercase hex digits (it becomes a path component).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use oci_spec::image::Descriptor;
use sha2::{Digest as _, Sha256};

use super::ImageError;

/// Hashes everything read through it.
pub(super) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    len: u64,
}

impl<R: Read> HashingReader<R> {
    pub(super) fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    /// Reads the rest and returns (hex digest, total length).
    pub(super) fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((hex::encode(self.hasher.finalize()), self.len))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

pub(super) fn sha256_file(path: &Path) -> Result<String, ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io(path, e))?;
    let (hex, _) = HashingReader::new(BufReader::with_capacity(256 << 10, file))
        .finish()
        .map_err(|e| ImageError::io(path, e))?;
    Ok(hex)
}

pub(super) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The hex part of a descriptor's sha256 digest; anything else is refused (the hex is a
/// file name below `blobs/sha256` and a cache entry name).
pub(super) fn sha256_hex_of(desc: &Descriptor) -> Result<String, String> {
    let digest = desc.digest();
    let hex = digest.digest();
    if digest.algorithm().to_string() != "sha256" || !is_sha256_hex(hex) {
        return Err(format!(
            "digest {digest} is not a sha256 digest (only sha256 is supported)"
        ));
    }
    Ok(hex.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lowercase_sha256_hex_names_a_blob() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex("../../etc/passwd"));
        assert!(!is_sha256_hex(&"a".repeat(63)));
    }
}
