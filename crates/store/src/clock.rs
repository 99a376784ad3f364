//! Time for the fence stores: milliseconds since the Unix epoch, injectable so tests can expire
//! a fence without sleeping, and rendered the way JavaScript's `Date#toISOString` does.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use time::OffsetDateTime;
use time::macros::format_description;

/// The last millisecond `Date#toISOString` renders with a four-digit year
/// (`9999-12-31T23:59:59.999Z`). Expiry times are clamped to it.
pub const MAX_TIMESTAMP_MS: u64 = 253_402_300_799_999;

/// A source of "now", in milliseconds since the Unix epoch.
///
/// Stores read it once per operation, after they hold their lock (or their SQLite write
/// transaction), so an expiry decision is never made on a time read before waiting.
/// Any `Fn() -> u64` closure is a clock.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

impl<F> Clock for F
where
    F: Fn() -> u64 + Send + Sync,
{
    fn now_ms(&self) -> u64 {
        self()
    }
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock before 1970 is a broken machine; treat it as the epoch rather than panic.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to. Clones share one time.
#[derive(Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms`.
    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now_ms", &self.now_ms())
            .finish()
    }
}

/// `now_ms + ttl_ms`, clamped to [`MAX_TIMESTAMP_MS`].
pub(crate) fn expiry(now_ms: u64, ttl_ms: u64) -> u64 {
    now_ms.saturating_add(ttl_ms).min(MAX_TIMESTAMP_MS)
}

/// Renders milliseconds since the epoch like JavaScript's `new Date(ms).toISOString()`:
/// `2026-12-02T14:39:12.123Z` (UTC, exactly three fractional digits).
///
/// Values past [`MAX_TIMESTAMP_MS`] are clamped to it (JavaScript would switch to a six-digit
/// `+0YYYYY` year there; no fence lives that long).
pub fn iso_millis(ms: u64) -> String {
    let ms = ms.min(MAX_TIMESTAMP_MS);
    let format =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|at| at.format(format).ok())
        // Unreachable for clamped input; keep a well-formed fallback rather than panic.
        .unwrap_or_else(|| "9999-12-31T23:59:59.999Z".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_javascript_to_iso_string() {
        assert_eq!(iso_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_millis(1_796_222_352_123), "2026-12-02T14:39:12.123Z");
        assert_eq!(iso_millis(1_000), "1970-01-01T00:00:01.000Z");
        assert_eq!(iso_millis(MAX_TIMESTAMP_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(iso_millis(u64::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn expiry_saturates() {
        assert_eq!(expiry(10, 5), 15);
        assert_eq!(expiry(u64::MAX - 1, 5), MAX_TIMESTAMP_MS);
    }

    #[test]
    fn manual_clock_clones_share_time_and_closures_are_clocks() {
        let clock = ManualClock::new(5);
        let other = clock.clone();
        other.advance(10);
        assert_eq!(clock.now_ms(), 15);
        clock.set(3);
        assert_eq!(other.now_ms(), 3);
        let fixed = || 42_u64;
        assert_eq!(fixed.now_ms(), 42);
        assert!(SystemClock.now_ms() > 1_600_000_000_000);
    }
}
