import hashlib
import multiprocessing
import stat
import threading
from pathlib import Path

import pytest
import yaml

from twinloop_twin.bundle import (
    MANIFEST_NAME,
    CalibrationRef,
    Provenance,
    SourceBag,
    TwinError,
    TwinIntegrityError,
    TwinManifestError,
    TwinVersionExists,
    latest_version,
    lineage,
    list_versions,
    load_twin,
    load_twin_version,
    write_twin_version,
)
from twinloop_twin.parameters import Parameter, ParameterSet

WORKCELL = "panda_table"
SCENE = b"<mujoco model='panda_table'><worldbody/></mujoco>\n"
MESH = bytes(range(256)) * 4


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _params(damping=1.0) -> ParameterSet:
    return ParameterSet(
        {
            "joint.panda_joint1.damping": Parameter(
                mean=damping, std=0.2, identifiable=True, unit="N*m*s/rad", source="nominal"
            ),
            "command.delay_s": Parameter(mean=0.004, std=0.002, identifiable=True, unit="s", source="nominal"),
            "box.mass_kg": Parameter(
                mean=0.5, std=0.0, identifiable=False, unit="kg", source="nominal", note="weighed"
            ),
        }
    )


def _write(root, *, parent=None, version=None, created_by="nominal", files=None, **kw):
    return write_twin_version(
        root,
        WORKCELL,
        parameters=kw.pop("parameters", _params()),
        provenance=Provenance(created_by=created_by, parent_version=parent, note=kw.pop("note", None)),
        files=files if files is not None else {"scene.xml": SCENE},
        version=version,
        **kw,
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _make_writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_round_trip_v0(tmp_path):
    mesh_src = tmp_path / "table.stl"
    mesh_src.write_bytes(MESH)
    provenance = Provenance(
        created_by="nominal",
        source_bags=[
            SourceBag(path="bags/ident_001", sha256=_sha(b"bag1"), split="fit", purpose="identification"),
            SourceBag(path="bags/trial_007", sha256=_sha(b"bag2"), split="held_out", purpose="trial"),
        ],
        calibration=CalibrationRef(ref="calib/hand_eye.yaml", sha256=_sha(b"calib")),
        note="first twin",
    )
    calibration = {"camera_T_gripper": {"xyz": [0.01, 0.02, 0.05], "quat_xyzw": [0.0, 0.0, 0.0, 1.0]}}
    validation = {"trajectory_rmse_rad": 0.012, "success_rate": 0.9}

    written = write_twin_version(
        tmp_path / "twins",
        WORKCELL,
        parameters=_params(),
        provenance=provenance,
        files={"scene.xml": SCENE, "meshes/table.stl": mesh_src},
        calibration=calibration,
        validation=validation,
    )
    assert written.path == tmp_path / "twins" / WORKCELL / "v0"

    loaded = load_twin_version(tmp_path / "twins", WORKCELL)
    assert loaded.version == 0 and loaded.workcell == WORKCELL
    assert loaded.manifest == written.manifest
    assert loaded.parameters == _params()
    assert loaded.manifest.provenance == provenance
    assert loaded.manifest.calibration == calibration
    assert loaded.manifest.validation == validation
    assert loaded.manifest.files == {"scene.xml": _sha(SCENE), "meshes/table.stl": _sha(MESH)}
    assert loaded.file_path("scene.xml").read_bytes() == SCENE
    assert loaded.file_path("meshes/table.stl").read_bytes() == MESH
    with pytest.raises(TwinError, match="not a file of twin"):
        loaded.file_path("missing.stl")

    # Immutable on disk too: files are read-only, and no temp folder is left behind.
    for rel in ("scene.xml", "meshes/table.stl", MANIFEST_NAME):
        assert not (loaded.path / rel).stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert [p.name for p in (tmp_path / "twins" / WORKCELL).iterdir()] == ["v0"]


def test_manifest_is_readable_yaml_with_header(tmp_path):
    bundle = _write(tmp_path)
    text = (bundle.path / MANIFEST_NAME).read_text()
    assert text.startswith("# twinloop twin manifest")
    data = yaml.safe_load(text)
    assert list(data) == [
        "schema_version",
        "workcell",
        "version",
        "provenance",
        "parameters",
        "calibration",
        "validation",
        "files",
    ]
    assert data["parameters"]["command.delay_s"] == {
        "mean": 0.004,
        "std": 0.002,
        "identifiable": True,
        "unit": "s",
        "source": "nominal",
    }


def test_provenance_and_lineage_through_three_versions(tmp_path):
    v0 = _write(tmp_path)
    v1 = _write(tmp_path, parent=0, created_by="calibration", note="hand-eye")
    identified = _params().with_updates(
        {
            "joint.panda_joint1.damping": Parameter(
                mean=0.73, std=0.04, identifiable=True, unit="N*m*s/rad", source="identified"
            )
        }
    )
    v2 = _write(tmp_path, parent=1, created_by="identification", parameters=identified)

    assert (v0.version, v1.version, v2.version) == (0, 1, 2)
    assert list_versions(tmp_path, WORKCELL) == [0, 1, 2]
    assert latest_version(tmp_path, WORKCELL) == 2
    latest = load_twin_version(tmp_path, WORKCELL)
    assert latest.version == 2
    assert latest.manifest.provenance.parent_version == 1
    assert latest.manifest.provenance.created_by == "identification"
    assert latest.parameters["joint.panda_joint1.damping"].mean == 0.73
    assert load_twin_version(tmp_path, WORKCELL, 1).manifest.provenance.note == "hand-eye"
    assert load_twin_version(tmp_path, WORKCELL, 0).parameters == _params()  # parent unchanged
    assert lineage(latest) == [2, 1, 0]
    assert lineage(v1) == [1, 0]


def test_tampered_file_is_refused_naming_it(tmp_path):
    bundle = _write(tmp_path, files={"scene.xml": SCENE, "meshes/table.stl": MESH})
    mesh = bundle.path / "meshes" / "table.stl"
    _make_writable(mesh)
    data = bytearray(mesh.read_bytes())
    data[100] ^= 0x01
    mesh.write_bytes(bytes(data))

    with pytest.raises(TwinIntegrityError) as info:
        load_twin(bundle.path)
    message = str(info.value)
    assert "meshes/table.stl" in message
    assert _sha(MESH) in message and _sha(bytes(data)) in message
    assert "twins are immutable" in message
    assert "scene.xml" not in message  # the intact file is not blamed


def test_deleted_file_is_refused(tmp_path):
    bundle = _write(tmp_path, files={"scene.xml": SCENE, "meshes/table.stl": MESH})
    (bundle.path / "meshes" / "table.stl").unlink()
    with pytest.raises(TwinIntegrityError, match=r"meshes/table\.stl: missing"):
        load_twin_version(tmp_path, WORKCELL, 0)


def test_unlisted_extra_file_is_reported(tmp_path):
    bundle = _write(tmp_path)
    (bundle.path / "notes.txt").write_text("tweaked by hand")
    with pytest.raises(TwinIntegrityError, match=r"notes\.txt: not listed"):
        load_twin(bundle.path)


def _edit_manifest(bundle, edit) -> None:
    path = bundle.path / MANIFEST_NAME
    _make_writable(path)
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize(
    "field, value, fragment",
    [("mean", float("nan"), "mean is nan"), ("std", -0.5, "std is -0.5")],
)
def test_manifest_with_invalid_parameter_is_refused(tmp_path, field, value, fragment):
    bundle = _write(tmp_path)
    _edit_manifest(bundle, lambda d: d["parameters"]["box.mass_kg"].__setitem__(field, value))
    with pytest.raises(TwinManifestError, match=rf"'box\.mass_kg'.*{fragment}"):
        load_twin(bundle.path)


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda d: d.pop("files"), r"missing key\(s\) \['files'\]"),
        (lambda d: d.__setitem__("schema_version", 99), "schema_version 99 is not supported"),
        (lambda d: d.__setitem__("version", "zero"), "version must be an integer"),
        (lambda d: d["provenance"].__setitem__("created_at", "yesterday"), "not a UTC ISO-8601"),
        (lambda d: d["files"].__setitem__("../escape.xml", "0" * 64), "must be relative"),
    ],
)
def test_malformed_manifest_is_refused(tmp_path, edit, fragment):
    bundle = _write(tmp_path)
    _edit_manifest(bundle, edit)
    with pytest.raises(TwinManifestError, match=fragment):
        load_twin(bundle.path)


def test_explicit_existing_version_is_refused_and_untouched(tmp_path):
    v0 = _write(tmp_path, files={"scene.xml": SCENE, "meshes/table.stl": MESH})
    before = _snapshot(v0.path)
    with pytest.raises(TwinVersionExists, match="never overwritten"):
        _write(tmp_path, version=0, files={"scene.xml": b"<mujoco/>"}, note="impostor")
    assert _snapshot(v0.path) == before
    assert list_versions(tmp_path, WORKCELL) == [0]
    assert [p.name for p in (tmp_path / WORKCELL).iterdir()] == ["v0"]  # no temp folder left


def test_missing_parent_is_refused(tmp_path):
    _write(tmp_path)
    with pytest.raises(TwinError, match="parent version v5 .* does not exist"):
        _write(tmp_path, parent=5)
    assert list_versions(tmp_path, WORKCELL) == [0]


def test_parent_must_be_older(tmp_path):
    _write(tmp_path)
    _write(tmp_path, parent=0, version=3)  # explicit numbers may leave gaps
    with pytest.raises(TwinManifestError, match="parent must be an older version"):
        _write(tmp_path, parent=3, version=2)
    assert list_versions(tmp_path, WORKCELL) == [0, 3]


def test_bad_file_paths_are_refused(tmp_path):
    for rel in ("../scene.xml", "/abs.xml", "meshes/../x.stl", MANIFEST_NAME, ".hidden"):
        with pytest.raises(TwinManifestError):
            _write(tmp_path, files={rel: SCENE})
    assert list_versions(tmp_path, WORKCELL) == []


def test_unyamlable_validation_is_refused_before_writing(tmp_path):
    with pytest.raises(TwinManifestError, match="YAML cannot store"):
        _write(tmp_path, validation={"scores": object()})
    assert list_versions(tmp_path, WORKCELL) == []


def test_load_without_any_version_says_what_to_do(tmp_path):
    with pytest.raises(TwinError, match="build v0 first"):
        load_twin_version(tmp_path, WORKCELL)
    assert latest_version(tmp_path, WORKCELL) is None


def _race_writer(root: str, start: threading.Barrier | None, tag: str) -> int:
    if start is not None:
        start.wait()
    bundle = _write(Path(root), parent=0, created_by="identification", note=tag,
                    files={"scene.xml": SCENE + tag.encode(), "meshes/table.stl": MESH})
    return bundle.version


def _check_race_result(root: Path, tags: list[str], versions: list[int]) -> None:
    assert sorted(versions) == list(range(1, len(tags) + 1))  # distinct, no gaps
    assert list_versions(root, WORKCELL) == list(range(len(tags) + 1))
    seen = set()
    for v in versions:
        bundle = load_twin_version(root, WORKCELL, v)  # re-hashes: no corruption
        tag = bundle.manifest.provenance.note
        assert bundle.file_path("scene.xml").read_bytes() == SCENE + tag.encode()
        seen.add(tag)
    assert seen == set(tags)
    assert not [p for p in (root / WORKCELL).iterdir() if p.name.startswith(".")]


def test_concurrent_threads_get_distinct_versions(tmp_path):
    _write(tmp_path)
    tags = [f"thread-{i}" for i in range(8)]
    start = threading.Barrier(len(tags))
    versions: list[int] = []
    errors: list[BaseException] = []

    def run(tag):
        try:
            versions.append(_race_writer(str(tmp_path), start, tag))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in tags]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _check_race_result(tmp_path, tags, versions)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_concurrent_processes_get_distinct_versions(tmp_path):
    _write(tmp_path)
    tags = [f"process-{i}" for i in range(4)]
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(len(tags))
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race_process, args=(str(tmp_path), start, t, queue)) for t in tags]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    errors = [r for r in results if isinstance(r, str)]
    assert errors == []
    _check_race_result(tmp_path, tags, [r for r in results if isinstance(r, int)])


def _race_process(root, start, tag, queue):
    try:
        queue.put(_race_writer(root, start, tag))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as text
        queue.put(f"{tag}: {exc!r}")
