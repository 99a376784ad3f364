#!/usr/bin/env python3
"""Reproduces runsc's crashes without omabox: a python process (three threads sleeping,
the main one reading stdin) is run, checkpointed and restored, N times. On Debian 12's
runsc 0.0~20221219 with the ptrace platform (on a loaded 2-core VM), some restored
processes die at once (the restored socket is reset: SIGSEGV in the first thread per
runsc --debug), and now and then one dies before its checkpoint (it reads EOF on stdin).
With --pipes the process's stdin and stdout are two pipes instead of one socket: on
2026-12-06, sockets failed 4 rounds in 27 and pipes none in 27 (same load), which is why
the backend hands the init pipes.
Usage (root): runsc_restore.py [N] [--pipes]. Prints one line per round and the count
that worked."""
import json, os, select, shutil, socket, subprocess, sys, tempfile

args = [a for a in sys.argv[1:] if a != "--pipes"]
PIPES = "--pipes" in sys.argv[1:]
N = int(args[0]) if args else 6


def start(verb_args, stdin_fd, stdout_fd):
    subprocess.run(runsc + verb_args, stdin=stdin_fd, stdout=stdout_fd, stderr=log, check=True)


class Channel:
    """The host's end of the process's stdio: one socket, or a pipe each way."""

    def __init__(self, verb_args):
        if PIPES:
            in_r, self.w = os.pipe()
            self.r, out_w = os.pipe()
            start(verb_args, in_r, out_w)
            os.close(in_r)
            os.close(out_w)
        else:
            a, b = socket.socketpair()
            start(verb_args, b.fileno(), b.fileno())
            b.close()
            self.sock = a

    def ask(self, line):
        """Sends a line; returns the answer, or None after 10 s or on an error."""
        try:
            if PIPES:
                os.write(self.w, line)
                ready, _, _ = select.select([self.r], [], [], 10)
                return os.read(self.r, 100) if ready else None
            self.sock.settimeout(10)
            self.sock.sendall(line)
            return self.sock.recv(100)
        except OSError:
            return None
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
    first = Channel(["run", "--bundle", bundle, "--detach", cid])
    first.ask(b"before\n")
    image = os.path.join(work, "image")
    shutil.rmtree(image, ignore_errors=True)
    os.makedirs(image)
    if subprocess.run(runsc + ["checkpoint", "--image-path", image, cid], stderr=log).returncode:
        print(i, "the process died before its checkpoint")
        subprocess.run(runsc + ["delete", "--force", cid], stderr=log)
        continue
    subprocess.run(runsc + ["delete", "--force", cid], stderr=log)
    second = Channel(["restore", "--image-path", image, "--bundle", bundle, "--detach", cid])
    ok = second.ask(b"after\n") == b"got after\n"
    worked += ok
    print(i, "restored process answered" if ok else "restored process died")
    subprocess.run(runsc + ["delete", "--force", cid], stderr=log)
print("%d of %d restores worked (logs in %s)" % (worked, N, work))
