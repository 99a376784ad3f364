"""Filesystem snapshots through the official `e2b` Python SDK, unchanged, against `omabox
serve`: `create_snapshot` (unnamed, named, the mode left to the server, a memory snapshot
refused), `list_snapshots` (all, a sandbox's, by name), `Sandbox.create(snapshot_id)` with
the snapshot's files and its own from then on, a snapshot of a sandbox made from one,
`delete_snapshot`, `fork` refused with the way that works, and bad input. Every check
raises on a wrong answer; the last line printed is `OK`. Access tokens seen are written to
$TOKENS_OUT."""

import os

import httpx
from e2b import AuthenticationException, Sandbox, SandboxException

URL = os.environ["E2B_API_URL"]
API = {"X-API-Key": os.environ["E2B_API_KEY"]}
tokens = []


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what, flush=True)


def create(*args, **kwargs):
    sandbox = Sandbox.create(*args, timeout=120, **kwargs)
    tokens.append(sandbox._envd_access_token)
    return sandbox


def ids(paginator):
    found = []
    while paginator.has_next:
        found += [s.snapshot_id for s in paginator.next_items()]
    return found


source = create()
source.files.write("/workspace/a.txt", "from the source")
source.files.write("/home/user/notes.txt", "home")
source.files.write("/workspace/dir/b", "x")
source.files.write("/tmp/t", "t")

unnamed = source.create_snapshot(mode="filesystem")
check(unnamed.snapshot_id.endswith(":default"), f"an unnamed snapshot's id has the tag ({unnamed.snapshot_id})")
check(unnamed.names == [unnamed.snapshot_id], f"its names ({unnamed.names})")
named = source.create_snapshot("my-snap")
check(named.snapshot_id == "my-snap:default", f"a named snapshot's id is its name ({named.snapshot_id})")
check(source.commands.run("echo alive").stdout == "alive\n", "the source runs on after its snapshots")
try:
    source.create_snapshot(mode="full")
    raise AssertionError("a memory snapshot must be refused")
except SandboxException as e:
    check("memory snapshots are not offered" in str(e) and "filesystem" in str(e), f"a memory snapshot is refused: {e}")

check(set(ids(Sandbox.list_snapshots())) == {unnamed.snapshot_id, named.snapshot_id}, "listed")
check(ids(Sandbox.list_snapshots(limit=1))[:2] == [named.snapshot_id, unnamed.snapshot_id], "paged, newest first")
check(set(ids(source.list_snapshots())) == {unnamed.snapshot_id, named.snapshot_id}, "listed by sandbox")
check(ids(Sandbox.list_snapshots(name="my-snap")) == [named.snapshot_id], "listed by name")
check(ids(Sandbox.list_snapshots(sandbox_id="nosuchsandbox0000000")) == [], "no snapshot of another sandbox")

# A snapshot keeps the files as they were, and outlives its sandbox.
source.files.write("/workspace/a.txt", "changed after the snapshot")
source.kill()
child = create(unnamed.snapshot_id)
check(child.files.read("/workspace/a.txt") == "from the source", "a sandbox from a snapshot has its files")
check(child.files.read("/workspace/dir/b") == "x", "… its directories")
check(child.files.read("/home/user/notes.txt") == "home", "… its home")
check(child.files.read("/tmp/t") == "t", "… its /tmp")
check(child.commands.run("whoami").stdout == "user\n", "… and runs commands")
by_name = create("my-snap")
child.files.write("/workspace/a.txt", "the child's own")
check(by_name.files.read("/workspace/a.txt") == "from the source", "each sandbox from a snapshot has its own files")
check(Sandbox.get_info(by_name.sandbox_id).template_id == "my-snap", "its template is the snapshot")

# A snapshot of a sandbox made from a snapshot, then paused and resumed.
grand = child.create_snapshot("grand")
grandchild = create(grand.snapshot_id)
check(grandchild.files.read("/workspace/a.txt") == "the child's own", "a snapshot of a snapshot's sandbox")
grandchild.files.write("/workspace/paused.txt", "p")
check(grandchild.pause() is True, "a sandbox from a snapshot pauses")
check(Sandbox.delete_snapshot(grand.snapshot_id) is True, "a snapshot is deleted")
resumed = Sandbox.connect(grandchild.sandbox_id, timeout=60)
check(resumed.files.read("/workspace/paused.txt") == "p", "and resumes after its snapshot was deleted")
check(Sandbox.delete_snapshot(grand.snapshot_id) is False, "deleting it again answers false (404)")
try:
    create("grand")
    raise AssertionError("a deleted snapshot must not start sandboxes")
except SandboxException as e:
    check("not known" in str(e), f"a deleted snapshot starts nothing: {e}")

# A name taken again replaces its snapshot.
again = by_name.create_snapshot("my-snap")
check(again.snapshot_id == "my-snap:default", "a name taken again")
check(ids(Sandbox.list_snapshots(name="my-snap")) == ["my-snap:default"], "keeps one snapshot")

try:
    child.fork(count=2)
    raise AssertionError("fork must be refused")
except SandboxException as e:
    check("create_snapshot" in str(e), f"fork is refused with the way that works: {e}")

# Bad input.
base = f"{URL}/sandboxes/{child.sandbox_id}/snapshots"
for bad in ["../x", "a/b", "a:v1", "", "x" * 129]:
    answer = httpx.post(base, headers=API, json={"name": bad})
    check(answer.status_code == 400 and "snapshot name" in answer.json()["message"], f"name {bad[:20]!r} refused ({answer.status_code})")
answer = httpx.post(base, headers=API, json={"nmae": "x"})
check(answer.status_code == 400, "an unknown field is refused")
answer = httpx.post(f"{URL}/sandboxes/nosuchsandbox0000000/snapshots", headers=API, json={})
check(answer.status_code == 404, f"a snapshot of no sandbox is 404 ({answer.status_code})")
answer = httpx.get(f"{URL}/snapshots", headers={"X-API-Key": "wrong"})
check(answer.status_code == 401, "a wrong key lists nothing")
answer = httpx.get(f"{URL}/snapshots?limit=0", headers=API)
check(answer.status_code == 400, "limit 0 is refused")
answer = httpx.delete(f"{URL}/templates/nosuch:default", headers=API)
check(answer.status_code == 404, "deleting no snapshot is 404")
try:
    Sandbox.list_snapshots(api_key="wrong").next_items()
    raise AssertionError("a wrong key must raise")
except AuthenticationException:
    check(True, "the SDK with a wrong key is refused")

for sandbox in [child, by_name, resumed]:
    sandbox.kill()
for snapshot in [unnamed, again]:
    check(Sandbox.delete_snapshot(snapshot.snapshot_id) is True, f"{snapshot.snapshot_id} deleted")
check(ids(Sandbox.list_snapshots()) == [], "none left")

with open(os.environ["TOKENS_OUT"], "w") as out:
    out.write("\n".join(tokens) + "\n")
print("OK")
