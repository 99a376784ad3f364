"""The official `e2b` Python SDK's `Template.build`, unchanged, against `omabox serve`
(E2B_API_URL and E2B_API_KEY point at it; its base is a Debian image): a template from
`base` with a file copied in, a command run and a build-time variable is built (its files
uploaded, its status and log polled), then `Sandbox.create(template=NAME)` starts from it;
a template chained on it adds a step; a build tagged `v2` and the tags given and taken
each start their build; the API client lists templates with their builds (v1 and v2),
reads a build's log newest first, updates one (public is refused) and deletes one (its
running sandbox runs on); steps omabox cannot honour are refused naming the step. Every check raises on a wrong answer; the last line printed is `OK`."""

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

# Tags: a build named NAME:TAG (plus `tags`) gets its tags; NAME stays on `default`.
v2 = Template().from_template("omabox-sdk-tpl").run_cmd("echo v2 >> /opt/app/marker")
built = Template.build(v2, "omabox-sdk-tpl:v2", tags=["stable"])
tags = {t.tag: t.build_id for t in Template.get_tags("omabox-sdk-tpl")}
check(set(tags) == {"default", "v2", "stable"} and tags["v2"] == built.build_id == tags["stable"]
      and tags["default"] != built.build_id, f"Template.get_tags: {tags}")
last = lambda name: Sandbox.create(template=name, timeout=30)  # noqa: E731
for name, want in [("omabox-sdk-tpl:v2", "v2\n"), ("omabox-sdk-tpl:stable", "v2\n"),
                   ("omabox-sdk-tpl", "mod.py\n"), ("omabox-sdk-tpl:default", "mod.py\n")]:
    s = last(name)
    got = s.commands.run("tail -n 1 /opt/app/marker").stdout
    s.kill()
    check(got == want, f"{name} starts its tagged build ({got!r})")
info = Template.assign_tags("omabox-sdk-tpl:v2", ["prod"])
check(str(info.build_id) == built.build_id and info.tags == ["prod"], f"Template.assign_tags: {info}")
Template.remove_tags("omabox-sdk-tpl", ["prod", "stable"])
check({t.tag for t in Template.get_tags("omabox-sdk-tpl")} == {"default", "v2"}, "Template.remove_tags")
for bad, needle in [
    (lambda: Template.remove_tags("omabox-sdk-tpl", "nosuchtag"), "no tag"),
    (lambda: Template.assign_tags("omabox-sdk-tpl:nosuchtag", "x"), "no build tagged"),
    (lambda: Template.get_tags("omabox-sdk-none"), "not found"),
    (lambda: last("omabox-sdk-tpl:nosuchtag"), "no build tagged"),
]:
    try:
        bad()
        raise AssertionError(f"must be refused: {needle}")
    except Exception as e:  # the SDK raises its own classes per call
        check(needle in str(e), f"refused: {e}")

# The API lists templates with their builds and deletes one; its sandboxes run on.
from e2b.api.client.api.templates import (  # noqa: E402
    delete_templates_template_id, get_templates, get_templates_template_id,
    get_templates_template_id_builds_build_id_logs, get_v2_templates,
    patch_templates_template_id, patch_v_2_templates_template_id)
from e2b.api.client.models import LogsDirection, TemplateUpdateRequest  # noqa: E402
from e2b.api.client_sync import get_api_client  # noqa: E402
from e2b.connection_config import ConnectionConfig  # noqa: E402

api = get_api_client(ConnectionConfig())
listed = get_templates.sync_detailed(client=api).parsed
by_name = {t.names[0]: t for t in listed}
check({"omabox-sdk-tpl", "omabox-sdk-child"} <= set(by_name), f"GET /templates: {sorted(by_name)}")
tpl = by_name["omabox-sdk-tpl"]
check(tpl.build_count == 3 and tpl.spawn_count >= 3 and str(tpl.build_status) == "ready",
      f"a listed template: {tpl}")
detail = get_templates_template_id.sync_detailed("omabox-sdk-tpl", client=api).parsed
check(detail.template_id == tpl.template_id and str(detail.builds[0].build_id) == built.build_id
      and all(str(b.status) == "ready" for b in detail.builds), f"GET /templates/id: {detail.builds}")
v2_listed = get_v2_templates.sync_detailed(client=api).parsed
check({t.template_id for t in v2_listed} == {t.template_id for t in listed}, "GET /v2/templates")
build_log = get_templates_template_id_builds_build_id_logs.sync_detailed(
    tpl.template_id, built.build_id, client=api, direction=LogsDirection.BACKWARD, limit=1).parsed
check(len(build_log.logs) == 1 and "ready" in build_log.logs[0].message,
      f"GET .../builds/id/logs, newest first: {build_log}")
private = TemplateUpdateRequest(public=False)
updated = patch_v_2_templates_template_id.sync_detailed("omabox-sdk-tpl", client=api, body=private)
check(updated.status_code == 200 and updated.parsed.names == ["omabox-sdk-tpl"],
      f"PATCH /v2/templates/id: {updated.status_code} {updated.parsed}")
public = patch_templates_template_id.sync_detailed(
    "omabox-sdk-tpl", client=api, body=TemplateUpdateRequest(public=True))
check(public.status_code == 400 and "public templates" in public.parsed.message,
      f"PATCH public: {public.status_code} {public.parsed}")
gone = delete_templates_template_id.sync_detailed("omabox-sdk-child", client=api)
check(gone.status_code == 204, f"DELETE /templates/id: {gone.status_code}")
check(not Template.exists("omabox-sdk-child"), "a deleted template is gone")
again = delete_templates_template_id.sync_detailed("omabox-sdk-child", client=api)
check(again.status_code == 404, f"deleted twice: {again.status_code}")
try:
    Sandbox.create(template="omabox-sdk-child")
    raise AssertionError("a deleted template must not start")
except SandboxException as e:
    check("not known" in str(e), f"a deleted template: {e}")
check(sbx.commands.run("tail -n 1 /opt/app/marker").stdout == "child\n",
      "a sandbox of a deleted template runs on")
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
