"""`twinloop loop`'s refusals, before anything starts or is written: one line, exit 2.
(The loop itself runs in test/test_loop.py.)"""
from __future__ import annotations

import pytest

from twinloop_validation.loop import main


def test_bad_modes_trials_and_oracle_on_a_real_cell_are_refused(capsys):
    for argv, message in ((["--modes", "nominal,teleport"], "give distinct modes"),
                          (["--modes", "nominal,nominal"], "give distinct modes"),
                          (["--trials", "0"], "at least one"),
                          (["--no-workcell", "--modes", "posterior,oracle"], "a real cell has none")):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2 and message in capsys.readouterr().err


def test_a_missing_truth_file_or_an_existing_run_folder_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["--truth-file", str(tmp_path / "missing.yaml"), "--run-dir", str(run_dir)]) == 2
    assert "not found" in capsys.readouterr().err and not run_dir.exists()
    run_dir.mkdir()
    (run_dir / "earlier.txt").write_text("an earlier run")
    assert main(["--run-dir", str(run_dir)]) == 2
    assert "exists" in capsys.readouterr().err
    assert [p.name for p in run_dir.iterdir()] == ["earlier.txt"]
