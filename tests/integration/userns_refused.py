"""Runs a bwrap where the kernel refuses new user namespaces, and prints what it said (JSON on stdout).

A child process enters a user namespace of its own (mapped to the host's uids by this process, which must be
root), sets that namespace's ``user.max_user_namespaces`` to 0, drops to uid 1000 and runs
``bwrap --unshare-all``: the refusal a hardened host gives an unprivileged user, made without touching the
host's sysctls. ``python userns_refused.py /path/to/bwrap``.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

CLONE_NEWUSER = 0x10000000


def main(bwrap: str) -> None:
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER) != 0:
            os._exit(3)
        os.write(ready_w, b"x")
        os.read(go_r, 1)  # the parent has written our uid and gid maps
        os.setgid(0)
        os.setuid(0)
        with open("/proc/sys/user/max_user_namespaces", "w") as fh:
            fh.write("0")
        res = subprocess.run(["setpriv", "--reuid=1000", "--regid=1000", "--keep-groups", bwrap, "--unshare-all",
                              "--ro-bind", "/", "/", "true"], capture_output=True, text=True)
        sysctl = Path("/proc/sys/user/max_user_namespaces").read_text().strip()
        print(json.dumps({"returncode": res.returncode, "stderr": res.stderr,
                          "sysctls": {"user.max_user_namespaces": sysctl}}), flush=True)
        os._exit(0)
    os.read(ready_r, 1)
    for name, text in (("uid_map", "0 0 65536"), ("setgroups", "deny"), ("gid_map", "0 0 65536")):
        with open(f"/proc/{pid}/{name}", "w") as fh:
            fh.write(text)
    os.write(go_w, b"x")
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main(sys.argv[1])
