"""Threads: torch's pool sized to the cores a process gets; OpenMP waits sleep instead of spinning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertknn_search.encoding import threads

pytestmark = pytest.mark.reliability  # two processes on the same cores must not stall each other


def cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "cores"),
    [
        ({}, 8),  # no cgroup files: the affinity mask decides
        ({"cpu.max": "max 100000\n"}, 8),
        ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs of quota: two threads, not eight
        ({"cpu.max": "50000 100000\n"}, 1),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8),
        ({"cpu.max": "garbage"}, 8),
    ],
)
def test_available_cores_is_the_affinity_capped_by_the_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], cores: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert threads.available_cores(cgroup(tmp_path, files)) == cores


def test_torch_uses_no_more_threads_than_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 1)
    try:
        assert threads.size_torch_threads() == 1
        assert torch.get_num_threads() == 1
        torch.set_num_threads(before)
        monkeypatch.setenv("OMP_NUM_THREADS", str(before))  # the user's choice is kept
        assert threads.size_torch_threads() == before
    finally:
        torch.set_num_threads(before)


def test_placing_the_encoder_sizes_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from bertknn_search.encoding.placement import place

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 1)
    try:
        assert place("cpu").device.type == "cpu"
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_waits_sleep_unless_the_user_says_otherwise(given: str | None, seen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    code = "import os, bertknn_search; print(os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == seen, out.stderr
