//! Credential injection for bound hosts: the relay terminates the sandbox's TLS with a
//! certificate from the binding's own CA, judges each HTTP request ([`judge`]: one `Host`
//! naming the bound name on the admitted port, an origin-form or matching absolute-form
//! target rewritten to origin-form, the path decoded once and matched segment-wise against
//! the bound prefixes), injects the bound header into the requests a rule matches, and
//! re-encrypts upstream with the host's roots.
//!
//! The secret lives only here, in host memory: the sandbox holds nothing but trust in the
//! binding's CA certificate (public). A request's own header of a bound name is dropped
//! before injection, so the sandbox can neither read nor replace the secret. A refused
//! request (`400`, `405`, `421`, `431`, `501`) is answered here, never forwarded, and closes
//! the connection. Pipelined requests are each judged. [`Credentials::revoke`] drops the
//! secrets: every request from then on, on new and on open connections, goes out without
//! them.
//!
//! HTTP/1.1 only (the sandbox is offered ALPN `http/1.1`); upgrades (WebSocket) and `CONNECT`
//! are refused. Request and response heads are capped at [`MAX_HEAD`] each way. Never logged:
//! header values, bodies.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use omabox_contract::SecretString;
use omabox_contract::networking::normalize_name;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;

use crate::rewind::Rewind;

mod judge;

/// How long an intercepted connection may wait for the next request head.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The largest request head (from the sandbox) and response head (from the upstream)
/// buffered, in bytes; a larger request head is answered `431`.
pub const MAX_HEAD: usize = 64 * 1024;

/// Why a CA or a leaf could not be made.
#[derive(Debug, thiserror::Error)]
#[error("credential egress certificate: {0}")]
pub struct CertificateError(String);

/// A binding's certificate authority. Its key never leaves this process.
pub struct InterceptCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl std::fmt::Debug for InterceptCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterceptCa").finish_non_exhaustive()
    }
}

impl InterceptCa {
    /// A fresh CA named after `label` (a binding id: not secret).
    pub fn generate(label: &str) -> Result<Self, CertificateError> {
        let err = |e: rcgen::Error| CertificateError(e.to_string());
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("omabox credential egress {label}"),
        );
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).map_err(err)?;
        Ok(Self { cert, key })
    }

    /// The CA certificate the sandbox trusts (PEM).
    pub fn certificate_pem(&self) -> String {
        self.cert.pem()
    }

    /// A leaf certificate for `name`, signed by this CA.
    fn issue(&self, name: &str) -> Result<Arc<CertifiedKey>, CertificateError> {
        let err = |e: rcgen::Error| CertificateError(e.to_string());
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).map_err(err)?;
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        let leaf = params.signed_by(&key, &self.cert, &self.key).map_err(err)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| CertificateError(e.to_string()))?;
        Ok(Arc::new(CertifiedKey::new(
            vec![leaf.der().clone(), self.cert.der().clone()],
            signer,
        )))
    }
}

/// Requests to `host` whose path starts with `path_prefix` get `header: value`.
#[derive(Clone)]
pub struct InjectionRule {
    /// The bound host name (normalized when compared).
    pub host: String,
    /// Path prefix (`/` for every path).
    pub path_prefix: String,
    /// The header set (e.g. `authorization`).
    pub header: HeaderName,
    /// Its whole value (e.g. `Bearer <token>`).
    pub value: SecretString,
}

impl InjectionRule {
    /// A rule from plain parts: `host` a DNS name, `path_prefix` starting with `/`,
    /// `header` a valid header name, `value` a valid header value. The error names the
    /// part, never the value.
    pub fn new(
        host: &str,
        path_prefix: &str,
        header: &str,
        value: SecretString,
    ) -> Result<Self, String> {
        let host = normalize_name(host).ok_or_else(|| format!("{host:?} is not a host name"))?;
        Self::check_prefix(path_prefix)?;
        let header = HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| format!("{header:?} is not a header name"))?;
        if HeaderValue::from_str(value.expose()).is_err() {
            return Err(format!(
                "the value for {host} is not a valid {header} header value"
            ));
        }
        Ok(Self {
            host,
            path_prefix: path_prefix.to_owned(),
            header,
            value,
        })
    }
}

impl InjectionRule {
    /// Whether `path_prefix` is a prefix a rule can have: `/`, or `/`-separated segments
    /// that each decode cleanly (`omabox_contract::url_path`), with or without a trailing
    /// `/` (which changes nothing: prefixes match whole segments).
    pub fn check_prefix(path_prefix: &str) -> Result<(), String> {
        if !path_prefix.starts_with('/') {
            return Err(format!("path prefix {path_prefix:?} must start with /"));
        }
        judge::prefix_segments(path_prefix).map(drop).ok_or_else(|| {
            format!(
                "path prefix {path_prefix:?} has an empty, '.' or '..' segment or an encoded '/', '\\', '?' or '#'"
            )
        })
    }
}

impl std::fmt::Debug for InjectionRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InjectionRule")
            .field("host", &self.host)
            .field("path_prefix", &self.path_prefix)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// One binding's credentials: its CA, its rules, the roots upstream servers are checked
/// against. Share it in an [`Arc`] with the relay ([`crate::Relay::set_credentials`]).
pub struct Credentials {
    ca: InterceptCa,
    rules: RwLock<Vec<InjectionRule>>,
    revoked: AtomicBool,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    upstream: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field(
                "rules",
                &*self.rules.read().unwrap_or_else(|e| e.into_inner()),
            )
            .field("revoked", &self.revoked.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// Credentials injecting `rules`, intercepting with `ca`, trusting `upstream_roots`
    /// for the real servers.
    pub fn new(
        ca: InterceptCa,
        rules: Vec<InjectionRule>,
        upstream_roots: RootCertStore,
    ) -> Result<Self, CertificateError> {
        let mut upstream = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| CertificateError(e.to_string()))?
        .with_root_certificates(upstream_roots)
        .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            ca,
            rules: RwLock::new(rules),
            revoked: AtomicBool::new(false),
            leaves: Mutex::new(HashMap::new()),
            upstream: Arc::new(upstream),
        })
    }

    /// The CA certificate the sandbox must trust (PEM).
    pub fn ca_pem(&self) -> String {
        self.ca.certificate_pem()
    }

    /// Whether connections to `name` are intercepted (a rule binds it and the binding is
    /// not revoked).
    pub fn binds(&self, name: &str) -> bool {
        let Some(name) = normalize_name(name) else {
            return false;
        };
        !self.revoked.load(Ordering::SeqCst)
            && self
                .rules
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|r| normalize_name(&r.host).as_deref() == Some(name.as_str()))
    }

    /// Drops every secret: from now on no request gets one, on any connection.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::SeqCst);
        self.rules
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Whether [`revoke`](Self::revoke) was called.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::SeqCst)
    }

    /// Judges `request` for the bound connection (see [`judge`]), removes its own headers of
    /// every bound name, then sets the matching rule's header. `Err`: the status to refuse
    /// it with.
    fn prepare(
        &self,
        bound: judge::Bound<'_>,
        request: &mut Request<Incoming>,
    ) -> Result<(), StatusCode> {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        let rule = judge::judge(request, bound, &rules)?;
        for rule in rules.iter() {
            request.headers_mut().remove(&rule.header);
        }
        if self.revoked.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(rule) = rule
            && let Ok(mut value) = HeaderValue::from_str(rule.value.expose())
        {
            value.set_sensitive(true);
            request.headers_mut().insert(rule.header.clone(), value);
        }
        Ok(())
    }

    fn leaf(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(leaf) = leaves.get(name) {
            return Some(Arc::clone(leaf));
        }
        let leaf = self.ca.issue(name).ok()?;
        leaves.insert(name.to_owned(), Arc::clone(&leaf));
        Some(leaf)
    }

    /// Serves one admitted connection for bound `name`: TLS from the sandbox (its first
    /// bytes already read into `sniffed`), TLS to `upstream` (connected on the port the
    /// connection was admitted on), HTTP/1.1 between, each request judged and injected.
    /// Returns when either side is done.
    pub async fn intercept(
        self: Arc<Self>,
        client: TcpStream,
        sniffed: Vec<u8>,
        name: String,
        upstream: TcpStream,
    ) -> io::Result<()> {
        let port = upstream.peer_addr()?.port();
        let mut server_config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(LeafResolver {
            credentials: Arc::clone(&self),
            name: name.clone(),
        }));
        server_config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = tokio_rustls::TlsAcceptor::from(Arc::new(server_config))
            .accept(Rewind::new(sniffed, client))
            .await?;
        let server_name = ServerName::try_from(name.clone()).map_err(io::Error::other)?;
        let upstream = tokio_rustls::TlsConnector::from(Arc::clone(&self.upstream))
            .connect(server_name, upstream)
            .await?;
        let (sender, connection) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD)
            .handshake(TokioIo::new(upstream))
            .await
            .map_err(io::Error::other)?;
        let upstream_done = tokio::spawn(connection);
        let sender = Arc::new(tokio::sync::Mutex::new(sender));
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            let (credentials, sender, name) =
                (Arc::clone(&self), Arc::clone(&sender), name.clone());
            async move {
                let bound = judge::Bound { name: &name, port };
                if let Err(code) = credentials.prepare(bound, &mut request) {
                    tracing::debug!(name = %name, status = %code, "intercepted request refused");
                    return Ok::<_, hyper::Error>(refusal(code));
                }
                let mut sender = sender.lock().await;
                match sender.send_request(request).await {
                    Ok(response) => Ok(response.map(|body| body.boxed())),
                    Err(e) => {
                        tracing::debug!(error = %e, "upstream request failed");
                        Ok(status(StatusCode::BAD_GATEWAY))
                    }
                }
            }
        });
        // An idle keep-alive connection (no request head within the timeout) is closed;
        // a long body (a clone) is not cut.
        let served = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(MAX_HEAD)
            .serve_connection(TokioIo::new(client), service)
            .await;
        upstream_done.abort();
        served.map_err(io::Error::other)
    }
}

/// A refusal: bodiless, and the connection closes after it (what follows it on the
/// connection was framed by a request that was not accepted).
fn refusal(code: StatusCode) -> Response<BoxBody<Bytes, hyper::Error>> {
    let mut response = status(code);
    response
        .headers_mut()
        .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A bodiless response with `code`.
fn status(code: StatusCode) -> Response<BoxBody<Bytes, hyper::Error>> {
    let mut response = Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = code;
    response
}

/// Presents the bound name's leaf, whatever SNI the client sent (the relay admitted the
/// connection by that name).
#[derive(Debug)]
struct LeafResolver {
    credentials: Arc<Credentials>,
    name: String,
}

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.credentials.leaf(&self.name)
    }
}

/// Parses PEM certificates (a CA bundle) into a root store; unparsable entries are skipped.
pub fn roots_from_pem(pem: &[u8]) -> RootCertStore {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem).flatten() {
        let _ = roots.add(cert);
    }
    roots
}
