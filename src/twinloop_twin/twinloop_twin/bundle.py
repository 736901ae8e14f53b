"""The twin bundle: an immutable, versioned folder `twins/<workcell>/v<N>/`.

Each version holds `twin.yaml` (the manifest: provenance, parameters with
uncertainty, calibration, validation scores, the sha256 of every file) next to
its files (MJCF scene, meshes, USD export). Every stage writes a NEW version
through `write_twin_version`; nothing ever modifies an existing one, and
`load_twin` refuses a bundle whose files no longer match their recorded hashes.

Pure Python; never imports rclpy.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from twinloop_twin.parameters import ParameterError, ParameterSet

__all__ = [
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "SPLITS",
    "CalibrationRef",
    "Provenance",
    "SourceBag",
    "TwinBundle",
    "TwinError",
    "TwinIntegrityError",
    "TwinManifest",
    "TwinManifestError",
    "TwinVersionExists",
    "latest_version",
    "lineage",
    "list_versions",
    "load_twin",
    "load_twin_version",
    "sha256_of",
    "write_twin_version",
]

MANIFEST_NAME = "twin.yaml"
SCHEMA_VERSION = 1
# Calibration/identification data and validation data never mix (design principle 2).
SPLITS = ("fit", "held_out")
TOOL_VERSION = "twinloop_twin 0.1.0"

_VERSION_DIR = re.compile(r"^v(0|[1-9][0-9]*)$")
_WORKCELL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_IMMUTABLE = "rebuild a new version from its sources; twins are immutable"
_MANIFEST_HEADER = (
    "# twinloop twin manifest. Written by twinloop_twin.bundle.write_twin_version.\n"
    "# Do not edit: this version is immutable and its files are checked against the\n"
    "# sha256 sums below. To change anything, write a new version.\n"
)


# --------------------------------------------------------------------------- errors


class TwinError(Exception):
    """Base of every twin bundle error; the message says what was wrong and what to do."""


class TwinVersionExists(TwinError):
    """The requested version folder already exists; versions are never overwritten."""


class TwinIntegrityError(TwinError):
    """A bundle's files do not match its manifest (changed, missing or unlisted files)."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class TwinManifestError(TwinError):
    """twin.yaml is malformed: wrong schema, missing keys, wrong types, invalid parameters."""


# --------------------------------------------------------------------------- data model


@dataclass(frozen=True, kw_only=True)
class SourceBag:
    """A recording a version was derived from, pinned by content hash."""

    path: str
    sha256: str
    split: str  # "fit" | "held_out"
    purpose: str  # calibration | identification | demonstration | trial

    def __post_init__(self) -> None:
        _require_str(self.path, "source bag path")
        _require_sha256(self.sha256, f"source bag {self.path!r} sha256")
        if self.split not in SPLITS:
            raise TwinManifestError(
                f"source bag {self.path!r} has split {self.split!r}; use one of {list(SPLITS)}"
            )
        _require_str(self.purpose, f"source bag {self.path!r} purpose")


@dataclass(frozen=True, kw_only=True)
class CalibrationRef:
    """The calibration YAML a version used: where it was (path or id) and its content hash."""

    ref: str
    sha256: str

    def __post_init__(self) -> None:
        _require_str(self.ref, "calibration ref")
        _require_sha256(self.sha256, f"calibration {self.ref!r} sha256")


def _utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where a version came from; enough to rebuild it from its recorded inputs."""

    created_by: str  # the stage: "nominal", "calibration", "geometry", "identification", ...
    parent_version: int | None = None
    source_bags: tuple[SourceBag, ...] = ()
    calibration: CalibrationRef | None = None
    created_at: str = field(default_factory=_utc_now_iso)  # UTC, ISO-8601
    tool_version: str = TOOL_VERSION
    note: str | None = None

    def __post_init__(self) -> None:
        _require_str(self.created_by, "provenance created_by")
        if self.parent_version is not None:
            _require_version(self.parent_version, "provenance parent_version")
        # Accept a list but store a tuple: the provenance of an immutable version is immutable.
        object.__setattr__(self, "source_bags", tuple(self.source_bags))
        for bag in self.source_bags:
            if not isinstance(bag, SourceBag):
                raise TwinManifestError(f"provenance source_bags must hold SourceBag, got {bag!r}")
        if self.calibration is not None and not isinstance(self.calibration, CalibrationRef):
            raise TwinManifestError(
                f"provenance calibration must be a CalibrationRef or None, got {self.calibration!r}"
            )
        _require_str(self.created_at, "provenance created_at")
        try:
            created = datetime.fromisoformat(self.created_at)
        except ValueError:
            created = None
        if created is None or created.utcoffset() != timezone.utc.utcoffset(None):
            raise TwinManifestError(
                f"provenance created_at {self.created_at!r} is not a UTC ISO-8601 time; "
                f"use e.g. datetime.now(timezone.utc).isoformat()"
            )
        _require_str(self.tool_version, "provenance tool_version")
        if self.note is not None:
            _require_str(self.note, "provenance note")

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent_version": self.parent_version,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "tool_version": self.tool_version,
            "source_bags": [
                {"path": b.path, "sha256": b.sha256, "split": b.split, "purpose": b.purpose}
                for b in self.source_bags
            ],
            "calibration": (
                None
                if self.calibration is None
                else {"ref": self.calibration.ref, "sha256": self.calibration.sha256}
            ),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Provenance":
        data = _require_keys(
            data,
            "provenance",
            required=("parent_version", "created_by", "created_at", "tool_version", "source_bags"),
            optional=("calibration", "note"),
        )
        bags = data["source_bags"]
        if not isinstance(bags, list):
            raise TwinManifestError(f"provenance source_bags must be a list, got {bags!r}")
        calibration = data.get("calibration")
        return cls(
            parent_version=data["parent_version"],
            created_by=data["created_by"],
            created_at=data["created_at"],
            tool_version=data["tool_version"],
            source_bags=tuple(
                SourceBag(
                    **_require_keys(
                        b, "provenance source_bags entry", required=("path", "sha256", "split", "purpose")
                    )
                )
                for b in bags
            ),
            calibration=(
                None
                if calibration is None
                else CalibrationRef(
                    **_require_keys(calibration, "provenance calibration", required=("ref", "sha256"))
                )
            ),
            note=data.get("note"),
        )


@dataclass(frozen=True, kw_only=True)
class TwinManifest:
    """The content of twin.yaml. `files` maps bundle-relative POSIX paths to sha256."""

    workcell: str
    version: int
    provenance: Provenance
    parameters: ParameterSet
    files: dict[str, str]
    validation: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _require_workcell(self.workcell)
        _require_version(self.version, "version")
        if not isinstance(self.provenance, Provenance):
            raise TwinManifestError(f"provenance must be a Provenance, got {self.provenance!r}")
        if not isinstance(self.parameters, ParameterSet):
            raise TwinManifestError(f"parameters must be a ParameterSet, got {self.parameters!r}")
        if not isinstance(self.files, Mapping):
            raise TwinManifestError(f"files must map relative paths to sha256, got {self.files!r}")
        for rel, digest in self.files.items():
            _check_relpath(rel)
            _require_sha256(digest, f"file {rel!r} sha256")
        for name in ("validation", "calibration"):
            if not isinstance(getattr(self, name), Mapping):
                raise TwinManifestError(f"{name} must be a mapping (may be empty), got {getattr(self, name)!r}")
        if self.schema_version != SCHEMA_VERSION:
            raise TwinManifestError(
                f"schema_version {self.schema_version!r} is not supported (this twinloop reads "
                f"{SCHEMA_VERSION}); use the twinloop release that wrote it, or rebuild the twin"
            )
        parent = self.provenance.parent_version
        if parent is not None and parent >= self.version:
            # Parents precede children, so lineage walks always terminate.
            raise TwinManifestError(
                f"version {self.version} names parent {parent}; a parent must be an older version"
            )

    def to_dict(self) -> dict[str, Any]:
        # Fixed key order: identity first, then where it came from, then what it holds.
        return {
            "schema_version": self.schema_version,
            "workcell": self.workcell,
            "version": self.version,
            "provenance": self.provenance.to_dict(),
            "parameters": self.parameters.to_dict(),
            "calibration": dict(self.calibration),
            "validation": dict(self.validation),
            "files": {rel: self.files[rel] for rel in sorted(self.files)},
        }

    @classmethod
    def from_dict(cls, data: Any) -> "TwinManifest":
        data = _require_keys(
            data,
            MANIFEST_NAME,
            required=(
                "schema_version",
                "workcell",
                "version",
                "provenance",
                "parameters",
                "calibration",
                "validation",
                "files",
            ),
        )
        # Check the schema first: a newer layout should say "upgrade", not "bad key".
        if data["schema_version"] != SCHEMA_VERSION:
            raise TwinManifestError(
                f"schema_version {data['schema_version']!r} is not supported (this twinloop reads "
                f"{SCHEMA_VERSION}); use the twinloop release that wrote it, or rebuild the twin"
            )
        try:
            parameters = ParameterSet.from_dict(data["parameters"])
        except ParameterError as exc:
            raise TwinManifestError(f"{MANIFEST_NAME} parameters: {exc}") from None
        return cls(
            schema_version=data["schema_version"],
            workcell=data["workcell"],
            version=data["version"],
            provenance=Provenance.from_dict(data["provenance"]),
            parameters=parameters,
            files=data["files"],
            calibration=data["calibration"],
            validation=data["validation"],
        )

    def to_yaml(self) -> str:
        try:
            body = yaml.safe_dump(
                self.to_dict(), sort_keys=False, default_flow_style=False, allow_unicode=True, width=100
            )
        except yaml.representer.RepresenterError as exc:
            raise TwinManifestError(
                f"manifest holds a value YAML cannot store ({exc}); pass plain Python "
                f"floats/ints/strings/lists/dicts in calibration and validation (e.g. float(x), x.tolist())"
            ) from None
        return _MANIFEST_HEADER + body


@dataclass(frozen=True)
class TwinBundle:
    """A loaded, verified twin version on disk."""

    path: Path
    manifest: TwinManifest

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def workcell(self) -> str:
        return self.manifest.workcell

    @property
    def parameters(self) -> ParameterSet:
        return self.manifest.parameters

    def file_path(self, rel: str) -> Path:
        """Absolute path of a file listed in the manifest (e.g. "scene.xml")."""
        if rel not in self.manifest.files:
            raise TwinError(
                f"{rel!r} is not a file of twin {self.workcell} v{self.version}; "
                f"its files are {sorted(self.manifest.files)}"
            )
        return self.path / rel


# --------------------------------------------------------------------------- versions


def list_versions(root: Path | str, workcell: str) -> list[int]:
    """Version numbers present under `root/<workcell>/`, ascending. Temp folders are ignored."""
    _require_workcell(workcell)
    workcell_dir = Path(root) / workcell
    if not workcell_dir.is_dir():
        return []
    versions = []
    for entry in workcell_dir.iterdir():
        match = _VERSION_DIR.match(entry.name)
        if match and entry.is_dir():
            versions.append(int(match.group(1)))
    return sorted(versions)


def latest_version(root: Path | str, workcell: str) -> int | None:
    """The highest version number, or None when the workcell has no twin yet."""
    versions = list_versions(root, workcell)
    return versions[-1] if versions else None


def lineage(bundle: TwinBundle) -> list[int]:
    """Version numbers from `bundle` back to its root, e.g. [2, 1, 0].

    Ancestors' manifests are read and validated but their files are not re-hashed:
    lineage answers "where did this come from", loading answers "is it intact".
    """
    chain = [bundle.version]
    parent = bundle.manifest.provenance.parent_version
    while parent is not None:
        parent_dir = bundle.path.parent / f"v{parent}"
        if not (parent_dir / MANIFEST_NAME).is_file():
            raise TwinError(
                f"twin {bundle.workcell} v{chain[-1]} names parent v{parent}, which is missing at "
                f"{parent_dir}; restore it from a backup (versions must never be deleted)"
            )
        parent_manifest = _read_manifest(parent_dir)
        chain.append(parent_manifest.version)
        parent = parent_manifest.provenance.parent_version
    return chain


# --------------------------------------------------------------------------- writing


def write_twin_version(
    root: Path | str,
    workcell: str,
    *,
    parameters: ParameterSet,
    provenance: Provenance,
    files: Mapping[str, bytes | Path],
    calibration: Mapping[str, Any] | None = None,
    validation: Mapping[str, Any] | None = None,
    version: int | None = None,
) -> TwinBundle:
    """Write a new immutable version `root/<workcell>/v<N>/` and return it, loaded.

    With `version=None` the next free number is taken (v0 first); a writer that
    loses a race to another writer simply takes the number after. With an explicit
    `version` that already exists, `TwinVersionExists` is raised and the existing
    version is untouched.

    Everything is written into a hidden temp folder next to the target and renamed
    into place in one step, so a crash never leaves a half-written version and two
    writers can never both own one number.
    """
    _require_workcell(workcell)
    if version is not None:
        _require_version(version, "version")
    workcell_dir = Path(root) / workcell
    workcell_dir.mkdir(parents=True, exist_ok=True)

    parent = provenance.parent_version
    if parent is not None and not (workcell_dir / f"v{parent}" / MANIFEST_NAME).is_file():
        raise TwinError(
            f"parent version v{parent} of workcell {workcell!r} does not exist under {workcell_dir}; "
            f"pass the version this one was derived from (see list_versions), or parent_version=None "
            f"for a fresh nominal twin"
        )
    if version is not None and (workcell_dir / f"v{version}").exists():
        raise _version_exists(workcell_dir, version)

    # Build the manifest once with a placeholder number to validate everything
    # (parameters, YAML-ability of calibration/validation) before touching disk.
    for rel in files:
        _check_relpath(rel)
    draft = TwinManifest(
        workcell=workcell,
        version=version if version is not None else _next_version(workcell_dir),
        provenance=provenance,
        parameters=parameters,
        files={rel: "0" * 64 for rel in files},
        calibration=dict(calibration or {}),
        validation=dict(validation or {}),
    )
    draft.to_yaml()

    tmp_dir = Path(tempfile.mkdtemp(prefix=".tmp-", dir=workcell_dir))
    os.chmod(tmp_dir, 0o755)  # mkdtemp makes it private; a published version is readable by all
    try:
        hashes = {rel: _write_file(tmp_dir / rel, content) for rel, content in files.items()}
        candidate = draft.version
        for _ in range(10_000):  # bounded only to turn a logic error into an error, not a hang
            manifest = TwinManifest(
                workcell=workcell,
                version=candidate,
                provenance=provenance,
                parameters=parameters,
                files=hashes,
                calibration=draft.calibration,
                validation=draft.validation,
            )
            manifest_path = tmp_dir / MANIFEST_NAME
            if manifest_path.exists():
                manifest_path.unlink()  # a rename race was lost; renumber and retry
            _write_file(manifest_path, manifest.to_yaml().encode("utf-8"))
            _fsync_dir(tmp_dir)
            target = workcell_dir / f"v{candidate}"
            try:
                # rename(2) of a directory fails if the target exists and is not empty,
                # so exactly one of several racing writers owns each version number.
                if target.exists():
                    raise FileExistsError(target)
                os.rename(tmp_dir, target)
            except OSError:
                if not target.exists():
                    raise
                if version is not None:
                    raise _version_exists(workcell_dir, version) from None
                candidate = _next_version(workcell_dir)
                continue
            _fsync_dir(workcell_dir)
            return load_twin(target)
        raise TwinError(f"could not find a free version number under {workcell_dir}")  # pragma: no cover
    finally:
        # Only present when the rename did not happen.
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir, ignore_errors=True)


def _next_version(workcell_dir: Path) -> int:
    versions = list_versions(workcell_dir.parent, workcell_dir.name)
    return versions[-1] + 1 if versions else 0


def _version_exists(workcell_dir: Path, version: int) -> TwinVersionExists:
    return TwinVersionExists(
        f"twin version {workcell_dir / f'v{version}'} already exists and versions are never "
        f"overwritten; write the next version instead (omit version= to take the next free number)"
    )


def _write_file(path: Path, content: bytes | Path | str) -> str:
    """Write (or copy) one file, fsync it, make it read-only, return its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(path, "xb") as out:
        if isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
            digest.update(data)
            out.write(data)
        elif isinstance(content, (Path, str)):
            source = Path(content)
            if not source.is_file():
                raise TwinError(f"file {source} to put in the twin does not exist or is not a file")
            with open(source, "rb") as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
        else:
            raise TwinError(
                f"content for {path.name!r} must be bytes or a Path to copy, got {type(content).__name__}"
            )
        out.flush()
        os.fsync(out.fileno())
    # Read-only is a guard against accidental edits, not security; the hashes are the check.
    os.chmod(path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    # Makes the directory entries durable before/after the rename (POSIX only).
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- loading


def load_twin(path: Path | str) -> TwinBundle:
    """Load and verify one version folder: manifest schema, and every file's sha256."""
    path = Path(path)
    manifest = _read_manifest(path)
    if path.name != f"v{manifest.version}":
        raise TwinManifestError(
            f"{path / MANIFEST_NAME} says version {manifest.version} but lives in folder "
            f"{path.name!r}; a version folder must be named v<version>. {_IMMUTABLE}"
        )

    problems: list[str] = []
    for rel, expected in sorted(manifest.files.items()):
        file = path / rel
        if not file.is_file():
            problems.append(f"{rel}: missing (expected sha256 {expected})")
            continue
        actual = sha256_of(file)
        if actual != expected:
            problems.append(f"{rel}: sha256 is {actual}, expected {expected}")
    listed = set(manifest.files) | {MANIFEST_NAME}
    for file in sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink()):
        rel = file.relative_to(path).as_posix()
        if rel not in listed:
            problems.append(f"{rel}: not listed in {MANIFEST_NAME} (unlisted extra file)")
    if problems:
        raise TwinIntegrityError(
            f"twin {manifest.workcell} v{manifest.version} at {path} does not match its manifest:\n  "
            + "\n  ".join(problems)
            + f"\nDo not repair it in place: {_IMMUTABLE}.",
            problems,
        )
    return TwinBundle(path=path, manifest=manifest)


def load_twin_version(root: Path | str, workcell: str, version: int | None = None) -> TwinBundle:
    """Load `root/<workcell>/v<version>/`, or the latest version when `version` is None."""
    if version is None:
        version = latest_version(root, workcell)
        if version is None:
            raise TwinError(
                f"workcell {workcell!r} has no twin under {Path(root) / workcell}; "
                f"build v0 first (write_twin_version with parent_version=None)"
            )
    path = Path(root) / workcell / f"v{version}"
    if not path.is_dir():
        raise TwinError(
            f"twin {workcell} v{version} does not exist at {path}; "
            f"versions present: {list_versions(root, workcell)}"
        )
    bundle = load_twin(path)
    if bundle.workcell != workcell:
        raise TwinManifestError(
            f"{path / MANIFEST_NAME} is for workcell {bundle.workcell!r}, found under {workcell!r}; "
            f"{_IMMUTABLE}"
        )
    return bundle


def sha256_of(path: Path | str) -> str:
    """sha256 hex digest of a file's content, read in chunks (meshes and bags are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_manifest(path: Path) -> TwinManifest:
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        raise TwinManifestError(
            f"{manifest_path} is missing; {path} is not a twin version. {_IMMUTABLE}"
        )
    try:
        data = yaml.safe_load(manifest_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TwinManifestError(f"{manifest_path} is not valid YAML ({exc}); {_IMMUTABLE}") from None
    try:
        return TwinManifest.from_dict(data)
    except TwinManifestError as exc:
        raise TwinManifestError(f"{manifest_path}: {exc}") from None


# --------------------------------------------------------------------------- checks


def _require_keys(
    data: Any, what: str, *, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise TwinManifestError(f"{what} must be a mapping, got {type(data).__name__}")
    missing = [k for k in required if k not in data]
    unknown = sorted(set(data) - set(required) - set(optional))
    if missing:
        raise TwinManifestError(f"{what} is missing key(s) {missing}")
    if unknown:
        raise TwinManifestError(f"{what} has unknown key(s) {unknown}; allowed: {list(required + optional)}")
    return dict(data)


def _require_str(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise TwinManifestError(f"{what} must be a non-empty string, got {value!r}")


def _require_sha256(value: Any, what: str) -> None:
    if not isinstance(value, str) or not _SHA256.match(value):
        raise TwinManifestError(f"{what} must be 64 lower-case hex digits (sha256), got {value!r}")


def _require_version(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TwinManifestError(f"{what} must be an integer >= 0, got {value!r}")


def _require_workcell(name: Any) -> None:
    if not isinstance(name, str) or not _WORKCELL_NAME.match(name):
        raise TwinManifestError(
            f"workcell name {name!r} must be letters, digits, '_' or '-' (it is a folder name), "
            f"e.g. 'panda_table'"
        )


def _check_relpath(rel: Any) -> None:
    """Bundle files are plain relative POSIX paths inside the version folder."""
    if not isinstance(rel, str) or not rel:
        raise TwinManifestError(f"file path {rel!r} must be a non-empty string")
    pure = PurePosixPath(rel)
    if (
        pure.is_absolute()
        or "\\" in rel
        or pure.as_posix() != rel
        or any(part in ("", ".", "..") or part.startswith(".") for part in rel.split("/"))
    ):
        raise TwinManifestError(
            f"file path {rel!r} must be relative, '/'-separated, without '.', '..' or hidden parts, "
            f"e.g. 'meshes/table.stl'"
        )
    if rel == MANIFEST_NAME:
        raise TwinManifestError(f"{MANIFEST_NAME} is written by the bundle itself; do not pass it in files")
