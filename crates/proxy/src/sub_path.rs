//! The proxied sub-path as data: the tail of a proxy route's path, decoded exactly once into
//! validated segments, and the one way an upstream URL is built from it (URL segments onto a
//! configured base, never string concatenation). Pure.
//!
//! ```text
//!   raw path  /v1/oma/inference-proxy/<session>/<raw tail>   (as on the wire, percent-encoded)
//!        │ raw_tail(path, 4)                                   (route segments skipped, raw)
//!        ▼
//!   "anthropic/v1/messages" ──split '/'──► each segment percent-decoded ONCE ──► validated
//!        │ refused (400) if a decoded segment is empty, "." or "..", or contains '/', '\',
//!        │ '?', '#', a control character (NUL included) or a percent-escape ("%2e" left by a
//!        │ double encoding), or is "."/".." before a ';' (servlet path parameters)
//!        ▼
//!   SubPath ["anthropic", "v1", "messages"] ──upstream_url(base, segments, query)──► Url
//! ```
//!
//! Invariant (property-tested in `tests/path_escape.rs`): a URL built by [`upstream_url`] has
//! the base's origin, starts with the base's path segments, and every segment it adds is
//! stable under any further percent-decoding and is neither `.` nor `..`; so an upstream —
//! however many times it decodes — never sees a path outside the configured base.
//!
//! The segment rule itself is `omabox_contract::url_path` (credential egress judges paths by
//! it too). Must never: build a URL by concatenating request text, decode a segment twice, or
//! accept a segment it cannot prove harmless.

use omabox_contract::url_path;

/// Why a sub-path was refused (always before any upstream request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid proxy path: a segment is empty, '.' or '..', is not UTF-8, or contains '/', '\\', '?', '#', a control character or a percent-escape after decoding"
)]
pub struct PathRefused;

/// A proxied sub-path: its segments, each decoded exactly once and validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubPath {
    segments: Vec<String>,
}

impl SubPath {
    /// Decodes and validates the raw (percent-encoded) tail of a proxy route, without its
    /// leading `/`. An empty tail is the empty sub-path.
    pub fn parse(raw: &str) -> Result<Self, PathRefused> {
        if raw.is_empty() {
            return Ok(Self::default());
        }
        let segments = raw
            .split('/')
            .map(decode_segment)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { segments })
    }

    /// Segments from already decoded text (tests and the planner's own inputs); each is
    /// validated like a decoded wire segment.
    pub fn from_segments<I, S>(segments: I) -> Result<Self, PathRefused>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let segments: Vec<String> = segments.into_iter().map(Into::into).collect();
        if segments
            .iter()
            .all(|segment| url_path::is_safe_segment(segment))
        {
            Ok(Self { segments })
        } else {
            Err(PathRefused)
        }
    }

    /// The decoded segments.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// Whether there is no segment.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

/// The raw tail of `path` after its first `skip` segments (the route's fixed segments and
/// parameters), without a leading `/`: `raw_tail("/v1/oma/inference-proxy/s/a/b", 4)` is
/// `"a/b"`. Nothing is decoded.
pub fn raw_tail(path: &str, skip: usize) -> &str {
    let path = path.strip_prefix('/').unwrap_or(path);
    path.splitn(skip + 1, '/').nth(skip).unwrap_or("")
}

/// The shared rule (`omabox_contract::url_path`), with the proxy's error.
fn decode_segment(raw: &str) -> Result<String, PathRefused> {
    url_path::decode_segment(raw).map_err(|_| PathRefused)
}

/// The upstream URL of `segments` under `base`: the base without fragment, its path segments
/// followed by `segments` (each percent-encoded by the URL library), and the base's query
/// joined with `query` (passed through as received: the reference forwards it unchanged).
/// `None` when `base` is not an absolute http(s) URL.
pub fn upstream_url(base: &str, segments: &[String], query: Option<&str>) -> Option<url::Url> {
    let mut url = url::Url::parse(base.trim()).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return None;
    }
    url.set_fragment(None);
    if !segments.is_empty() {
        let mut path = url.path_segments_mut().ok()?;
        path.pop_if_empty();
        path.extend(segments);
    }
    let query = query.filter(|query| !query.is_empty());
    let joined = match (url.query().filter(|q| !q.is_empty()), query) {
        (Some(own), Some(query)) => Some(format!("{own}&{query}")),
        (None, Some(query)) => Some(query.to_owned()),
        (own, None) => own.map(str::to_owned),
    };
    url.set_query(joined.as_deref());
    Some(url)
}

/// The base's path segments without a trailing empty one (what a base "ends with").
pub fn base_segments(base: &url::Url) -> Vec<String> {
    let mut segments: Vec<String> = base
        .path_segments()
        .map(|segments| segments.map(str::to_owned).collect())
        .unwrap_or_default();
    if segments.last().is_some_and(String::is_empty) {
        segments.pop();
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<Vec<String>, PathRefused> {
        SubPath::parse(raw).map(|path| path.segments().to_vec())
    }

    #[test]
    fn decodes_once() {
        assert_eq!(parse("a/b%20c/d:e").unwrap(), ["a", "b c", "d:e"]);
        assert_eq!(parse("").unwrap(), Vec::<String>::new());
        assert_eq!(parse("100%").unwrap(), ["100%"]);
        assert_eq!(parse("x;y=1").unwrap(), ["x;y=1"]);
    }

    #[test]
    fn refuses_every_escape() {
        for raw in [
            "..",
            ".",
            "%2e%2e",
            "%2E.",
            "%252e%252e",
            "a/%2e%2e/admin",
            "a//b",
            "a/",
            "/a",
            "a%2fb",
            "a%252fb",
            "a%5cb",
            "a\\b",
            "a%3fb",
            "a%253fb",
            "a%23b",
            "a%00b",
            "a%0d%0ab",
            "..;",
            "..;x=1",
            "%ff",
        ] {
            assert_eq!(parse(raw), Err(PathRefused), "{raw:?}");
        }
    }

    #[test]
    fn tails() {
        assert_eq!(raw_tail("/v1/oma/inference-proxy/s/a/%2e/b", 4), "a/%2e/b");
        assert_eq!(raw_tail("/v1/oma/inference-proxy/s", 4), "");
        assert_eq!(raw_tail("/v1/oma/mcp-proxy/s/srv/", 5), "");
    }

    #[test]
    fn urls_are_built_from_segments() {
        let segments = parse("v1/c%20d/e:f").unwrap();
        let url = upstream_url("https://h.test/base/", &segments, Some("x=1&y=%2F")).unwrap();
        assert_eq!(url.as_str(), "https://h.test/base/v1/c%20d/e:f?x=1&y=%2F");
        let url = upstream_url("https://h.test/mcp?k=v#f", &[], Some("a=1")).unwrap();
        assert_eq!(url.as_str(), "https://h.test/mcp?k=v&a=1");
        let url = upstream_url("https://h.test", &parse("100%").unwrap(), None).unwrap();
        assert_eq!(url.as_str(), "https://h.test/100%25");
        assert!(upstream_url("file:///etc", &[], None).is_none());
        assert!(upstream_url("not a url", &[], None).is_none());
    }
}
