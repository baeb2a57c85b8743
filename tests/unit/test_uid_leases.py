"""Sandbox uids: one holder at a time across processes, released on close or death."""

from __future__ import annotations

import subprocess
import sys

import pytest

from codemill.sandbox.uids import NoFreeUid, UidLeases


def test_a_uid_is_held_by_one_lease_at_a_time_and_comes_back(tmp_path):
    a, b = UidLeases(100, 3, str(tmp_path)), UidLeases(100, 3, str(tmp_path))
    first = [a.take(), a.take()]
    assert first == [100, 101]
    assert b.take() == 102  # a second holder (as another process would) skips what the first holds
    with pytest.raises(NoFreeUid, match="all 3 sandbox uids"):
        b.take()
    a.give_back(100)
    assert b.take() == 100


def test_a_dead_process_never_strands_its_uid(tmp_path):
    code = ("import sys, time\nfrom codemill.sandbox.uids import UidLeases\n"
            f"u = UidLeases(200, 2, {str(tmp_path)!r}).take()\nprint(u, flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "200"
        assert UidLeases(200, 2, str(tmp_path)).take() == 201  # held by the live process
    finally:
        proc.kill()
        proc.wait()
    assert UidLeases(200, 2, str(tmp_path)).take() == 200
