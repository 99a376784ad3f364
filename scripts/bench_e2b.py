"""The official `e2b` Python SDK (pinned 2.63.0) against a fresh `omabox serve`: how long
a user waits and how much host memory an idle sandbox holds. Run through
`scripts/bench-e2b` (which builds omabox and the venv when missing); every figure below is
measured in one run:

1. `Sandbox.create()` then the first `commands.run("echo hi")`: p50/p90 over N sandboxes
   (each killed after), timed in this process with time.perf_counter; the create alone and
   the first run alone too. The first create after serve started (it prepares the
   sandboxes' config and starts the zygote) is shown apart and not in the percentiles.
2. `commands.run("true")` round trip in one sandbox: p50/p99.
3. The whole command as a user times it: a new python process that imports e2b, creates,
   runs `echo hi` and kills (median of 10, wall time around the process).
4. COUNT idle sandboxes under the one serve, created from a thread pool: host memory per
   sandbox (see `memory` below for exactly what is counted), then every sandbox must still
   answer `commands.run("true")`, then all are killed and serve's process tree must be back
   to what it was before they were created.

serve runs as this user (root: sandboxes need it) with a temp data dir, a random operator
key and a cgroup parent of its own (`omabox-bench-e2b-PID`), so the sandboxes' processes
are found exactly, whatever else runs on the machine.
"""

import argparse
import concurrent.futures
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

TARGETS = {"create_run_p50_ms": 25.0, "run_true_p50_ms": 2.0, "idle_mib_per_sandbox": 0.5}
CGROUP_ROOT = "/sys/fs/cgroup"
# The memory a sandbox holds outside its processes' pages, from /proc/meminfo: the kernel's
# (namespaces, mounts, cgroups, sockets, inodes: slab; its tasks' stacks and page tables; the
# cgroups' per-CPU counters) and its tmpfs files (Shmem; an idle sandbox maps none, so they
# are not in any PSS). System-wide, but other work moves these far less than AnonPages or
# the page cache do.
KERNEL_FIELDS = ("Slab", "KernelStack", "PageTables", "Percpu", "Shmem")


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def summary(values_s):
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "min_ms": round(min(ms), 3),
        "max_ms": round(max(ms), 3),
    }


# serve colours its log lines even into a pipe; the table shows them without escapes.
ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def plain(line):
    return ESCAPES.sub("", line.rstrip("\n"))


class Serve:
    """`omabox serve --listen 127.0.0.1:0` with a temp data dir; stderr kept (last lines)."""

    def __init__(self, binary, key, cgroup_parent):
        self.data = tempfile.mkdtemp(prefix="omabox-bench-e2b-")
        env = dict(
            os.environ,
            OMABOX_API_KEY=key,
            OMABOX_LINUX_CGROUP_PARENT=cgroup_parent,
            OMABOX_LOG=os.environ.get("OMABOX_LOG", "warn"),
        )
        self.proc = subprocess.Popen(
            [binary, "--data-dir", self.data, "serve", "--listen", "127.0.0.1:0"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        prefix = "omabox serve: listening on http://"
        for line in self.proc.stderr:
            self.log.append(plain(line))
            if line.startswith(prefix):
                self.url = "http://" + line[len(prefix):].strip()
                break
        else:
            sys.exit("serve exited before listening:\n" + "\n".join(self.log[-20:]))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(plain(line))
            del self.log[:-200]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


# ---- processes and memory -------------------------------------------------------------


def children_map():
    """pid -> list of child pids, from /proc/PID/stat."""
    kids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def serve_tree(serve_pid):
    """serve's pid and every descendant's."""
    kids = children_map()
    tree, todo = [], [serve_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(kids.get(pid, []))
    return tree


def cgroup_pids(parent):
    """Every pid in the cgroups below `parent` in the pids and memory hierarchies."""
    pids = set()
    for hierarchy in ("pids", "memory"):
        top = os.path.join(CGROUP_ROOT, hierarchy, parent)
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(dirpath, "cgroup.procs")) as f:
                        pids.update(int(line) for line in f if line.strip())
                except OSError:
                    pass
    return pids


def cgroup_dirs(parent):
    top = os.path.join(CGROUP_ROOT, "memory", parent)
    if not os.path.isdir(top):
        return 0
    return sum(1 for e in os.scandir(top) if e.is_dir())


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def pss_kib(pid):
    """The process's PSS in KiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def meminfo_kib():
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
    return fields


def used_kib(info):
    return info["MemTotal"] - info["MemAvailable"]


def slab_kib():
    """Bytes held per slab cache (num_slabs × pages per slab), in KiB."""
    page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
    caches = {}
    try:
        with open("/proc/slabinfo") as f:
            for line in f.readlines()[2:]:
                parts = line.split()
                caches[parts[0]] = int(parts[14]) * int(parts[5]) * page_kib
    except (OSError, IndexError, ValueError):
        pass
    return caches


def cgroup_charge(parent):
    """The memory cgroup charge of every sandbox (v1, hierarchical): total and kernel part."""
    top = os.path.join(CGROUP_ROOT, "memory", parent)
    out = {}
    for name in ("memory.usage_in_bytes", "memory.kmem.usage_in_bytes"):
        try:
            with open(os.path.join(top, name)) as f:
                out[name] = int(f.read())
        except OSError:
            out[name] = None
    return out


def snapshot(serve_pid, parent):
    """Processes (serve's tree ∪ the sandboxes' cgroups), their PSS, meminfo, the charge."""
    pids = set(serve_tree(serve_pid)) | cgroup_pids(parent)
    info = meminfo_kib()
    try:
        fds = len(os.listdir(f"/proc/{serve_pid}/fd"))
    except OSError:
        fds = None
    return {
        "processes": len(pids),
        "serve_fds": fds,
        "serve_threads": len(os.listdir(f"/proc/{serve_pid}/task")),
        "pss_kib": sum(pss_kib(pid) for pid in pids),
        "serve_pss_kib": pss_kib(serve_pid),
        "used_kib": used_kib(info),
        "meminfo": info,
        "slab": slab_kib(),
        "cgroup": cgroup_charge(parent),
    }


# ---- the SDK --------------------------------------------------------------------------


def bench_create_run(Sandbox, n):
    t0 = time.perf_counter()
    first = Sandbox.create()
    t1 = time.perf_counter()
    out = first.commands.run("echo hi").stdout
    t2 = time.perf_counter()
    first.kill()
    assert out == "hi\n", out
    creates, runs, wholes = [], [], []
    for _ in range(n):
        a = time.perf_counter()
        sbx = Sandbox.create()
        b = time.perf_counter()
        out = sbx.commands.run("echo hi").stdout
        c = time.perf_counter()
        sbx.kill()
        if out != "hi\n":
            raise AssertionError(f"echo hi answered {out!r}")
        creates.append(b - a)
        runs.append(c - b)
        wholes.append(c - a)
    return {
        "first_after_start_ms": {
            "create": round((t1 - t0) * 1000, 3),
            "run": round((t2 - t1) * 1000, 3),
        },
        "create_then_run": summary(wholes),
        "create": summary(creates),
        "first_run": summary(runs),
    }


def cpu_ticks(pid, children=False):
    """utime+stime (and the reaped children's, with `children`) of a process, in ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    # After the comm: state is fields[0]; utime, stime, cutime, cstime are stat's 14-17.
    ticks = int(fields[11]) + int(fields[12])
    return ticks + (int(fields[13]) + int(fields[14]) if children else 0)


def bench_run_true(Sandbox, runs, serve, parent):
    sbx = Sandbox.create()
    try:
        for _ in range(10):
            sbx.commands.run("true")
        (init,) = cgroup_pids(parent)
        hz = os.sysconf("SC_CLK_TCK")
        serve_cpu, init_cpu = cpu_ticks(serve.proc.pid), cpu_ticks(init, children=True)
        own_cpu = time.process_time()
        times = []
        for _ in range(runs):
            a = time.perf_counter()
            sbx.commands.run("true")
            times.append(time.perf_counter() - a)
        own_cpu = time.process_time() - own_cpu
        serve_cpu = cpu_ticks(serve.proc.pid) - serve_cpu
        init_cpu = cpu_ticks(init, children=True) - init_cpu
    finally:
        sbx.kill()
    result = summary(times)
    result["cpu_ms_per_run"] = {
        "sdk_process": round(own_cpu * 1000 / runs, 3),
        "serve": round(serve_cpu * 1000 / hz / runs, 3),
        "sandbox": round(init_cpu * 1000 / hz / runs, 3),
    }
    return result


WHOLE = """
from e2b import Sandbox
s = Sandbox.create()
assert s.commands.run("echo hi").stdout == "hi\\n"
s.kill()
"""


def bench_whole(times):
    imports = []
    for _ in range(times):
        a = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import e2b"], check=True)
        imports.append(time.perf_counter() - a)
    walls = []
    for _ in range(times):
        a = time.perf_counter()
        subprocess.run([sys.executable, "-c", WHOLE], check=True)
        walls.append(time.perf_counter() - a)
    s = summary(walls)
    return {"n": s["n"], "median_ms": round(statistics.median(w * 1000 for w in walls), 3),
            "min_ms": s["min_ms"], "max_ms": s["max_ms"],
            "import_e2b_alone_median_ms": round(
                statistics.median(w * 1000 for w in imports), 3)}


def bench_idle(Sandbox, serve, parent, count, threads, check_sample):
    before = snapshot(serve.proc.pid, parent)
    before_names = sorted(comm(p) for p in serve_tree(serve.proc.pid))
    made, errors = [], []
    lock = threading.Lock()
    stop = threading.Event()

    def create(_):
        if stop.is_set():
            return
        try:
            sbx = Sandbox.create(timeout=3600, request_timeout=600)
        except Exception as e:  # noqa: BLE001 - reported whole, the run stops creating
            with lock:
                errors.append(f"{type(e).__name__}: {e}")
            stop.set()
            return
        with lock:
            made.append(sbx)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, range(count)))
    create_s = time.perf_counter() - started
    time.sleep(2)  # let the last starts settle (spare forked, pages touched)
    after = snapshot(serve.proc.pid, parent)
    held = len(made)
    result = {
        "asked": count,
        "created": held,
        "threads": threads,
        "create_all_s": round(create_s, 2),
        "first_error": errors[0] if errors else None,
        "errors": len(errors),
        "serve_log_tail": serve.log[-2:] if errors else [],
        "processes_before": before["processes"],
        "processes_with_sandboxes": after["processes"],
        "sandbox_cgroups": cgroup_dirs(parent),
        "serve_fds": [before["serve_fds"], after["serve_fds"]],
        "serve_threads": [before["serve_threads"], after["serve_threads"]],
    }
    if held:
        d_pss = after["pss_kib"] - before["pss_kib"]
        d_used = after["used_kib"] - before["used_kib"]
        charge = after["cgroup"]
        d_kernel = sum(after["meminfo"][k] - before["meminfo"][k] for k in KERNEL_FIELDS)
        result["memory"] = {
            "host_mib_per_sandbox": round((d_pss + d_kernel) / 1024 / held, 3),
            "pss_delta_mib_per_sandbox": round(d_pss / 1024 / held, 3),
            "serve_pss_delta_mib_per_sandbox": round(
                (after["serve_pss_kib"] - before["serve_pss_kib"]) / 1024 / held, 3),
            "kernel_delta_mib_per_sandbox": round(d_kernel / 1024 / held, 3),
            "used_delta_mib_per_sandbox": round(d_used / 1024 / held, 3),
            "cgroup_charge_mib_per_sandbox": round(
                (charge["memory.usage_in_bytes"] or 0) / 2**20 / held, 3),
            "cgroup_kmem_mib_per_sandbox": round(
                (charge["memory.kmem.usage_in_bytes"] or 0) / 2**20 / held, 3),
            "meminfo_delta_mib": {
                k: round((after["meminfo"][k] - before["meminfo"][k]) / 1024, 1)
                for k in KERNEL_FIELDS + ("AnonPages", "Cached")
            },
            "slab_top_kib_per_sandbox": dict(sorted(
                ((name, round((kib - before["slab"].get(name, 0)) / held, 1))
                 for name, kib in after["slab"].items()),
                key=lambda item: -item[1])[:12]),
        }
    # Every sandbox still answers.
    sample = made
    if check_sample:
        sample = made[:: max(1, held // check_sample)][:check_sample]
    bad = []
    a = time.perf_counter()
    for sbx in sample:
        try:
            sbx.commands.run("true", request_timeout=60)
        except Exception as e:  # noqa: BLE001 - counted and the first one shown
            bad.append(f"{sbx.sandbox_id}: {type(e).__name__}: {e}")
    result["answer_checked"] = len(sample)
    result["answer_failed"] = len(bad)
    result["answer_first_failure"] = bad[0] if bad else None
    result["answer_all_s"] = round(time.perf_counter() - a, 2)
    # Kill them all; serve's tree must come back to what it was before.
    held_info = meminfo_kib()
    kill_errors = []

    def kill(sbx):
        try:
            sbx.kill(request_timeout=600)
        except Exception as e:  # noqa: BLE001
            kill_errors.append(f"{type(e).__name__}: {e}")

    a = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(kill, made))
    result["kill_all_s"] = round(time.perf_counter() - a, 2)
    result["kill_errors"] = len(kill_errors)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tree = serve_tree(serve.proc.pid)
        back = len(tree) <= len(before_names)
        if back and not cgroup_pids(parent) and not cgroup_dirs(parent):
            break
        time.sleep(0.2)
    tree = serve_tree(serve.proc.pid)
    result["serve_tree_before"] = before_names
    result["serve_tree_after_kill"] = sorted(comm(p) for p in tree)
    result["sandbox_processes_after_kill"] = len(cgroup_pids(parent))
    result["sandbox_cgroups_after_kill"] = cgroup_dirs(parent)
    time.sleep(2)
    gone = snapshot(serve.proc.pid, parent)
    result["serve_fds"].append(gone["serve_fds"])
    result["serve_threads"].append(gone["serve_threads"])
    result["serve_pss_mib"] = [
        round(x["serve_pss_kib"] / 1024, 1) for x in (before, after, gone)]
    if held:
        now = meminfo_kib()
        freed = used_kib(held_info) - used_kib(now)
        kernel_freed = sum(held_info[k] - now[k] for k in KERNEL_FIELDS)
        result["memory"]["used_freed_by_kill_mib_per_sandbox"] = round(freed / 1024 / held, 3)
        result["memory"]["kernel_freed_by_kill_mib_per_sandbox"] = round(
            kernel_freed / 1024 / held, 3)
    return result


# ---- output ---------------------------------------------------------------------------


def table(r):
    lines = []
    add = lines.append
    m = r["machine"]
    add(f"omabox serve + e2b {r['sdk']} SDK — {r['date']} — binary {r['binary']}")
    add(f"load avg {m['load_before']} → {m['load_after']} on {m['cpus']} CPUs (shared machine:"
        " figures are noisy)")
    if "create_run" in r:
        c = r["create_run"]
        add("")
        add(f"1. Sandbox.create() → first commands.run('echo hi') output, "
            f"{c['create_then_run']['n']} sandboxes (each killed after):")
        add(f"   {'':28} {'p50 ms':>9} {'p90 ms':>9} {'max ms':>9}")
        for key, name in (("create_then_run", "create + first run"),
                          ("create", "create alone"), ("first_run", "first run alone")):
            s = c[key]
            target = ""
            if key == "create_then_run":
                target = f"   target ≤ {TARGETS['create_run_p50_ms']:g} ms p50"
            add(f"   {name:28} {s['p50_ms']:9.2f} {s['p90_ms']:9.2f} {s['max_ms']:9.2f}{target}")
        f = c["first_after_start_ms"]
        add(f"   (the first sandbox after serve started: create {f['create']:.1f} ms, "
            f"run {f['run']:.1f} ms; not counted)")
    if "run_true" in r:
        s = r["run_true"]
        add("")
        add(f"2. commands.run('true') in one sandbox, {s['n']} runs: p50 {s['p50_ms']:.2f} ms, "
            f"p99 {s['p99_ms']:.2f} ms (max {s['max_ms']:.2f})   "
            f"target ≤ {TARGETS['run_true_p50_ms']:g} ms p50")
        cpu = s["cpu_ms_per_run"]
        add(f"   CPU per run: the SDK's process {cpu['sdk_process']:.2f} ms, "
            f"serve {cpu['serve']:.2f} ms, the sandbox (its init and the reaped "
            f"`bash -l -c true`) {cpu['sandbox']:.2f} ms")
    if "whole" in r:
        w = r["whole"]
        add("")
        add(f"3. whole command (python -c: import e2b, create, run echo hi, kill), {w['n']} runs: "
            f"median {w['median_ms']:.0f} ms (min {w['min_ms']:.0f}, max {w['max_ms']:.0f}); "
            f"python -c 'import e2b' alone: median {w['import_e2b_alone_median_ms']:.0f} ms")
    if "idle" in r:
        i = r["idle"]
        add("")
        add(f"4. idle sandboxes: {i['created']} of {i['asked']} created in {i['create_all_s']} s "
            f"({i['threads']} threads)")
        if i["first_error"]:
            add(f"   creation stopped at the first error ({i['errors']} failed): "
                f"{i['first_error']}")
            for line in i["serve_log_tail"]:
                add(f"   serve: {line}")
        mem = i.get("memory")
        if mem:
            add(f"   host memory per sandbox: {mem['host_mib_per_sandbox']:.3f} MiB   "
                f"target ≤ {TARGETS['idle_mib_per_sandbox']:g} MiB")
            add(f"     = PSS delta of serve's tree and every sandbox process "
                f"{mem['pss_delta_mib_per_sandbox']:.3f} MiB (serve itself "
                f"{mem['serve_pss_delta_mib_per_sandbox']:.3f})")
            add(f"     + kernel delta (meminfo {'+'.join(KERNEL_FIELDS)}, system-wide) "
                f"{mem['kernel_delta_mib_per_sandbox']:.3f} MiB")
            add(f"   cross-checks: MemTotal−MemAvailable delta "
                f"{mem['used_delta_mib_per_sandbox']:.3f} MiB (system-wide: other builds' "
                f"memory moves it); freed at kill "
                f"{mem.get('used_freed_by_kill_mib_per_sandbox', 0):.3f} MiB, kernel freed "
                f"{mem.get('kernel_freed_by_kill_mib_per_sandbox', 0):.3f} MiB")
            add(f"   the sandboxes' memory cgroups' charge: "
                f"{mem['cgroup_charge_mib_per_sandbox']:.3f} MiB "
                f"(kernel {mem['cgroup_kmem_mib_per_sandbox']:.3f} MiB)")
            add(f"   meminfo deltas (MiB, all sandboxes): {mem['meminfo_delta_mib']}")
            add(f"   largest slab cache growth (KiB per sandbox): "
                f"{mem['slab_top_kib_per_sandbox']}")
        add(f"   processes: {i['processes_before']} before, "
            f"{i['processes_with_sandboxes']} with them ({i['sandbox_cgroups']} sandbox cgroups)")
        add("   serve before → with them → after the kill: fds {} → {} → {}, "
            "threads {} → {} → {}, PSS {} → {} → {} MiB".format(
                *i["serve_fds"], *i["serve_threads"], *i["serve_pss_mib"]))
        add(f"   answer check: commands.run('true') in {i['answer_checked']} sandboxes, "
            f"{i['answer_failed']} failed ({i['answer_all_s']} s)"
            + (f": {i['answer_first_failure']}" if i["answer_first_failure"] else ""))
        add(f"   kill all: {i['kill_all_s']} s, {i['kill_errors']} errors; serve's tree "
            f"{i['serve_tree_before']} before, {i['serve_tree_after_kill']} after; "
            f"{i['sandbox_processes_after_kill']} sandbox processes and "
            f"{i['sandbox_cgroups_after_kill']} cgroups left")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench-e2b", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object (the table goes to stderr)")
    ap.add_argument("--sandboxes", type=int, default=30, help="create+run samples (30)")
    ap.add_argument("--runs", type=int, default=200, help="run('true') samples (200)")
    ap.add_argument("--whole", type=int, default=10, help="whole-command samples (10)")
    ap.add_argument("--count", type=int, default=1000, help="idle sandboxes (1000; 0 skips)")
    ap.add_argument("--threads", type=int, default=8, help="threads creating them (8)")
    ap.add_argument("--check-sample", type=int, default=0,
                    help="check only this many idle sandboxes answer (0: all)")
    args = ap.parse_args()

    binary = os.environ["OMABOX_BIN"]
    key = "omk_bench-" + secrets.token_hex(16)
    parent = f"omabox-bench-e2b-{os.getpid()}"
    serve = Serve(binary, key, parent)
    os.environ.update(E2B_API_URL=serve.url, E2B_SANDBOX_URL=serve.url, E2B_API_KEY=key)
    for name in ("E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        os.environ.pop(name, None)
    from importlib.metadata import version

    from e2b import Sandbox

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "binary": binary,
        "sdk": version("e2b"),
        "machine": {"cpus": os.cpu_count(), "load_before": round(os.getloadavg()[0], 2)},
        "targets": TARGETS,
    }
    try:
        if args.sandboxes:
            result["create_run"] = bench_create_run(Sandbox, args.sandboxes)
        if args.runs:
            result["run_true"] = bench_run_true(Sandbox, args.runs, serve, parent)
        if args.whole:
            result["whole"] = bench_whole(args.whole)
        if args.count:
            result["idle"] = bench_idle(Sandbox, serve, parent, args.count, args.threads,
                                        args.check_sample)
    finally:
        serve.stop()
        for hierarchy in os.listdir(CGROUP_ROOT):
            try:
                os.rmdir(os.path.join(CGROUP_ROOT, hierarchy, parent))
            except OSError:
                pass
    result["machine"]["load_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(table(result), file=sys.stderr)
        print(json.dumps(result, indent=2))
    else:
        print(table(result))


if __name__ == "__main__":
    main()
