"""A twin version's standing (twinloop_twin.status): recorded per version beside the versions,
never inside one; shown by `twinloop twin list|show`; a broken file is one line, exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from twinloop_twin.bundle import TwinError, load_twin_version
from twinloop_twin.nominal import build_nominal_twin
from twinloop_twin.status import STATUS_FILE, load_verdicts, record_verdict

TWINLOOP = str(Path(sys.executable).with_name("twinloop"))


def test_verdicts_are_kept_per_version_beside_the_versions(tmp_path):
    twin = build_nominal_twin(tmp_path / "twins", "emulated")
    assert load_verdicts(tmp_path / "twins", "emulated") == {}
    record_verdict(twin.path, True, "median z 19.4 over 2 trial(s)", "validation/a/report.json")
    later = record_verdict(twin.path, False, "median z 0.5 over 2 trial(s)", "validation/b/report.json")
    verdicts = load_verdicts(tmp_path / "twins", "emulated")
    assert list(verdicts) == [0] and verdicts[0] == later and not later.stale  # the latest verdict wins
    assert (tmp_path / "twins" / "emulated" / STATUS_FILE).is_file()
    load_twin_version(tmp_path / "twins", "emulated", 0)  # the version itself is untouched: it still verifies

    record_verdict(twin.path, True, "median z 19.4 over 2 trial(s)", "validation/c/report.json")
    listed = subprocess.run([TWINLOOP, "twin", "list", "--root", str(tmp_path / "twins")], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0 and listed.stdout.startswith("emulated v0: STALE (checked "), listed.stdout
    shown = subprocess.run([TWINLOOP, "twin", "show", str(twin.path)], capture_output=True, text=True, timeout=60)
    assert "  status: STALE (checked " in shown.stdout and "round validation/c/report.json" in shown.stdout
    assert shown.stdout.splitlines()[0].endswith("(no parent: the first version)"), shown.stdout

    with pytest.raises(TwinError, match="not a twin version folder"):
        record_verdict(tmp_path / "twins" / "emulated", True, "x", "r")


def test_a_broken_status_file_is_one_line_and_exit_2(tmp_path):
    build_nominal_twin(tmp_path / "twins", "emulated")
    (tmp_path / "twins" / "emulated" / STATUS_FILE).write_text("versions: [1, 2\n")
    done = subprocess.run([TWINLOOP, "twin", "list", "--root", str(tmp_path / "twins")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "is not a twin status file" in line and "move it aside" in line
