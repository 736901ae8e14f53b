"""Every file of the workspace's launch/, config/ and urdf/ is loaded by a test here.

No ROS node is started: launch files are checked by parsing them (and built with the
real `launch` when it is installed), parameter files against the parameters the nodes
declare (read from the node sources with `ast`), physics/workcell/URDF files through the
loaders the nodes use, the Fast DDS profile for staying on localhost. Also the package
manifests: package.xml format 3 and one console script per `*_node.py` module with a main().
"""
from __future__ import annotations

import ast
import fnmatch
import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from twinloop_twin.physics import load_physics
from twinloop_twin.workcell import compose_workcell_urdf, load_workcell

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
WORKSPACE_DIRS = ("launch", "config", "urdf")
# The package whose share/ receives the top-level launch/, config/ and urdf/.
SHARE_PACKAGE = "twinloop_bringup"

# Which test loads which file: first matching pattern wins. A file no pattern matches
# fails test_every_workspace_file_has_a_loader: add a pattern and a loader test for it.
LOADERS: list[tuple[str, str]] = [
    ("launch/*.launch.py", "launch"),
    ("config/workcell.yaml", "workcell"),
    ("config/nominal_physics.yaml", "physics"),
    ("config/emulated_truth*.yaml", "physics"),
    ("config/fastdds_*.xml", "fastdds"),
    ("config/*.rviz", "rviz"),
    ("config/recording.yaml", "recording_profiles"),
    ("config/excitation.yaml", "excitation"),
    ("config/calibration_targets.yaml", "calibration_targets"),
    ("config/policy_task.yaml", "policy_task"),
    ("config/planning.yaml", "planning"),
    ("config/moveit_cpp.yaml", "moveit_cpp"),
    ("config/*.yaml", "parameters"),  # any other YAML in config/ is a ROS 2 parameter file
    ("urdf/*.urdf", "urdf"),
]

# Parameters a node declares that its parameter file need not list: passed by the
# process that starts it (the emulated workcell starts the camera node with them).
INTERNAL_PARAMETERS = {
    "emulated_cameras": {"scene_state", "parent_pid", "truth_file", "workcell_config", "urdf", "twin_path"},
}
# Parameter files that document the nodes' defaults: every value equals the declared default.
DEFAULTS_FILES = {"config/emulated_workcell.yaml"}
# Executables of other ROS packages that launch files may start.
EXTERNAL_EXECUTABLES = {("rviz2", "rviz2"), ("robot_state_publisher", "robot_state_publisher")}


def _workspace_files() -> list[str]:
    files = []
    for folder in WORKSPACE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files.append(path.relative_to(ROOT).as_posix())
    return files


def _kind(relative: str) -> str | None:
    for pattern, kind in LOADERS:
        if fnmatch.fnmatch(relative, pattern):
            return kind
    return None


def _files_of(kind: str) -> list[str]:
    return [f for f in _workspace_files() if _kind(f) == kind]


def test_every_workspace_file_has_a_loader():
    unknown = [f for f in _workspace_files() if _kind(f) is None]
    assert not unknown, (
        f"no test loads {unknown}: add a (pattern, kind) entry to LOADERS in {Path(__file__).name} "
        "and a test that loads files of that kind")


def test_loaders_cover_something():
    # A loader list that matches nothing would make every test below vacuous.
    kinds = {_kind(f) for f in _workspace_files()}
    assert {"launch", "parameters", "physics", "workcell", "fastdds", "urdf"} <= kinds


# ------------------------------------------------------------------ package sources (ast)

def _call_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _setup_call(package_dir: Path) -> ast.Call:
    tree = ast.parse((package_dir / "setup.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _call_name(n) == "setup"]
    assert len(calls) == 1, f"{package_dir}/setup.py: expected one setup() call"
    return calls[0]


def console_scripts(package: str) -> dict[str, str]:
    """{script name: 'module:function'} from src/<package>/setup.py, read with ast."""
    setup = _setup_call(SRC / package)
    entry_points = _keyword(setup, "entry_points")
    if entry_points is None:
        return {}
    entries = ast.literal_eval(entry_points).get("console_scripts", [])
    scripts = {}
    for entry in entries:
        name, _, target = entry.partition("=")
        scripts[name.strip()] = target.strip()
    return scripts


def _literal_key(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _module_dicts(tree: ast.Module) -> dict[str, ast.Dict]:
    """Module-level `NAME = {...}` dict literals (parameter tables such as PARAMETERS)."""
    return {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Dict) for target in node.targets if isinstance(target, ast.Name)}


def _parameter_table(table: ast.Dict) -> dict[str, object]:
    """{name: default} of a `{name: (default, description)}` table; non-literal defaults are None."""
    out = {}
    for key, value in zip(table.keys, table.values):
        default = value.elts[0] if isinstance(value, ast.Tuple) and value.elts else None
        try:
            out[ast.literal_eval(key)] = ast.literal_eval(default) if default is not None else None
        except ValueError:  # computed: a list expression is still a list; otherwise unknown (None)
            out[ast.literal_eval(key)] = [] if isinstance(default, (ast.List, ast.Tuple)) else None
    return out


# Base classes whose constructors declare parameters from a table of their own module.
SERVER_BASES = {"WorkcellServer": (SRC / "twinloop_sim/twinloop_sim/workcell_server_node.py", "COMMON_PARAMETERS")}


def declared_parameters() -> dict[str, dict[str, object]]:
    """{node name: {parameter: default}} from every `*_node.py` under src/.

    The node name is the string passed to `super().__init__(...)`; the parameters are the
    keys of the dict passed to twinloop_ros.node.declare(self, {...}), of a
    module-level table passed to `super().__init__(name, TABLE, ...)` (plus the base
    class's own table, see SERVER_BASES), and any `self.declare_parameter("name", default)`.
    """
    nodes: dict[str, dict[str, object]] = {}
    for source in sorted(SRC.glob("*/*/*_node.py")):
        if not _defines_main(source):
            continue  # a node's base class (SERVER_BASES) or a helper attached to a node
        tree = ast.parse(source.read_text())
        tables = _module_dicts(tree)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            name, params = None, {}
            for base in cls.bases:
                if isinstance(base, ast.Name) and base.id in SERVER_BASES:
                    path, table = SERVER_BASES[base.id]
                    params.update(_parameter_table(_module_dicts(ast.parse(path.read_text()))[table]))
            for call in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
                func = call.func
                if (isinstance(func, ast.Attribute) and func.attr == "__init__"
                        and isinstance(func.value, ast.Call) and _call_name(func.value) == "super"):
                    first = call.args[0] if call.args else _keyword(call, "node_name")
                    name = _literal_key(first) or name
                    for arg in call.args[1:]:
                        if isinstance(arg, ast.Name) and arg.id in tables:
                            params.update(_parameter_table(tables[arg.id]))
                elif _call_name(call) == "declare" and len(call.args) == 2 and isinstance(call.args[1], ast.Dict):
                    params.update(_parameter_table(call.args[1]))
                elif _call_name(call) == "declare_parameter" and call.args:
                    key = _literal_key(call.args[0])
                    if key:
                        params[key] = ast.literal_eval(call.args[1]) if len(call.args) > 1 else None
            if name is not None:
                nodes[name] = params
    return nodes


def test_declared_parameters_are_found():
    # Guards the ast reading above: if the nodes change how they declare, this says so.
    nodes = declared_parameters()
    assert "camera_rate_hz" in nodes.get("emulated_workcell", {}), nodes.keys()
    assert "scene_state" in nodes.get("emulated_cameras", {}), nodes.keys()
    assert {"twin_path", "real_time", "seed"} <= set(nodes.get("sim_bridge", {})), nodes.keys()


# ------------------------------------------------------------------ launch files

def _launch_tree(relative: str) -> ast.Module:
    return ast.parse((ROOT / relative).read_text(), filename=relative)


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _call_name(n) == name]


@pytest.mark.parametrize("relative", _files_of("launch"))
def test_launch_file_starts_declared_executables(relative):
    tree = _launch_tree(relative)
    nodes = _calls(tree, "Node")
    assert nodes or _calls(tree, "IncludeLaunchDescription"), f"{relative}: starts no Node and includes nothing"
    for call in nodes:
        package = _literal_key(_keyword(call, "package"))
        executable = _literal_key(_keyword(call, "executable"))
        assert package and executable, f"{relative}:{call.lineno}: Node needs literal package= and executable="
        if (SRC / package).is_dir():
            scripts = console_scripts(package)
            assert executable in scripts, (
                f"{relative}:{call.lineno}: {package} has no console script '{executable}' "
                f"(src/{package}/setup.py declares {sorted(scripts)})")
        else:
            assert (package, executable) in EXTERNAL_EXECUTABLES, (
                f"{relative}:{call.lineno}: {package}/{executable} is neither a workspace package nor "
                "a known external executable (EXTERNAL_EXECUTABLES)")


def test_stack_node_set_starts_declared_executables():
    # stack.launch.py and replay.launch.py build their nodes from the node set
    # (twinloop_bringup.launch_support), not from literal Node(...) calls.
    from twinloop_bringup.node_set import STACK

    for node in STACK:
        if (SRC / node.package).is_dir():
            scripts = console_scripts(node.package)
            assert node.executable in scripts, f"node set: {node.package} has no console script '{node.executable}'"
            assert scripts[node.executable].partition(":")[0] == node.module, (
                f"node set: {node.name} runs {scripts[node.executable]} under ros2 launch but {node.module} "
                "under twinloop bringup")
        else:
            assert (node.package, node.executable) in EXTERNAL_EXECUTABLES, node
        if node.params_file:
            assert (ROOT / "config" / node.params_file).is_file(), f"node set: {node.name}: no config/{node.params_file}"


@pytest.mark.parametrize("relative", _files_of("launch"))
def test_launch_arguments_are_declared_and_used(relative):
    tree = _launch_tree(relative)
    declared = {}
    for call in _calls(tree, "DeclareLaunchArgument"):
        name = _literal_key(call.args[0] if call.args else _keyword(call, "name"))
        assert name, f"{relative}:{call.lineno}: DeclareLaunchArgument needs a literal name"
        assert name not in declared, f"{relative}: argument '{name}' declared twice"
        assert _keyword(call, "description") is not None, f"{relative}: argument '{name}' has no description"
        assert _keyword(call, "default_value") is not None, f"{relative}: argument '{name}' has no default"
        declared[name] = call.lineno
    used = {_literal_key(c.args[0]) for c in _calls(tree, "LaunchConfiguration") if c.args}
    assert declared, f"{relative}: declares no argument"
    assert not set(declared) - used, f"{relative}: declared but never used: {sorted(set(declared) - used)}"
    assert not used - set(declared), f"{relative}: used but never declared: {sorted(used - set(declared))}"


def _referenced_files(tree: ast.AST) -> list[str]:
    """Share-relative paths built as PathJoinSubstitution([share_dir, 'dir', ..., 'file'])
    (the launch files' convention for the share); paths relative to other roots (a twin
    folder given as an argument) are not workspace files."""
    paths = []
    for call in _calls(tree, "PathJoinSubstitution"):
        if not call.args or not isinstance(call.args[0], (ast.List, ast.Tuple)):
            continue
        first = call.args[0].elts[0] if call.args[0].elts else None
        if not (isinstance(first, ast.Name) and first.id == "share_dir"):
            continue
        tail = []
        for element in reversed(call.args[0].elts):
            text = _literal_key(element)
            if text is None:
                break
            tail.insert(0, text)
        if tail and "." in tail[-1]:
            paths.append("/".join(tail))
    return paths


@pytest.mark.parametrize("relative", _files_of("launch"))
def test_launch_file_references_existing_files(relative):
    references = _referenced_files(_launch_tree(relative))
    for reference in references:
        assert (ROOT / reference).is_file(), (
            f"{relative} refers to {reference}, which is not in the workspace (and so not in the share)")


def test_emulated_workcell_launch_uses_its_parameter_file():
    # The launch file's default params_file is the shipped one, and it exists.
    assert "config/emulated_workcell.yaml" in _referenced_files(_launch_tree("launch/emulated_workcell.launch.py"))


def _launch_available() -> str | None:
    try:
        import launch
        import launch_ros  # noqa: F401
    except ImportError as error:
        return f"ROS 2 `launch`/`launch_ros` not importable ({error}); the PyPI wheels lack them"
    if not hasattr(launch, "LaunchDescription"):
        return "the importable `launch` is not ROS 2's"
    return None


@pytest.mark.parametrize("relative", _files_of("launch"))
def test_launch_description_builds(relative):
    reason = _launch_available()
    if reason:
        pytest.skip(reason)
    from launch import LaunchDescription
    spec = importlib.util.spec_from_file_location(Path(relative).stem.replace(".", "_"), ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    assert isinstance(description, LaunchDescription)
    declared = {a.name for a in description.get_launch_arguments()}
    assert declared == {_literal_key(c.args[0]) for c in _calls(_launch_tree(relative), "DeclareLaunchArgument")}


def test_share_package_installs_workspace_files(monkeypatch):
    """setup.py of the share package installs every launch/, config/, urdf/ file."""
    import setuptools  # noqa: F401  (provides distutils on Python >= 3.12)
    from distutils.core import run_setup
    package_dir = SRC / SHARE_PACKAGE
    monkeypatch.chdir(package_dir)  # colcon and pip run setup.py from the package directory
    distribution = run_setup("setup.py", stop_after="config")
    installed = set()
    for destination, sources in distribution.data_files:
        for source in sources:
            installed.add((destination, (package_dir / source).resolve()))
    for relative in _workspace_files():
        destination = f"share/{SHARE_PACKAGE}/{Path(relative).parent.as_posix()}"
        assert (destination, (ROOT / relative).resolve()) in installed, (
            f"{relative} is not installed to {destination} by src/{SHARE_PACKAGE}/setup.py data_files")


# ------------------------------------------------------------------ config/

def _python_type(value: object) -> str:
    # ROS 2 parameter types: a YAML 500 is an integer and is refused for a double parameter.
    return {bool: "bool", int: "integer", float: "double", str: "string"}.get(type(value), type(value).__name__)


@pytest.mark.parametrize("relative", _files_of("parameters"))
def test_parameter_file_matches_declared_parameters(relative):
    raw = yaml.safe_load((ROOT / relative).read_text())
    assert isinstance(raw, dict) and raw, f"{relative}: not a mapping (if it is not a parameter file, add a loader)"
    nodes = declared_parameters()
    for key, section in raw.items():
        assert isinstance(key, str) and key.startswith("/**/"), (
            f"{relative}: top-level key {key!r} should be '/**/<node name>' (matches the node in any namespace)")
        node = key[len("/**/"):]
        assert node in nodes, f"{relative}: no node named '{node}' under src/ (known: {sorted(nodes)})"
        assert isinstance(section, dict) and list(section) == ["ros__parameters"], (
            f"{relative}: '{key}' must hold exactly 'ros__parameters'")
        values = section["ros__parameters"]
        declared = nodes[node]
        assert isinstance(values, dict) and values, f"{relative}: '{key}' has no parameters"
        undeclared = sorted(set(values) - set(declared))
        assert not undeclared, f"{relative}: {node} does not declare {undeclared}"
        missing = sorted(set(declared) - set(values) - INTERNAL_PARAMETERS.get(node, set()))
        assert not missing, f"{relative}: {node} declares {missing}, which this file does not document"
        for name, value in values.items():
            if declared[name] is None:
                continue  # a computed default of unknown type: nothing to compare with
            assert _python_type(value) == _python_type(declared[name]), (
                f"{relative}: {node}.{name} is {_python_type(value)} ({value!r}) but declared "
                f"{_python_type(declared[name])} ({declared[name]!r}); ROS 2 refuses the mismatch")
            if relative in DEFAULTS_FILES:
                assert value == declared[name], (
                    f"{relative} documents the defaults: {node}.{name} is {value!r} here, "
                    f"{declared[name]!r} in the node; change both")


@pytest.mark.parametrize("relative", _files_of("physics"))
def test_physics_file_loads(relative):
    physics = load_physics(ROOT / relative)
    assert physics.command_delay_s >= 0.0


@pytest.mark.parametrize("relative", _files_of("workcell"))
def test_workcell_file_loads(relative):
    workcell = load_workcell(ROOT / relative, ROOT / "urdf" / "workcell.urdf")
    assert workcell.cameras, f"{relative}: no camera"


@pytest.mark.parametrize("relative", _files_of("recording_profiles"))
def test_recording_profiles_load(relative):
    from twinloop_logging.profiles import load_profiles
    profiles = load_profiles(ROOT / relative)
    assert {"calibration", "identification", "trial", "all"} <= set(profiles), f"{relative}: {sorted(profiles)}"


@pytest.mark.parametrize("relative", _files_of("rviz"))
def test_rviz_config_loads(relative):
    # test/test_bringup.py checks that every topic it shows is published by the stack
    config = yaml.safe_load((ROOT / relative).read_text())
    displays = config["Visualization Manager"]["Displays"]
    assert displays and all(d["Class"].startswith("rviz_default_plugins/") for d in displays)
    assert config["Visualization Manager"]["Global Options"]["Fixed Frame"] == "world"


@pytest.mark.parametrize("relative", _files_of("calibration_targets"))
def test_calibration_targets_load(relative):
    from twinloop_calibration.targets import load_targets
    targets, default = load_targets(ROOT / relative)
    assert default in targets and all(t.point_count > 0 for t in targets.values())


@pytest.mark.parametrize("relative", _files_of("policy_task"))
def test_policy_task_file_loads(relative):
    # src/twinloop_policy/test/test_carry.py checks that its motion keeps inside the shipped envelope
    from twinloop_policy.task import load_task_config
    task = load_task_config(ROOT / relative)
    assert task.training.contexts >= 1 and task.goal.radius_m > 0, relative


@pytest.mark.parametrize("relative", _files_of("planning"))
def test_planning_file_loads_and_documents_the_defaults(relative):
    from twinloop_planning.config import load_planning_config
    from twinloop_planning.planner import PlannerSettings
    from twinloop_planning.scene import SceneSettings
    assert load_planning_config(ROOT / relative) == (PlannerSettings(), SceneSettings())


@pytest.mark.parametrize("relative", _files_of("moveit_cpp"))
def test_moveit_cpp_file_names_what_moveitpy_reads(relative):
    """MoveItPy's settings (the moveit_py backend; MoveIt itself is not installed here): the
    planning scene monitor's options, the pipelines, and request defaults whose pipeline is
    one of them and whose timing is left to twinloop_planning (scaling 1)."""
    import yaml
    document = yaml.safe_load((ROOT / relative).read_text())
    assert {"planning_scene_monitor_options", "planning_pipelines", "plan_request_params"} <= set(document)
    assert document["planning_scene_monitor_options"]["robot_description"] == "robot_description"
    request = document["plan_request_params"]
    assert request["planning_pipeline"] in document["planning_pipelines"]["pipeline_names"]
    assert request["max_velocity_scaling_factor"] == request["max_acceleration_scaling_factor"] == 1.0
    assert request["planning_time"] > 0 and request["planning_attempts"] >= 1


@pytest.mark.parametrize("relative", _files_of("excitation"))
def test_excitation_file_loads(relative):
    from twinloop_builder.excitation import load_excitation_config
    config = load_excitation_config(ROOT / relative)
    assert config.joints.duration_s > 0 and config.pushes, relative


def test_excitation_keeps_inside_the_shipped_envelope():
    # The excitation's motion limits and its pacing sit inside the monitor's shipped limits:
    # accelerations at most the monitor's, the player's pause lead below the lead where the
    # monitor faults, and its longest hold shorter than the monitor's command watchdog.
    from twinloop_builder.excitation import load_excitation_config
    joints = load_excitation_config(ROOT / "config/excitation.yaml").joints
    monitor = yaml.safe_load((ROOT / "config/envelope.yaml").read_text())["/**/envelope_monitor"]["ros__parameters"]
    for name, acceleration, lead in zip(monitor["joint_names"], monitor["acceleration_limits"],
                                        monitor["max_target_lead"]):
        assert joints.acceleration_limits[name] <= acceleration, name
        assert 0 < joints.pause_lead[name] <= 0.8 * lead, (name, joints.pause_lead[name], lead)
    assert joints.max_pause_s < monitor["command_timeout_s"]


FASTDDS = "{http://www.eprosima.com}"
LOOPBACK = {"UDPv4": "127.0.0.1", "UDPv6": "::1", "TCPv4": "127.0.0.1", "TCPv6": "::1"}


def _text(element: ET.Element, path: str) -> str | None:
    found = element.find(path)
    return None if found is None or found.text is None else found.text.strip()


@pytest.mark.parametrize("relative", _files_of("fastdds"))
def test_fastdds_profile_stays_on_localhost(relative):
    root = ET.parse(ROOT / relative).getroot()
    descriptors = {}
    for descriptor in root.iter(f"{FASTDDS}transport_descriptor"):
        kind = _text(descriptor, f"{FASTDDS}type")
        descriptors[_text(descriptor, f"{FASTDDS}transport_id")] = kind
        if kind == "SHM":
            continue
        assert kind in LOOPBACK, f"{relative}: transport type {kind!r} is not checked by this test; add it"
        addresses = [a.text.strip() for a in descriptor.iter(f"{FASTDDS}address") if a.text]
        assert addresses, f"{relative}: {kind} transport has no interface allowlist: it would use every interface"
        assert set(addresses) == {LOOPBACK[kind]}, f"{relative}: {kind} transport allows {addresses}"
    participants = list(root.iter(f"{FASTDDS}participant"))
    assert participants, f"{relative}: no participant profile"
    for participant in participants:
        assert _text(participant, f"{FASTDDS}rtps/{FASTDDS}useBuiltinTransports") == "false", (
            f"{relative}: participant {participant.get('profile_name')} keeps the built-in transports, "
            "which listen on every interface")
        used = [t.text.strip() for t in participant.iter(f"{FASTDDS}transport_id")]
        assert used and set(used) <= set(descriptors), (
            f"{relative}: participant uses transports {used}, declared are {sorted(descriptors)}")


# ------------------------------------------------------------------ urdf/

@pytest.mark.parametrize("relative", _files_of("urdf"))
def test_urdf_composes(relative):
    composed = ET.fromstring(compose_workcell_urdf(ROOT / relative))
    assert composed.tag == "robot"
    links = {link.get("name") for link in composed.iter("link")}
    assert "world" in links and any(name.startswith("panda_") for name in links)


# ------------------------------------------------------------------ packages under src/

PACKAGES = sorted(p.parent.name for p in SRC.glob("*/package.xml"))


@pytest.mark.parametrize("package", PACKAGES)
def test_package_xml_is_format_3(package):
    manifest = ET.parse(SRC / package / "package.xml").getroot()
    assert manifest.get("format") == "3", f"src/{package}/package.xml: use <package format=\"3\">"
    assert _text(manifest, "name") == package, f"src/{package}/package.xml: <name> differs from its folder"


def _build_type(package: str) -> str | None:
    return _text(ET.parse(SRC / package / "package.xml").getroot(), "export/build_type")


def _defines_main(module: Path) -> bool:
    tree = ast.parse(module.read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)


@pytest.mark.parametrize("package", [p for p in PACKAGES if _build_type(p) == "ament_python"])
def test_every_node_module_has_a_console_script(package):
    scripts = console_scripts(package)
    targets = {target.partition(":")[0] for target in scripts.values()}
    for module in sorted((SRC / package / package).glob("*_node.py")):
        if not _defines_main(module):
            continue  # a node's base class or a helper attached to a node: ROS glue, not a node
        dotted = f"{package}.{module.stem}"
        assert dotted in targets, f"src/{package}/setup.py: no console script runs {dotted}"
    for name, target in scripts.items():
        module = target.partition(":")[0]
        path = SRC / package / Path(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), (
            f"src/{package}/setup.py: console script '{name}' points at missing module {module}")
