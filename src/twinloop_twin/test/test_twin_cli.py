"""`twinloop twin build-nominal` writes v0 once and verifies it afterwards; `list` on a missing root."""
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from twinloop_twin.cli import MISMATCH_EXIT, main
from twinloop_twin.workcell import SHARE_ENV, default_config_dir

TWINLOOP = str(Path(sys.executable).with_name("twinloop"))


def _hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_build_nominal_twice_writes_then_verifies_and_a_changed_config_is_refused(tmp_path, capsys, monkeypatch):
    root = tmp_path / "twins"
    assert main(["build-nominal", "--root", str(root)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {root}/emulated/v0")
    written = _hashes(root)

    # a second run, as `make demo` does every time: v0 is checked, not rewritten
    done = subprocess.run([TWINLOOP, "twin", "build-nominal", "--root", str(root)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"verified {root}/emulated/v0: intact"), done.stdout
    assert _hashes(root) == written

    # the nominal physics edited since v0 was written: one line naming what differs, exit 4
    share = tmp_path / "share"
    shutil.copytree(default_config_dir(), share / "config")
    shutil.copytree(default_config_dir().parent / "urdf", share / "urdf")
    physics = yaml.safe_load((share / "config" / "nominal_physics.yaml").read_text())
    physics["box"]["mass_kg"] *= 1.5
    (share / "config" / "nominal_physics.yaml").write_text(yaml.safe_dump(physics, sort_keys=False))
    monkeypatch.setenv(SHARE_ENV, str(share))
    capsys.readouterr()
    assert main(["build-nominal", "--root", str(root)]) == MISMATCH_EXIT == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"twinloop twin: error: {root}/emulated/v0 is not the nominal twin")
    assert "inputs/physics.yaml" in line and "box.mass_kg" in line and "--root" in line
    assert _hashes(root) == written
    assert sorted(p.name for p in (root / "emulated").iterdir()) == ["v0"]


def test_list_on_a_missing_root_says_so_and_exits_2(tmp_path):
    done = subprocess.run([TWINLOOP, "twin", "list", "--root", str(tmp_path / "no_twins")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("twinloop twin: error: no twins of workcell 'emulated' under")
    assert "build-nominal" in line
    assert not (tmp_path / "no_twins").exists()
