from __future__ import annotations

import os

from codemill.cpus import cgroup_quota, usable_cpus
from codemill.models.launch import threads_per_rank


def test_cgroup_v2_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path) == 2.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(tmp_path) is None


def test_unreadable_cgroup_means_unknown(tmp_path):
    (tmp_path / "cpu.max").write_text("garbage")
    assert cgroup_quota(tmp_path) is None
    assert cgroup_quota(tmp_path / "absent") is None


def test_usable_cpus_never_exceeds_the_affinity_mask():
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
    assert threads_per_rank(10_000) == 1
