"""The workcell description: robot URDF + workcell URDF + what a URDF cannot hold.

Pure Python (no rclpy). Transforms live only in ``urdf/workcell.urdf`` and the Panda URDF
of ``example-robot-data``; ``config/workcell.yaml`` holds camera intrinsics, the ChArUco
pattern, the nominal box pose, the table height (cross-checked against the URDF) and the
robot's home configuration.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import sysconfig
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS

EXAMPLE_ROBOT_DATA_ENV = "TWINLOOP_EXAMPLE_ROBOT_DATA"
SHARE_ENV = "TWINLOOP_SHARE"
EXAMPLE_ROBOT_DATA_PACKAGE = "example-robot-data"
PANDA_URDF_RELPATH = Path("robots/panda_description/urdf/panda.urdf")
INSTALL_HINT = "install it with `pip install example-robot-data` (or `apt install ros-$ROS_DISTRO-example-robot-data`)"

_PACKAGE_SCHEME = "package://"


class ExampleRobotDataMissing(FileNotFoundError):
    """The example-robot-data package (Panda URDF and meshes) cannot be found."""


class WorkcellConfigError(ValueError):
    """config/workcell.yaml or urdf/workcell.urdf is malformed or inconsistent."""


# ---------------------------------------------------------------------------------------
# Locating installed assets
# ---------------------------------------------------------------------------------------

def _candidate_prefixes() -> list[Path]:
    """Install prefixes where `share/example-robot-data` may live, most specific first."""
    prefixes: list[Path] = []
    # pip wheels (cmeel) install under <site-packages>/cmeel.prefix
    for key in ("purelib", "platlib"):
        prefixes.append(Path(sysconfig.get_paths()[key]) / "cmeel.prefix")
    prefixes.extend(Path(p) / "cmeel.prefix" for p in sys.path if p.endswith("site-packages"))
    # a sourced ROS 2 workspace or /opt/ros/<distro>
    for entry in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if entry:
            prefixes.append(Path(entry))
    return prefixes


def _ament_index_share() -> Path | None:
    if importlib.util.find_spec("ament_index_python") is None:
        return None
    from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
    try:
        return Path(get_package_share_directory(EXAMPLE_ROBOT_DATA_PACKAGE))
    except (PackageNotFoundError, ValueError, LookupError):
        return None


def find_example_robot_data() -> Path:
    """Return the `share/example-robot-data` directory holding the Panda URDF and meshes.

    ``$TWINLOOP_EXAMPLE_ROBOT_DATA`` overrides the search (and is then the only place looked at).
    """
    override = os.environ.get(EXAMPLE_ROBOT_DATA_ENV)
    if override:
        candidates = [Path(override)]
    else:
        candidates = [prefix / "share" / EXAMPLE_ROBOT_DATA_PACKAGE for prefix in _candidate_prefixes()]
        ament_share = _ament_index_share()
        if ament_share is not None:
            candidates.append(ament_share)
    for candidate in candidates:
        if (candidate / PANDA_URDF_RELPATH).is_file():
            return candidate.resolve()
    where = (f"${EXAMPLE_ROBOT_DATA_ENV}={override}" if override
             else ", ".join(str(c) for c in dict.fromkeys(candidates)) or "(no prefixes)")
    raise ExampleRobotDataMissing(
        f"example-robot-data (Franka Panda URDF '{PANDA_URDF_RELPATH}') not found; looked in: {where}. "
        f"To fix: {INSTALL_HINT}"
        + (f", or unset {EXAMPLE_ROBOT_DATA_ENV} / point it at a `share/example-robot-data` directory."
           if override else ", or set AMENT_PREFIX_PATH to a prefix that contains share/example-robot-data.")
    )


def panda_urdf_path() -> Path:
    return find_example_robot_data() / PANDA_URDF_RELPATH


def resolve_package_uri(uri: str, package_shares: Mapping[str, Path] | None = None) -> Path:
    """`package://<pkg>/<rel>` -> absolute path. Plain paths and `file://` pass through."""
    if uri.startswith("file://"):
        return Path(uri[len("file://"):])
    if not uri.startswith(_PACKAGE_SCHEME):
        return Path(uri)
    package, _, relative = uri[len(_PACKAGE_SCHEME):].partition("/")
    shares = dict(package_shares or {})
    if package not in shares:
        if package != EXAMPLE_ROBOT_DATA_PACKAGE:
            raise FileNotFoundError(
                f"cannot resolve '{uri}': only '{EXAMPLE_ROBOT_DATA_PACKAGE}' is known; pass its share "
                "directory in package_shares")
        shares[package] = find_example_robot_data()
    return shares[package] / relative


def _repo_share_root() -> Path | None:
    """The repository root when running from the source tree (src/twinloop_twin/twinloop_twin/)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "urdf" / "workcell.urdf").is_file() else None


def _installed_share_root() -> Path | None:
    """share/twinloop_sim of a colcon install, which carries config/ and urdf/."""
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
    except ImportError:
        return None
    try:
        share = Path(get_package_share_directory("twinloop_sim"))
    except PackageNotFoundError:
        return None
    return share if (share / "urdf" / "workcell.urdf").is_file() else None


def _share_root() -> Path:
    share = os.environ.get(SHARE_ENV)
    if share:
        return Path(share)
    root = _repo_share_root() or _installed_share_root()
    if root is None:
        raise FileNotFoundError(
            f"cannot find twinloop's config/ and urdf/: not running from the source tree and ${SHARE_ENV} "
            "is unset. Set it to the installed share directory (the one holding config/ and urdf/).")
    return root


def default_config_dir() -> Path:
    return _share_root() / "config"


def default_urdf_path() -> Path:
    return _share_root() / "urdf" / "workcell.urdf"


# ---------------------------------------------------------------------------------------
# URDF composition
# ---------------------------------------------------------------------------------------

def compose_workcell_urdf(workcell_urdf: Path | str, robot_urdf: Path | str | None = None,
                          *, name: str = "twinloop_workcell") -> str:
    """Merge the Panda URDF into the workcell URDF: one tree rooted at `world`.

    `package://` URIs are kept so the string can be published on /robot_description.
    """
    robot_path = Path(robot_urdf) if robot_urdf is not None else panda_urdf_path()
    workcell_root = _parse_urdf(Path(workcell_urdf))
    robot_root = _parse_urdf(robot_path)
    composed = ET.Element("robot", {"name": name})
    names: dict[str, str] = {}
    for source, root in ((robot_path, robot_root), (Path(workcell_urdf), workcell_root)):
        for element in root:
            if not isinstance(element.tag, str):
                continue  # comments
            key = f"{element.tag}:{element.get('name')}"
            if element.tag in ("link", "joint") and key in names:
                raise WorkcellConfigError(
                    f"{element.tag} '{element.get('name')}' is defined in both {names[key]} and {source}; "
                    "rename it in the workcell URDF.")
            if element.tag == "material" and key in names:
                continue  # a shared material name is fine; the first definition wins
            names[key] = str(source)
            composed.append(element)
    _check_single_tree(composed, Path(workcell_urdf))
    ET.indent(composed)
    return '<?xml version="1.0"?>\n' + ET.tostring(composed, encoding="unicode") + "\n"


def _parse_urdf(path: Path) -> ET.Element:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as error:
        raise WorkcellConfigError(f"cannot read URDF {path}: {error}") from error
    if root.tag != "robot":
        raise WorkcellConfigError(f"{path}: root element is <{root.tag}>, expected <robot>")
    return root


def _check_single_tree(robot: ET.Element, workcell_urdf: Path) -> None:
    links = {link.get("name") for link in robot.findall("link")}
    children = {joint.find("child").get("link") for joint in robot.findall("joint")}
    roots = links - children
    if roots != {"world"}:
        raise WorkcellConfigError(
            f"the composed URDF must have exactly one root link 'world', found {sorted(roots)}; "
            f"check the fixed joints in {workcell_urdf} (e.g. world -> panda_link0).")


def urdf_for_mujoco(urdf_xml: str) -> str:
    """URDF with absolute mesh paths and STL visuals (MuJoCo cannot read .dae).

    The Panda's collision STLs stand in for its visual COLLADA meshes.
    """
    root = ET.fromstring(urdf_xml)
    for mesh in root.iter("mesh"):
        uri = mesh.get("filename", "")
        if uri.endswith(".dae"):
            uri = uri.replace("/meshes/visual/", "/meshes/collision/")[: -len(".dae")] + ".stl"
        path = resolve_package_uri(uri)
        if not path.is_file():
            raise FileNotFoundError(f"mesh '{mesh.get('filename')}' resolved to {path}, which does not exist")
        mesh.set("filename", str(path))
    return ET.tostring(root, encoding="unicode")


def fixed_joint_origin(urdf_xml: str, child_link: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(xyz, rpy) of the joint whose child is `child_link`."""
    for joint in ET.fromstring(urdf_xml).findall("joint"):
        if joint.find("child").get("link") == child_link:
            origin = joint.find("origin")
            xyz = origin.get("xyz", "0 0 0") if origin is not None else "0 0 0"
            rpy = origin.get("rpy", "0 0 0") if origin is not None else "0 0 0"
            return tuple(map(float, xyz.split())), tuple(map(float, rpy.split()))
    raise WorkcellConfigError(f"no joint with child link '{child_link}' in the URDF")


def link_box_size(urdf_xml: str, link: str) -> tuple[float, float, float]:
    """Size of the first <collision> box of a link."""
    for element in ET.fromstring(urdf_xml).findall("link"):
        if element.get("name") == link:
            box = element.find("collision/geometry/box")
            if box is None:
                break
            return tuple(map(float, box.get("size").split()))  # type: ignore[return-value]
    raise WorkcellConfigError(f"link '{link}' has no <collision><geometry><box> in the URDF")


# ---------------------------------------------------------------------------------------
# Workcell configuration
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CameraIntrinsics:
    """Pinhole intrinsics of one RGB-D camera (depth aligned to color)."""

    name: str
    color_optical_frame: str
    depth_optical_frame: str
    width: int  # px
    height: int  # px
    fx: float  # px
    fy: float  # px
    cx: float  # px
    cy: float  # px
    rate_hz: float
    depth_min_m: float
    depth_max_m: float

    @property
    def fovy_deg(self) -> float:
        return math.degrees(2.0 * math.atan2(self.height / 2.0, self.fy))

    @property
    def camera_matrix(self) -> list[list[float]]:
        return [[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]]


@dataclass(frozen=True)
class CharucoBoardSpec:
    frame: str  # URDF link whose frame is OpenCV's board frame
    squares_x: int
    squares_y: int
    square_length_m: float
    marker_length_m: float
    dictionary: str  # cv2.aruco predefined dictionary name, e.g. DICT_5X5_100

    @property
    def size_m(self) -> tuple[float, float]:
        return (self.squares_x * self.square_length_m, self.squares_y * self.square_length_m)


@dataclass(frozen=True)
class BoxSpec:
    link: str
    size_m: tuple[float, float, float]
    world_position_m: tuple[float, float, float]  # nominal initial position of the box centre
    world_quat_wxyz: tuple[float, float, float, float]  # nominal initial orientation


@dataclass(frozen=True)
class WorkcellDescription:
    cameras: dict[str, CameraIntrinsics]
    board: CharucoBoardSpec
    box: BoxSpec
    table_top_height_m: float
    home_joint_positions: dict[str, float]  # rad (arm) / m (fingers), one per joint in ALL_JOINTS
    urdf_xml: str  # composed robot + workcell URDF, package:// URIs kept
    config_path: Path
    urdf_path: Path

    @property
    def home_arm_positions(self) -> list[float]:
        return [self.home_joint_positions[name] for name in ARM_JOINTS]


def load_workcell(config_dir_or_file: Path | str | None = None, urdf_path: Path | str | None = None,
                  robot_urdf: Path | str | None = None) -> WorkcellDescription:
    """Load config/workcell.yaml and compose the URDF; cross-check the duplicated sizes."""
    config_path = Path(config_dir_or_file) if config_dir_or_file is not None else default_config_dir()
    if config_path.is_dir():
        config_path = config_path / "workcell.yaml"
    urdf_path = Path(urdf_path) if urdf_path is not None else default_urdf_path()
    raw = _read_yaml(config_path)
    reader = _Reader(config_path)
    urdf_xml = compose_workcell_urdf(urdf_path, robot_urdf)
    description = WorkcellDescription(
        cameras={name: _camera(reader, name, value)
                 for name, value in reader.mapping(raw, "cameras").items()},
        board=_board(reader, reader.mapping(raw, "charuco_board")),
        box=_box(reader, reader.mapping(raw, "box")),
        table_top_height_m=reader.number(reader.mapping(raw, "table"), "table.top_height_m", "top_height_m"),
        home_joint_positions=_home(reader, reader.mapping(raw, "robot")),
        urdf_xml=urdf_xml,
        config_path=config_path,
        urdf_path=urdf_path,
    )
    reader.reject_unknown(raw, "", {"cameras", "charuco_board", "box", "table", "robot"})
    _check_against_urdf(description)
    return description


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise WorkcellConfigError(f"cannot read {path}: {error}") from error
    if not isinstance(data, dict):
        raise WorkcellConfigError(f"{path}: expected a mapping at the top level")
    return data


class _Reader:
    """Typed access to YAML values with errors that name the file and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, problem: str, fix: str) -> WorkcellConfigError:
        return WorkcellConfigError(f"{self.path}: key '{key}' {problem}; {fix}")

    def mapping(self, parent: Mapping[str, Any], key: str, full_key: str | None = None) -> dict[str, Any]:
        value = parent.get(key)
        if not isinstance(value, dict):
            raise self.fail(full_key or key, "is missing or not a mapping",
                            "see the documented layout in config/workcell.yaml")
        return value

    def number(self, parent: Mapping[str, Any], full_key: str, key: str, *, positive: bool = True) -> float:
        if key not in parent:
            raise self.fail(full_key, "is missing", "add it")
        value = parent[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(full_key, f"must be a finite number, got {value!r}", "fix the value")
        if positive and value <= 0:
            raise self.fail(full_key, f"must be > 0, got {value}", "fix the value")
        return float(value)

    def integer(self, parent: Mapping[str, Any], full_key: str, key: str) -> int:
        value = parent.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(full_key, f"must be a positive integer, got {value!r}", "fix the value")
        return value

    def text(self, parent: Mapping[str, Any], full_key: str, key: str) -> str:
        value = parent.get(key)
        if not isinstance(value, str) or not value:
            raise self.fail(full_key, f"must be a non-empty string, got {value!r}", "fix the value")
        return value

    def vector(self, parent: Mapping[str, Any], full_key: str, key: str, length: int) -> tuple[float, ...]:
        value = parent.get(key)
        if (not isinstance(value, list) or len(value) != length
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
            raise self.fail(full_key, f"must be a list of {length} finite numbers, got {value!r}", "fix the value")
        return tuple(float(v) for v in value)

    def reject_unknown(self, section: Mapping[str, Any], prefix: str, known: set[str]) -> None:
        for key in section:
            if key not in known:
                raise self.fail(prefix + str(key), "is not a known key",
                                f"remove it or use one of {sorted(known)}")


def _camera(reader: _Reader, name: str, raw: Any) -> CameraIntrinsics:
    prefix = f"cameras.{name}."
    if not isinstance(raw, dict):
        raise reader.fail(prefix[:-1], "must be a mapping", "see config/workcell.yaml")
    fields = ("color_optical_frame", "depth_optical_frame", "width", "height", "fx", "fy", "cx", "cy",
              "rate_hz", "depth_min_m", "depth_max_m")
    reader.reject_unknown(raw, prefix, set(fields))
    camera = CameraIntrinsics(
        name=name,
        color_optical_frame=reader.text(raw, prefix + "color_optical_frame", "color_optical_frame"),
        depth_optical_frame=reader.text(raw, prefix + "depth_optical_frame", "depth_optical_frame"),
        width=reader.integer(raw, prefix + "width", "width"),
        height=reader.integer(raw, prefix + "height", "height"),
        **{key: reader.number(raw, prefix + key, key) for key in ("fx", "fy", "cx", "cy", "rate_hz",
                                                                   "depth_min_m", "depth_max_m")},
    )
    if camera.depth_min_m >= camera.depth_max_m:
        raise reader.fail(prefix + "depth_min_m", "must be smaller than depth_max_m", "fix the range")
    return camera


def _board(reader: _Reader, raw: dict[str, Any]) -> CharucoBoardSpec:
    prefix = "charuco_board."
    reader.reject_unknown(raw, prefix, {"frame", "squares_x", "squares_y", "square_length_m",
                                        "marker_length_m", "dictionary"})
    board = CharucoBoardSpec(
        frame=reader.text(raw, prefix + "frame", "frame"),
        squares_x=reader.integer(raw, prefix + "squares_x", "squares_x"),
        squares_y=reader.integer(raw, prefix + "squares_y", "squares_y"),
        square_length_m=reader.number(raw, prefix + "square_length_m", "square_length_m"),
        marker_length_m=reader.number(raw, prefix + "marker_length_m", "marker_length_m"),
        dictionary=reader.text(raw, prefix + "dictionary", "dictionary"),
    )
    if board.marker_length_m >= board.square_length_m:
        raise reader.fail(prefix + "marker_length_m", "must be smaller than square_length_m", "fix the pattern")
    if not board.dictionary.startswith("DICT_"):
        raise reader.fail(prefix + "dictionary", f"'{board.dictionary}' is not a cv2.aruco dictionary name",
                          "use e.g. DICT_5X5_100")
    return board


def _box(reader: _Reader, raw: dict[str, Any]) -> BoxSpec:
    prefix = "box."
    reader.reject_unknown(raw, prefix, {"link", "size_m", "initial_pose"})
    pose = reader.mapping(raw, "initial_pose", prefix + "initial_pose")
    reader.reject_unknown(pose, prefix + "initial_pose.", {"xyz_m", "rpy_rad"})
    roll, pitch, yaw = reader.vector(pose, prefix + "initial_pose.rpy_rad", "rpy_rad", 3)
    size = reader.vector(raw, prefix + "size_m", "size_m", 3)
    if min(size) <= 0:
        raise reader.fail(prefix + "size_m", "must be positive", "fix the sizes")
    return BoxSpec(
        link=reader.text(raw, prefix + "link", "link"),
        size_m=size,  # type: ignore[arg-type]
        world_position_m=reader.vector(pose, prefix + "initial_pose.xyz_m", "xyz_m", 3),  # type: ignore[arg-type]
        world_quat_wxyz=rpy_to_quat_wxyz(roll, pitch, yaw),
    )


def _home(reader: _Reader, raw: dict[str, Any]) -> dict[str, float]:
    reader.reject_unknown(raw, "robot.", {"home_joint_positions"})
    home = reader.mapping(raw, "home_joint_positions", "robot.home_joint_positions")
    reader.reject_unknown(home, "robot.home_joint_positions.", set(ALL_JOINTS))
    return {name: reader.number(home, f"robot.home_joint_positions.{name}", name, positive=False)
            for name in ALL_JOINTS}


def rpy_to_quat_wxyz(roll: float, pitch: float, yaw: float) -> tuple[float, float, float, float]:
    """URDF rpy (fixed-axis x, y, z; R = Rz(yaw) Ry(pitch) Rx(roll)) to a unit quaternion."""
    cr, sr = math.cos(roll / 2), math.sin(roll / 2)
    cp, sp = math.cos(pitch / 2), math.sin(pitch / 2)
    cy, sy = math.cos(yaw / 2), math.sin(yaw / 2)
    return (cr * cp * cy + sr * sp * sy, sr * cp * cy - cr * sp * sy,
            cr * sp * cy + sr * cp * sy, cr * cp * sy - sr * sp * cy)


def _check_against_urdf(description: WorkcellDescription) -> None:
    """Values duplicated for convenience must agree with the URDF, which owns geometry."""
    urdf, path, config = description.urdf_xml, description.urdf_path, description.config_path
    links = {link.get("name") for link in ET.fromstring(urdf).findall("link")}
    frames = [description.board.frame, description.box.link]
    for camera in description.cameras.values():
        frames += [camera.color_optical_frame, camera.depth_optical_frame]
    for frame in frames:
        if frame not in links:
            raise WorkcellConfigError(f"{config} names frame '{frame}', which is not a link of {path}; fix the name")
    table_xyz, _ = fixed_joint_origin(urdf, "table")
    if abs(table_xyz[2] - description.table_top_height_m) > 1e-9:
        raise WorkcellConfigError(
            f"{config}: table.top_height_m = {description.table_top_height_m} but {path} puts the table top at "
            f"z = {table_xyz[2]}; the URDF owns the transform, update the YAML to match.")
    if _mismatch(link_box_size(urdf, description.box.link), description.box.size_m):
        raise WorkcellConfigError(f"{config}: box.size_m disagrees with the box geometry in {path}; make them equal.")
    board_box = link_box_size(urdf, description.board.frame)
    if _mismatch(board_box[:2], description.board.size_m):
        raise WorkcellConfigError(
            f"{config}: the ChArUco pattern is {description.board.size_m} m but the '{description.board.frame}' "
            f"geometry in {path} is {board_box[:2]} m; make them equal.")


def _mismatch(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return any(abs(x - y) > 1e-9 for x, y in zip(a, b, strict=True))
