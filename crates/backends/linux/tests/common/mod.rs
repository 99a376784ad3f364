//! The linux mechanism crate's test support (runtime in the test dirs, the loud-skip
//! helper, a sandbox guard that always tears down), shared rather than copied: the
//! backend re-exports the same types, so the one file serves both crates' tests.

#[path = "../../../../linux-sandbox/tests/common/mod.rs"]
mod shared;

pub use shared::*;
