//! Fuzzes the sub-path planners: any bytes, read as `<raw tail>[?<query>]`, must never make
//! the inference or MCP planner build an upstream URL outside its configured base (the
//! property lives in `tests/common/escape.rs`, shared with the stable proptest).

#![no_main]

#[allow(dead_code)]
#[path = "../../tests/common/escape.rs"]
mod escape;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (raw, query) = match text.split_once('?') {
        Some((raw, query)) => (raw, Some(query)),
        None => (text, None),
    };
    if let Err(violation) = escape::check_raw_tail(raw, query) {
        panic!("{violation}");
    }
});
