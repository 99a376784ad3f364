"""The official `e2b` Python SDK against `omabox serve --backend gvisor` with a template
that names an image (a busybox image of a test registry, which has no `user` account):
the sandbox's root is the image (its file there, writable in the sandbox's memory only),
E2B's user is added to it, a full pause and `connect` go on from the same memory (a counter held in
a shell's memory counts on) over the same root, a fork and a sandbox from a memory snapshot do too, and templates that are not images are refused. Every check
raises on a wrong answer; the last line printed is `OK`. Access tokens seen are written to
$TOKENS_OUT."""

import os

from e2b import Sandbox, SandboxException

IMAGE = os.environ["IMAGE_TEMPLATE"]


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what, flush=True)


tokens = []
sbx = Sandbox.create(template=IMAGE, timeout=120)
tokens.append(sbx._envd_access_token)
check(sbx.commands.run("cat /image-marker").stdout == "from the image\n", "the image is the root")
check(sbx.commands.run("id -un; id -u").stdout == "user\n1000\n", "as E2B's user, added to the image")
check(sbx.commands.run("id -u", user="root").stdout == "0\n", "root when asked")
sbx.commands.run("echo changed > /image-marker", user="root")
check(sbx.commands.run("cat /image-marker").stdout == "changed\n", "the root is writable in the sandbox")
other = Sandbox.create(template=IMAGE, timeout=60)
tokens.append(other._envd_access_token)
check(other.commands.run("cat /image-marker").stdout == "from the image\n",
      "another sandbox of the image sees the image, not the first one's change")
other.kill()

# A counter held only in a shell's memory, writing its value to /tmp every 0.1 s.
sbx.commands.run(
    "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; "
    "sleep 0.1; done) >/dev/null 2>&1 </dev/null &"
)


def count(sandbox):
    """The counter's last value; 0 before its first write (the loop may not have run yet)."""
    out = sandbox.commands.run("cat /tmp/count 2>/dev/null || echo 0", timeout=30).stdout
    return int(out.strip() or "0")


def counting(sandbox, above):
    """The counter's value once it passed `above` (it runs on), within ~5 s."""
    for _ in range(50):
        value = count(sandbox)
        if value > above:
            return value
        sandbox.commands.run("sleep 0.1")
    raise AssertionError(f"the counter stays at {count(sandbox)}, not above {above}")


before = counting(sbx, 3)
check(sbx.pause(mode="full") is True, "a full pause")
again = Sandbox.connect(sbx.sandbox_id, timeout=60)
resumed = count(again)
check(resumed >= before, f"the counter's value survives the pause ({before} then {resumed})")
check(counting(again, resumed) > resumed, "and it goes on counting from there after connect")
check(again.commands.run("cat /image-marker").stdout == "changed\n", "over the same root, changes kept")
forks = again.fork(count=1, timeout=60)
tokens.extend(f._envd_access_token for f in forks)
forked = count(forks[0])
check(forked >= resumed and counting(forks[0], forked) > forked,
      f"a fork goes on counting from the same memory ({forked})")
check(forks[0].commands.run("cat /image-marker").stdout == "changed\n", "over the same root")
forks[0].kill()

# A memory snapshot keeps the root too: a sandbox made from it goes on over the same one.
snap = again.create_snapshot()
from_snap = Sandbox.create(template=snap.snapshot_id, timeout=60)
tokens.append(from_snap._envd_access_token)
check(from_snap.commands.run("cat /image-marker").stdout == "changed\n",
      "a sandbox from a memory snapshot has the snapshot's root")
snapped = count(from_snap)
check(counting(from_snap, snapped) > snapped, "and its counter goes on")
from_snap.kill()
check(Sandbox.delete_snapshot(snap.snapshot_id) is True, "the snapshot is deleted")
again.kill()

for bad, needle in [("code-interpreter-v1", "not known"), (os.environ["MISSING_IMAGE"], "")]:
    try:
        Sandbox.create(template=bad, timeout=30)
        raise AssertionError(f"template {bad} must be refused")
    except SandboxException as e:
        check(needle in str(e), f"refused {bad}: {str(e)[:160]}")

with open(os.environ["TOKENS_OUT"], "w") as out:
    out.write("\n".join(tokens))
print("OK")
