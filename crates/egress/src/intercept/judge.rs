//! What one intercepted request may be: refused, or forwarded (with or without the bound
//! secret), and in exactly which form. Pure: the relay's HTTP plumbing applies the verdict.
//!
//! A request to the bound name `N` on port `P` (the port the connection was admitted on) is,
//! in order:
//! 1. `CONNECT` → 405 (no tunnel through an intercepted connection); `TRACE`/`TRACK` → 405
//!    (the server's echo of the request would hand the sandbox the secret), also named by a
//!    method-override header (`X-HTTP-Method-Override`, …); an upgrade (`Upgrade`,
//!    `Connection: upgrade`) → 501 (it would carry unjudged bytes); a head over
//!    [`MAX_HEAD`] → 431.
//! 2. `Host`: exactly one, parsed by [`Authority`] → else 400 (none, several, user info,
//!    not a name, bad port); naming another name, or another port than `P` → 421.
//! 3. The target: origin-form (`/x`) as is; absolute-form only `https://` with an authority
//!    [`Authority::is`] `N` on `P` (400 for another scheme or user info, 421 for another
//!    authority), then rewritten to origin-form, so the upstream sees the path that was
//!    judged and no authority of the sandbox's choosing; asterisk-form (`*`) only for
//!    `OPTIONS`, never with the secret; authority-form otherwise → 400.
//! 4. `Host` is rewritten to `N` (with the port, when the sandbox gave one).
//! 5. The path: its raw segments (split at `/`, before `?`) each decoded once by
//!    [`omabox_contract::url_path`]. When some rule binds `N` to a prefix narrower than `/`,
//!    a path that does not decode cleanly (`..`, `%2e%2e`, `%2f`, `\`, `..;`, `//`, a double
//!    encoding, …) is refused with 400: it is not forwarded where a server could read it
//!    differently; so is a request carrying a header some servers route by instead of the
//!    path (`X-Original-URL`, `X-Rewrite-URL`). A rule matches when its prefix's raw segments are the first raw segments
//!    of the path, byte for byte (so `/org/app-evil` is not under `/org/app`, and
//!    `/org/%61pp` gets no secret even if a server reads it as `/org/app`); a trailing `/`
//!    on either side does not matter; the longest matching prefix wins. A rule for all of
//!    `N` (prefix `/`) matches every path (nothing can climb out of a whole host), so such a
//!    host's requests are forwarded whatever their path (npm's `@scope%2fname`).

use hyper::header::{CONNECTION, HOST, HeaderValue, UPGRADE};
use hyper::{Method, Request, StatusCode, Uri};
use omabox_contract::networking::normalize_name;
use omabox_contract::url_path::decode_segment;

use super::{InjectionRule, MAX_HEAD};
use crate::authority::{Authority, AuthorityError};

/// The connection a request arrived on: the bound name and the port it was admitted on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bound<'a> {
    pub(super) name: &'a str,
    pub(super) port: u16,
}

/// Judges `request` (rewriting its target and `Host` as forwarded) against `rules`; the
/// matching rule, `None` for no secret, or the status to refuse it with.
pub(super) fn judge<'r, B>(
    request: &mut Request<B>,
    bound: Bound<'_>,
    rules: &'r [InjectionRule],
) -> Result<Option<&'r InjectionRule>, StatusCode> {
    let overridden = METHOD_OVERRIDES
        .iter()
        .flat_map(|h| request.headers().get_all(*h))
        .any(|value| value.to_str().map_or(true, |v| refused_method(v.trim())));
    if refused_method(request.method().as_str()) || overridden {
        return Err(StatusCode::METHOD_NOT_ALLOWED);
    }
    if wants_upgrade(request) {
        return Err(StatusCode::NOT_IMPLEMENTED);
    }
    if head_size(request) > MAX_HEAD {
        return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
    let host = one_host(request)?;
    if !host.is(bound.name, bound.port) {
        return Err(StatusCode::MISDIRECTED_REQUEST);
    }
    let asterisk = origin_form(request, bound)?;
    let canonical = match host.port {
        Some(port) => format!("{}:{port}", host.name),
        None => host.name,
    };
    let canonical = HeaderValue::from_str(&canonical).map_err(|_| StatusCode::BAD_REQUEST)?;
    request.headers_mut().insert(HOST, canonical);
    if asterisk {
        return Ok(None);
    }
    let scoped = for_name(rules, bound.name)
        .any(|r| !prefix_segments(&r.path_prefix).is_some_and(|p| p.is_empty()));
    if scoped
        && PATH_OVERRIDES
            .iter()
            .any(|h| request.headers().contains_key(*h))
    {
        return Err(StatusCode::BAD_REQUEST);
    }
    matching_rule(request.uri().path(), bound.name, rules, scoped)
}

/// Headers some servers route by instead of the request's path (Symfony, IIS's URL Rewrite,
/// Zend): under a scoped binding they would move a request judged under the prefix to any
/// other path of the host, secret included.
const PATH_OVERRIDES: [&str; 3] = ["x-original-url", "x-rewrite-url", "x-override-url"];

/// Headers some frameworks take the method from instead of the request line.
const METHOD_OVERRIDES: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

fn for_name<'r, 'n>(
    rules: &'r [InjectionRule],
    name: &'n str,
) -> impl Iterator<Item = &'r InjectionRule> + use<'r, 'n> {
    rules
        .iter()
        .filter(move |r| normalize_name(&r.host).as_deref() == Some(name))
}

/// `CONNECT` (a tunnel), `TRACE` and IIS's `TRACK` (a server answering them echoes the
/// request it received, the injected header included, back to the sandbox), in any case.
fn refused_method(method: &str) -> bool {
    ["CONNECT", "TRACE", "TRACK"]
        .iter()
        .any(|m| method.eq_ignore_ascii_case(m))
}

/// The request head's size as sent (request line and header lines), give or take a few
/// bytes of whitespace. hyper's buffer cap is not a head cap (a head that arrives in one
/// read is parsed whole), so the head is measured again here.
fn head_size<B>(request: &Request<B>) -> usize {
    let line = request.method().as_str().len() + request.uri().to_string().len() + 12;
    request.headers().iter().fold(line, |size, (name, value)| {
        size + name.as_str().len() + value.len() + 4
    })
}

fn wants_upgrade<B>(request: &Request<B>) -> bool {
    request.headers().contains_key(UPGRADE)
        || request.headers().get_all(CONNECTION).iter().any(|value| {
            value.to_str().map_or(true, |v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

fn one_host<B>(request: &Request<B>) -> Result<Authority, StatusCode> {
    let mut hosts = request.headers().get_all(HOST).iter();
    let (Some(host), None) = (hosts.next(), hosts.next()) else {
        return Err(StatusCode::BAD_REQUEST);
    };
    Authority::parse_bytes(host.as_bytes()).map_err(|_| StatusCode::BAD_REQUEST)
}

/// Step 3: leaves an origin-form target in `request`; `true` for `OPTIONS *`.
fn origin_form<B>(request: &mut Request<B>, bound: Bound<'_>) -> Result<bool, StatusCode> {
    let uri = request.uri();
    if uri.path() == "*" && uri.authority().is_none() {
        return if request.method() == Method::OPTIONS {
            Ok(true)
        } else {
            Err(StatusCode::BAD_REQUEST)
        };
    }
    let Some(authority) = uri.authority() else {
        return Ok(false);
    };
    if uri.scheme_str() != Some("https") {
        return Err(StatusCode::BAD_REQUEST);
    }
    match Authority::parse(authority.as_str()) {
        Err(AuthorityError::UserInfo) | Err(AuthorityError::BadPort) => {
            return Err(StatusCode::BAD_REQUEST);
        }
        Ok(named) if named.is(bound.name, bound.port) => {}
        _ => return Err(StatusCode::MISDIRECTED_REQUEST),
    }
    let origin = uri.path_and_query().map_or("/", |p| p.as_str());
    let origin = if origin.starts_with('/') { origin } else { "/" };
    *request.uri_mut() = origin.parse::<Uri>().map_err(|_| StatusCode::BAD_REQUEST)?;
    Ok(false)
}

/// Step 5.
fn matching_rule<'r>(
    path: &str,
    name: &str,
    rules: &'r [InjectionRule],
    scoped: bool,
) -> Result<Option<&'r InjectionRule>, StatusCode> {
    let segments = path_segments(path);
    if segments.is_none() && scoped {
        return Err(StatusCode::BAD_REQUEST);
    }
    Ok(for_name(rules, name)
        .filter_map(|rule| {
            let prefix = prefix_segments(&rule.path_prefix)?;
            let under = prefix.is_empty()
                || segments
                    .as_ref()
                    .is_some_and(|s| s.len() >= prefix.len() && s[..prefix.len()] == prefix[..]);
            under.then_some((prefix.len(), rule))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, rule)| rule))
}

/// The raw segments of an origin-form path (`/a/b/` → `a`, `b`), each of which decodes
/// cleanly; `None` when one does not, or the path is not absolute. A trailing `/` adds
/// no segment; any other empty segment (`//`) is refused.
pub(super) fn path_segments(path: &str) -> Option<Vec<&str>> {
    let rest = path.strip_prefix('/')?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Some(Vec::new());
    }
    rest.split('/')
        .map(|raw| decode_segment(raw).ok().map(|_| raw))
        .collect()
}

/// A rule's prefix as raw segments (`/` → none); `None` for a prefix that is not a clean
/// path (refused when the rule is made; never matches).
pub(super) fn prefix_segments(prefix: &str) -> Option<Vec<&str>> {
    path_segments(prefix)
}

#[cfg(test)]
mod tests {
    use omabox_contract::SecretString;

    use super::*;

    fn rule(host: &str, prefix: &str) -> InjectionRule {
        InjectionRule::new(host, prefix, "authorization", SecretString::new("x")).unwrap()
    }

    fn verdict(
        target: &str,
        host: &str,
        rules: &[InjectionRule],
    ) -> (Result<Option<String>, StatusCode>, Request<()>) {
        let mut request = Request::builder()
            .uri(target)
            .header(HOST, host)
            .body(())
            .unwrap();
        let bound = Bound {
            name: "api.test",
            port: 443,
        };
        let got = judge(&mut request, bound, rules).map(|r| r.map(|r| r.path_prefix.clone()));
        (got, request)
    }

    /// A path as one kind of server reads it: decoded `decodes` times, `\\` taken for `/`
    /// or not, `;` parameters dropped per segment or not, empty segments merged, dot
    /// segments removed (RFC 3986 5.2.4).
    fn server_view(raw: &str, decodes: usize, backslash: bool, parameters: bool) -> Vec<String> {
        let mut path = raw.to_owned();
        for _ in 0..decodes {
            path = percent_encoding::percent_decode_str(&path)
                .decode_utf8_lossy()
                .into_owned();
        }
        if backslash {
            path = path.replace('\\', "/");
        }
        let mut out: Vec<String> = Vec::new();
        for segment in path.split('/') {
            let segment = if parameters {
                segment.split(';').next().unwrap_or("")
            } else {
                segment
            };
            match segment {
                "" | "." => {}
                ".." => {
                    out.pop();
                }
                other => out.push(other.to_owned()),
            }
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        /// Whatever a path is made of, when it gets the secret of `/org/app` every kind of
        /// server above reads it under `/org/app`.
        #[test]
        fn a_path_with_the_secret_is_under_the_prefix_for_every_server(
            tokens in proptest::collection::vec(proptest::sample::select(vec![
                "org", "app", "app-evil", "..", ".", "%2e", "%2E", "%2e%2e", "%2f", "%2F",
                "%5c", "\\", ";", ";x=1", "..;", "%25", "2e", "/", "//", "a", "%61pp",
                "%252e", "%252f", "%3f", "?", "%23",
            ]), 0..10)
        ) {
            let rules = [rule("api.test", "/org/app")];
            // Under the prefix as written, then anything: what a forger starts from.
            let raw = format!("/org/app{}", tokens.concat());
            let Ok(uri) = raw.parse::<Uri>() else { return Ok(()) };
            let (got, request) = verdict(&uri.to_string(), "api.test", &rules);
            if let Ok(Some(_)) = got {
                let path = request.uri().path().to_owned();
                for decodes in 0..3 {
                    for backslash in [false, true] {
                        for parameters in [false, true] {
                            let view = server_view(&path, decodes, backslash, parameters);
                            proptest::prop_assert!(
                                view.len() >= 2 && view[0] == "org" && view[1] == "app",
                                "{raw} read as {view:?} ({decodes} decodes, \\ as / {backslash}, ; dropped {parameters})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_longest_matching_prefix_wins() {
        let rules = [
            rule("api.test", "/"),
            rule("api.test", "/org/"),
            rule("api.test", "/org/app"),
            rule("other.test", "/org/app/x"),
        ];
        for (path, prefix) in [
            ("/", "/"),
            ("/org", "/org/"),
            ("/org/app-evil", "/org/"),
            ("/org/app/x/y", "/org/app"),
            ("/other", "/"),
        ] {
            assert_eq!(
                verdict(path, "api.test", &rules).0,
                Ok(Some(prefix.into())),
                "{path}"
            );
        }
        // A scoped rule for the host makes every ambiguous path a refusal.
        assert_eq!(
            verdict("/a/../org/app", "api.test", &rules).0,
            Err(StatusCode::BAD_REQUEST)
        );
    }

    #[test]
    fn a_whole_host_binding_forwards_any_path_with_the_secret() {
        let rules = [rule("api.test", "/")];
        for path in ["/@scope%2fpkg", "/a/../b", "//x", "/a%5cb"] {
            assert_eq!(
                verdict(path, "api.test", &rules).0,
                Ok(Some("/".into())),
                "{path}"
            );
        }
    }

    #[test]
    fn the_forwarded_request_is_origin_form_with_the_canonical_host() {
        let rules = [rule("api.test", "/")];
        let (got, request) = verdict("https://API.test:443/x?y=1", "Api.Test.:443", &rules);
        assert_eq!(got, Ok(Some("/".into())));
        assert_eq!(request.uri().to_string(), "/x?y=1");
        assert_eq!(request.headers()[HOST], "api.test:443");
        let (got, request) = verdict("https://api.test", "api.test", &rules);
        assert_eq!(got, Ok(Some("/".into())));
        assert_eq!(request.uri().to_string(), "/");
        let (got, _) = verdict("*", "api.test", &rules);
        assert_eq!(
            got,
            Err(StatusCode::BAD_REQUEST),
            "asterisk only for OPTIONS"
        );
    }
}
