//! An HTTPS origin for credential egress tests: a test CA and a server certificate for
//! `api.test` (made with `openssl`), and a Python file server run inside the fake internet
//! that answers only requests carrying `Authorization: Bearer <secret>` (else 401) and never
//! echoes a request header back. It serves `hello.txt` and a bare git repository
//! `repo.git` (dumb HTTP protocol) holding `file.txt`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::Internet;

const SERVER: &str = r#"
import http.server, os, ssl, sys
host, port, certs, root, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)
    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer " + secret:
            self.send_response(401)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        self.path = self.path.split("?")[0]
        return super().do_GET()
    def log_message(self, *a):
        pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(os.path.join(certs, "server.pem"), os.path.join(certs, "server.key"))
server = http.server.ThreadingHTTPServer((host, port), Handler)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()
"#;

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run a test tool");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The origin; killed on drop.
pub struct Origin {
    child: Child,
    pub dir: tempfile::TempDir,
}

impl Origin {
    /// The test CA's certificate (PEM).
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ca.pem")).unwrap()
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Starts it at `far:443` of `inet`, demanding `secret`.
    pub fn start(inet: &Internet, secret: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let openssl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(d));
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=omabox test CA"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ]);
        openssl(&ca);
        let mut csr = vec!["req", "-subj", "/CN=api.test"];
        csr.extend(ec);
        csr.extend(["-keyout", "server.key", "-out", "server.csr"]);
        openssl(&csr);
        std::fs::write(d.join("ext"), "subjectAltName=DNS:api.test\n").unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext",
            "-out",
            "server.pem",
        ]);
        let root = d.join("www");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("hello.txt"), "hello from api\n").unwrap();
        make_repo(&root);
        std::fs::write(d.join("server.py"), SERVER).unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &inet.name, "/usr/bin/python3"])
            .arg(d.join("server.py"))
            .args([&inet.far.to_string(), "443"])
            .arg(d)
            .arg(&root)
            .arg(secret)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the origin");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready", "the origin did not start");
        Self { child, dir }
    }
}

/// `root/repo.git`: a bare repository with one commit holding `file.txt`, ready for the
/// dumb HTTP protocol.
fn make_repo(root: &Path) {
    let work = root.join("work");
    let git = |dir: &Path, args: &[&str]| {
        run(Command::new("git")
            .args([
                "-c",
                "user.email=t@omabox.test",
                "-c",
                "user.name=t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(dir))
    };
    git(root, &["init", "-q", "--bare", "repo.git"]);
    git(root, &["init", "-q", "work"]);
    std::fs::write(work.join("file.txt"), "cloned through the relay\n").unwrap();
    git(&work, &["add", "file.txt"]);
    git(&work, &["commit", "-q", "-m", "one"]);
    git(&work, &["push", "-q", "../repo.git", "HEAD:main"]);
    git(&root.join("repo.git"), &["update-server-info"]);
    std::fs::remove_dir_all(&work).unwrap();
}

impl Drop for Origin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
