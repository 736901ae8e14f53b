"""The package layout holds: every import is declared, no package cycle, the layers keep apart,
and the pure core never loads rclpy.

Read from the sources with `ast` (nothing is imported) and from each src/*/package.xml.

What is checked, per ament_python package under src/:
- Declared dependencies. Every absolute import (top-level name, module-level or inside a
  function: a lazy import runs too) of the package's modules maps to a package.xml key
  (IMPORT_KEYS; otherwise the import name is the key, as for ROS packages: `rclpy`,
  `sensor_msgs`) that the package declares as <depend> or <exec_depend>. Imports of the
  package's own tests (src/<package>/test/) may also be declared as <test_depend>. The
  standard library needs nothing. PIP_ONLY imports have no rosdep key: they are exempt from
  package.xml and must instead be pinned in tools/requirements.txt. MOVEIT_ONLY imports
  (MoveIt 2, used where installed) are exempt too, and allowed in one module only. The launch files
  (launch/*.launch.py) are installed by twinloop_bringup and count as its modules.
  Not checked: setup.py (build time), the top-level test/, bench/ and tools/ (they span
  packages and belong to no manifest).
- No stale suite dependency: a declared twinloop_* dependency is imported, or (for
  twinloop_bringup) started as a node by the node set or a launch file.
- No package cycle, over declared and imported twinloop_* dependencies together.
- Layers: the foundation (twinloop_twin, twinloop_ros) imports no stage package
  (STAGES); twinloop_safety imports neither twinloop_policy nor twinloop_sim (the monitor
  must not depend on what it guards); a stage package imports no other package's node
  module (`*_node.py`).
- The pure core never loads rclpy. The pure core of a package is every module of it except
  the ROS glue:
    * `*_node.py`: a node, a node's base class, or a helper that attaches to a node or
      exists for a node's start-up;
    * `cli.py` and `*_cli.py`: command-line front ends, which may start a node;
    * every module of twinloop_ros and twinloop_bringup (the glue packages);
    * twinloop_sim.isaac_twin_bridge, which runs inside Isaac Sim's own Python (the only
      module allowed Isaac Sim's modules, ISAAC_SIM_ONLY).
  A pure-core module fails if it imports rclpy, or imports a suite module that does,
  followed transitively through the suite's modules.
"""
from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

FOUNDATION = ("twinloop_twin", "twinloop_ros")
GLUE_PACKAGES = ("twinloop_ros", "twinloop_bringup")
STAGES = ("twinloop_logging", "twinloop_calibration", "twinloop_builder", "twinloop_perception", "twinloop_sim",
          "twinloop_policy", "twinloop_safety", "twinloop_validation")
SAFETY_MUST_NOT_IMPORT = ("twinloop_policy", "twinloop_sim")
LAUNCH_PACKAGE = "twinloop_bringup"  # installs launch/ as its share

# Import name -> package.xml key (rosdep key or ROS package name) where the two differ.
IMPORT_KEYS = {
    "numpy": "python3-numpy",
    "scipy": "python3-scipy",
    "yaml": "python3-yaml",
    "cv2": "python3-opencv",
    "torch": "python3-torch",
    "zstandard": "python3-zstandard",
    "pytest": "python3-pytest",
    "pinocchio": "pinocchio",
    "example_robot_data": "example-robot-data",
    "plotly": "python3-plotly",
}
# Import name -> the pinned PyPI distribution in tools/requirements.txt (no rosdep key).
PIP_ONLY = {
    "mujoco": "mujoco",
    "rosbags": "rosbags",
    "mcap": "mcap",
    "mcap_ros2": "mcap-ros2-support",
    "pxr": "usd-core",
    "open3d": "open3d-cpu",
    "coacd": "coacd",
    "manifold3d": "manifold3d",
    "ray": "ray",
    "ompl": "ompl",
    "ruckig": "ruckig",
}
ISAAC_SIM_MODULE = "twinloop_sim.isaac_twin_bridge"
ISAAC_SIM_ONLY = {"isaacsim", "omni"}
# MoveIt 2 (moveit_py and what its backend builds messages with): imported only by
# MOVEIT_MODULE, and only where importable (moveit_backend.AVAILABLE); not declared, so that
# rosdep does not install MoveIt for every user of the suite.
MOVEIT_ONLY = {"moveit", "moveit_configs_utils", "moveit_msgs", "shape_msgs"}
MOVEIT_MODULE = "twinloop_planning.moveit_backend"


@dataclass
class Module:
    name: str  # dotted
    path: Path
    package: str
    is_test: bool
    imports: dict[str, int] = field(default_factory=dict)  # dotted module -> first line

    @property
    def top_level_imports(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for dotted, line in self.imports.items():
            out.setdefault(dotted.split(".")[0], line)
        return out

    def where(self, line: int) -> str:
        return f"{self.path.relative_to(ROOT)}:{line}"


def _imports(path: Path) -> dict[str, int]:
    """Absolute imports of a file: `import a.b` -> a.b; `from a.b import c` -> a.b.c and a.b."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.setdefault(node.module, node.lineno)
            for alias in node.names:  # `from pkg import module` names a module too
                found.setdefault(f"{node.module}.{alias.name}", node.lineno)
    return found


def _python_packages() -> list[str]:
    out = []
    for manifest in sorted(SRC.glob("*/package.xml")):
        build_type = ET.parse(manifest).getroot().findtext("export/build_type")
        if build_type == "ament_python":
            out.append(manifest.parent.name)
    return out


PACKAGES = _python_packages()


def _modules() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((SRC / package / package).rglob("*.py")):
            parts = path.relative_to(SRC / package).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = Module(name, path, package, False, _imports(path))
        for path in sorted((SRC / package / "test").rglob("*.py")):
            name = f"{package}.test." + ".".join(path.relative_to(SRC / package / "test").with_suffix("").parts)
            modules[name] = Module(name, path, package, True, _imports(path))
    for path in sorted((ROOT / "launch").glob("*.launch.py")):
        name = f"launch/{path.name}"
        modules[name] = Module(name, path, LAUNCH_PACKAGE, False, _imports(path))
    return modules


MODULES = _modules()


def _declared(package: str) -> dict[str, set[str]]:
    """{'run': keys of <depend>/<exec_depend>, 'test': keys of <test_depend>}."""
    root = ET.parse(SRC / package / "package.xml").getroot()
    keys = lambda *tags: {e.text.strip() for tag in tags for e in root.findall(tag) if e.text}  # noqa: E731
    return {"run": keys("depend", "exec_depend"), "test": keys("test_depend")}


def _key(top_level: str) -> str:
    return IMPORT_KEYS.get(top_level, top_level)


def _is_suite(name: str) -> bool:
    return name.startswith("twinloop_")


def _is_glue(module: Module) -> bool:
    stem = module.path.name
    return (module.package in GLUE_PACKAGES or module.name.startswith("launch/") or stem.endswith("_node.py")
            or stem == "cli.py" or stem.endswith("_cli.py") or module.name == ISAAC_SIM_MODULE)


def _started_packages() -> set[str]:
    """Packages whose nodes twinloop_bringup starts: the node set and the launch files' Node(package=...)."""
    tree = ast.parse((SRC / "twinloop_bringup/twinloop_bringup/node_set.py").read_text())
    started = {c.args[1].value for c in ast.walk(tree) if isinstance(c, ast.Call)  # StackNode(name, package, ...)
               and getattr(c.func, "id", None) == "StackNode" and len(c.args) > 1
               and isinstance(c.args[1], ast.Constant)}
    for path in (ROOT / "launch").glob("*.launch.py"):
        for call in ast.walk(ast.parse(path.read_text())):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Node":
                for keyword in call.keywords:
                    if keyword.arg == "package" and isinstance(keyword.value, ast.Constant):
                        started.add(keyword.value.value)
    return {name for name in started if _is_suite(name)}


def _requirement_pins() -> set[str]:
    pins = set()
    for line in (ROOT / "tools/requirements.txt").read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==", line)
        if match:
            pins.add(match.group(1).lower())
    return pins


# ------------------------------------------------------------------ the reading itself

def test_the_reading_finds_what_is_there():
    # Guards the ast reading and the manifest parsing: if they found nothing, every test
    # below would pass vacuously.
    assert {"twinloop_twin", "twinloop_ros", "twinloop_sim", "twinloop_safety"} <= set(PACKAGES)
    assert "rclpy" in MODULES["twinloop_ros.node"].top_level_imports
    assert "twinloop_twin.workcell" in MODULES["twinloop_sim.inputs_node"].imports
    assert MODULES["twinloop_twin.scene"].package == "twinloop_twin" and not _is_glue(MODULES["twinloop_twin.scene"])
    assert _is_glue(MODULES["twinloop_safety.envelope_monitor_node"]) and not _is_glue(MODULES["twinloop_safety.envelope"])
    assert "rclpy" in _declared("twinloop_ros")["run"] and "python3-pytest" in _declared("twinloop_twin")["test"]
    assert {"twinloop_logging", "twinloop_safety"} <= _started_packages()


# ------------------------------------------------------------------ declared dependencies

@pytest.mark.parametrize("package", PACKAGES)
def test_every_import_is_declared(package):
    declared = _declared(package)
    pins = _requirement_pins()
    problems = []
    for module in (m for m in MODULES.values() if m.package == package):
        allowed = declared["run"] | (declared["test"] if module.is_test else set())
        kind = "<depend>, <exec_depend> or <test_depend>" if module.is_test else "<depend> or <exec_depend>"
        for name, line in sorted(module.top_level_imports.items()):
            if name in sys.stdlib_module_names or name == "__future__" or name == package:
                continue
            if module.is_test and (module.path.parent / f"{name}.py").is_file():
                continue  # a sibling test module (its shared cases)
            if name in ISAAC_SIM_ONLY:
                if module.name != ISAAC_SIM_MODULE:
                    problems.append(f"{module.where(line)}: imports {name}, which exists only inside Isaac Sim; "
                                    f"only {ISAAC_SIM_MODULE} may")
                continue
            if name in MOVEIT_ONLY:
                if module.name != MOVEIT_MODULE:
                    problems.append(f"{module.where(line)}: imports {name} (MoveIt 2, installed only on some "
                                    f"machines); only {MOVEIT_MODULE} may")
                continue
            if name in PIP_ONLY:
                if PIP_ONLY[name].lower() not in pins:
                    problems.append(f"{module.where(line)}: imports {name} (no rosdep key): pin "
                                    f"{PIP_ONLY[name]} in tools/requirements.txt")
                continue
            if _key(name) not in allowed:
                problems.append(f"{module.where(line)}: imports {name}; declare {kind} {_key(name)} "
                                f"in src/{package}/package.xml")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_stale_suite_dependency(package):
    imported = {name for m in MODULES.values() if m.package == package and not m.is_test
                for name in m.top_level_imports if _is_suite(name)}
    if package == "twinloop_bringup":
        imported |= _started_packages()
    stale = sorted(name for name in _declared(package)["run"] if _is_suite(name) and name not in imported)
    assert not stale, (f"src/{package}/package.xml declares {stale} but no module of {package} imports "
                       "(or starts) them: remove them, or the dependency graph is wrong")


def _suite_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for package in PACKAGES:
        graph[package] |= {k for k in _declared(package)["run"] if _is_suite(k) and k != package}
    for module in MODULES.values():
        if not module.is_test:
            graph[module.package] |= {n for n in module.top_level_imports if _is_suite(n) and n != module.package}
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == 1:
                return path[path.index(successor):] + [successor]
            if successor not in state:
                cycle = visit(successor)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_package_cycle():
    cycle = _find_cycle(_suite_graph())
    assert cycle is None, f"package cycle (declared or imported): {' -> '.join(cycle)}"


# ------------------------------------------------------------------ layers

def _runtime_suite_imports(package: str):
    for module in MODULES.values():
        if module.package == package and not module.is_test:
            for dotted, line in module.imports.items():
                if _is_suite(dotted.split(".")[0]):
                    yield module, dotted, line


@pytest.mark.parametrize("package", FOUNDATION)
def test_foundation_imports_no_stage(package):
    bad = [f"{m.where(line)}: imports {dotted}" for m, dotted, line in _runtime_suite_imports(package)
           if dotted.split(".")[0] in STAGES]
    assert not bad, f"{package} is below every stage and may import none:\n" + "\n".join(bad)


def test_safety_imports_neither_policy_nor_sim():
    bad = [f"{m.where(line)}: imports {dotted}" for m, dotted, line in _runtime_suite_imports("twinloop_safety")
           if dotted.split(".")[0] in SAFETY_MUST_NOT_IMPORT]
    assert not bad, "the envelope monitor must not depend on what it guards:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", [p for p in PACKAGES if p in STAGES])
def test_stage_imports_no_other_package_node(package):
    bad = []
    for module, dotted, line in _runtime_suite_imports(package):
        target = _resolve(dotted)
        if (target and MODULES[target].package != package and MODULES[target].package in STAGES
                and MODULES[target].path.name.endswith("_node.py")):
            bad.append(f"{module.where(line)}: imports {target}")
    assert not bad, f"{package} imports another stage's node module:\n" + "\n".join(bad)


# ------------------------------------------------------------------ the pure core

def _resolve(dotted: str) -> str | None:
    """The suite module an import names: the longest dotted prefix that is a module here."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _rclpy_chain(start: str) -> list[str] | None:
    """[start, ..., module importing rclpy] following suite imports, or None."""
    seen = {start}
    queue: list[list[str]] = [[start]]
    while queue:
        chain = queue.pop(0)
        module = MODULES[chain[-1]]
        if "rclpy" in module.top_level_imports:
            return chain
        for dotted in sorted(module.imports):
            target = _resolve(dotted) if _is_suite(dotted.split(".")[0]) else None
            if target and target not in seen:
                seen.add(target)
                queue.append(chain + [target])
    return None


def test_glue_classification():
    is_glue = {name: _is_glue(module) for name, module in MODULES.items()}
    assert is_glue["twinloop_sim.workcell_server_node"] and is_glue["twinloop_builder.cli"]
    assert is_glue["twinloop_sim.replay_cli"] and is_glue["twinloop_ros.clients"] and is_glue[ISAAC_SIM_MODULE]
    assert not is_glue["twinloop_sim.replay"] and not is_glue["twinloop_builder.identification"]
    # The chain search follows suite imports: twinloop_ros.qos imports rclpy itself.
    assert _rclpy_chain("twinloop_ros.qos") == ["twinloop_ros.qos"]
    assert _rclpy_chain("twinloop_twin.physics") is None
    # ... and through suite modules: the sim's start-up loading raises the node's StartupError.
    assert _rclpy_chain("twinloop_sim.inputs_node") == ["twinloop_sim.inputs_node", "twinloop_ros.node"]


@pytest.mark.parametrize("package", PACKAGES)
def test_pure_core_never_loads_rclpy(package):
    bad = []
    for module in MODULES.values():
        if module.package != package or module.is_test or _is_glue(module):
            continue
        chain = _rclpy_chain(module.name)
        if chain:
            bad.append(f"{module.path.relative_to(ROOT)}: loads rclpy via {' -> '.join(chain)} -> rclpy")
    assert not bad, ("pure-core modules (see this file's docstring) must not load rclpy; move the ROS part "
                     "into a *_node.py module or rename a glue module so:\n" + "\n".join(bad))
