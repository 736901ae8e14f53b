"""Nodes as processes: the bring-up, the demo, benchmarks and tests start nodes this way.

Every process started here gets a localhost-only DDS environment (unless the caller
asks otherwise) and its domain id, so that runs cannot hear each other or anything off
this host.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from twinloop_twin.workcell import default_config_dir

_domain_counter = itertools.count()


def fresh_domain_id() -> int:
    """A domain id unlikely to be in use by another test process on this host (1..200)."""
    return 1 + (os.getpid() * 7 + next(_domain_counter)) % 200


def localhost_env(domain_id: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ROS_DOMAIN_ID": str(domain_id),
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        "FASTDDS_DEFAULT_PROFILES_FILE": str(default_config_dir() / "fastdds_localhost.xml"),
        "MUJOCO_GL": env.get("MUJOCO_GL", "egl"),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


def interrupt_group(process: subprocess.Popen, timeout_s: float = 60.0) -> int:
    """Ctrl-C to a process started in a session of its own (a bring-up: it stops its nodes),
    SIGKILL to the group after `timeout_s`; its exit code."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


class NodeProcess:
    """A node started as a subprocess (`python -m module --ros-args ...`)."""

    def __init__(self, module: str, domain_id: int, parameters: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None,
                 extra_args: list[str] | None = None, cwd: Path | None = None) -> None:
        args = [sys.executable, "-m", module, "--ros-args", *(extra_args or [])]
        for name, value in (parameters or {}).items():
            args += ["-p", f"{name}:={_param_text(value)}"]
        self.log_path = log_path
        self._log = open(log_path, "w") if log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(args, env=localhost_env(domain_id, **(env or {})),
                                        stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""


def _param_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
