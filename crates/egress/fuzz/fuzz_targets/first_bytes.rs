//! Fuzzes `sniff`: any first bytes must give an outcome without a panic, keep at most the
//! byte cap, keep exactly a prefix of the input, and name only a normalized DNS name.

#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use omabox_egress::{SniffLimits, sniff};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let limits = SniffLimits {
        max_bytes: 16 * 1024,
        timeout: Duration::from_secs(1),
    };
    let mut reader = data;
    let sniffed = runtime().block_on(sniff(&mut reader, limits));
    assert!(sniffed.bytes.len() <= limits.max_bytes);
    assert!(data.starts_with(&sniffed.bytes));
    if let Ok(name) = sniffed.outcome {
        let normalized = omabox_contract::networking::normalize_name(&name.name);
        assert_eq!(normalized.as_deref(), Some(name.name.as_str()));
    }
});
