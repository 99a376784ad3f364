//! The one parser of an HTTP authority (`Host` header values, the authority of an
//! absolute-form or authority-form request target) for everything in this crate that decides
//! by it: the relay's sniffing and credential egress's interception.
//!
//! An authority here is `NAME[:PORT]`: a DNS name (normalized: lowercase, one trailing dot
//! dropped) and an optional port of 1–65535. Refused, never guessed at: user info (`a@b`, the
//! `Host` grammar has none, and `a@b` names `b` to one parser and `a@b` to another), an IP
//! literal in brackets, a name that is not a DNS name (IDN must come as punycode), a port that
//! is not a number (`:http`) or is empty (`name:`).

use omabox_contract::networking::normalize_name;

/// A parsed authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    /// The DNS name, normalized.
    pub name: String,
    /// The port, when one was given.
    pub port: Option<u16>,
}

/// Why an authority was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorityError {
    /// It carries user info (`user@host`).
    #[error("the authority carries user info")]
    UserInfo,
    /// The host is not a DNS name (an IP literal in brackets, bad bytes, empty).
    #[error("the authority's host is not a DNS name")]
    NotAName,
    /// The port is not a number from 1 to 65535.
    #[error("the authority's port is not a number from 1 to 65535")]
    BadPort,
}

impl Authority {
    /// Parses `NAME[:PORT]` (see the module doc). Surrounding spaces and tabs are ignored
    /// (optional whitespace around a header value).
    pub fn parse(text: &str) -> Result<Self, AuthorityError> {
        let text = text.trim_matches([' ', '\t']);
        if text.contains('@') {
            return Err(AuthorityError::UserInfo);
        }
        if text.starts_with('[') {
            return Err(AuthorityError::NotAName);
        }
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) => {
                let port = Some(port)
                    .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|p| p.parse::<u16>().ok())
                    .filter(|p| *p != 0)
                    .ok_or(AuthorityError::BadPort)?;
                (host, Some(port))
            }
            None => (text, None),
        };
        let name = normalize_name(host).ok_or(AuthorityError::NotAName)?;
        Ok(Self { name, port })
    }

    /// Parses raw header bytes (not UTF-8: not a name).
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, AuthorityError> {
        std::str::from_utf8(bytes)
            .map_err(|_| AuthorityError::NotAName)
            .and_then(Self::parse)
    }

    /// Whether this authority names `name` on `port`: the same name, and no port or that
    /// port.
    pub fn is(&self, name: &str, port: u16) -> bool {
        self.name == name && self.port.is_none_or(|p| p == port)
    }
}

/// What a request target names besides a path: the authority of an absolute-form
/// (`https://host/x`) or authority-form (`host:443`, CONNECT) target, parsed with
/// [`Authority::parse`]; `Ok(None)` for origin-form (`/x`) and asterisk-form (`*`). A target
/// that is none of these forms is refused as [`AuthorityError::NotAName`].
pub fn target_authority(target: &str) -> Result<Option<Authority>, AuthorityError> {
    if target.starts_with('/') || target == "*" {
        return Ok(None);
    }
    let uri: hyper::Uri = target.parse().map_err(|_| AuthorityError::NotAName)?;
    let authority = uri.authority().ok_or(AuthorityError::NotAName)?;
    Authority::parse(authority.as_str()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> (String, Option<u16>) {
        let a = Authority::parse(text).unwrap();
        (a.name, a.port)
    }

    #[test]
    fn names_with_an_optional_port() {
        assert_eq!(ok("Example.COM:8080"), ("example.com".into(), Some(8080)));
        assert_eq!(ok("example.com."), ("example.com".into(), None));
        assert_eq!(ok(" api.example.com\t"), ("api.example.com".into(), None));
        assert_eq!(
            ok("xn--bcher-kva.example"),
            ("xn--bcher-kva.example".into(), None)
        );
    }

    #[test]
    fn user_info_literals_and_bad_ports_are_refused() {
        for (text, why) in [
            ("a@b.example", AuthorityError::UserInfo),
            ("user:pw@b.example:443", AuthorityError::UserInfo),
            ("b.example@evil.example", AuthorityError::UserInfo),
            ("[::1]:80", AuthorityError::NotAName),
            ("b\u{fc}cher.example", AuthorityError::NotAName),
            ("", AuthorityError::NotAName),
            ("a..b", AuthorityError::NotAName),
            ("ex ample.com", AuthorityError::NotAName),
            ("example.com:http", AuthorityError::BadPort),
            ("example.com:", AuthorityError::BadPort),
            ("example.com:0", AuthorityError::BadPort),
            ("example.com:65536", AuthorityError::BadPort),
            ("example.com:+443", AuthorityError::BadPort),
        ] {
            assert_eq!(Authority::parse(text), Err(why), "{text:?}");
        }
        assert_eq!(
            Authority::parse_bytes(b"\xff.example"),
            Err(AuthorityError::NotAName)
        );
    }

    #[test]
    fn a_target_names_an_authority_only_in_absolute_or_authority_form() {
        assert_eq!(target_authority("/x?y").unwrap(), None);
        assert_eq!(target_authority("*").unwrap(), None);
        assert_eq!(
            target_authority("https://EVIL.example/x").unwrap(),
            Some(Authority {
                name: "evil.example".into(),
                port: None
            })
        );
        assert_eq!(
            target_authority("evil.example:443").unwrap(),
            Some(Authority {
                name: "evil.example".into(),
                port: Some(443)
            })
        );
        assert_eq!(
            target_authority("https://a@b.example/"),
            Err(AuthorityError::UserInfo)
        );
    }
}
