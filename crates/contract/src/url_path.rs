//! One rule for URL path segments, shared by every place omabox decides something from a
//! request path it did not write: the proxy's sub-paths (`omabox-proxy`'s `sub_path`) and
//! credential egress's path prefixes (`omabox-egress`'s `intercept`). Pure.
//!
//! A raw (percent-encoded, as on the wire) segment is decoded exactly once and is then
//! refused when it is empty, `.` or `..` (also before a `;`, servlet path parameters: `..;x`),
//! is not UTF-8, or contains `/`, `\`, `?`, `#`, a control character (NUL included) or a
//! percent-escape (a double encoding such as `%252e`, which a server decoding twice reads as
//! `.`). The same rule applies to the segment's Unicode compatibility form (NFKC), which
//! some servers normalize paths to: `‥` (two dot leader), `．．` (fullwidth full stops), `／`
//! and `＼` are refused like `..`, `/` and `\`. What is left cannot move a path anywhere,
//! however a server splits, decodes or normalizes it further: no segment climbs (`..`),
//! splits (`/`, `\`), ends the path (`?`, `#`) or changes under another decoding.
//!
//! Must never: decode twice, or accept a segment it cannot prove harmless.

use percent_encoding::percent_decode_str;
use unicode_normalization::UnicodeNormalization as _;

/// A segment the rule of the module doc refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a path segment is empty, '.' or '..', is not UTF-8, or contains '/', '\\', '?', '#', a control character or a percent-escape after decoding"
)]
pub struct SegmentRefused;

/// Decodes one raw segment once and checks it (see the module doc).
pub fn decode_segment(raw: &str) -> Result<String, SegmentRefused> {
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| SegmentRefused)?;
    if is_safe_segment(&decoded) {
        Ok(decoded.into_owned())
    } else {
        Err(SegmentRefused)
    }
}

/// The rule of the module doc on already decoded text.
pub fn is_safe_segment(segment: &str) -> bool {
    ascii_rule(segment) && (segment.is_ascii() || ascii_rule(&segment.nfkc().collect::<String>()))
}

fn ascii_rule(segment: &str) -> bool {
    let before_parameters = segment.split(';').next().unwrap_or("");
    !segment.is_empty()
        && !matches!(before_parameters, "." | "..")
        && !segment
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '?' | '#') || c.is_control())
        && !has_percent_escape(segment)
}

fn has_percent_escape(text: &str) -> bool {
    text.as_bytes()
        .windows(3)
        .any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_decoded_once() {
        assert_eq!(decode_segment("b%20c").unwrap(), "b c");
        assert_eq!(decode_segment("d:e").unwrap(), "d:e");
        assert_eq!(decode_segment("%61pp").unwrap(), "app");
        assert_eq!(decode_segment("100%").unwrap(), "100%");
        assert_eq!(decode_segment("x;y=1").unwrap(), "x;y=1");
        assert_eq!(decode_segment("...").unwrap(), "...");
        assert_eq!(decode_segment("caf%C3%A9").unwrap(), "caf\u{e9}");
        assert_eq!(
            decode_segment("%E2%80%A6").unwrap(),
            "\u{2026}",
            "an ellipsis is '...'"
        );
    }

    #[test]
    fn every_escaping_or_ambiguous_segment_is_refused() {
        for raw in [
            "",
            ".",
            "..",
            "%2e",
            "%2e%2e",
            "%2E%2E",
            "%2E.",
            ".%2e",
            "%252e%252e",
            "a%2fb",
            "a%2Fb",
            "a%252fb",
            "a%5cb",
            "a%5Cb",
            "a\\b",
            "a%3fb",
            "a%23b",
            "a%00b",
            "a%0d%0ab",
            "..;",
            "..;x=1",
            ".;",
            "%2e%2e;x",
            "%ff",
            "a%c3",
            "%c0%ae%c0%ae",
            // Compatibility forms: two dot leader, fullwidth and small full stops, solidi,
            // question mark, percent sign.
            "%E2%80%A5",
            "%EF%BC%8E%EF%BC%8E",
            "%EF%BC%8E.",
            "%EF%B9%92%EF%B9%92",
            "a%EF%BC%8Fb",
            "a%EF%BC%BCb",
            "a%EF%B9%A8b",
            "a%EF%BC%9Fb",
            "%EF%BC%852e%EF%BC%852e",
        ] {
            assert_eq!(decode_segment(raw), Err(SegmentRefused), "{raw:?}");
        }
    }
}
