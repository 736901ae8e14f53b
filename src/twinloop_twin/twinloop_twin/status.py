"""Whether a twin version still describes its cell: current, stale, or not checked yet.

A version is immutable, but whether it still describes the cell is a fact about the cell
over time (maintenance, a new payload, wear), so it is not written into the version. Each
workcell's folder of versions holds a small sidecar, `<root>/<workcell>/status.yaml`,
with the latest verdict per version: the state (`current` or `stale`), the evidence in
words, the validation round that judged it and when. Validation writes it (twinloop_validation:
each round with a staleness check); `twinloop twin list|show`, the twin builder's
`/diagnostics` and its RViz text marker read it. Written whole (a temporary file renamed
over it), so a reader never sees half a file. Pure Python.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from twinloop_twin.bundle import TwinError

STATUS_FILE = "status.yaml"
STATES = ("current", "stale")


@dataclass(frozen=True)
class Verdict:
    version: int
    state: str  # one of STATES
    evidence: str
    round: str  # the report of the round that judged it
    checked_at: str  # UTC, ISO-8601

    @property
    def stale(self) -> bool:
        return self.state == "stale"


def status_path(root: Path | str, workcell: str) -> Path:
    return Path(root) / workcell / STATUS_FILE


def load_verdicts(root: Path | str, workcell: str) -> dict[int, Verdict]:
    """Version -> its latest verdict (empty: none checked yet). Raises TwinError on a broken file."""
    path = status_path(root, workcell)
    if not path.is_file():
        return {}
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        return {int(v): Verdict(version=int(v), **entry) for v, entry in (raw.get("versions") or {}).items()}
    except (yaml.YAMLError, TypeError, ValueError, AttributeError) as error:
        raise TwinError(f"{path} is not a twin status file ({error}); move it aside: the next validation round "
                        "writes a new one") from None


def record_verdict(twin_path: Path | str, stale: bool, evidence: str, round_path: str) -> Verdict:
    """Record a round's verdict on the version at `twin_path` (a folder .../<workcell>/v<N>)."""
    twin_path = Path(twin_path)
    workcell_dir = twin_path.parent
    if not twin_path.name.startswith("v") or not twin_path.name[1:].isdigit():
        raise TwinError(f"{twin_path} is not a twin version folder (v<N>)")
    version = int(twin_path.name[1:])
    verdict = Verdict(version, "stale" if stale else "current", evidence, str(round_path),
                      datetime.now(timezone.utc).isoformat(timespec="seconds"))
    verdicts = load_verdicts(workcell_dir.parent, workcell_dir.name)
    verdicts[version] = verdict
    body = {"versions": {v: {k: x for k, x in asdict(d).items() if k != "version"} for v, d in sorted(verdicts.items())}}
    path = workcell_dir / STATUS_FILE
    temporary = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    temporary.write_text("# Latest verdict per twin version, written by twinloop validation rounds.\n"
                         + yaml.safe_dump(body, sort_keys=False))
    os.replace(temporary, path)
    return verdict


def describe(verdict: Verdict | None) -> str:
    if verdict is None:
        return "not checked against the cell yet"
    return f"{verdict.state.upper() if verdict.stale else verdict.state} (checked {verdict.checked_at}: {verdict.evidence})"
