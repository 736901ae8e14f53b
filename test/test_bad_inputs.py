"""Bad-input corpus: generated bad files, configs and options run against every `twinloop` CLI.

Every run gets a folder of its own holding the inputs it is given (a copy, made bad in one
way) and the places its outputs would go. After the run:
- the exit code is the one expected (2 for bad input, 0 where the input is harmless for that
  command, e.g. `bag info` on a bag whose topics are merely not what replay needs);
- stderr holds no traceback and, on an error, ends in one line that starts with the
  command's name and says what is wrong;
- nothing in the run's folder was written, renamed or deleted (sha256 of every file and
  the list of folders, before and after), except by `twinloop bag repair`, whose purpose is
  to write into the bag: there every original file's bytes must still be in the bag folder,
  nothing outside it may change, and the repaired bag must then check clean.

The corpus is generated here (bags written with twinloop_logging's BagWriter, configs and
the real hand-eye data set copied into the run's folder and spoiled); `bench/bad_inputs.py`
runs the whole cross product and prints the counts. `make test` runs a selection (CORE:
every kind of bad input against its main consumers, every defect of the issue) in this
process through each command's main(argv), and a few as real `twinloop` processes.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HANDEYE = ROOT.parent / "shared" / "data" / "handeye_ros_industrial_10x10"
TWINLOOP = str(Path(sys.executable).with_name("twinloop"))
T0 = 1_700_000_000_000_000_000
CAMERA = "wrist_camera"


# ----------------------------------------------------------------------------- base inputs

@dataclass
class Base:
    """Good inputs, made once; runs copy what they need into their own folder."""
    root: Path
    bag: Path        # identification session, split fit, 1 s, joint states + commands + camera
    twins: Path      # a twins root holding emulated/v0
    share: Path      # config/ and urdf/ as TWINLOOP_SHARE
    policy: Path     # a policy folder that exists (its content is never read)
    bags: dict[str, Path] = field(default_factory=dict)  # bags written differently: states none | empty | nan ...


def write_session_bag(path: Path, *, seconds: float = 1.0, states: str = "ok", split: str = "fit",
                      chunk_size: int = 16 << 10) -> Path:
    """A recorder-like bag: /joint_states at 500 Hz (states: ok | none | empty | nan),
    /joint_command at 250 Hz, a small camera stream with its camera_info, a session."""
    from rosbags.typesys import Stores, get_typestore

    from twinloop_logging.bag_writer import BagWriter
    from twinloop_logging.session import SESSION_KEY, new_session
    from twinloop_logging.typedefs import TypeResolver
    from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS
    from twinloop_twin.workcell import load_workcell

    store = get_typestore(Stores.ROS2_KILTED)
    t = store.types
    session = new_session("identification", split, session_id=path.name, robot="emulated_panda",
                          profile="identification")
    writer = BagWriter(path, chunk_size=chunk_size, file_metadata={SESSION_KEY: {"json": session.to_json()}})
    writer.custom_data[SESSION_KEY] = session.to_json()
    resolver = TypeResolver()
    types = {"/joint_command": "sensor_msgs/msg/JointState", f"/{CAMERA}/color/image_raw": "sensor_msgs/msg/Image",
             f"/{CAMERA}/color/camera_info": "sensor_msgs/msg/CameraInfo"}
    if states != "none":
        types["/joint_states"] = "sensor_msgs/msg/JointState"
    for topic, msgtype in types.items():
        writer.add_topic(topic, resolver.definition(msgtype))

    def header(stamp: int, frame: str = ""):
        return t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=stamp // 10**9,
                                                                               nanosec=stamp % 10**9), frame_id=frame)

    def write(topic: str, msg, stamp: int) -> None:
        writer.write(topic, bytes(store.serialize_cdr(msg, types[topic])), stamp)

    home = load_workcell().home_joint_positions
    q0 = np.array([home[j] for j in ALL_JOINTS])
    k = np.array([60.0, 0.0, 16.0, 0.0, 60.0, 12.0, 0.0, 0.0, 1.0])
    for i in range(int(seconds * 500)):
        stamp = T0 + i * 2_000_000
        q = q0.copy()
        q[0] += 0.05 * math.sin(2 * math.pi * 0.5 * i * 0.002)
        if i % 2 == 0:
            write("/joint_command", t["sensor_msgs/msg/JointState"](
                header=header(stamp), name=list(ARM_JOINTS), position=q[:7].copy(), velocity=np.zeros(0),
                effort=np.zeros(0)), stamp)
        if states in ("ok", "nan"):
            position = np.full(len(q), np.nan) if states == "nan" else q
            write("/joint_states", t["sensor_msgs/msg/JointState"](
                header=header(stamp + 500_000), name=list(ALL_JOINTS), position=position, velocity=np.zeros(len(q)),
                effort=np.zeros(len(q))), stamp + 1_000_000)
        if i % 50 == 0:  # 10 Hz, 32x24 pixels: no target in view
            frame = f"{CAMERA}_color_optical_frame"
            write(f"/{CAMERA}/color/camera_info", t["sensor_msgs/msg/CameraInfo"](
                header=header(stamp, frame), height=24, width=32, distortion_model="plumb_bob", d=np.zeros(5), k=k,
                r=np.eye(3).ravel(), p=np.zeros(12), binning_x=0, binning_y=0,
                roi=t["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0, width=0,
                                                          do_rectify=False)), stamp)
            write(f"/{CAMERA}/color/image_raw", t["sensor_msgs/msg/Image"](
                header=header(stamp, frame), height=24, width=32, encoding="rgb8", is_bigendian=0, step=96,
                data=np.full(24 * 96, 128, dtype=np.uint8)), stamp)
    writer.close()
    return path


def make_base(root: Path) -> Base:
    from twinloop_twin.nominal import build_nominal_twin

    root.mkdir(parents=True, exist_ok=True)
    twins = root / "twins"
    build_nominal_twin(twins, "emulated")
    share = root / "share"
    for folder in ("config", "urdf"):
        shutil.copytree(ROOT / folder, share / folder)
    policy = root / "policy"
    policy.mkdir()
    (policy / "policy.yaml").write_text("format: twinloop-policy/1\nname: trained_push\n")
    (policy / "policy.pt").write_bytes(b"a trained module")
    bags = {states: write_session_bag(root / f"bag_states_{states}", states=states)
            for states in ("none", "empty", "nan")}
    bags["held_out"] = write_session_bag(root / "bag_held_out", split="held_out")
    return Base(root, write_session_bag(root / "bag"), twins, share, policy, bags)


def copy_into(source: Path, target: Path) -> Path:
    """A writable copy (the shared data is read-only)."""
    if source.is_dir():
        shutil.copytree(source, target)
        for path in [target, *target.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    else:
        shutil.copy(source, target)
        target.chmod(0o644)
    return target


# ----------------------------------------------------------------------------- bad bags

def _mcap(bag: Path) -> Path:
    return next(bag.glob("*.mcap"))


def _set_metadata(bag: Path, change: Callable[[dict], None]) -> None:
    path = bag / "metadata.yaml"
    raw = yaml.safe_load(path.read_text())
    change(raw["rosbag2_bagfile_information"])
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def _overwrite_chunk(bag: Path) -> None:
    from mcap.reader import make_reader
    path = _mcap(bag)
    with open(path, "rb") as stream:
        chunks = make_reader(stream).get_summary().chunk_indexes
    chunk = chunks[len(chunks) // 2]
    data = bytearray(path.read_bytes())
    middle = chunk.chunk_start_offset + chunk.chunk_length // 2
    data[middle:middle + 64] = b"\xaa" * 64
    path.write_bytes(bytes(data))


def _unrelated_mcaps(folder: Path) -> None:
    """Two bags' files side by side, no metadata.yaml, and a text file named .mcap."""
    folder.mkdir()
    for name in ("morning", "evening"):
        bag = write_session_bag(folder.parent / f"src_{name}", seconds=0.2)
        shutil.move(_mcap(bag), folder / f"{name}.mcap")
        shutil.rmtree(bag)
    (folder / "notes.mcap").write_text("operator notes, not a recording\n")


BAD_BAGS: dict[str, tuple[Callable[[Base, Path], Path], bool]] = {
    # name: (make it in the run folder, whether the bag itself is damaged)
    "truncated": (lambda b, d: _cut(copy_into(b.bag, d / "bag"), 0.6), True),
    "chunk_overwritten": (lambda b, d: _do(copy_into(b.bag, d / "bag"), _overwrite_chunk), True),
    "zero_bytes": (lambda b, d: _do(copy_into(b.bag, d / "bag"), lambda p: _mcap(p).write_bytes(b"")), True),
    "not_mcap": (lambda b, d: _do(copy_into(b.bag, d / "bag"), lambda p: _mcap(p).write_text("hello\n" * 50)), True),
    "metadata_not_yaml": (lambda b, d: _do(copy_into(b.bag, d / "bag"),
                                           lambda p: (p / "metadata.yaml").write_text("rosbag2: [unclosed\n")), True),
    "metadata_count_99999": (lambda b, d: _do(copy_into(b.bag, d / "bag"), lambda p: _set_metadata(
        p, lambda m: m.__setitem__("message_count", 99999))), True),
    "metadata_missing": (lambda b, d: _do(copy_into(b.bag, d / "bag"), lambda p: (p / "metadata.yaml").unlink()),
                         True),
    "metadata_wrong_type": (lambda b, d: _do(copy_into(b.bag, d / "bag"), lambda p: _set_metadata(
        p, lambda m: m.__setitem__("message_count", "many"))), True),
    "metadata_lists_missing_file": (lambda b, d: _do(copy_into(b.bag, d / "bag"), lambda p: _set_metadata(
        p, lambda m: m["relative_file_paths"].append("bag_1.mcap"))), True),
    "session_not_json": (lambda b, d: _do(copy_into(b.bag, d / "bag"), lambda p: _set_metadata(
        p, lambda m: m["custom_data"].__setitem__("twinloop.session", "{purpose: fit"))), True),
    "no_joint_states_topic": (lambda b, d: copy_into(b.bags["none"], d / "bag"), False),
    "empty_joint_states": (lambda b, d: copy_into(b.bags["empty"], d / "bag"), False),
    "nan_joint_states": (lambda b, d: copy_into(b.bags["nan"], d / "bag"), False),
    "held_out_as_fit": (lambda b, d: copy_into(b.bags["held_out"], d / "bag"), False),
    "text_file": (lambda b, d: _do(d / "notes.txt", lambda p: p.write_text("not a bag\n")), True),
    "no_such_path": (lambda b, d: d / "nothing_here", True),
    "unrelated_mcaps": (lambda b, d: _do(d / "loose", _unrelated_mcaps), True),
}


def _do(path: Path, action: Callable[[Path], None]) -> Path:
    action(path)
    return path


def _cut(bag: Path, fraction: float) -> Path:
    path = _mcap(bag)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * fraction)])
    return bag


# ----------------------------------------------------------------------------- bad configs

def _numeric_leaf(node, trail=()):
    """Trail of keys to the first number (not bool) in a YAML document, depth first."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return trail + (key,)
        found = _numeric_leaf(value, trail + (key,))
        if found:
            return found
    return None


def spoil_yaml(path: Path, how: str) -> None:
    """NaN / inf / a string where the first number is, an unknown key beside it, not YAML, empty."""
    if how == "not_yaml":
        path.write_text("key: [unclosed\n  - {\n")
        return
    if how == "empty":
        path.write_text("")
        return
    raw = yaml.safe_load(path.read_text())
    trail = _numeric_leaf(raw)
    parent = raw
    for key in trail[:-1]:
        parent = parent[key]
    if how == "unknown_key":
        if isinstance(parent, dict):
            parent["unexpected_key"] = 1.0
        else:
            raw["unexpected_key"] = 1.0
    else:
        parent[trail[-1]] = {"nan": math.nan, "inf": math.inf, "wrong_type": "three"}[how]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


CONFIG_SPOILS = ("nan", "inf", "wrong_type", "unknown_key", "not_yaml", "empty")
# config file -> the commands that read it (argv; {bag}, {out} filled per run)
CONFIG_READERS: dict[str, dict[str, list[str]]] = {
    "workcell.yaml": {"calibrate": ["calibrate", "--bag", "{bag}", "--bootstrap", "0"],
                      "policy": ["policy", "scripted", "{out}/policy"],
                      "build_nominal": ["twin", "build-nominal", "--root", "{out}/twins"]},
    "calibration_targets.yaml": {"calibrate": ["calibrate", "--bag", "{bag}", "--bootstrap", "0"]},
    "nominal_physics.yaml": {"build_nominal": ["twin", "build-nominal", "--root", "{out}/twins"]},
    "excitation.yaml": {"excite": ["build", "excite", "--split", "fit"]},
}


# ----------------------------------------------------------------------------- bad data sets

def _dataset(base: Base, work: Path, change: Callable[[dict], None] | None = None,
             pose: Callable[[Path], None] | None = None) -> Path:
    """cal_data.yaml and poses/ of the real data set in `work` (images read where they are)."""
    folder = work / "dataset"
    folder.mkdir()
    copy_into(HANDEYE / "poses", folder / "poses")
    raw = yaml.safe_load((HANDEYE / "cal_data.yaml").read_text())
    for entry in raw["data"]:
        entry["image"] = str(HANDEYE / entry["image"])
    if change:
        change(raw)
    (folder / "cal_data.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    if pose:
        pose(folder / "poses" / "0.yaml")
    return folder / "cal_data.yaml"


def _pose_line(key: str, value: str) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        lines = [f"{key}: {value}" if line.startswith(f"{key}:") else line for line in path.read_text().splitlines()]
        path.write_text("\n".join(line for line in lines if not line.endswith(": DROP")) + "\n")
    return change


BAD_DATASETS: dict[str, tuple[Callable[[dict], None] | None, Callable[[Path], None] | None]] = {
    "no_intrinsics": (lambda r: r.pop("intrinsics"), None),
    "intrinsics_without_fx": (lambda r: r["intrinsics"].pop("fx"), None),
    "fx_nan": (lambda r: r["intrinsics"].__setitem__("fx", math.nan), None),
    "fx_inf": (lambda r: r["intrinsics"].__setitem__("fx", math.inf), None),
    "fx_wrong_type": (lambda r: r["intrinsics"].__setitem__("fx", "550 px"), None),
    "cols_wrong_type": (lambda r: r["target_finder"].__setitem__("cols", "ten"), None),
    "missing_rows": (lambda r: r["target_finder"].pop("rows"), None),
    "spacing_negative": (lambda r: r["target_finder"].__setitem__("spacing", -0.0254), None),
    "unknown_key": (lambda r: r.__setitem__("intrinsic", {"fx": 550.0}), None),
    "entry_without_image": (lambda r: r["data"][0].pop("image"), None),
    "entry_missing_image_file": (lambda r: r["data"][0].__setitem__("image", "images/none.png"), None),
    "static_camera_wrong_type": (lambda r: r.__setitem__("static_camera", "no"), None),
    "no_data": (lambda r: r.__setitem__("data", []), None),
    "pose_nan": (None, _pose_line("x", ".nan")),
    "pose_inf": (None, _pose_line("z", ".inf")),
    "pose_wrong_type": (None, _pose_line("y", "left")),
    "pose_without_qw": (None, _pose_line("qw", "DROP")),
    "pose_unknown_key": (None, lambda p: p.write_text(p.read_text() + "roll: 0.0\n")),
    "pose_not_unit_quaternion": (None, _pose_line("qw", "3.0")),
}


# ----------------------------------------------------------------------------- bad twins

def _twin(base: Base, work: Path, spoil: Callable[[Path], None]) -> Path:
    root = copy_into(base.twins, work / "twins")
    spoil(root / "emulated" / "v0")
    return root


def _set_twin_yaml(version: Path, change: Callable[[dict], None]) -> None:
    raw = yaml.safe_load((version / "twin.yaml").read_text())
    change(raw)
    (version / "twin.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def _first_parameter(raw: dict) -> dict:
    return next(iter(raw["parameters"].values()))


BAD_TWINS: dict[str, Callable[[Path], None]] = {
    "hash_mismatch": lambda v: (v / "scene.xml").write_text((v / "scene.xml").read_text() + "<!-- edited -->\n"),
    "missing_file": lambda v: (v / "scene.xml").unlink(),
    "unlisted_file": lambda v: (v / "notes.txt").write_text("edited by hand\n"),
    "parameter_nan": lambda v: _set_twin_yaml(v, lambda r: _first_parameter(r).__setitem__("mean", math.nan)),
    "parameter_wrong_type": lambda v: _set_twin_yaml(v, lambda r: _first_parameter(r).__setitem__("std", "wide")),
    "manifest_unknown_key": lambda v: _set_twin_yaml(v, lambda r: r.__setitem__("colour", "blue")),
    "manifest_not_yaml": lambda v: (v / "twin.yaml").write_text("version: [0\n"),
    "manifest_missing": lambda v: (v / "twin.yaml").unlink(),
    "folder_misnamed": lambda v: v.rename(v.with_name("v7")),
}


# ----------------------------------------------------------------------------- runs

Prepared = tuple[list[str], dict[str, str], "str | None"]  # argv, environment, folder it may write into


@dataclass(frozen=True)
class Run:
    name: str                                    # "<kind>/<input>: <command>"
    prepare: Callable[[Base, Path], Prepared]    # makes the inputs in the run's folder
    expect: int = 2
    check_after: Callable[[Path], list[str]] | None = None  # more problems to look for after the run
    says: str | None = None  # what the error line must name (the option at fault)

    @property
    def input(self) -> str:
        return self.name.split(":")[0]


@dataclass
class Outcome:
    run: Run
    code: int | None
    stdout: str
    stderr: str
    changed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def traceback(self) -> bool:
        return self.code is None or "Traceback (most recent call last)" in self.stderr

    @property
    def error_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    @property
    def clear(self) -> bool:
        """Expected exit code, no traceback, and on an error one line naming the command."""
        if self.traceback or self.code != self.run.expect:
            return False
        return self.code == 0 or (self.error_line.startswith(("twinloop ", "[")) and len(self.error_line) > 30)

    def problems(self) -> list[str]:
        out = []
        if self.traceback:
            out.append(f"traceback: {self.stderr.strip().splitlines()[-1] if self.stderr.strip() else 'none'}")
        elif self.code != self.run.expect:
            out.append(f"exit code {self.code}, expected {self.run.expect}: {self.error_line or self.stdout[-200:]}")
        elif not self.clear:
            out.append(f"unclear error line {self.error_line!r}")
        elif self.run.says is not None and self.run.says not in self.error_line:
            out.append(f"the error line does not name {self.run.says}: {self.error_line!r}")
        out += [f"changed: {c}" for c in self.changed]
        return out


def _bag_run(name: str, command: str, argv: list[str], expect: int, after=None) -> Run:
    make, _ = BAD_BAGS[name]

    def prepare(base: Base, work: Path) -> Prepared:
        bag = make(base, work)
        twins = copy_into(base.twins, work / "twins")
        filled = [a.format(bag=bag, twin=twins / "emulated" / "v0", twins=twins) for a in argv]
        return filled, {}, (bag.relative_to(work).as_posix() if command == "repair" else None)
    return Run(f"bag/{name}: {command}", prepare, expect, after)


def _repaired_bag_checks_clean(work: Path) -> list[str]:
    from twinloop_logging.integrity import check_bag
    return [f"after repair: {p}" for p in check_bag(work / "bag").problems]


# replay --report-only: a replay that succeeds writes its response under replays/ of the working directory
BAG_COMMANDS = {"info": ["bag", "info", "{bag}"], "repair": ["bag", "repair", "{bag}"],
                "replay": ["replay", "{bag}", "--twin", "{twin}", "--report-only"],
                "calibrate": ["calibrate", "--bag", "{bag}", "--bootstrap", "0"],
                "build": ["build", "build", "--fit", "{bag}", "--root", "{twins}"]}
# Exit codes that differ from 2: info reads bags that are whole but useless to a stage;
# repair recovers damaged bags and leaves whole ones alone; replay does not need metadata counts.
BAG_EXPECT = {
    ("truncated", "repair"): 0, ("chunk_overwritten", "repair"): 0, ("metadata_not_yaml", "repair"): 0,
    ("metadata_count_99999", "repair"): 0, ("metadata_count_99999", "replay"): 0,
    ("metadata_missing", "repair"): 0, ("metadata_wrong_type", "repair"): 0,
    ("metadata_lists_missing_file", "repair"): 0, ("session_not_json", "repair"): 0,
    **{(name, command): 0 for name in ("no_joint_states_topic", "empty_joint_states", "nan_joint_states",
                                       "held_out_as_fit") for command in ("info", "repair")},
    ("held_out_as_fit", "replay"): 0,
}


def bag_runs() -> list[Run]:
    runs = []
    for name in BAD_BAGS:
        for command, argv in BAG_COMMANDS.items():
            expect = BAG_EXPECT.get((name, command), 2)
            after = _repaired_bag_checks_clean if command == "repair" and expect == 0 else None
            runs.append(_bag_run(name, command, argv, expect, after))
    return runs


def config_runs() -> list[Run]:
    runs = []
    for file, readers in CONFIG_READERS.items():
        for how in CONFIG_SPOILS:
            for command, argv in readers.items():
                def prepare(base: Base, work: Path, file=file, how=how, argv=argv) -> Prepared:
                    share = copy_into(base.share, work / "share")
                    spoil_yaml(share / "config" / file, how)
                    bag = copy_into(base.bag, work / "bag")
                    (work / "out").mkdir()
                    return [a.format(bag=bag, out=work / "out") for a in argv], {"TWINLOOP_SHARE": str(share)}, None
                runs.append(Run(f"config/{file}/{how}: {command}", prepare))
    return runs


def excitation_file_runs() -> list[Run]:
    """--config files of `twinloop build excite` (beyond the spoils of config_runs)."""
    def spoil(change: Callable[[dict], None]):
        def prepare(base: Base, work: Path) -> Prepared:
            raw = yaml.safe_load((base.share / "config" / "excitation.yaml").read_text())
            change(raw)
            (work / "excitation.yaml").write_text(yaml.safe_dump(raw))
            return ["build", "excite", "--split", "fit", "--config", str(work / "excitation.yaml")], {}, None
        return prepare
    changes = {
        "amplitude_nan": lambda r: r["joints"]["amplitude"].__setitem__("panda_joint3", math.nan),
        "amplitude_wrong_type": lambda r: r["joints"]["amplitude"].__setitem__("panda_joint3", "big"),
        "duration_wrong_type": lambda r: r["joints"].__setitem__("duration_s", "long"),
        "band_wrong_shape": lambda r: r["joints"].__setitem__("band_hz", [0.1, 0.5, 1.0]),
        "push_speed_inf": lambda r: r["pushes"][0].__setitem__("speed_m_s", math.inf),
        "push_unknown_key": lambda r: r["pushes"][0].__setitem__("force_n", 3.0),
        "joints_not_a_mapping": lambda r: r.__setitem__("joints", [0.4, 0.4]),
        "unknown_joint": lambda r: r["joints"]["amplitude"].__setitem__("panda_joint9", 0.1),
    }
    return [Run(f"excitation/{name}: excite", spoil(change)) for name, change in changes.items()]


def dataset_runs() -> list[Run]:
    def prepare_for(change, pose):
        def prepare(base: Base, work: Path) -> Prepared:
            return ["calibrate", "--dataset", str(_dataset(base, work, change, pose)), "--bootstrap", "0"], {}, None
        return prepare
    return [Run(f"dataset/{name}: calibrate", prepare_for(*spoils)) for name, spoils in BAD_DATASETS.items()]


def twin_runs() -> list[Run]:
    commands = {"verify": ["twin", "verify", "{twin}"], "show": ["twin", "show", "{twin}"],
                "export_usd": ["twin", "export-usd", "{twin}", "{work}/scene.usda"],
                "replay": ["replay", "{bag}", "--twin", "{twin}", "--report-only"],
                "build": ["build", "build", "--fit", "{bag}", "--root", "{twins}"]}
    runs = []
    for name, spoil in BAD_TWINS.items():
        for command, argv in commands.items():
            def prepare(base: Base, work: Path, spoil=spoil, argv=argv, name=name) -> Prepared:
                twins = _twin(base, work, spoil)
                twin = twins / "emulated" / ("v7" if name == "folder_misnamed" else "v0")
                bag = copy_into(base.bag, work / "bag")
                return [a.format(twin=twin, twins=twins, bag=bag, work=work) for a in argv], {}, None
            runs.append(Run(f"twin/{name}: {command}", prepare))
    return runs


def option_runs() -> list[Run]:
    """Out-of-range options and outputs that exist already."""
    def simple(argv: list[str], setup: Callable[[Base, Path], None] | None = None):
        def prepare(base: Base, work: Path) -> Prepared:
            if setup:
                setup(base, work)
            twins = copy_into(base.twins, work / "twins") if any("{twin" in a for a in argv) else None
            bag = copy_into(base.bag, work / "bag") if any("{bag}" in a for a in argv) else None
            env = {}
            if argv[:2] in (["bag", "record"], ["build", "excite"]):
                # should the options be accepted after all, the recorder it starts (the
                # services excite calls) stay on this host, on a domain of its own
                from twinloop_ros.process import fresh_domain_id
                env = {"ROS_DOMAIN_ID": str(fresh_domain_id()), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
            return [a.format(work=work, twin=twins and twins / "emulated" / "v0", twins=twins, bag=bag)
                    for a in argv], env, None
        return prepare

    def existing_policy(base: Base, work: Path) -> None:
        copy_into(base.policy, work / "policy")

    def existing_file(name: str):
        return lambda base, work: (work / name).write_text("keep me\n")

    def existing_response(base: Base, work: Path) -> None:
        (work / "replays" / "bag-replay-v0").mkdir(parents=True)
        (work / "replays" / "bag-replay-v0" / "metadata.yaml").write_text("an earlier response\n")

    def truth_with(offsets: str):
        def setup(base: Base, work: Path) -> None:
            from twinloop_twin.workcell import default_config_dir
            text = (default_config_dir() / "emulated_truth.yaml").read_text()
            (work / "truth.yaml").write_text(text + "unmodelled:\n  camera_offsets:\n" + offsets)
        return setup

    unknown_camera = truth_with("    thermal_camera: {xyz_m: [0.01, 0, 0], rpy_deg: [0, 0, 0]}\n")
    two_angles = truth_with("    static_camera: {xyz_m: [0.01, 0, 0], rpy_deg: [1.0, -0.8]}\n")
    goal = ["--goal", "0", "0", "0", "-2", "0", "2", "nan"]
    cases = {
        "policy_rate_zero": (["policy", "scripted", "{work}/p", "--rate", "0"], None),
        "policy_rate_nan": (["policy", "scripted", "{work}/p", "--rate", "nan"], None),
        "policy_rate_inf": (["policy", "scripted", "{work}/p", "--rate", "inf"], None),
        "policy_timeout_negative": (["policy", "scripted", "{work}/p", "--timeout", "-1"], None),
        "policy_goal_nan": (["policy", "scripted", "{work}/p", *goal], None),
        "policy_existing_folder": (["policy", "scripted", "{work}/policy"], existing_policy),
        "policy_existing_file": (["policy", "scripted", "{work}/taken"], existing_file("taken")),
        "policy_under_a_file": (["policy", "scripted", "{work}/taken/p"], existing_file("taken")),
        # --duration 2: accepted by mistake, they record 2 s and fail the run instead of recording on
        "record_split_duration_nan": (["bag", "record", "calibration", "--output-dir", "{work}/bags",
                                       "--split-duration", "nan", "--duration", "2"], None),
        "record_split_size_negative": (["bag", "record", "calibration", "--output-dir", "{work}/bags",
                                        "--split-size", "-5", "--duration", "2"], None),
        "record_duration_inf": (["bag", "record", "calibration", "--output-dir", "{work}/bags", "--duration",
                                 "inf"], None),  # bench only: accepted by mistake it records until stopped
        "replay_existing_response": (["replay", "{bag}", "--twin", "{twin}", "--output-dir", "{work}/replays"],
                                     existing_response),
        "export_usd_existing_file": (["twin", "export-usd", "{twin}", "{work}/taken.usda"],
                                     existing_file("taken.usda")),
        "export_usd_missing_folder": (["twin", "export-usd", "{twin}", "{work}/nowhere/scene.usda"], None),
        "calibrate_existing_output": (["calibrate", "--dataset", str(HANDEYE / "cal_data.yaml"), "--output",
                                       "{work}/taken.yaml"], existing_file("taken.yaml")),
        "calibrate_bootstrap_negative": (["calibrate", "--dataset", str(HANDEYE / "cal_data.yaml"), "--bootstrap",
                                          "-1"], None),
        "calibrate_std_nan": (["calibrate", "--dataset", str(HANDEYE / "cal_data.yaml"),
                               "--max-translation-std-m", "nan"], None),
        "twin_list_missing_root": (["twin", "list", "--root", "{work}/no_twins"], None),
        # refused before any node starts
        "bringup_envelope_missing": (["bringup", "--envelope", "{work}/nowhere.yaml", "--log-dir", "{work}/log"],
                                     None),
        "bringup_envelope_not_an_envelope": (["bringup", "--envelope", "{work}/taken.yaml", "--log-dir",
                                              "{work}/log"], existing_file("taken.yaml")),
        "bringup_tracker_calibration_missing": (["bringup", "--tracker-calibration", "{work}/nowhere.yaml",
                                                 "--log-dir", "{work}/log"], None),
        "bringup_tracker_calibration_not_one": (["bringup", "--tracker-calibration", "{work}/taken.yaml",
                                                 "--log-dir", "{work}/log"], existing_file("taken.yaml")),
        "bringup_truth_unknown_camera": (["bringup", "--truth-file", "{work}/truth.yaml", "--log-dir", "{work}/log"],
                                         unknown_camera),
        "bringup_truth_two_angles": (["bringup", "--truth-file", "{work}/truth.yaml", "--log-dir", "{work}/log"],
                                     two_angles),
        "loop_truth_unknown_camera": (["loop", "--quick", "--truth-file", "{work}/truth.yaml", "--run-dir",
                                       "{work}/run"], unknown_camera),
        # --monitor '': accepted by mistake, excite waits for a recorder that is not there and exits 3
        "excite_lead_in_nan": (["build", "excite", "--split", "fit", "--lead-in", "nan", "--monitor", ""], None),
        "excite_lead_in_negative": (["build", "excite", "--split", "fit", "--lead-in", "-1", "--monitor", ""], None),
        "excite_duration_zero": (["build", "excite", "--split", "fit", "--duration", "0", "--monitor", ""], None),
        "build_max_iterations_zero": (["build", "build", "--fit", "{bag}", "--root", "{twins}", "--max-iterations",
                                       "0"], None),
        "build_max_iterations_negative": (["build", "build", "--fit", "{bag}", "--root", "{twins}",
                                           "--max-iterations", "-2"], None),
    }
    # the option a run spoils, where another error could hide it (a build from the corpus's
    # 1 s bag fails for its length whatever --max-iterations says)
    says = {name: f"argument {option}:" for name, option in (
        ("excite_lead_in_nan", "--lead-in"), ("excite_lead_in_negative", "--lead-in"),
        ("excite_duration_zero", "--duration"), ("build_max_iterations_zero", "--max-iterations"),
        ("build_max_iterations_negative", "--max-iterations"))}
    says.update({"bringup_truth_unknown_camera": "names thermal_camera, not a camera of the workcell",
                 "bringup_truth_two_angles": "rpy_deg' must be a list of 3 numbers",
                 "loop_truth_unknown_camera": "names thermal_camera, not a camera of the workcell"})
    return [Run(f"option/{name}: {argv[0]}", simple(argv, setup), says=says.get(name))
            for name, (argv, setup) in cases.items()]


def corpus() -> list[Run]:
    return bag_runs() + config_runs() + excitation_file_runs() + dataset_runs() + twin_runs() + option_runs()


# The selection `make test` runs: every bad input against its main consumer, and every
# defect the issue lists against the command it was found with.
CORE_BAG_COMMANDS = {"info", "repair", "replay"}
CORE_EXTRA = {"bag/chunk_overwritten: calibrate", "bag/chunk_overwritten: build", "bag/empty_joint_states: calibrate",
              "bag/text_file: calibrate", "bag/nan_joint_states: build", "config/workcell.yaml/nan: calibrate",
              "config/workcell.yaml/wrong_type: policy", "config/nominal_physics.yaml/unknown_key: build_nominal",
              "twin/hash_mismatch: replay", "twin/hash_mismatch: build", "twin/parameter_nan: export_usd"}


def core(runs: list[Run]) -> list[Run]:
    def wanted(run: Run) -> bool:
        kind = run.name.split("/")[0]
        command = run.name.rsplit(": ", 1)[1]
        if run.name in CORE_EXTRA:
            return True
        if kind == "bag":
            return command in CORE_BAG_COMMANDS
        if kind == "config":
            return run.name.endswith(tuple(f"{how}: {c}" for how in CONFIG_SPOILS for c in ("calibrate", "excite",
                                                                                              "build_nominal")))
        if kind == "twin":
            return command in ("verify", "export_usd")
        return run.name != "option/record_duration_inf: bag"
    return [run for run in runs if wanted(run)]


# ----------------------------------------------------------------------------- running

def snapshot(folder: Path) -> dict[str, str]:
    """Every file's sha256 and every folder, by path relative to `folder`."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            out[rel] = "<folder>"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def changes(before: dict[str, str], after: dict[str, str], writable: str | None) -> list[str]:
    """What changed that should not have. Inside `writable` (the bag a repair works on)
    files may be added or renamed, but every original file's bytes must still be there."""
    def inside(path: str) -> bool:
        return writable is not None and (path == writable or path.startswith(writable + "/"))
    out = [f"{path} {'added' if path not in before else 'removed' if path not in after else 'changed'}"
           for path in sorted(set(before) | set(after)) if not inside(path) and before.get(path) != after.get(path)]
    kept = {digest for path, digest in after.items() if inside(path)}
    out += [f"{path}: its bytes are gone" for path, digest in before.items()
            if inside(path) and digest != "<folder>" and digest not in kept]
    return out


def run_in_process(argv: list[str], env: dict[str, str]) -> tuple[int | None, str, str]:
    from twinloop_bringup.cli import main
    out, err = io.StringIO(), io.StringIO()
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse's own errors
                code = exit_.code if isinstance(exit_.code, int) else 1
            except Exception:  # noqa: BLE001 - what the corpus looks for
                traceback.print_exc()
                code = None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return code, out.getvalue(), err.getvalue()


def run_subprocess(argv: list[str], env: dict[str, str]) -> tuple[int | None, str, str]:
    done = subprocess.run([TWINLOOP, *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", **env})
    return done.returncode, done.stdout, done.stderr


def execute(run: Run, base: Base, work: Path, *, in_process: bool = True) -> Outcome:
    work.mkdir(parents=True)
    argv, env, writable = run.prepare(base, work)
    before = snapshot(work)
    started = time.monotonic()
    code, stdout, stderr = (run_in_process if in_process else run_subprocess)(argv, env)
    outcome = Outcome(run, code, stdout, stderr, seconds=time.monotonic() - started)
    outcome.changed = changes(before, snapshot(work), writable if code == 0 == run.expect else None)
    if code == run.expect and run.check_after is not None:
        outcome.changed += run.check_after(work)
    return outcome


# ----------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    made = make_base(tmp_path_factory.mktemp("base"))
    before = snapshot(made.root)
    yield made
    assert snapshot(made.root) == before, "a run changed the shared good inputs it copied from"


CORE = core(corpus())


@pytest.mark.parametrize("run", CORE, ids=[run.name for run in CORE])
def test_bad_input_gives_one_clear_line_and_changes_nothing(run, base, tmp_path):
    outcome = execute(run, base, tmp_path / "run")
    assert outcome.problems() == [], f"{run.name}\nstderr: {outcome.stderr[-2000:]}"


# As real `twinloop` processes: the exit code and stderr a user sees, end to end.
END_TO_END = ["bag/chunk_overwritten: replay", "bag/chunk_overwritten: info", "bag/unrelated_mcaps: repair",
              "dataset/no_intrinsics: calibrate", "option/policy_rate_zero: policy",
              "option/record_split_duration_nan: bag", "config/workcell.yaml/nan: calibrate",
              "twin/hash_mismatch: verify"]


@pytest.mark.parametrize("name", END_TO_END)
def test_end_to_end_exit_code_and_one_line(name, base, tmp_path):
    (run,) = [r for r in corpus() if r.name == name]
    outcome = execute(run, base, tmp_path / "run", in_process=False)
    assert outcome.problems() == [], f"{name}\nstderr: {outcome.stderr[-2000:]}"
    # the error is the last line; nothing before it on stderr but progress lines
    assert outcome.error_line.startswith("twinloop"), outcome.stderr


def test_corpus_covers_every_command_and_kind_of_bad_input():
    runs = corpus()
    names = {r.name for r in runs}
    assert len(runs) >= 180 and len(CORE) >= 90
    commands = {tuple(r.name.rsplit(": ", 1)[1:]) for r in runs}
    for command in ("info", "repair", "replay", "calibrate", "build", "excite", "policy", "verify", "show",
                    "export_usd", "build_nominal", "bag", "twin"):
        assert (command,) in commands, command
    assert all(name in names for name in END_TO_END + sorted(CORE_EXTRA))
    # the change detector sees what the runs must not do
    before = {"a": "1", "b": "<folder>", "b/c": "2"}
    assert changes(before, before, None) == []
    assert changes(before, {**before, "d": "<folder>"}, None) == ["d added"]
    assert changes(before, {"a": "1", "b": "<folder>", "b/c.damaged": "2", "b/c": "3"}, "b") == []
    assert changes(before, {"a": "1", "b": "<folder>", "b/c": "3"}, "b") == ["b/c: its bytes are gone"]
