"""E2B's full pause through the official `e2b` Python SDK, unchanged, against
`omabox serve --backend gvisor`: a sandbox (E2B's user in its home, envs, files), a process
holding state only in its memory and a background command, `pause(mode="full")`, nothing
running while paused, `Sandbox.connect` restoring it (same id and token, the counter and the
background command going on (its output stream ends with the pause), files kept), the default `pause()` (the SDK leaves the mode to
the server: full here), `fork(count=2)` (each copy going on from the same memory with its
own id, token and files; the source running on), a memory snapshot and a sandbox created
from it (going on from its memory), a filesystem-only pause (processes end),
and a paused sandbox's kill. Every check raises on a wrong answer; the last line printed is `OK`. Access tokens
seen are written to $TOKENS_OUT."""

import os

import httpx
from e2b import NotFoundException, Sandbox, SandboxException, SandboxState

URL = os.environ["E2B_API_URL"]
API = {"X-API-Key": os.environ["E2B_API_KEY"]}
tokens = []


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what, flush=True)


sbx = Sandbox.create(timeout=120, envs={"GREETING": "hi"})
tokens.append(sbx._envd_access_token)
check(sbx.commands.run("echo hello").stdout == "hello\n", "a command runs")
check(sbx.commands.run("whoami").stdout == "user\n", "as E2B's user")
check(sbx.commands.run("pwd").stdout == "/home/user\n", "in its home")
check(sbx.commands.run("echo $GREETING").stdout == "hi\n", "with the create's envs")
check(sbx.commands.run("whoami", user="root").stdout == "root\n", "root when asked")
metrics = sbx.get_metrics()
check(len(metrics) == 1 and metrics[0].mem_used > 0 and metrics[0].cpu_count >= 1,
      f"metrics from the sandbox's cgroup ({metrics})")
sbx.files.write("/home/user/note.txt", "in the home")
sbx.files.write("/workspace/kept.txt", "in the workspace")

# A counter held only in a shell's memory, answering over fifos in /tmp (gVisor's memory).
sbx.commands.run(
    "mkfifo /tmp/ask /tmp/answer && "
    "(i=0; while :; do read l < /tmp/ask; i=$((i+1)); echo $i > /tmp/answer; done) "
    ">/dev/null 2>&1 </dev/null &"
)


def ask(sandbox):
    return sandbox.commands.run("echo x > /tmp/ask; cat /tmp/answer", timeout=30).stdout.strip()


check(ask(sbx) == "1", "the counter answers")
check(ask(sbx) == "2", "and counts")
sleeper = sbx.commands.run("sleep 600", background=True)

check(sbx.pause(mode="full") is True, "a full pause")
check(Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED, "paused")
try:
    sbx.commands.run("true")
    raise AssertionError("a paused sandbox must not run commands")
except SandboxException:
    check(True, "a paused sandbox runs nothing")

resumed = Sandbox.connect(sbx.sandbox_id, timeout=60)
check(resumed.sandbox_id == sbx.sandbox_id, "resumed under the same id")
check(resumed._envd_access_token == sbx._envd_access_token, "with the same token")
check(ask(resumed) == "3", "the counter went on from its memory")
# The background command runs on; its output stream ended with the pause (the connection it
# was served on), so the SDK's process list does not show it again.
alive = resumed.commands.run(f"kill -0 {sleeper.pid} && echo alive", user="root").stdout
check(alive == "alive\n", "the background command runs on")
check(resumed.files.read("/home/user/note.txt") == "in the home", "the home's file kept")
check(resumed.files.read("/workspace/kept.txt") == "in the workspace", "the workspace's file kept")
check(Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING, "running again")

# The SDK's default pause leaves the mode to the server: full here.
check(resumed.pause() is True, "the default pause")
again = Sandbox.connect(sbx.sandbox_id, timeout=60)
check(ask(again) == "4", "the default pause kept the memory too")

# Fork: checkpointed in place, restored twice; every copy's counter goes on from the same
# point, separately, and each has its own id, token and files.
forks = again.fork(count=2, timeout=60)
check(len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), f"two forks ({forks})")
tokens.extend(f._envd_access_token for f in forks)
check(len({f.sandbox_id for f in forks} | {again.sandbox_id}) == 3, "each fork has its own id")
check(all(f._envd_access_token != again._envd_access_token for f in forks), "and its own token")
check([ask(f) for f in forks] == ["5", "5"], "each fork's counter goes on from the checkpoint")
check(ask(again) == "5", "the source runs on from the same point")
check(ask(forks[0]) == "6" and ask(forks[1]) == "6", "each fork counts on its own")
forks[0].files.write("/home/user/mine.txt", "fork 0")
check(not forks[1].files.exists("/home/user/mine.txt"), "forks' files are their own")
check(not again.files.exists("/home/user/mine.txt"), "and not the source's")
check(forks[1].files.read("/home/user/note.txt") == "in the home", "a fork has the source's files")
check(forks[1].commands.run("whoami").stdout == "user\n", "a fork runs as E2B's user")
answer = httpx.post(f"{URL}/sandboxes/{again.sandbox_id}/fork", headers=API, json={"count": 21})
check(answer.status_code == 400 and "count must be 1 to 20" in answer.text, f"21 forks refused ({answer.text[:200]})")
for f in forks:
    f.kill()

# A memory snapshot (the SDK's default mode, full here): the source runs on, and a sandbox
# created from the snapshot goes on from the snapshot's memory, with its files.
snap = again.create_snapshot()
check(ask(again) == "6", "the source runs on after its memory snapshot")
child = Sandbox.create(snap.snapshot_id, timeout=60)
tokens.append(child._envd_access_token)
check(child.sandbox_id != again.sandbox_id, "a sandbox from the snapshot has its own id")
check(ask(child) == "6", "it goes on from the snapshot's memory")
check(ask(child) == "7" and ask(again) == "7", "and counts on its own")
check(child.files.read("/home/user/note.txt") == "in the home", "with the snapshot's files")
check(child.commands.run("echo $GREETING").stdout == "hi\n", "and its environment")
child.kill()
check(Sandbox.delete_snapshot(snap.snapshot_id) is True, "the memory snapshot is deleted")

# A filesystem pause keeps the files and ends the processes.
check(again.pause(mode="filesystem") is True, "a filesystem pause")
cold = Sandbox.connect(sbx.sandbox_id, timeout=60)
check(cold.files.read("/workspace/kept.txt") == "in the workspace", "files kept by a filesystem pause")
gone = cold.commands.run(f"kill -0 {sleeper.pid} 2>/dev/null || echo gone", user="root").stdout
check(gone == "gone\n", "its processes ended")

# A paused sandbox's kill removes it, checkpoint and all.
check(cold.pause() is True, "paused again")
cold.kill()
try:
    Sandbox.connect(sbx.sandbox_id)
    raise AssertionError("connecting to a killed paused sandbox must raise")
except (NotFoundException, SandboxException):
    check(True, "a killed paused sandbox is gone")

with open(os.environ["TOKENS_OUT"], "w") as out:
    out.write("\n".join(tokens) + "\n")
print("OK", flush=True)
os._exit(0)
