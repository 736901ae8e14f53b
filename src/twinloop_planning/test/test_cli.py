"""`twinloop plan check` as the README shows it, and its refusals: one line, an exit code."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TWINLOOP = str(Path(sys.executable).parent / "twinloop")


def readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Motion planning"):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    return [line.strip() for line in block.splitlines() if line.startswith("twinloop ")]


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    return subprocess.run([TWINLOOP, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_readme_check_lines(tmp_path):
    lines = readme_block()
    assert len(lines) == 2, lines
    for line in lines:
        done = run(line, tmp_path)
        assert done.returncode == 0 and done.stdout.startswith("path: 2 waypoints"), (line, done.stderr)
        assert "the straight line is clear" in done.stdout and not done.stderr
    slow, fast = run(lines[1], tmp_path), run("twinloop plan check --to home --from 0.3,-0.5,0,-2.2,0,1.7,0.8", tmp_path)
    duration = [float(re.search(r"; ([0-9.]+) s of motion", d.stdout).group(1)) for d in (slow, fast)]
    assert duration[0] > duration[1], duration  # --speed 0.5 caps below 0.8 of the envelope's limits


def test_no_move_and_a_negative_first_value(tmp_path):
    done = run("twinloop plan check --to home", tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "path: none needed, the start is the goal", done.stdout
    done = run("twinloop plan check --to=-0.3,-0.5,0,-2.2,0,1.7,0.8", tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("path: 2 waypoints"), done.stderr


def test_refusals_are_one_line_with_an_exit_code(tmp_path):
    bad_config = tmp_path / "planning.yaml"
    bad_config.write_text("planner:\n  time_limit_s: .nan\n")
    broken_yaml = tmp_path / "broken.yaml"
    broken_yaml.write_text("planner: [1, 2\n")
    for command, code, said in (
            ("twinloop plan check --to 0.3,-0.5,0,0.5,0,1.7,0.8", 2, "panda_joint4=0.500 outside"),
            ("twinloop plan check --to 1,2", 2, "give 7 (the arm) or 8"),
            ("twinloop plan check --to nowhere", 2, "is not 'home' or joint positions"),
            ("twinloop plan check --to home --twin nosuch/v9", 2, "nosuch"),
            (f"twinloop plan check --to home --config {bad_config}", 2, "time_limit_s must be a finite number"),
            ("twinloop plan check --to home --speed 0", 2, "--speed must be > 0"),
            ("twinloop plan check --to home --envelope /nonexistent.yaml", 2, "cannot read the envelope"),
            (f"twinloop plan check --to home --config {broken_yaml}", 2, "cannot read the planning settings"),
            (f"twinloop plan check --to home --envelope {broken_yaml}", 2, "cannot read the envelope"),
            ("twinloop plan check --to home --from 0.3,-0.5,0,-2.2,0,1.7,0.8,0.5", 2, "the start is not a valid state"),
    ):
        done = run(command, tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code and len(lines) == 1 and said in lines[0], (command, done.stderr)
        assert lines[0].startswith("twinloop plan: error: ")
