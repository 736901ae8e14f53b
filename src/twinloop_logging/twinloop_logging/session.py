"""Session metadata of one recording: why it was recorded and what was in use."""
from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PURPOSES = ("calibration", "identification", "demonstration", "trial")
SPLITS = ("fit", "held_out")
SESSION_KEY = "twinloop.session"        # custom_data key in metadata.yaml / MCAP metadata name
ANNOTATION_KEY = "twinloop.annotation"  # MCAP metadata name of one operator note
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class SessionError(ValueError):
    """Session metadata is invalid; the message says which field and what is allowed."""


class BagExistsError(FileExistsError):
    """The output bag folder exists already; a session never overwrites a bag."""


@dataclass
class Annotation:
    time_ns: int
    note: str


@dataclass
class SessionInfo:
    session_id: str
    purpose: str
    split: str
    profile: str = ""
    operator_note: str = ""
    twin_version: str = ""
    policy_version: str = ""
    robot: str = ""
    host: str = ""
    trial_index: int = 0
    started_ns: int = 0
    annotations: list[Annotation] = field(default_factory=list)

    def validate(self) -> "SessionInfo":
        if self.purpose not in PURPOSES:
            raise SessionError(f"purpose '{self.purpose}' is not one of {list(PURPOSES)}")
        if self.split not in SPLITS:
            raise SessionError(f"split '{self.split}' is not one of {list(SPLITS)} "
                               "(fit: may be used to build the twin; held_out: validation only)")
        if not _SAFE_ID.fullmatch(self.session_id):
            raise SessionError(f"session_id '{self.session_id}' must be a folder-safe name "
                               "(letters, digits, '.', '_', '-'; not starting with '.' or '-')")
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SessionInfo":
        raw = json.loads(text)
        raw["annotations"] = [Annotation(**a) for a in raw.get("annotations", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})


def session_name(purpose: str, split: str, *, robot: str = "", kind: str = "", now_ns: int | None = None) -> str:
    """'<UTC time>-<robot>-<purpose>-<kind>-<split>' (empty parts left out), e.g.
    '20261203T172452Z-emulated_panda-identification-joints-fit': a bag's folder name says
    what it holds and whether it may be fitted (fit) or only scored (held_out)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime((time.time_ns() if now_ns is None else now_ns) / 1e9))
    return "-".join(part for part in (stamp, _slug(robot), purpose, _slug(kind), split) if part)


def new_session(purpose: str, split: str, *, session_id: str = "", robot: str = "", **fields) -> SessionInfo:
    """A validated session; an empty session_id becomes session_name(purpose, split, robot=robot)."""
    now_ns = time.time_ns()
    if not session_id:
        session_id = session_name(purpose, split, robot=robot, now_ns=now_ns)
    return SessionInfo(session_id=session_id, purpose=purpose, split=split, robot=robot,
                       host=socket.gethostname(), started_ns=now_ns, **fields).validate()


def bag_path_for(output_dir: Path | str, session: SessionInfo, *, unique: bool) -> Path:
    """Folder of the session's bag, absolute (a relative `output_dir` is taken in this
    process's working directory: the path is handed to clients working elsewhere). Never
    an existing one: `unique` (generated ids) adds a suffix, otherwise an existing folder
    is a BagExistsError."""
    path = Path(output_dir).absolute() / session.session_id
    if not path.exists():
        return path
    if not unique:
        raise BagExistsError(f"bag folder {path} exists already; a session never overwrites a bag. "
                             "Choose another session_id or output_dir, or move the old bag away")
    for index in range(1, 1000):
        candidate = path.with_name(f"{path.name}-{index}")
        if not candidate.exists():
            session.session_id = candidate.name
            return candidate
    raise BagExistsError(f"{path}-1 .. -999 all exist; choose another output_dir")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.-")
