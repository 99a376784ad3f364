//! A real OCI registry for tests: Debian's `docker-registry` (distribution 2.x) serving
//! a temporary directory on a loopback port, optionally behind htpasswd basic auth or
//! bearer tokens (`crate::registry_token`), and
//! a minimal push client (plain HTTP/1.1 over a `TcpStream`: monolithic blob uploads and
//! manifest PUTs) so tests make their own tiny images.
//!
//! Gate a test with `require_capability(TestRegistry::missing())`. The registry process
//! is killed and its directory removed when the [`TestRegistry`] is dropped.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

/// The registry binary of Debian's `docker-registry` package.
pub const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";

/// A running `docker-registry` on `127.0.0.1:<port>`.
#[derive(Debug)]
pub struct TestRegistry {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    auth: Option<(String, String)>,
    /// With token auth: the issuer the push client takes its own tokens from.
    token: Option<crate::registry_token::TokenIssuer>,
}

/// An HTTP response: status, headers, body.
pub type Response = (u16, Vec<(String, String)>, Vec<u8>);

/// One pushed image.
#[derive(Debug, Clone)]
pub struct PushedImage {
    /// `sha256:<hex>` of the manifest.
    pub digest: String,
    /// The manifest's size in bytes.
    pub manifest_size: usize,
    /// The layer blobs' digests, in order.
    pub layers: Vec<String>,
    /// The config blob's digest.
    pub config: String,
}

impl TestRegistry {
    /// Why a registry cannot run here (`None`: it can).
    pub fn missing() -> Option<String> {
        if !Path::new(REGISTRY_BINARY).exists() {
            return Some(format!(
                "{REGISTRY_BINARY} is missing (apt-get install docker-registry)"
            ));
        }
        if Command::new("htpasswd")
            .arg("-h")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            return Some("htpasswd is missing (apt-get install apache2-utils)".into());
        }
        if Command::new("openssl")
            .arg("version")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            return Some("openssl is missing (apt-get install openssl)".into());
        }
        None
    }

    /// Starts an open registry.
    pub fn start() -> Self {
        Self::spawn(None, false)
    }

    /// Starts a registry that wants basic auth as `user`/`password` (htpasswd, bcrypt).
    pub fn start_with_auth(user: &str, password: &str) -> Self {
        Self::spawn(Some((user.to_owned(), password.to_owned())), false)
    }

    /// Starts a registry that wants bearer tokens, which its issuer gives for
    /// `user`/`password` (distribution's token auth).
    pub fn start_with_token_auth(user: &str, password: &str) -> Self {
        Self::spawn(Some((user.to_owned(), password.to_owned())), true)
    }

    fn spawn(auth: Option<(String, String)>, token: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("omabox-registry-")
            .tempdir()
            .expect("registry tempdir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  secret: omabox-test\n",
            dir.path().join("storage").display()
        );
        let mut issuer = None;
        if let (Some((user, password)), true) = (&auth, token) {
            let tokens = crate::registry_token::TokenIssuer::new(dir.path());
            let realm = tokens.serve(user, password);
            config.push_str(&tokens.registry_auth(&realm));
            issuer = Some(tokens);
        } else if let Some((user, password)) = &auth {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .expect("run htpasswd");
            assert!(out.status.success(), "htpasswd failed");
            std::fs::write(dir.path().join("htpasswd"), &out.stdout).expect("write htpasswd");
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: omabox-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).expect("write registry config");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("registry log");
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let registry = Self {
            child,
            addr,
            dir,
            auth,
            token: issuer,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok((status, _, _)) = registry.request("GET", "/v2/", &[], &[])
                && (status == 200 || status == 401)
            {
                return registry;
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer on {addr}: {}",
                std::fs::read_to_string(registry.dir.path().join("registry.log"))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `127.0.0.1:<port>`, the registry part of a reference.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The storage file of a blob (to tamper with it).
    pub fn blob_data_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Pushes an image of uncompressed tar `layers` (bottom first) as `repo:tag` (an OCI
    /// manifest for linux and this host's architecture).
    pub fn push_image(&self, repo: &str, tag: &str, layers: &[Vec<u8>]) -> PushedImage {
        let mut layer_descs = Vec::new();
        let mut digests = Vec::new();
        for layer in layers {
            let digest = self.push_blob(repo, layer);
            layer_descs.push(format!(
                r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{digest}","size":{}}}"#,
                layer.len()
            ));
            digests.push(digest);
        }
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let config = format!(
            r#"{{"architecture":"{arch}","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":[{}]}}}}"#,
            digests
                .iter()
                .map(|d| format!("\"{d}\""))
                .collect::<Vec<_>>()
                .join(",")
        );
        let config_digest = self.push_blob(repo, config.as_bytes());
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{}]}}"#,
            config.len(),
            layer_descs.join(",")
        );
        let (status, _, body) = self
            .request(
                "PUT",
                &format!("/v2/{repo}/manifests/{tag}"),
                &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
                manifest.as_bytes(),
            )
            .expect("push manifest");
        assert_eq!(
            status,
            201,
            "manifest PUT: {}",
            String::from_utf8_lossy(&body)
        );
        PushedImage {
            digest: sha256(manifest.as_bytes()),
            manifest_size: manifest.len(),
            layers: digests,
            config: config_digest,
        }
    }

    /// Pushes an OCI image index as `repo:tag` listing `manifests` (pushed before to the
    /// same repository) with their platforms (`(image, "linux", "arm64")`); returns its
    /// digest.
    pub fn push_index(
        &self,
        repo: &str,
        tag: &str,
        manifests: &[(&PushedImage, &str, &str)],
    ) -> String {
        let entries: Vec<String> = manifests
            .iter()
            .map(|(image, os, arch)| {
                format!(
                    r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":{},"platform":{{"architecture":"{arch}","os":"{os}"}}}}"#,
                    image.digest, image.manifest_size
                )
            })
            .collect();
        let index = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{}]}}"#,
            entries.join(",")
        );
        let (status, _, body) = self
            .request(
                "PUT",
                &format!("/v2/{repo}/manifests/{tag}"),
                &[("Content-Type", "application/vnd.oci.image.index.v1+json")],
                index.as_bytes(),
            )
            .expect("push index");
        assert_eq!(status, 201, "index PUT: {}", String::from_utf8_lossy(&body));
        sha256(index.as_bytes())
    }

    /// Uploads one blob (monolithic: POST then PUT with the digest); returns its digest.
    pub fn push_blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = sha256(bytes);
        let (status, headers, body) = self
            .request("POST", &format!("/v2/{repo}/blobs/uploads/"), &[], &[])
            .expect("start upload");
        assert_eq!(
            status,
            202,
            "upload POST: {}",
            String::from_utf8_lossy(&body)
        );
        let location = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("location"))
            .map(|(_, v)| v.clone())
            .expect("upload location");
        let path = match location.find("/v2/") {
            Some(i) => location[i..].to_owned(),
            None => location,
        };
        let sep = if path.contains('?') { '&' } else { '?' };
        let (status, _, body) = self
            .request(
                "PUT",
                &format!("{path}{sep}digest={digest}"),
                &[("Content-Type", "application/octet-stream")],
                bytes,
            )
            .expect("upload PUT");
        assert_eq!(
            status,
            201,
            "upload PUT: {}",
            String::from_utf8_lossy(&body)
        );
        digest
    }

    /// One HTTP/1.1 request (`Connection: close`); the registry's credentials are sent
    /// when it has some.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if let Some(issuer) = &self.token {
            // The push client's own token: every action on the repository the path names.
            let repo = path
                .strip_prefix("/v2/")
                .and_then(|rest| {
                    ["/blobs/", "/manifests/", "/tags/"]
                        .iter()
                        .find_map(|marker| rest.split_once(marker).map(|(name, _)| name))
                })
                .map(|name| vec![format!("repository:{name}:pull,push,delete")])
                .unwrap_or_default();
            head.push_str(&format!(
                "Authorization: Bearer {}\r\n",
                issuer.token(&repo)
            ));
        } else if let Some((user, password)) = &self.auth {
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            head.push_str(&format!("Authorization: Basic {token}\r\n"));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no HTTP header end"))?;
        let head = String::from_utf8_lossy(&response[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other("bad status line"))?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        Ok((status, headers, response[split + 4..].to_vec()))
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex_encode(&Sha256::digest(bytes)))
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An uncompressed tar layer: `(path, mode, content)` files (parents implied; entries
/// for the parent directories are written first).
pub fn tar_layer(files: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for (path, _, _) in files {
        let mut parent = Path::new(path).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(p.to_path_buf());
            parent = p.parent();
        }
    }
    for dir in dirs {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        builder
            .append_data(&mut header, &dir, std::io::empty())
            .expect("tar dir");
    }
    for (path, mode, content) in files {
        let mut header = tar::Header::new_ustar();
        header.set_mode(*mode);
        header.set_size(content.len() as u64);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        builder
            .append_data(&mut header, path, *content)
            .expect("tar file");
    }
    builder.into_inner().expect("tar")
}

/// The applets a busybox image links to `/bin/busybox` ([`busybox_layer`]).
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh",
    "cat",
    "echo",
    "printf",
    "sleep",
    "true",
    "false",
    "env",
    "mkdir",
    "ls",
    "rm",
    "kill",
    "test",
    "head",
    "tail",
    "grep",
    "sed",
    "tr",
    "wc",
    "cp",
    "mv",
    "touch",
    "chmod",
    "id",
    "pwd",
    "dd",
    "od",
    "sha256sum",
    "timeout",
    "seq",
    "yes",
    "tee",
    "stat",
    "find",
    "xargs",
    "sort",
    "uniq",
    "cut",
    "date",
    "uname",
    "hostname",
    "ps",
    "basename",
    "dirname",
    "readlink",
    "realpath",
    "mktemp",
    "nproc",
];

/// A layer of `busybox` (the bytes of a static busybox) at `/bin/busybox`, every one of
/// [`BUSYBOX_APPLETS`] a symbolic link to it in `/bin`, and an empty `/tmp`: a small image
/// whose commands behave like a distribution's.
pub fn busybox_layer(busybox: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut entry =
        |kind: tar::EntryType, path: &str, mode: u32, data: &[u8], link: Option<&str>| {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(kind);
            header.set_mode(mode);
            header.set_size(data.len() as u64);
            header.set_mtime(0);
            header.set_uid(0);
            header.set_gid(0);
            match link {
                Some(target) => builder
                    .append_link(&mut header, path, target)
                    .expect("tar link"),
                None => builder
                    .append_data(&mut header, path, data)
                    .expect("tar entry"),
            }
        };
    entry(tar::EntryType::Directory, "bin/", 0o755, &[], None);
    entry(tar::EntryType::Directory, "tmp/", 0o1777, &[], None);
    entry(tar::EntryType::Regular, "bin/busybox", 0o755, busybox, None);
    for applet in BUSYBOX_APPLETS {
        entry(
            tar::EntryType::Symlink,
            &format!("bin/{applet}"),
            0o777,
            &[],
            Some("busybox"),
        );
    }
    builder.into_inner().expect("tar")
}

/// The files of a layer running host programs: each of `paths` (a program, a data file)
/// and every library `ldd` names for it, at their host paths (symbolic links followed), as
/// `(path without the leading /, bytes)`. For an image with the host's `curl`, say.
pub fn host_files(paths: &[&str]) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<String> = Vec::new();
    for path in paths {
        let ldd = Command::new("ldd").arg(path).output().expect("run ldd");
        all.extend(
            String::from_utf8_lossy(&ldd.stdout)
                .lines()
                .filter_map(|line| {
                    line.split_whitespace()
                        .find(|word| word.starts_with('/'))
                        .map(str::to_owned)
                }),
        );
        all.push((*path).to_owned());
    }
    all.sort();
    all.dedup();
    all.into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
            (p.trim_start_matches('/').to_owned(), bytes)
        })
        .collect()
}
