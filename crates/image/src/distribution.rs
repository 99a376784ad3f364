//! A small client of the OCI distribution protocol (pull only): `GET` of manifests and
//! blobs of one repository, bearer-token and basic auth, redirects followed one hop at a
//! time under [`crate::net_policy`], every body read in chunks under a size cap (the
//! caller's for manifests and the config, 4 MiB in `registry.rs`; 1 MiB of a token response;
//! 64 KiB of an error body) and the stall rule, every error naming its cause.
//!
//! Must never: follow a redirect or fetch a token realm the policy refused; send a
//! credential (the password, the token) anywhere but the registry's own origin and an
//! admitted realm; hold more than the caller's cap of a body in memory; wait longer than
//! the stall window for a byte of progress; put a credential, a control character or
//! more than a few hundred characters of the registry's text into an error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderValue, LOCATION, WWW_AUTHENTICATE};
use reqwest::{Response, StatusCode, Url};

use crate::credentials::RegistryCredential;
use crate::escape;
use crate::net_policy::{HostPolicy, PolicyResolver, Purpose};
use crate::registry::{PullTimeouts, STALL_TIMEOUT_ENV};

/// A token response larger than this is refused.
const MAX_TOKEN_RESPONSE: u64 = 1 << 20;
/// Of an error response, this much is read (the rest is not).
const MAX_ERROR_BODY: u64 = 64 << 10;
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;
/// The least a response must deliver per stall window (or end).
pub(crate) const MIN_PROGRESS: u64 = 1024;

/// One pull's connection to one repository.
pub(crate) struct Session {
    http: reqwest::Client,
    policy: Arc<HostPolicy>,
    /// `scheme://registry/v2/repository/`.
    base: Url,
    /// `host[:port]` of the registry, for messages.
    registry: String,
    repository: String,
    credential: Option<RegistryCredential>,
    /// What the registry's origin gets as `Authorization`, once known.
    auth: Option<HeaderValue>,
    stall: Duration,
}

/// The stall rule's state for one response body.
pub(crate) struct Progress {
    window_start: Instant,
    window_bytes: u64,
    stall: Duration,
    from: String,
}

impl Session {
    pub(crate) fn new(
        policy: Arc<HostPolicy>,
        registry: &str,
        repository: &str,
        credential: Option<RegistryCredential>,
        timeouts: PullTimeouts,
    ) -> Result<Self, String> {
        let base = Url::parse(&format!("{}/v2/{repository}/", policy.base()))
            .map_err(|e| format!("cannot make a URL of {registry}/{repository}: {e}"))?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would connect where the address rule cannot look.
            .no_proxy()
            .dns_resolver(Arc::new(PolicyResolver(Arc::clone(&policy))))
            .connect_timeout(timeouts.stall.min(Duration::from_secs(30)))
            .read_timeout(timeouts.stall)
            .user_agent(concat!("omabox/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {}", chain(&e)))?;
        Ok(Self {
            http,
            policy,
            base,
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            credential,
            auth: None,
            stall: timeouts.stall,
        })
    }

    /// The manifest (or index) `reference` (a tag or a digest) names, at most `cap`
    /// bytes.
    pub(crate) async fn manifest(
        &mut self,
        reference: &str,
        accept: &[&str],
        cap: u64,
    ) -> Result<Vec<u8>, String> {
        let url = self.url(&format!("manifests/{reference}"))?;
        let response = self.get(url, Some(&accept.join(", "))).await?;
        self.read_capped(response, cap, "the manifest").await
    }

    /// A response streaming blob `digest` (read it with [`Self::chunk`]).
    pub(crate) async fn blob(&mut self, digest: &str) -> Result<(Response, Progress), String> {
        let url = self.url(&format!("blobs/{digest}"))?;
        let response = self.get(url, None).await?;
        let progress = self.progress(&response);
        Ok((response, progress))
    }

    /// The next piece of `response`'s body (`None`: its end), under the stall rule.
    pub(crate) async fn chunk(
        &self,
        response: &mut Response,
        progress: &mut Progress,
    ) -> Result<Option<bytes::Bytes>, String> {
        loop {
            let end = progress.window_start + progress.stall;
            let now = Instant::now();
            if now >= end {
                if progress.window_bytes < MIN_PROGRESS {
                    return Err(format!(
                        "{} sent less than {MIN_PROGRESS} bytes in {} s: the transfer stalled ({STALL_TIMEOUT_ENV})",
                        progress.from,
                        progress.stall.as_secs()
                    ));
                }
                progress.window_start = now;
                progress.window_bytes = 0;
                continue;
            }
            match tokio::time::timeout_at(end.into(), response.chunk()).await {
                Err(_) => {}
                Ok(Err(e)) => return Err(describe(&e, &progress.from)),
                Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(bytes))) => {
                    progress.window_bytes += bytes.len() as u64;
                    return Ok(Some(bytes));
                }
            }
        }
    }

    fn url(&self, path: &str) -> Result<Url, String> {
        self.base
            .join(path)
            .map_err(|e| format!("cannot make a URL of {path}: {e}"))
    }

    fn progress(&self, response: &Response) -> Progress {
        Progress {
            window_start: Instant::now(),
            window_bytes: 0,
            stall: self.stall,
            from: authority(response.url()),
        }
    }

    /// `GET url`: authenticates once on a 401 from the registry, follows redirects the
    /// policy admits; a success response, or why not.
    async fn get(&mut self, url: Url, accept: Option<&str>) -> Result<Response, String> {
        let mut url = url;
        let mut authenticated = false;
        let mut hops = 0;
        loop {
            let own = self.policy.is_registry(&url);
            let mut request = self.http.get(url.clone());
            if let Some(accept) = accept {
                request = request.header(ACCEPT, accept);
            }
            if own && let Some(auth) = &self.auth {
                request = request.header(AUTHORIZATION, auth.clone());
            }
            let response = self.send(request, &url).await?;
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED && own && !authenticated {
                authenticated = true;
                let challenge = response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let body = self.read_prefix(response).await;
                if self.authenticate(challenge.as_deref()).await? {
                    continue;
                }
                return Err(self.status_error(status, &body, &url));
            }
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                hops += 1;
                if hops > MAX_REDIRECTS {
                    return Err(format!(
                        "{} redirected more than {MAX_REDIRECTS} times",
                        authority(&url)
                    ));
                }
                let next = response
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|location| url.join(location).ok())
                    .ok_or_else(|| {
                        format!(
                            "{} answered {status} without a usable Location",
                            authority(&url)
                        )
                    })?;
                self.policy.check(&next, Purpose::Redirect)?;
                url = next;
                continue;
            }
            if status.is_success() {
                return Ok(response);
            }
            let body = self.read_prefix(response).await;
            return Err(self.status_error(status, &body, &url));
        }
    }

    /// Answers a challenge: `Basic` with the credential, `Bearer` with a token from the
    /// realm (if the policy admits it). `false`: nothing to answer with.
    async fn authenticate(&mut self, challenge: Option<&str>) -> Result<bool, String> {
        let Some(challenge) = challenge.map(Challenge::parse) else {
            return Ok(false);
        };
        match challenge.scheme.as_str() {
            "basic" => match &self.credential {
                Some(c) => {
                    self.auth = Some(basic(c)?);
                    Ok(true)
                }
                None => Ok(false),
            },
            "bearer" => {
                let realm = challenge
                    .param("realm")
                    .ok_or("the registry asked for a bearer token without naming a realm")?;
                let mut url = Url::parse(realm).map_err(|e| {
                    format!(
                        "the registry's token realm {:?} is not a URL: {e}",
                        escape::untrusted(realm, escape::SHOWN_CHARS)
                    )
                })?;
                self.policy.check(&url, Purpose::TokenRealm)?;
                url.query_pairs_mut()
                    .append_pair("scope", &format!("repository:{}:pull", self.repository));
                if let Some(service) = challenge.param("service") {
                    url.query_pairs_mut().append_pair("service", service);
                }
                let mut request = self.http.get(url.clone());
                if let Some(c) = &self.credential {
                    request = request.header(AUTHORIZATION, basic(c)?);
                }
                let response = self.send(request, &url).await?;
                let status = response.status();
                if !status.is_success() {
                    let body = self.read_prefix(response).await;
                    return Err(format!(
                        "token realm: {}",
                        self.status_error(status, &body, &url)
                    ));
                }
                let body = self
                    .read_capped(response, MAX_TOKEN_RESPONSE, "the token response")
                    .await?;
                #[derive(serde::Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let token = serde_json::from_slice::<Token>(&body)
                    .ok()
                    .and_then(|t| t.token.or(t.access_token))
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| format!("the token realm {} sent no token", authority(&url)))?;
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        format!(
                            "the token realm {} sent a token that is not a header value",
                            authority(&url)
                        )
                    })?;
                value.set_sensitive(true);
                self.auth = Some(value);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Sends `request`; the response's head must arrive within the stall window.
    async fn send(&self, request: reqwest::RequestBuilder, url: &Url) -> Result<Response, String> {
        match tokio::time::timeout(self.stall, request.send()).await {
            Err(_) => Err(format!(
                "{} did not answer within {} s ({STALL_TIMEOUT_ENV})",
                authority(url),
                self.stall.as_secs()
            )),
            Ok(Err(e)) => Err(describe(&e, &authority(url))),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// The body, refused once it is longer than `cap` (announced or as it streams).
    async fn read_capped(
        &self,
        mut response: Response,
        cap: u64,
        what: &str,
    ) -> Result<Vec<u8>, String> {
        let too_large = || format!("{what} is larger than {} MiB: refused", cap >> 20);
        if response.content_length().is_some_and(|len| len > cap) {
            return Err(too_large());
        }
        let mut progress = self.progress(&response);
        let mut body = Vec::new();
        while let Some(chunk) = self.chunk(&mut response, &mut progress).await? {
            if body.len() as u64 + chunk.len() as u64 > cap {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Up to [`MAX_ERROR_BODY`] of an error response (what arrives before a failure).
    async fn read_prefix(&self, mut response: Response) -> Vec<u8> {
        let mut progress = self.progress(&response);
        let mut body = Vec::new();
        while (body.len() as u64) < MAX_ERROR_BODY {
            match self.chunk(&mut response, &mut progress).await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                _ => break,
            }
        }
        body.truncate(MAX_ERROR_BODY as usize);
        body
    }

    /// `401 Unauthorized from host: message (CODE)`, with a hint about credentials.
    fn status_error(&self, status: StatusCode, body: &[u8], url: &Url) -> String {
        let mut text = format!("{status} from {}", authority(url));
        let detail = registry_errors(body);
        if !detail.is_empty() {
            text.push_str(": ");
            text.push_str(&detail);
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            match &self.credential {
                Some(c) => text.push_str(&format!(
                    " (the registry refused the credentials of user {:?} for {})",
                    escape::untrusted(&c.username, 100),
                    self.registry
                )),
                None => text.push_str(&format!(
                    " (no credentials for {}: add them to the vault as registry/{0}, or to docker's config.json)",
                    self.registry
                )),
            }
        }
        self.scrub(&text)
    }

    /// `text` without the credential's password (and its base64 forms).
    pub(crate) fn scrub(&self, text: &str) -> String {
        scrub(text, self.credential.as_ref())
    }
}

/// `text` with the credential's password (and its base64 forms) cut out: a registry's
/// error text is not trusted to leave it out.
pub(crate) fn scrub(text: &str, credential: Option<&RegistryCredential>) -> String {
    let Some(c) = credential else {
        return text.to_owned();
    };
    let password = c.expose_password();
    if password.is_empty() {
        return text.to_owned();
    }
    let engine = base64::engine::general_purpose::STANDARD;
    let basic = engine.encode(format!("{}:{password}", c.username));
    text.replace(&basic, "<redacted>")
        .replace(password, "<redacted>")
        .replace(&escape::untrusted(password, usize::MAX), "<redacted>")
}

fn basic(c: &RegistryCredential) -> Result<HeaderValue, String> {
    let engine = base64::engine::general_purpose::STANDARD;
    let token = engine.encode(format!("{}:{}", c.username, c.expose_password()));
    let mut value = HeaderValue::from_str(&format!("Basic {token}"))
        .map_err(|_| "the credential cannot be sent as a header".to_owned())?;
    value.set_sensitive(true);
    Ok(value)
}

/// The registry's JSON errors (`code`, `message`), or the start of a text body; escaped
/// and cut.
fn registry_errors(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: Option<String>,
        message: Option<String>,
    }
    let text = match serde_json::from_slice::<Envelope>(body) {
        Ok(envelope) => envelope
            .errors
            .iter()
            .take(4)
            .map(|e| match (&e.message, &e.code) {
                (Some(m), Some(c)) => format!("{m} ({c})"),
                (Some(m), None) => m.clone(),
                (None, Some(c)) => c.clone(),
                (None, None) => String::new(),
            })
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("; "),
        Err(_) => String::from_utf8_lossy(body).trim().to_owned(),
    };
    escape::untrusted(&text, escape::SHOWN_CHARS)
}

/// A `WWW-Authenticate` challenge: scheme (lowercase) and its parameters.
#[derive(Debug)]
struct Challenge {
    scheme: String,
    params: Vec<(String, String)>,
}

impl Challenge {
    fn parse(header: &str) -> Self {
        let header = header.trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        let mut params = Vec::new();
        let mut rest = rest.trim();
        while !rest.is_empty() {
            let Some((key, after)) = rest.split_once('=') else {
                break;
            };
            let key = key
                .trim()
                .trim_start_matches(',')
                .trim()
                .to_ascii_lowercase();
            let after = after.trim_start();
            let (value, remainder) = if let Some(quoted) = after.strip_prefix('"') {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let mut end = quoted.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, next)) = chars.next() {
                                value.push(next);
                            }
                        }
                        '"' => {
                            end = i + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                (value, &quoted[end.min(quoted.len())..])
            } else {
                let end = after.find(',').unwrap_or(after.len());
                (after[..end].trim().to_owned(), &after[end..])
            };
            params.push((key, value));
            rest = remainder.trim_start().trim_start_matches(',').trim_start();
        }
        Self {
            scheme: scheme.to_ascii_lowercase(),
            params,
        }
    }

    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `host:port` of `url`, escaped.
fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    let text = match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    };
    escape::untrusted(&text, escape::SHOWN_CHARS)
}

/// What went wrong talking to `target`, down to the innermost cause (`connection
/// refused`, a TLS alert, the address rule), escaped.
fn describe(e: &reqwest::Error, target: &str) -> String {
    let what = if e.is_connect() {
        format!("cannot connect to {target}")
    } else if e.is_timeout() {
        format!("timed out talking to {target}")
    } else if e.is_body() || e.is_decode() {
        format!("the connection to {target} broke")
    } else {
        format!("talking to {target} failed")
    };
    let cause = chain(e);
    escape::untrusted(&format!("{what}: {cause}"), 2 * escape::SHOWN_CHARS)
}

/// The error's sources, outermost first, without repeats and without reqwest's own
/// "error sending request for url (…)" (the caller names the target).
fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&dyn std::error::Error> = e.source();
    while let Some(err) = next {
        let text = err.to_string();
        // hyper's "client error (Connect)" says nothing the caller's words do not.
        let noise = text.starts_with("client error (");
        if !text.is_empty() && !noise && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    if parts.is_empty() {
        parts.push(e.to_string());
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse_quoted_and_bare_parameters() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.example/token",service="reg \"x\"",scope=repository:a:pull"#,
        );
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.param("realm"), Some("https://auth.example/token"));
        assert_eq!(c.param("service"), Some(r#"reg "x""#));
        assert_eq!(c.param("scope"), Some("repository:a:pull"));
        let c = Challenge::parse(r#"Basic realm="Registry Realm""#);
        assert_eq!(c.scheme, "basic");
        assert_eq!(c.param("realm"), Some("Registry Realm"));
        assert!(Challenge::parse("Bearer").param("realm").is_none());
    }

    #[test]
    fn registry_errors_show_message_and_code_escaped() {
        let body =
            br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest \u001b[2J unknown"}]}"#;
        assert_eq!(
            registry_errors(body),
            "manifest \\u{1b}[2J unknown (MANIFEST_UNKNOWN)"
        );
        assert_eq!(registry_errors(b"  plain\x07 text "), "plain\\u{7} text");
    }
}
