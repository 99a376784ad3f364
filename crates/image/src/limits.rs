//! Bounds on what one image may make the host hold while it is unpacked: bytes written
//! and entries made (a decompression or inode bomb fills the cache's filesystem), and
//! the memory the tar parser takes for one entry's headers (the `tar` crate reads a PAX
//! extension or a GNU long name whole into memory, whatever size it claims).
//!
//! Must never let an unpack write more than [`UnpackLimits::max_bytes`] of file data,
//! make more than [`UnpackLimits::max_entries`] entries, or read more than
//! [`MAX_HEADER_BYTES`] between two entries.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

use crate::ImageError;

/// Env key: the most bytes of file data one image may unpack to (`64G`, `500M`, bytes).
pub const MAX_BYTES_ENV: &str = "OMABOX_IMAGE_MAX_BYTES";
/// Env key: the most entries (files, directories, links, whiteouts) one image may have.
pub const MAX_ENTRIES_ENV: &str = "OMABOX_IMAGE_MAX_ENTRIES";
/// What the tar parser may read between two entries: headers, PAX records, GNU long
/// names (Linux paths are at most 4 KiB).
pub(crate) const MAX_HEADER_BYTES: u64 = 1 << 20;

/// How much one image may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Bytes of file data written, every layer counted (default 64 GiB).
    pub max_bytes: u64,
    /// Entries applied, every layer counted (default 4,000,000).
    pub max_entries: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        Self {
            max_bytes: 64 << 30,
            max_entries: 4_000_000,
        }
    }
}

impl UnpackLimits {
    /// From an environment: [`MAX_BYTES_ENV`], [`MAX_ENTRIES_ENV`] (unset: the
    /// defaults).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, ImageError> {
        Self::parse(
            get(MAX_BYTES_ENV).as_deref(),
            get(MAX_ENTRIES_ENV).as_deref(),
        )
    }

    /// The two values as the env gives them.
    pub fn parse(bytes: Option<&str>, entries: Option<&str>) -> Result<Self, ImageError> {
        let mut limits = Self::default();
        if let Some(v) = bytes.map(str::trim).filter(|v| !v.is_empty()) {
            limits.max_bytes = parse_size(v).ok_or_else(|| ImageError::BadSetting {
                key: MAX_BYTES_ENV,
                value: v.to_owned(),
                reason: "must be bytes > 0, or with a K/M/G/T suffix (binary: 64G = 64 GiB)".into(),
            })?;
        }
        if let Some(v) = entries.map(str::trim).filter(|v| !v.is_empty()) {
            limits.max_entries =
                v.parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| ImageError::BadSetting {
                        key: MAX_ENTRIES_ENV,
                        value: v.to_owned(),
                        reason: "must be a whole number greater than 0".into(),
                    })?;
        }
        Ok(limits)
    }
}

fn parse_size(text: &str) -> Option<u64> {
    let (digits, shift) = match text.chars().last()?.to_ascii_uppercase() {
        'K' => (&text[..text.len() - 1], 10),
        'M' => (&text[..text.len() - 1], 20),
        'G' => (&text[..text.len() - 1], 30),
        'T' => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(1 << shift).filter(|n| *n > 0)
}

/// The running count of one unpack against its limits.
#[derive(Debug)]
pub(crate) struct Tally {
    limits: UnpackLimits,
    bytes: u64,
    entries: u64,
}

impl Tally {
    pub(crate) fn new(limits: UnpackLimits) -> Self {
        Self {
            limits,
            bytes: 0,
            entries: 0,
        }
    }

    /// One more entry.
    pub(crate) fn entry(&mut self) -> Result<(), ImageError> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(ImageError::Limit(format!(
                "the image has more than {} entries ({MAX_ENTRIES_ENV})",
                self.limits.max_entries
            )));
        }
        Ok(())
    }

    /// Bytes still allowed.
    pub(crate) fn bytes_left(&self) -> u64 {
        self.limits.max_bytes.saturating_sub(self.bytes)
    }

    /// `n` more bytes written (refused past the limit).
    pub(crate) fn bytes(&mut self, n: u64) -> Result<(), ImageError> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.limits.max_bytes {
            return Err(ImageError::Limit(format!(
                "the image unpacks to more than {} bytes ({MAX_BYTES_ENV})",
                self.limits.max_bytes
            )));
        }
        Ok(())
    }
}

/// The budget of bytes the tar parser may read between two entries (module doc).
#[derive(Debug, Clone, Default)]
pub(crate) struct HeaderBudget {
    /// `Some(n)`: between entries, `n` bytes left; `None`: inside an entry's data.
    left: Rc<Cell<Option<u64>>>,
    exceeded: Rc<Cell<bool>>,
}

impl HeaderBudget {
    /// `reader`, counted against this budget.
    pub(crate) fn wrap<R: Read>(&self, reader: R) -> Budgeted<R> {
        Budgeted {
            inner: reader,
            budget: self.clone(),
        }
    }

    /// The parser is about to look for the next entry.
    pub(crate) fn between_entries(&self) {
        self.left.set(Some(MAX_HEADER_BYTES));
    }

    /// The parser found an entry; its data is unbounded here.
    pub(crate) fn in_entry(&self) {
        self.left.set(None);
    }

    /// The error to report for a parser failure: the budget's own, if it ran out.
    pub(crate) fn explain(&self, error: io::Error, context: &str) -> ImageError {
        if self.exceeded.get() {
            ImageError::Limit(format!(
                "a tar header with its extensions (PAX records, GNU long names) is larger than {} KiB{}",
                MAX_HEADER_BYTES >> 10,
                if context.is_empty() {
                    String::new()
                } else {
                    format!(" ({context})")
                }
            ))
        } else {
            ImageError::Tar {
                context: context.to_owned(),
                source: error,
            }
        }
    }
}

/// A reader that stops once its [`HeaderBudget`] between entries is spent.
pub(crate) struct Budgeted<R> {
    inner: R,
    budget: HeaderBudget,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(left) = self.budget.left.get() else {
            return self.inner.read(buf);
        };
        if left == 0 {
            self.budget.exceeded.set(true);
            return Err(io::Error::other("tar header budget spent"));
        }
        let take = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..take])?;
        self.budget.left.set(Some(left - n as u64));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_from_the_env_or_name_the_key() {
        let l = UnpackLimits::parse(Some("512M"), Some("1000")).unwrap();
        assert_eq!((l.max_bytes, l.max_entries), (512 << 20, 1000));
        assert_eq!(
            UnpackLimits::parse(Some("4096"), None).unwrap().max_bytes,
            4096
        );
        assert_eq!(
            UnpackLimits::parse(None, None).unwrap(),
            UnpackLimits::default()
        );
        for (bytes, entries, key) in [
            (Some("0"), None, MAX_BYTES_ENV),
            (Some("lots"), None, MAX_BYTES_ENV),
            (Some("99999999999T"), None, MAX_BYTES_ENV),
            (None, Some("-1"), MAX_ENTRIES_ENV),
        ] {
            let e = UnpackLimits::parse(bytes, entries).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn the_header_budget_counts_only_between_entries() {
        let budget = HeaderBudget::default();
        let data = vec![0u8; (MAX_HEADER_BYTES as usize) * 2];
        let mut reader = budget.wrap(&data[..]);
        budget.in_entry();
        let mut sink = vec![0u8; data.len()];
        reader.read_exact(&mut sink).unwrap();
        let mut reader = budget.wrap(&data[..]);
        budget.between_entries();
        let e = io::copy(&mut reader, &mut io::sink()).unwrap_err();
        assert!(budget.exceeded.get(), "{e}");
    }
}
