"""The official `e2b` Python SDK, unchanged, against `omabox serve --backend docker`
(E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point at it; its `base` is a busybox image
of a test registry, which has no `user` account of its own): commands (output, stderr,
exit codes, envs, cwd, background, kill), E2B's user `user` and root, files (text,
binary, list), the control plane (list, info, metrics, timeout), a filesystem pause and
`connect` keeping files, image references as templates and the refusals. Every check
raises on a wrong answer; the last line printed is `OK`. Access tokens seen are written
to $TOKENS_OUT."""

import os

from e2b import CommandExitException, Sandbox, SandboxException, SandboxState
from e2b.sandbox.sandbox_api import SandboxQuery


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what, flush=True)


tokens = []
sbx = Sandbox.create(timeout=120, metadata={"suite": "docker"}, envs={"GREETING": "hi"})
tokens.append(sbx._envd_access_token)

# Commands.
r = sbx.commands.run("echo $GREETING; echo oops >&2")
check((r.stdout, r.stderr, r.exit_code) == ("hi\n", "oops\n", 0), "run: stdout, stderr, exit 0")
try:
    sbx.commands.run("echo bad >&2; exit 3")
    raise AssertionError("a failing command must raise")
except CommandExitException as e:
    check(e.exit_code == 3 and "bad" in e.stderr, "a failing command raises with its code and stderr")
r = sbx.commands.run("pwd; echo $X", cwd="/tmp", envs={"X": "y"})
check(r.stdout == "/tmp\ny\n", f"cwd and envs: {r.stdout!r}")

# E2B's user, added to an image that lacks it; root when asked.
r = sbx.commands.run("id -un; id -u; echo $HOME; touch /home/user/mine && stat -c %U /home/user/mine")
check(r.stdout == "user\n1000\n/home/user\nuser\n", f"the default user: {r.stdout!r}")
r = sbx.commands.run("id -u", user="root")
check(r.stdout == "0\n", f"root when asked: {r.stdout!r}")
try:
    sbx.commands.run("touch /etc/not-yours")
    raise AssertionError("user must not write /etc")
except CommandExitException as e:
    check("denied" in e.stderr.lower(), f"user cannot write /etc: {e.stderr!r}")

# Background commands and kill.
sleeper = sbx.commands.run("sleep 600", background=True)
check(sleeper.pid in [p.pid for p in sbx.commands.list()], "a background command is listed")
check(sbx.commands.kill(sleeper.pid), "kill")

# Files.
sbx.files.write("/home/user/notes.txt", "written by the sdk")
check(sbx.files.read("/home/user/notes.txt") == "written by the sdk", "a text file")
blob = bytes(range(256)) * 64
sbx.files.write("/home/user/blob.bin", blob)
check(sbx.files.read("/home/user/blob.bin", format="bytes") == blob, "a binary file")
names = {e.name for e in sbx.files.list("/home/user")}
check({"notes.txt", "blob.bin", "mine"} <= names, f"list: {names}")

# The control plane.
check(sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()], "Sandbox.list")
check(sbx.get_info().metadata == {"suite": "docker"}, "get_info metadata")
sbx.set_timeout(90)
busy = sbx.commands.run("while :; do :; done", background=True)
m = sbx.get_metrics()[0]
check(m.cpu_count >= 1 and 0 < m.cpu_used_pct <= 100 and 0 < m.mem_used <= m.mem_total == 256 << 20,
      f"metrics from the container's cgroup: {m.cpu_count} CPUs, {m.cpu_used_pct}%, {m.mem_used} of {m.mem_total}")
sbx.commands.kill(busy.pid)

# A filesystem pause keeps files, not processes; connect resumes under the same id and token.
sbx.files.write("/home/user/kept.txt", "kept in /home/user")
sbx.files.write("/tmp/kept.txt", "kept in /tmp")
check(sbx.pause() is True, "pause")
check(Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED, "paused")
paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
check([s.sandbox_id for s in paused] == [sbx.sandbox_id], "listed with state=paused")
try:
    sbx.commands.run("true")
    raise AssertionError("a paused sandbox must not run commands")
except SandboxException:
    check(True, "a paused sandbox runs nothing")
resumed = Sandbox.connect(sbx.sandbox_id, timeout=60)
check(resumed._envd_access_token == sbx._envd_access_token, "resumed with the same token")
check(resumed.files.read("/home/user/kept.txt") == "kept in /home/user", "a /home/user file survives pause")
check(resumed.files.read("/tmp/kept.txt") == "kept in /tmp", "a /tmp file survives pause")
check(resumed.commands.run("echo $GREETING; id -un").stdout == "hi\nuser\n", "envs and user again")
resumed.kill()
check(sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()], "killed")

# An image reference as the template; names that are neither are refused.
other = Sandbox.create(template=os.environ["OTHER_IMAGE"], timeout=30)
tokens.append(other._envd_access_token)
check(other.commands.run("cat /other-image").stdout == "other\n", "a template naming an image")
other.kill()
for bad, needle in [("code-interpreter-v1", "image reference"), (os.environ["MISSING_IMAGE"], "")]:
    try:
        Sandbox.create(template=bad, timeout=30)
        raise AssertionError(f"template {bad} must be refused")
    except SandboxException as e:
        check(needle in str(e), f"refused {bad}: {str(e)[:160]}")

with open(os.environ["TOKENS_OUT"], "w") as out:
    out.write("\n".join(tokens))
print("OK")
