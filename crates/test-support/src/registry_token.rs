//! A bearer-token issuer for [`crate::registry::TestRegistry`]: the registry runs with
//! distribution's `auth: token` and sends clients here (`WWW-Authenticate: Bearer
//! realm=…`); this answers `GET /token?service=…&scope=repository:NAME:pull,push` with a JWT
//! (ES256, its certificate in the `x5c` header, the registry trusting that certificate)
//! when the request carries the right basic credentials, else 401. The key, the
//! certificate and the signatures come from the `openssl` command.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;

/// The `service` and `issuer` the registry is configured with.
pub const SERVICE: &str = "omabox-test-registry";
const ISSUER: &str = "omabox-test-issuer";

/// Signs tokens; see the module doc.
#[derive(Debug, Clone)]
pub struct TokenIssuer {
    key: PathBuf,
    /// The certificate (PEM) the registry's `rootcertbundle` names.
    pub cert: PathBuf,
    cert_der_b64: String,
}

impl TokenIssuer {
    /// A new key and self-signed certificate in `dir`.
    pub fn new(dir: &Path) -> Self {
        let (key, cert) = (dir.join("token.key"), dir.join("token.pem"));
        run(Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=omabox-test-token-issuer", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert));
        let der = run(Command::new("openssl")
            .args(["x509", "-outform", "DER", "-in"])
            .arg(&cert));
        Self {
            key,
            cert,
            cert_der_b64: base64::engine::general_purpose::STANDARD.encode(der),
        }
    }

    /// A token for `scopes` (`repository:NAME:ACTIONS`), valid for five minutes.
    pub fn token(&self, scopes: &[String]) -> String {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let header = format!(
            r#"{{"alg":"ES256","typ":"JWT","x5c":["{}"]}}"#,
            self.cert_der_b64
        );
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let access: Vec<String> = scopes
            .iter()
            .filter_map(|scope| {
                let mut parts = scope.splitn(3, ':');
                let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
                let actions: Vec<String> = actions.split(',').map(|a| format!("\"{a}\"")).collect();
                Some(format!(
                    r#"{{"type":"{kind}","name":"{name}","actions":[{}]}}"#,
                    actions.join(",")
                ))
            })
            .collect();
        let claims = format!(
            r#"{{"iss":"{ISSUER}","sub":"test","aud":"{SERVICE}","exp":{},"nbf":{},"iat":{now},"jti":"{now}-{}","access":[{}]}}"#,
            now + 300,
            now - 10,
            rand_suffix(),
            access.join(",")
        );
        let input = format!("{}.{}", b64(header.as_bytes()), b64(claims.as_bytes()));
        let mut child = Command::new("openssl")
            .args(["dgst", "-sha256", "-sign"])
            .arg(&self.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run openssl dgst");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("sign input");
        let out = child.wait_with_output().expect("openssl dgst");
        assert!(out.status.success(), "openssl dgst failed");
        format!("{input}.{}", b64(&der_to_raw_p256(&out.stdout)))
    }

    /// The registry config's `auth:` section for this issuer at `realm`.
    pub fn registry_auth(&self, realm: &str) -> String {
        format!(
            "auth:\n  token:\n    realm: {realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
            self.cert.display()
        )
    }

    /// Serves tokens on a loopback port for `user`/`password` until the process ends;
    /// returns the realm URL.
    pub fn serve(&self, user: &str, password: &str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("token port");
        let addr: SocketAddr = listener.local_addr().expect("token addr");
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        let issuer = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let target = line.split(' ').nth(1).unwrap_or_default().to_owned();
                let mut authorized = false;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = header.split_once(':')
                        && k.eq_ignore_ascii_case("authorization")
                        && v.trim() == expected
                    {
                        authorized = true;
                    }
                }
                let scopes: Vec<String> = target
                    .split_once('?')
                    .map(|(_, query)| query)
                    .unwrap_or_default()
                    .split('&')
                    .filter_map(|kv| kv.strip_prefix("scope="))
                    .map(percent_decode)
                    .collect();
                let (status, body) = if authorized {
                    let token = issuer.token(&scopes);
                    (
                        "200 OK",
                        format!(
                            r#"{{"token":"{token}","access_token":"{token}","expires_in":300}}"#
                        ),
                    )
                } else {
                    ("401 Unauthorized", String::from(r#"{"errors":[]}"#))
                };
                let mut stream = &stream;
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        format!("http://{addr}/token")
    }
}

fn run(command: &mut Command) -> Vec<u8> {
    let out = command.output().expect("run openssl");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn rand_suffix() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An ECDSA signature as openssl writes it (DER `SEQUENCE { INTEGER r, INTEGER s }`) in
/// JWS form: `r || s`, 32 bytes each.
fn der_to_raw_p256(der: &[u8]) -> Vec<u8> {
    fn integer(bytes: &[u8]) -> (&[u8], &[u8]) {
        assert_eq!(bytes[0], 0x02, "DER INTEGER expected");
        let len = bytes[1] as usize;
        (&bytes[2..2 + len], &bytes[2 + len..])
    }
    assert_eq!(der[0], 0x30, "DER SEQUENCE expected");
    let body = if der[1] & 0x80 != 0 {
        &der[3..]
    } else {
        &der[2..]
    };
    let (r, rest) = integer(body);
    let (s, _) = integer(rest);
    let mut raw = Vec::with_capacity(64);
    for n in [r, s] {
        let n = &n[n.len().saturating_sub(32)..];
        raw.extend(std::iter::repeat_n(0, 32 - n.len()));
        raw.extend_from_slice(n);
    }
    raw
}
