"""The official `e2b` Python SDK's `Template.build`, unchanged, against `omabox serve`
(E2B_API_URL and E2B_API_KEY point at it; its base is a Debian image): a template from
`base` with a file copied in, a command run and a build-time variable is built (its files
uploaded, its status and log polled), then `Sandbox.create(template=NAME)` starts from it;
a template chained on it adds a step; steps omabox cannot honour are refused naming the
step. Every check raises on a wrong answer; the last line printed is `OK`."""

import os
import tempfile

from e2b import BuildException, Sandbox, SandboxException, Template

ctx = tempfile.mkdtemp()
with open(os.path.join(ctx, "hello.txt"), "w") as f:
    f.write("hello from the context\n")
os.makedirs(os.path.join(ctx, "pkg", "sub"))
with open(os.path.join(ctx, "pkg", "sub", "mod.py"), "w") as f:
    f.write("X = 1\n")


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what, flush=True)


logs = []
template = (
    Template(file_context_path=ctx)
    .from_template("base")
    .set_envs({"BUILD_ONLY": "seen-in-build"})
    .copy("hello.txt", "/opt/app/")
    .copy("pkg", "/opt/app/pkg", mode=0o755)
    .set_workdir("/opt/app")
    .run_cmd("echo built:$BUILD_ONLY > marker && cat hello.txt >> marker && ls pkg/sub >> marker")
)
info = Template.build(template, "omabox-sdk-tpl", on_build_logs=logs.append)
check(info.name == "omabox-sdk-tpl" and info.template_id and info.build_id, f"built: {info}")
check(any("ready" in str(entry.message) for entry in logs), f"the build's log: {[str(e.message) for e in logs]}")

check(Template.exists("omabox-sdk-tpl") and not Template.exists("omabox-sdk-none"), "Template.exists")

sbx = Sandbox.create(template="omabox-sdk-tpl", timeout=60)
r = sbx.commands.run("cat /opt/app/marker; stat -c %a /opt/app/pkg/sub/mod.py; echo env:${BUILD_ONLY:-unset}")
check(
    r.stdout == "built:seen-in-build\nhello from the context\nmod.py\n755\nenv:unset\n",
    f"a sandbox of the template has its files, build-time variables only in the build: {r.stdout!r}",
)
check(sbx.files.read("/opt/app/hello.txt") == "hello from the context\n", "a copied file")
sbx.kill()

# Built again with the same content: the layer is found, not built again; chained.
Template.build(template, "omabox-sdk-tpl")
child = Template().from_template("omabox-sdk-tpl").run_cmd("echo child >> /opt/app/marker")
Template.build(child, "omabox-sdk-child")
sbx = Sandbox.create(template="omabox-sdk-child", timeout=60)
check(sbx.commands.run("tail -n 1 /opt/app/marker").stdout == "child\n", "a template built on a template")
sbx.kill()

# Refusals name the step.
for bad, needle in [
    (Template().from_template("base").run_cmd("id", user="user"), "step 1 (RUN)"),
    (Template().from_template("base").run_cmd("true").set_user("user"), "step 2 (USER)"),
    (Template().from_template("base").set_start_cmd("sleep 1", "true"), "startCmd"),
    (Template().from_template("nosuchtemplate"), "no such template"),
]:
    try:
        Template.build(bad, "omabox-sdk-bad")
        raise AssertionError(f"a build with {needle} must be refused")
    except (BuildException, SandboxException) as e:
        check(needle in str(e), f"refused: {e}")

# A failing step fails the build with its output.
try:
    Template.build(Template().from_template("base").run_cmd("echo broken-step >&2; exit 7"), "omabox-sdk-fails")
    raise AssertionError("a failing step must fail the build")
except BuildException as e:
    check("broken-step" in str(e), f"a failing step: {e}")
try:
    Sandbox.create(template="omabox-sdk-fails")
    raise AssertionError("a template whose build failed must not start")
except SandboxException as e:
    check("no finished build" in str(e), f"a failed template: {e}")

print("OK")
