"""The official `e2b` Python SDK, unchanged, against `omabox serve` (E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY point at it). Every check raises on a wrong answer; the
last line printed is `OK`. Access tokens seen are written to $TOKENS_OUT so the Rust test
can check that serve's log holds none of them."""

import os
import time

import httpx
from e2b import (
    ALL_TRAFFIC,
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
)

URL = os.environ["E2B_API_URL"]
API = {"X-API-Key": os.environ["E2B_API_KEY"]}
tokens = []


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what, flush=True)


def wait_for(predicate, what, seconds=20):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


sbx = Sandbox.create(timeout=120, metadata={"suite": "sdk"}, envs={"GREETING": "hi"})
tokens.append(sbx._envd_access_token)

# Commands: output, exit codes, stderr on failure, cwd and envs.
r = sbx.commands.run("echo $GREETING; echo oops >&2")
check((r.stdout, r.stderr, r.exit_code) == ("hi\n", "oops\n", 0), "run: stdout, stderr, exit 0")
try:
    sbx.commands.run("echo bad >&2; exit 3")
    raise AssertionError("a failing command must raise")
except CommandExitException as e:
    check(e.exit_code == 3 and "bad" in e.stderr, "a failing command raises with its code and stderr")
r = sbx.commands.run("pwd; echo $X", cwd="/tmp", envs={"X": "y"})
check(r.stdout == "/tmp\ny\n", "cwd and envs")
sbx.commands.run("true", envs={"API_SECRET": "never-logged-8c1f"})

# Users: `user` (uid 1000, home /home/user) by default, root when asked.
r = sbx.commands.run("id -un; id -u; echo $HOME; pwd; touch mine && stat -c %U mine")
check(r.stdout == "user\n1000\n/home/user\n/home/user\nuser\n", f"the default user: {r.stdout!r}")
r = sbx.commands.run("id -u; pwd", user="root")
check(r.stdout == "0\n/root\n" or r.stdout == "0\n/\n", f"root when asked: {r.stdout!r}")
try:
    sbx.commands.run("touch /etc/owned")
    raise AssertionError("the default user must not write /etc")
except CommandExitException as e:
    check("denied" in e.stderr.lower() or "read-only" in e.stderr.lower(), "user cannot write /etc")

# Output streams as written: the command waits for a file the test writes only once it
# saw the first line (iterating the handle yields output as it arrives).
h = sbx.commands.run(
    "echo ready; while [ ! -f /tmp/go ]; do sleep 0.02; done; echo done", background=True
)
seen = []
for stdout, _stderr, _pty in h:
    if stdout:
        seen.append(stdout)
        if stdout == "ready\n":
            sbx.files.write("/tmp/go", "")
check("".join(seen) == "ready\ndone\n", "output streams as written, in order")

# stdin.
h = sbx.commands.run("cat", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "typed\n")
sbx.commands.close_stdin(h.pid)
check(h.wait().stdout == "typed\n", "stdin reaches the command and closes")

# Background commands: listed, connected to, killed.
h = sbx.commands.run("sleep 60", background=True)
check(h.pid in [p.pid for p in sbx.commands.list()], "a background command is listed")
check(sbx.commands.kill(h.pid), "kill answers true")
try:
    h.wait()
    raise AssertionError("a killed command must not succeed")
except CommandExitException as e:
    check(e.exit_code == -1, "a killed command ends with -1")
check(not sbx.commands.kill(h.pid), "killing a gone command answers false")
h = sbx.commands.run("while [ ! -f /tmp/go2 ]; do sleep 0.02; done; echo later", background=True)
h.disconnect()
again = sbx.commands.connect(h.pid)
sbx.files.write("/tmp/go2", "")
check(again.wait().stdout == "later\n", "connect reattaches to a running command")

# A command that floods its output: all of it arrives, in order.
r = sbx.commands.run("head -c 20000000 /dev/zero | tr '\\0' a")
check(len(r.stdout) == 20_000_000 and set(r.stdout) == {"a"}, "20 MB of output arrives whole")

# Files: text, binary, listing, metadata.
sbx.files.write("/tmp/dir/a.txt", "content")
check(sbx.files.read("/tmp/dir/a.txt") == "content", "text write then read")
blob = bytes(range(256)) * 4096
sbx.files.write("/tmp/dir/blob", blob)
check(bytes(sbx.files.read("/tmp/dir/blob", format="bytes")) == blob, "binary bytes survive")
names = sorted(e.name for e in sbx.files.list("/tmp/dir"))
check(names == ["a.txt", "blob"], f"list: {names}")
info = sbx.files.get_info("/tmp/dir/blob")
check(info.size == len(blob) and info.type.value == "file", "get_info size and type")
check(sbx.files.exists("/tmp/dir/a.txt") and not sbx.files.exists("/tmp/nope"), "exists")
try:
    sbx.files.read("/tmp/nope")
    raise AssertionError("reading a missing file must raise")
except NotFoundException:
    check(True, "a missing file is NotFound")

# Directories, renames, removals, owners and relative paths (the user's home).
check(sbx.files.make_dir("projects/app"), "make_dir creates (relative: in the home)")
check(not sbx.files.make_dir("/home/user/projects/app"), "make_dir of an existing dir answers false")
sbx.files.write("projects/app/main.py", "print(1)")
info = sbx.files.get_info("/home/user/projects/app/main.py")
check(info.owner == "user" and info.permissions.startswith("-rw"), f"written files belong to the user: {info.owner} {info.permissions}")
moved = sbx.files.rename("projects/app/main.py", "projects/app/run.py")
check(moved.path == "/home/user/projects/app/run.py", f"rename answers the new path: {moved.path}")
sbx.commands.run("ln -s /etc/hostname projects/app/link")
entries = {e.name: e for e in sbx.files.list("projects", depth=2)}
check(set(entries) == {"app", "run.py", "link"}, f"a depth-2 listing: {sorted(entries)}")
check(entries["link"].symlink_target == "/etc/hostname", "a symlink's target is listed")
check(entries["run.py"].modified_time.year >= 2024, "entries carry their modification time")
sbx.files.remove("projects")
check(not sbx.files.exists("projects"), "remove takes a tree")
check(sbx.files.read("/etc/hostname") != "", "removing a tree with a symlink leaves its target")

# Watching a directory (created files, writes, removals; recursive into new directories).
sbx.files.make_dir("watched")
watcher = sbx.files.watch_dir("watched", recursive=True)
sbx.files.write("watched/a.txt", "1")
sbx.commands.run("mkdir -p watched/sub && sleep 0.1 && echo x > watched/sub/b.txt && rm watched/a.txt")
events = []
wait_for(
    lambda: events.extend(watcher.get_new_events())
    or ("sub/b.txt", "create") in [(e.name, e.type.value) for e in events],
    "the watcher's events",
)
seen = {(e.name, e.type.value) for e in events}
check({("a.txt", "create"), ("sub", "create"), ("a.txt", "remove")} <= seen, f"watch events: {sorted(seen)}")
watcher.stop()
try:
    watcher.get_new_events()
    raise AssertionError("a stopped watcher has no events")
except SandboxException:
    check(True, "a stopped watcher is gone")
# Entries in watch events (include_entry): each event carries the path's info, read by
# the sandbox when the event is read (none once the path is gone).
sbx.files.make_dir("entries")
watcher = sbx.files.watch_dir("entries", include_entry=True)
sbx.files.write("entries/f.txt", "12345")
sbx.commands.run("mkdir entries/d && ln -s /etc/hostname entries/l && rm entries/f.txt")
events = []
wait_for(
    lambda: events.extend(watcher.get_new_events())
    or ("f.txt", "remove") in [(e.name, e.type.value) for e in events],
    "the watcher's events with entries",
)
created = {e.name: e.entry for e in events if e.type.value == "create"}
check(set(created) >= {"f.txt", "d", "l"}, f"created: {sorted(created)}")
check(created["d"] is not None and created["d"].type.value == "dir", f"a directory's entry: {created['d']}")
check(created["d"].path == "/home/user/entries/d" and created["d"].owner == "user", f"its path and owner: {created['d']}")
link = created["l"]
check(link is not None and link.symlink_target == "/etc/hostname", f"a symlink's entry, not followed: {link}")
writes = [e.entry for e in events if e.name == "f.txt" and e.type.value == "write" and e.entry is not None]
check(all(w.type.value == "file" and w.size <= 5 for w in writes), f"a written file's entries: {writes}")
removed = [e for e in events if e.type.value == "remove"]
check(all(e.entry is None for e in removed), "a removed path has no entry")
watcher.stop()
try:
    sbx.files.write("/tmp/meta.txt", "x", metadata={"k": "v"})
    raise AssertionError("file metadata must be refused")
except SandboxException as e:
    check("metadata" in str(e).lower(), f"file metadata is refused: {e}")
try:
    sbx.files.watch_dir("/etc/hostname")
    raise AssertionError("watching a file must fail")
except SandboxException as e:
    check("not a directory" in str(e), f"watching a file is refused: {e}")

# A terminal: bash in a pty, typed input, resize.
from e2b import PtySize

terminal = sbx.pty.create(PtySize(rows=24, cols=80))
shown = b""


def read_until(needle):
    global shown
    for _out, _err, pty in terminal:
        if pty:
            shown += pty
            if needle in shown:
                return
    raise AssertionError(f"the terminal ended before showing {needle!r}: {shown[-300:]!r}")


sbx.pty.send_stdin(terminal.pid, b"stty size; echo mark$((40+2))\n")
read_until(b"mark42")
check(b"24 80" in shown, "a terminal has its size")
sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
sbx.pty.send_stdin(terminal.pid, b"stty size; echo again$((1+1))\n")
read_until(b"again2")
check(b"30 100" in shown, "a resized terminal has its new size")
sbx.pty.send_stdin(terminal.pid, b"exit 0\n")
check(terminal.wait().exit_code == 0, "a terminal session ends with its shell")

# An upload larger than the sandbox's disk (its /workspace tmpfs): a clear error.
try:
    sbx.files.write("/workspace/big", b"x" * (48 << 20))
    raise AssertionError("an oversize upload must fail")
except SandboxException as e:
    check("space" in str(e).lower(), f"an oversize upload fails for space: {e}")

# The control plane.
check(sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()], "Sandbox.list")
check(sbx.get_info().metadata == {"suite": "sdk"}, "get_info metadata")
sbx.set_timeout(90)

# Metrics: one sample of the sandbox's own cgroup and /workspace (64 MiB of memory, a
# 32 MiB /workspace), with a busy loop running and 1 MiB written.
sbx.files.write("/workspace/mib", b"m" * (1 << 20))
# The loop says when it runs; on a loaded machine one 100 ms window may still see it get no
# CPU, so a few samples are taken and one must show it.
busy = sbx.commands.run("touch /tmp/busy; while :; do :; done", background=True)
for _ in range(100):
    if sbx.files.exists("/tmp/busy"):
        break
    time.sleep(0.05)
samples = []
while len(samples) < 10 and not (samples and samples[-1] > 0):
    metrics = sbx.get_metrics()
    check(len(metrics) == 1, "get_metrics answers one sample")
    samples.append(metrics[0].cpu_used_pct)
m = metrics[0]
check(m.cpu_count >= 1 and all(0 <= pct <= 100 for pct in samples) and samples[-1] > 0,
      f"cpu: {m.cpu_count} CPUs, {samples}% used")
check(0 < m.mem_used <= m.mem_total == 64 << 20, f"memory: {m.mem_used} of {m.mem_total}")
check(0 <= m.mem_cache <= m.mem_used, f"page cache: {m.mem_cache}")
check(m.disk_total == 32 << 20 and (1 << 20) <= m.disk_used <= m.disk_total, f"disk: {m.disk_used} of {m.disk_total}")
sbx.commands.kill(busy.pid)
answer = httpx.get(f"{URL}/sandboxes/metrics", params={"sandbox_ids": f"{sbx.sandbox_id},nosuchsandbox0000000"}, headers=API)
check(answer.status_code == 200 and list(answer.json()["sandboxes"]) == [sbx.sandbox_id], f"metrics of many: the running ones ({answer.text[:200]})")

# Bad input: unknown sandbox, wrong key, another sandbox's token.
try:
    Sandbox.connect("nosuchsandbox0000000")
    raise AssertionError("connecting to no sandbox must raise")
except (NotFoundException, SandboxException) as e:
    check("not found" in str(e).lower(), "an unknown sandbox is not found")
try:
    Sandbox.create(api_key="wrong-key")
    raise AssertionError("a wrong key must raise")
except AuthenticationException:
    check(True, "a wrong API key is refused")
other = Sandbox.create(timeout=60)
tokens.append(other._envd_access_token)
answer = httpx.post(
    f"{URL}/process.Process/List",
    headers={
        "E2b-Sandbox-Id": other.sandbox_id,
        "X-Access-Token": sbx._envd_access_token,
        "Content-Type": "application/json",
    },
    content=b"{}",
)
check(answer.status_code == 401, f"a sandbox's token does not open another ({answer.status_code})")
check(sbx._envd_access_token not in answer.text, "the refusal does not echo the token")
answer = httpx.post(
    f"{URL}/process.Process/List",
    headers={"E2b-Sandbox-Id": other.sandbox_id, "Content-Type": "application/json"},
    content=b"{}",
)
check(answer.status_code == 401, "no token, no access")
other.kill()

# Network update: the SDK's body is read (a host allow list with a deny-all is what the
# policy enforces), but this serve's sandboxes have no network to change (its
# OMABOX_LINUX_NETWORK is unset: none); an IP address is refused naming allowOut.
try:
    sbx.update_network({"allow_out": ["api.example.com"], "deny_out": [ALL_TRAFFIC]})
    raise AssertionError("a network update of a sandbox without a network must raise")
except SandboxException as e:
    check("no network to change" in str(e), f"a network update without a network: {e}")
try:
    sbx.update_network({"allow_out": ["8.8.8.8"], "deny_out": [ALL_TRAFFIC]})
    raise AssertionError("an IP address in allow_out must raise")
except SandboxException as e:
    check("allowOut" in str(e) and "IP address" in str(e), f"an IP in allow_out: {e}")

# Pause (the filesystem mode: files kept, processes not) and resume by connect, under the
# same id and token.
sbx.files.write("/workspace/kept.txt", "kept in /workspace")
sbx.files.write("/tmp/kept.txt", "kept in /tmp")
sleeper = sbx.commands.run("sleep 600", background=True)
answer = httpx.post(f"{URL}/sandboxes/{sbx.sandbox_id}/pause", headers=API, json={"memory": True})
check(answer.status_code == 400 and "only filesystem pause" in answer.json()["message"], f"a memory pause is refused ({answer.text[:200]})")
check(sbx.pause() is True, "pause")
info = Sandbox.get_info(sbx.sandbox_id)
check(info.state == SandboxState.PAUSED, f"a paused sandbox's state is paused ({info.state})")
paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
check([s.sandbox_id for s in paused] == [sbx.sandbox_id], "listed with state=paused")
running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
check(sbx.sandbox_id not in [s.sandbox_id for s in running], "not listed as running")
check(sbx.pause() is False, "pausing a paused sandbox answers false (409)")
try:
    sbx.commands.run("true")
    raise AssertionError("a paused sandbox must not run commands")
except SandboxException:
    check(True, "a paused sandbox runs nothing")
resumed = Sandbox.connect(sbx.sandbox_id, timeout=60)
check(resumed.sandbox_id == sbx.sandbox_id, "resumed under the same id")
check(resumed._envd_access_token == sbx._envd_access_token, "resumed with the same token")
check(resumed.files.read("/workspace/kept.txt") == "kept in /workspace", "a /workspace file survives pause")
check(resumed.files.read("/tmp/kept.txt") == "kept in /tmp", "a /tmp file survives pause")
check(sleeper.pid not in [p.pid for p in resumed.commands.list()], "processes do not survive pause")
check(resumed.commands.run("echo $GREETING").stdout == "hi\n", "the create's envs are set again")
check(Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING, "running again")
resumed.pause()
resumed.kill()
check(sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()], "a paused sandbox's kill removes it")
try:
    Sandbox.connect(sbx.sandbox_id)
    raise AssertionError("connecting to a killed paused sandbox must raise")
except (NotFoundException, SandboxException):
    check(True, "a killed paused sandbox is gone")

sbx.kill()
try:
    sbx.commands.run("true")
    raise AssertionError("a killed sandbox must not run commands")
except SandboxException:
    check(True, "a killed sandbox answers not running")


# The sandbox's log (GET /v2/sandboxes/{id}/logs), read through the SDK's own API client
# and models: what happened to it, oldest first, outliving it; no environment value.
from e2b.api.client.api.sandboxes import get_v_2_sandboxes_sandbox_id_logs as logs_v2
from e2b.api.client.models import LogsDirection
from e2b.connection_config import ConnectionConfig
from e2b.api.client_sync import get_api_client

api_client = get_api_client(ConnectionConfig())
log = logs_v2.sync(sbx.sandbox_id, client=api_client, limit=10000)
events = [e.fields.additional_properties.get("event") for e in log.logs]
check(events[0] == "created" and events[-1] == "killed", f"the log runs from created to killed: {events}")
check({"process_start", "process_end", "paused", "resumed"} <= set(events), f"the log's events: {sorted(set(events))}")
failed = [e for e in log.logs if e.fields.additional_properties.get("exitCode") == "3"]
check(failed and failed[0].level.value == "warn" and "exited with code 3" in failed[0].message, "a failed command's end is a warning with its code")
started = [e.fields.additional_properties for e in log.logs if e.fields.additional_properties.get("event") == "process_start"]
check(any("exit 3" in f["cmd"] for f in started), "a process start names its command")
check(any(f["envNames"] == "API_SECRET" for f in started), "a process start names its variables")
raw = httpx.get(f"{URL}/v2/sandboxes/{sbx.sandbox_id}/logs", headers=API, params={"limit": 10000}).text
check("never-logged-8c1f" not in raw and sbx._envd_access_token not in raw, "no environment value or token in the log")
newest = logs_v2.sync(sbx.sandbox_id, client=api_client, direction=LogsDirection.BACKWARD, limit=2)
check([e.fields.additional_properties["event"] for e in newest.logs] == ["killed", "paused"], f"backward: newest first ({[e.message for e in newest.logs]})")
answer = httpx.get(f"{URL}/sandboxes/{sbx.sandbox_id}/logs", headers=API, params={"start": 0, "limit": 1})
check(answer.status_code == 200 and len(answer.json()["logs"]) == 1 and "created" in answer.json()["logs"][0]["line"], f"v1 logs: {answer.text[:200]}")

# The async SDK: ordered stdin through the client-streaming StreamInput.
import asyncio

from e2b import AsyncSandbox


async def async_part():
    sandbox = await AsyncSandbox.create(timeout=60)
    tokens.append(sandbox._envd_access_token)
    handle = await sandbox.commands.run("cat", background=True, stdin=True)
    async with sandbox.commands.stream_input(handle.pid) as stdin:
        for part in ["one ", "two ", "three\n"]:
            await stdin.send(part)
    await sandbox.commands.close_stdin(handle.pid)
    result = await handle.wait()
    check(result.stdout == "one two three\n", f"stream_input writes in order: {result.stdout!r}")
    await sandbox.kill()


asyncio.run(async_part())

with open(os.environ["TOKENS_OUT"], "w") as out:
    out.write("\n".join(tokens))
print("OK", flush=True)
# Every check passed. Python's own teardown of the SDK's threads (the sync watch and PTY
# streams, the async part's loop) aborted once under load (SIGABRT after "OK", nothing on
# stderr); nothing of serve is checked by it, so the script ends here.
os._exit(0)
