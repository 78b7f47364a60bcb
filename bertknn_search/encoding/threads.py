"""CPU threads: size torch's intra-op pool to the cores this process may really use."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def available_cores(cgroup: Path = CGROUP) -> int:
    """CPUs this process may run on: its affinity mask, capped by a container's CPU quota.

    Args:
        cgroup: the cgroup file system root (v2 ``cpu.max``, or v1 ``cpu/cpu.cfs_*``).

    Returns:
        At least 1.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = _quota(cgroup)
    return max(1, min(cores, quota) if quota else cores)


def _quota(cgroup: Path) -> int | None:
    """The CPU quota in whole cores (rounded up), None without one."""
    try:
        limit, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if limit == "max" else math.ceil(int(limit) / int(period))
    except (OSError, ValueError):
        pass
    try:
        limit = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        return None if limit <= 0 else math.ceil(limit / period)
    except (OSError, ValueError):
        return None


def size_torch_threads() -> int:
    """Use no more intra-op threads than ``available_cores``, unless OMP_NUM_THREADS chose a number.

    torch counts the machine's cores, not a container's quota; threads beyond the cores a process
    gets only wait on each other.

    Returns:
        The number of intra-op threads torch now uses.
    """
    import torch

    if not os.environ.get("OMP_NUM_THREADS"):
        cores = available_cores()
        if cores < torch.get_num_threads():
            torch.set_num_threads(cores)
    return torch.get_num_threads()


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as Linux names them (``avx2``, ``avx512_bf16``, ``amx_bf16`` ...).

    Empty where ``cpuinfo`` cannot be read (not Linux): callers then assume none, which only costs speed.
    """
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()
