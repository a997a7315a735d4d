"""The one way the benchmarks measure a command: run it in its own process, then read its wall
time, CPU time, peak RSS and (for ``--json`` commands) its JSON output.

Units are in the names. Peak memory is the peak RSS of the process, as ``/usr/bin/time -f %M``
reports it: the kernel's ``ru_maxrss`` of the waited-for child (``os.wait4``; on Linux in KiB),
which covers the child's own children that it waited for (torchrun's workers, for one).
``peak_rss_mib`` is that figure / 1024; nothing here reports "MB" or "GB".

The benchmarks import this as a sibling module (``from measure import run_measured``): Python puts
a script's own folder first on ``sys.path``, so ``python benchmarks/bench_x.py`` finds it.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsetool.util.machine import cpu_name

__all__ = ["Measured", "run_measured", "self_peak_rss_mib", "machine", "ram_gib"]

KIB_PER_MIB = 1024


@dataclass(frozen=True)
class Measured:
    """One command's run: exit code, times in seconds, peak RSS in KiB, and its output."""

    cmd: tuple[str, ...]
    returncode: int
    wall_s: float  # from start to exit
    cpu_s: float  # user + system, all threads and waited-for children
    peak_rss_kib: int
    stdout: str
    stderr: str
    started: float  # time.perf_counter() at the start, for a caller's own later mark

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_kib / KIB_PER_MIB

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def json(self) -> Any | None:
        """The command's stdout as JSON, or None when it failed or printed something else."""
        if not self.ok:
            return None
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError:
            return None

    def error_line(self) -> str:
        """The ``error:`` line of a failed command's stderr, else its last line ("" if it ran)."""
        if self.ok:
            return ""
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        return next((x for x in lines if x.startswith("error:")), lines[-1] if lines else "")

    def seconds_since_start(self) -> float:
        """Wall seconds from this run's start to now (e.g. after a ``sync`` that followed it)."""
        return time.perf_counter() - self.started


def run_measured(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    keep_output: bool = True,
) -> Measured:
    """Run ``cmd`` (``env``: its whole environment, None = this one's) and measure it.

    stdout and stderr go to temporary files (a pipe could fill and stall the child), read back
    after exit unless ``keep_output`` is False. Nothing raises on a failed command: look at
    ``returncode``/``ok``.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", errors="replace") if keep_output else "")
    return Measured(
        cmd=tuple(str(c) for c in cmd),
        returncode=proc.returncode,
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_kib=int(usage.ru_maxrss),
        stdout=texts[0],
        stderr=texts[1],
        started=started,
    )


def self_peak_rss_mib() -> float:
    """This process's own peak RSS so far, in MiB (``ru_maxrss`` of ``RUSAGE_SELF`` / 1024)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB_PER_MIB


def ram_gib() -> float:
    """The machine's physical memory in GiB."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30


def machine() -> str:
    """What a result's record says of the machine: cores, architecture, CPU model
    (``sparsetool.util.machine.cpu_name``)."""
    return f"{os.cpu_count()} cores, {platform.machine()}, {cpu_name()}"
