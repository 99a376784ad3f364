//! Test support for omabox: hand-written fakes for every contract port (fault injection per
//! step, call recording) and the conformance suite every backend runs.
//!
//! The TypeScript test catalogue of the contract is ported under `tests/`, one file per
//! TypeScript test file, one Rust test per case, named after the case.

#![forbid(unsafe_code)]
pub mod conformance;
/// Contract-only fakes for admission and the harness lanes (they live in
/// `omabox-test-support` so the host's unit tests can use them without a cycle).
pub use omabox_test_support::drivers;
pub mod fakes;
