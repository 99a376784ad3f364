#!/usr/bin/env python3
"""Reproduces runsc's crashes without omabox: a python process (three threads sleeping,
the main one reading stdin) is run, checkpointed and restored, N times. On Debian 12's
runsc 0.0~20221219 with the ptrace platform (on a loaded 2-core VM), some restored
processes die at once (the restored socket is reset: SIGSEGV in the first thread per
runsc --debug), and now and then one dies before its checkpoint.
Usage (root): runsc_restore.py [N]. Prints one line per round and the count that worked."""
import json, os, shutil, socket, subprocess, sys, tempfile

N = int(sys.argv[1]) if len(sys.argv) > 1 else 6
work = tempfile.mkdtemp(prefix="runsc-repro-")
prog = os.path.join(work, "prog.py")
with open(prog, "w") as f:
    f.write(
        "import sys, threading, time\n"
        "for _ in range(3):\n"
        "    threading.Thread(target=lambda: time.sleep(1000), daemon=True).start()\n"
        "for line in sys.stdin:\n"
        "    sys.stdout.write('got ' + line); sys.stdout.flush()\n"
    )
bundle = os.path.join(work, "bundle")
os.makedirs(bundle)
subprocess.run(["runsc", "spec", "--", "/usr/bin/python3", prog], cwd=bundle, check=True)
with open(os.path.join(bundle, "config.json")) as f:
    config = json.load(f)
config["root"] = {"path": "/", "readonly": True}
config["process"]["terminal"] = False
with open(os.path.join(bundle, "config.json"), "w") as f:
    json.dump(config, f)
runsc = ["runsc", "--root", os.path.join(work, "state"), "--platform", "ptrace",
         "--network", "none", "--ignore-cgroups"]
log = open(os.path.join(work, "runsc.log"), "ab")
worked = 0
for i in range(N):
    cid = "repro%d" % i
    a, b = socket.socketpair()
    subprocess.run(runsc + ["run", "--bundle", bundle, "--detach", cid],
                   stdin=b.fileno(), stdout=b.fileno(), stderr=log, check=True)
    b.close()
    a.settimeout(10)
    a.sendall(b"before\n")
    a.recv(100)
    image = os.path.join(work, "image")
    shutil.rmtree(image, ignore_errors=True)
    os.makedirs(image)
    if subprocess.run(runsc + ["checkpoint", "--image-path", image, cid], stderr=log).returncode:
        print(i, "the process died before its checkpoint")
        subprocess.run(runsc + ["delete", "--force", cid], stderr=log)
        continue
    subprocess.run(runsc + ["delete", "--force", cid], stderr=log)
    a2, b2 = socket.socketpair()
    subprocess.run(runsc + ["restore", "--image-path", image, "--bundle", bundle, "--detach", cid],
                   stdin=b2.fileno(), stdout=b2.fileno(), stderr=log, check=True)
    b2.close()
    a2.settimeout(10)
    try:
        a2.sendall(b"after\n")
        ok = a2.recv(100) == b"got after\n"
    except OSError as e:
        ok = False
    worked += ok
    print(i, "restored process answered" if ok else "restored process died")
    subprocess.run(runsc + ["delete", "--force", cid], stderr=log)
print("%d of %d restores worked (logs in %s)" % (worked, N, work))
