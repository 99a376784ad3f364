//! The per-session workspace checkpoint limits, from the environment.
//!
//! `OMABOX_CHECKPOINT_MAX_ENTRIES` (default 1 000 000) and `OMABOX_CHECKPOINT_MAX_BYTES`
//! (default 64 GiB; plain bytes, or with a `K`/`M`/`G`/`T` suffix, powers of 1024). A
//! checkpoint over either fails the run with an error naming the limit; the last publication
//! stays. A malformed value is an error here, never a silent default.

use anyhow::Context;
use omabox_persistence::CheckpointLimits;

/// Environment variable of [`CheckpointLimits::max_entries`].
pub const MAX_ENTRIES_ENV: &str = "OMABOX_CHECKPOINT_MAX_ENTRIES";
/// Environment variable of [`CheckpointLimits::max_bytes`].
pub const MAX_BYTES_ENV: &str = "OMABOX_CHECKPOINT_MAX_BYTES";

/// The limits the environment sets, defaults for what it does not.
pub fn from_env() -> anyhow::Result<CheckpointLimits> {
    from_lookup(|name| std::env::var(name).ok())
}

fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<CheckpointLimits> {
    let mut limits = CheckpointLimits::default();
    if let Some(value) = lookup(MAX_ENTRIES_ENV) {
        limits.max_entries = value
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .with_context(|| {
                format!("{MAX_ENTRIES_ENV}={value:?} is not a positive whole number of entries")
            })?;
    }
    if let Some(value) = lookup(MAX_BYTES_ENV) {
        limits.max_bytes = parse_bytes(&value).with_context(|| {
            format!(
                "{MAX_BYTES_ENV}={value:?} is not a positive size (bytes, or with K, M, G or T)"
            )
        })?;
    }
    Ok(limits)
}

fn parse_bytes(value: &str) -> Option<u64> {
    let value = value.trim();
    let (digits, shift) = match value.char_indices().last()? {
        (at, 'K' | 'k') => (&value[..at], 10),
        (at, 'M' | 'm') => (&value[..at], 20),
        (at, 'G' | 'g') => (&value[..at], 30),
        (at, 'T' | 't') => (&value[..at], 40),
        _ => (value, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(1u64 << shift))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_limits_and_refuses_bad_values() {
        let limits = from_lookup(|name| match name {
            MAX_ENTRIES_ENV => Some("500".into()),
            MAX_BYTES_ENV => Some("2G".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((limits.max_entries, limits.max_bytes), (500, 2 << 30));
        assert_eq!(from_lookup(|_| None).unwrap(), CheckpointLimits::default());
        for bad in ["", "0", "-1", "1.5G", "lots", "99999999999T"] {
            let error = from_lookup(|name| (name == MAX_BYTES_ENV).then(|| bad.to_owned()))
                .unwrap_err()
                .to_string();
            assert!(error.contains(MAX_BYTES_ENV), "{error}");
        }
        assert!(from_lookup(|name| (name == MAX_ENTRIES_ENV).then(|| "x".into())).is_err());
    }
}
