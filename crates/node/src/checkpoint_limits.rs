//! The per-session workspace checkpoint limits' size syntax.
//!
//! `checkpoint_max_entries` (`OMABOX_CHECKPOINT_MAX_ENTRIES`, default 1 000 000) and
//! `checkpoint_max_bytes` (`OMABOX_CHECKPOINT_MAX_BYTES`, default 64 GiB; plain bytes, or with
//! a `K`/`M`/`G`/`T` suffix, powers of 1024) are settings (`crate::config`,
//! `NodeConfig::checkpoint_limits`). A checkpoint over either fails the run with an error
//! naming the limit; the last publication stays. A malformed value is an error, never a
//! silent default.

/// `value` in bytes: a positive whole number, optionally with a `K`/`M`/`G`/`T` suffix.
pub fn parse_bytes(value: &str) -> Option<u64> {
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
    use crate::config::{Environment, Flags, NodeConfig};
    use omabox_persistence::CheckpointLimits;

    fn config(vars: &[(&str, &str)]) -> NodeConfig {
        let env: Environment = vars
            .iter()
            .copied()
            .chain([("HOME", "/nonexistent")])
            .collect();
        NodeConfig::from_sources(&Flags::new(), env).unwrap()
    }

    #[test]
    fn reads_both_limits_and_refuses_bad_values() {
        let limits = config(&[
            ("OMABOX_CHECKPOINT_MAX_ENTRIES", "500"),
            ("OMABOX_CHECKPOINT_MAX_BYTES", "2G"),
        ])
        .checkpoint_limits()
        .unwrap();
        assert_eq!((limits.max_entries, limits.max_bytes), (500, 2 << 30));
        assert_eq!(
            config(&[]).checkpoint_limits().unwrap(),
            CheckpointLimits::default()
        );
        for bad in ["", "0", "-1", "1.5G", "lots", "99999999999T"] {
            let error = config(&[("OMABOX_CHECKPOINT_MAX_BYTES", bad)])
                .checkpoint_limits()
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with(&format!(
                    "OMABOX_CHECKPOINT_MAX_BYTES={bad:?} is invalid (env)"
                )),
                "{error}"
            );
        }
        assert!(
            config(&[("OMABOX_CHECKPOINT_MAX_ENTRIES", "x")])
                .checkpoint_limits()
                .is_err()
        );
    }
}
