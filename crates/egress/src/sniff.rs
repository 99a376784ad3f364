//! The name a client asks for, read from the first bytes it sends: the TLS ClientHello's
//! SNI, else an HTTP/1.x request's `Host` header.
//!
//! Contract: [`sniff`] reads at most [`SniffLimits::max_bytes`] bytes within
//! [`SniffLimits::timeout`], never allocates more than that, never panics on any input, and
//! returns every byte it read ([`Sniffed::bytes`]) so the caller replays them to the upstream
//! unchanged. It decides nothing: whether the name is admitted is the relay's question.
//!
//! The ClientHello is parsed by rustls's [`rustls::server::Acceptor`] (no certificate is
//! needed to read it); the request head by `httparse`. A client that encrypts its
//! ClientHello (ECH) shows the outer, public name, and that is the name decided on. `Host`
//! and an absolute-form target are read by [`crate::authority`], the parser interception
//! uses too; a target naming another host than `Host` names nothing.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::authority::{Authority, target_authority};

/// How much and how long [`sniff`] reads before giving up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SniffLimits {
    /// Bytes read at most (a ClientHello or request head larger than this has no name).
    pub max_bytes: usize,
    /// Time from the first read to a decision, whatever the client trickles (slowloris).
    pub timeout: Duration,
}

impl Default for SniffLimits {
    fn default() -> Self {
        Self {
            max_bytes: 16 * 1024,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Which protocol named the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// A TLS ClientHello's `server_name` extension.
    Tls,
    /// An HTTP/1.x request's `Host` header.
    Http,
}

/// A destination name the client asked for, lowercased, without a trailing dot or port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedName {
    /// The name.
    pub name: String,
    /// Where it was read.
    pub protocol: Protocol,
}

/// Why no name came out of the first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoName {
    /// The client sent nothing decisive before the timeout.
    #[error("no name before the timeout")]
    Timeout,
    /// The ClientHello or request head is larger than the byte cap.
    #[error("no name within the byte cap")]
    TooLarge,
    /// The client closed (or the read failed) before a name was complete.
    #[error("the connection ended before a name")]
    Closed,
    /// The bytes are neither a TLS ClientHello nor an HTTP/1.x request.
    #[error("neither TLS nor HTTP/1")]
    Unrecognized,
    /// A TLS ClientHello without a DNS `server_name`.
    #[error("TLS without SNI")]
    TlsWithoutSni,
    /// An HTTP/1.x request without a `Host` header, or with several.
    #[error("HTTP without one Host header")]
    HttpWithoutHost,
    /// A `Host` header that is not a DNS name (an address literal, user info, bad bytes).
    #[error("the Host header is not a DNS name")]
    InvalidName,
    /// An absolute-form or authority-form request target naming another host than `Host`.
    #[error("the request target names another host than Host")]
    ConflictingAuthority,
}

/// What [`sniff`] read and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sniffed {
    /// Every byte read, in order: replay them to the upstream before anything else.
    pub bytes: Vec<u8>,
    /// The requested name, or why there is none.
    pub outcome: Result<RequestedName, NoName>,
}

/// Reads the first bytes of `stream` until they name a destination, up to `limits`.
pub async fn sniff<R: AsyncRead + Unpin>(stream: &mut R, limits: SniffLimits) -> Sniffed {
    let mut bytes = Vec::new();
    let outcome =
        match tokio::time::timeout(limits.timeout, read_name(stream, limits, &mut bytes)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(NoName::Timeout),
        };
    Sniffed { bytes, outcome }
}

async fn read_name<R: AsyncRead + Unpin>(
    stream: &mut R,
    limits: SniffLimits,
    bytes: &mut Vec<u8>,
) -> Result<RequestedName, NoName> {
    let mut parser = None;
    let mut chunk = [0u8; 4096];
    loop {
        let room = limits.max_bytes.saturating_sub(bytes.len());
        if room == 0 {
            return Err(NoName::TooLarge);
        }
        let want = room.min(chunk.len());
        let n = match stream.read(&mut chunk[..want]).await {
            Ok(0) | Err(_) => return Err(NoName::Closed),
            Ok(n) => n,
        };
        let new = &chunk[..n];
        bytes.extend_from_slice(new);
        let parser = parser.get_or_insert_with(|| Parser::for_first_byte(bytes[0]));
        if let Some(outcome) = parser.feed(bytes, new) {
            return outcome;
        }
    }
}

/// The protocol guessed from the first byte, with its incremental state.
enum Parser {
    Tls(Box<rustls::server::Acceptor>),
    Http,
    Unrecognized,
}

/// TLS record content type 22: handshake.
const TLS_HANDSHAKE: u8 = 0x16;

impl Parser {
    fn for_first_byte(byte: u8) -> Self {
        match byte {
            TLS_HANDSHAKE => Self::Tls(Box::default()),
            // Every HTTP/1 method is an upper-case token.
            b'A'..=b'Z' => Self::Http,
            _ => Self::Unrecognized,
        }
    }

    /// `Some` once decided; `None` to read more. `all` is every byte so far, `new` the
    /// last read.
    fn feed(&mut self, all: &[u8], new: &[u8]) -> Option<Result<RequestedName, NoName>> {
        match self {
            Self::Unrecognized => Some(Err(NoName::Unrecognized)),
            Self::Tls(acceptor) => tls_name(acceptor, new),
            // A request head is complete only at a line end: parse again only then.
            Self::Http if !new.contains(&b'\n') => None,
            Self::Http => http_host(all),
        }
    }
}

fn tls_name(
    acceptor: &mut rustls::server::Acceptor,
    mut new: &[u8],
) -> Option<Result<RequestedName, NoName>> {
    while !new.is_empty() {
        match acceptor.read_tls(&mut new) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => return Some(Err(NoName::TooLarge)),
        }
    }
    match acceptor.accept() {
        Ok(None) => None,
        Ok(Some(accepted)) => Some(
            accepted
                .client_hello()
                .server_name()
                .and_then(omabox_contract::networking::normalize_name)
                .map(|name| RequestedName {
                    name,
                    protocol: Protocol::Tls,
                })
                .ok_or(NoName::TlsWithoutSni),
        ),
        Err(_) => Some(Err(NoName::Unrecognized)),
    }
}

fn http_host(all: &[u8]) -> Option<Result<RequestedName, NoName>> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(all) {
        Ok(httparse::Status::Partial) => None,
        Err(httparse::Error::TooManyHeaders) => Some(Err(NoName::TooLarge)),
        Err(_) => Some(Err(NoName::Unrecognized)),
        Ok(httparse::Status::Complete(_)) => {
            let mut hosts = request
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"));
            let (Some(host), None) = (hosts.next(), hosts.next()) else {
                return Some(Err(NoName::HttpWithoutHost));
            };
            let Ok(host) = Authority::parse_bytes(host.value) else {
                return Some(Err(NoName::InvalidName));
            };
            // An absolute-form (`GET http://other/`) or authority-form target names a
            // destination too, and a proxy-like upstream would follow it: it must name the
            // same host as `Host`.
            match request.path.map(target_authority) {
                None | Some(Ok(None)) => {}
                Some(Ok(Some(target))) if target.name == host.name => {}
                Some(_) => return Some(Err(NoName::ConflictingAuthority)),
            }
            Some(Ok(RequestedName {
                name: host.name,
                protocol: Protocol::Http,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(head: &str) -> Result<String, NoName> {
        let head = format!("{head}\r\n\r\n");
        http_host(head.as_bytes())
            .expect("a complete head")
            .map(|r| r.name)
    }

    #[test]
    fn host_values_lose_their_port_and_must_be_names() {
        let get = |value: &str| host(&format!("GET / HTTP/1.1\r\nHost: {value}"));
        assert_eq!(get("Example.COM:8080").unwrap(), "example.com");
        assert_eq!(get("example.com.").unwrap(), "example.com");
        for bad in [
            "[::1]:80",
            "example.com:http",
            "ex ample.com",
            "a..b",
            "a@b.example",
        ] {
            assert_eq!(get(bad), Err(NoName::InvalidName), "{bad:?}");
        }
    }

    #[test]
    fn a_target_naming_another_authority_than_host_has_no_name() {
        for head in [
            "GET http://evil.example/x HTTP/1.1\r\nHost: allowed.example",
            "GET https://evil.example/ HTTP/1.1\r\nHost: allowed.example",
            "CONNECT evil.example:443 HTTP/1.1\r\nHost: allowed.example",
            "GET http://allowed.example@evil.example/ HTTP/1.1\r\nHost: allowed.example",
        ] {
            assert_eq!(host(head), Err(NoName::ConflictingAuthority), "{head:?}");
        }
        for head in [
            "GET http://Allowed.Example:8080/x HTTP/1.1\r\nHost: allowed.example",
            "GET /x HTTP/1.1\r\nHost: allowed.example",
            "OPTIONS * HTTP/1.1\r\nHost: allowed.example",
        ] {
            assert_eq!(host(head).unwrap(), "allowed.example", "{head:?}");
        }
    }
}
