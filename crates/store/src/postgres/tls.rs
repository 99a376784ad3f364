//! TLS to PostgreSQL: the URL's `sslmode` and `sslrootcert`, read as libpq reads them.
//!
//! `tokio-postgres` parses `sslmode=disable|prefer|require` only and brings no TLS; so
//! [`split`] takes the libpq options it does not know (`sslmode=verify-ca|verify-full`,
//! `sslrootcert=`) out of the URL before the driver parses it, and every connection (the
//! pool's and the run listener's) goes through one rustls connector (ring, as the rest of
//! omabox):
//!
//! | `sslmode`              | encrypted                       | the server is checked        |
//! |------------------------|---------------------------------|------------------------------|
//! | `disable`              | no                              | no                           |
//! | `prefer` (the default) | if the server offers TLS        | no                           |
//! | `require`              | yes, or no connection           | no (with `sslrootcert`: CA)  |
//! | `verify-ca`            | yes                             | chain to the roots           |
//! | `verify-full`          | yes                             | chain and host name          |
//!
//! The roots are the PEM file `sslrootcert` names, else the system's (also
//! `sslrootcert=system`). What this must never do: connect in plain text or to an
//! unverified server when the URL asks for verification, or put the URL (its password) in an
//! error: errors here name an option or the root file.
//!
//! Channel binding (`SCRAM-SHA-256-PLUS`) is not offered: the stream reports none, so the
//! login is plain SCRAM inside the TLS session.

use crate::StoreError;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// How much of the server's identity is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Encryption only (`prefer`, `require`): libpq's behaviour, for a trusted network.
    None,
    /// The certificate chains to the roots (`verify-ca`; `require` with `sslrootcert`).
    Ca,
    /// The chain and the host name the URL connects to (`verify-full`).
    Full,
}

/// The TLS options [`split`] took out of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    /// What is checked.
    pub verify: Verify,
    /// `sslrootcert`: a PEM file, or `None` for the system's roots.
    pub root_cert: Option<PathBuf>,
}

/// `url` without the options the driver does not parse, the TLS options, and whether
/// verification forces `sslmode=require` on the driver's side.
pub fn split(url: &str) -> Result<(String, TlsOptions, bool), StoreError> {
    let mut verify = None;
    let mut root_cert = None;
    let mut keep = |key: &str, value: &str| -> Result<bool, StoreError> {
        match (key, value) {
            ("sslmode", "verify-ca") => verify = Some(Verify::Ca),
            ("sslmode", "verify-full") => verify = Some(Verify::Full),
            ("sslrootcert", "system") => root_cert = Some(None),
            ("sslrootcert", "") => {
                return Err(StoreError::DatabaseUrl("sslrootcert is empty".to_owned()));
            }
            ("sslrootcert", path) => root_cert = Some(Some(PathBuf::from(path))),
            _ => return Ok(true),
        }
        Ok(false)
    };
    let rest = if let Some((head, query)) = url.split_once("://").and_then(|_| url.split_once('?'))
    {
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if keep(key, &percent_decode(value)?)? {
                kept.push(pair);
            }
        }
        if kept.is_empty() {
            head.to_owned()
        } else {
            format!("{head}?{}", kept.join("&"))
        }
    } else if url.contains("://") {
        url.to_owned()
    } else {
        // The `key=value` form (unquoted values; a quoted one is left to the driver).
        let mut kept = Vec::new();
        for word in url.split_ascii_whitespace() {
            let (key, value) = word.split_once('=').unwrap_or((word, ""));
            if keep(key, value)? {
                kept.push(word);
            }
        }
        kept.join(" ")
    };
    let forced = verify.is_some();
    let root_cert = root_cert.flatten();
    let verify = match verify {
        Some(verify) => verify,
        // libpq: `require` with a root file checks the chain.
        None if root_cert.is_some() => Verify::Ca,
        None => Verify::None,
    };
    Ok((rest, TlsOptions { verify, root_cert }, forced))
}

/// `%XX` escapes of a URL query value decoded (a path may carry `%2F`).
fn percent_decode(value: &str) -> Result<String, StoreError> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = bytes
                .get(index + 1..index + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| StoreError::DatabaseUrl("a bad %-escape".to_owned()))?;
            out.push(hex);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).map_err(|_| StoreError::DatabaseUrl("a value is not UTF-8".to_owned()))
}

/// The connector every connection of a store uses (cheap to clone).
#[derive(Clone)]
pub struct MakeRustls {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MakeRustls").finish_non_exhaustive()
    }
}

impl MakeRustls {
    /// The connector for `options` (reads the root file now: a missing or empty one is an
    /// error before any connection).
    pub fn new(options: &TlsOptions) -> Result<Self, StoreError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|error| StoreError::Tls(error.to_string()))?;
        let config = match options.verify {
            Verify::None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
                .with_no_client_auth(),
            Verify::Ca | Verify::Full => {
                let roots = Arc::new(roots(options)?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|error| StoreError::Tls(error.to_string()))?;
                if options.verify == Verify::Full {
                    builder.with_webpki_verifier(webpki).with_no_client_auth()
                } else {
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
                        .with_no_client_auth()
                }
            }
        };
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

/// The roots: `sslrootcert`'s PEM certificates, or the system's.
fn roots(options: &TlsOptions) -> Result<RootCertStore, StoreError> {
    let mut roots = RootCertStore::empty();
    match &options.root_cert {
        Some(path) => {
            let failed = |detail: String| {
                StoreError::Tls(format!("sslrootcert {}: {detail}", path.display()))
            };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|error| failed(error.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| failed(error.to_string()))?;
            if certs.is_empty() {
                return Err(failed("no PEM certificate in it".to_owned()));
            }
            for cert in certs {
                roots.add(cert).map_err(|error| failed(error.to_string()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(StoreError::Tls(
                    "the system has no root certificate to verify the server with: name the \
                     server's CA with sslrootcert=PATH in the database URL"
                        .to_owned(),
                ));
            }
        }
    }
    Ok(roots)
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, io::Error> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        Ok(RustlsConnect {
            config: Arc::clone(&self.config),
            name,
        })
    }
}

/// One connection's TLS handshake.
#[derive(Debug)]
pub struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(RustlsStream(Box::new(tls)))
        })
    }
}

/// A TLS session to the server.
#[derive(Debug)]
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

/// `prefer`/`require` without roots: the session is encrypted and its handshake signature
/// checked, the certificate is not (libpq's behaviour for these modes).
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: webpki's checks but for the name.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_modes_and_the_root_file_are_taken_out_of_a_url() {
        let (rest, options, forced) = split(
            "postgres://u:pw@db:5432/omabox?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:pw@db:5432/omabox?application_name=x");
        assert_eq!(options.verify, Verify::Full);
        assert_eq!(options.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        assert!(forced);

        let (rest, options, forced) =
            split("postgres://u:pw@db/omabox?sslmode=require&sslrootcert=/ca.pem").unwrap();
        assert_eq!(rest, "postgres://u:pw@db/omabox?sslmode=require");
        assert_eq!(
            options.verify,
            Verify::Ca,
            "libpq: require with a root file"
        );
        assert!(!forced);

        let (rest, options, _) =
            split("host=db user=u password=pw sslmode=verify-ca sslrootcert=system").unwrap();
        assert_eq!(rest, "host=db user=u password=pw");
        assert_eq!(options.verify, Verify::Ca);
        assert_eq!(options.root_cert, None);

        let (rest, options, forced) = split("postgres://u:pw@db/omabox").unwrap();
        assert_eq!(rest, "postgres://u:pw@db/omabox");
        assert_eq!(options.verify, Verify::None);
        assert!(!forced);
    }

    #[test]
    fn a_missing_root_file_is_named_and_the_url_is_not() {
        let (_, options, _) = split(
            "postgres://u:s3cr3t@db/omabox?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        )
        .unwrap();
        let error = MakeRustls::new(&options).unwrap_err().to_string();
        assert!(error.contains("/nonexistent/ca.pem"), "{error}");
        assert!(!error.contains("s3cr3t"), "{error}");
    }
}
