"""Twin version 0: the nominal twin built from `urdf/` and `config/`.

Every later stage writes a new version on top of it. v0 is self-contained: its MJCF scene
references meshes and textures copied into the bundle (hashed with everything else), so
it stays loadable and identical whatever is installed later.
"""
from __future__ import annotations

import dataclasses
import hashlib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import mujoco

from twinloop_twin.bundle import (
    Provenance,
    TwinBundle,
    TwinError,
    latest_version,
    load_twin_version,
    sha256_of,
    write_twin_version,
)
from twinloop_twin.geometry_layer import GEOMETRY_FILE, GeometryLayer, load_geometry_layer
from twinloop_twin.parameters import Parameter, ParameterSet
from twinloop_twin.physics import ARM_JOINTS, WorkcellPhysics, load_physics
from twinloop_twin.scene import build_workcell_spec
from twinloop_twin.workcell import WorkcellDescription, default_config_dir, load_workcell

SCENE_FILE = "scene.xml"
URDF_FILE = "workcell.urdf"

# v0 has measured nothing: each parameter carries a broad prior (this fraction of its
# nominal value, with a floor for values near zero) and identifiable=False, so no later
# stage mistakes it for a measurement.
PRIOR_RELATIVE_STD = 0.5
PRIOR_FLOOR = {"friction_loss": 0.05, "damping": 0.1, "armature": 0.01, "delay_s": 0.005}


def physics_parameters(physics: WorkcellPhysics, *, source: str) -> ParameterSet:
    """The physics hypothesis as named parameters, each with its prior uncertainty."""
    items: dict[str, Parameter] = {}

    def add(name: str, mean: float, unit: str, floor: float = 0.0) -> None:
        items[name] = Parameter(mean=float(mean), std=max(PRIOR_RELATIVE_STD * abs(mean), floor),
                                identifiable=False, unit=unit, source=source)

    for joint, dynamics in physics.joints.items():
        arm = joint in ARM_JOINTS
        torque = "N*m" if arm else "N"
        add(f"joint.{joint}.friction_loss", dynamics.friction_loss, torque, PRIOR_FLOOR["friction_loss"])
        add(f"joint.{joint}.damping", dynamics.damping, f"{torque}*s/{'rad' if arm else 'm'}",
            PRIOR_FLOOR["damping"])
        add(f"joint.{joint}.armature", dynamics.armature, "kg*m^2" if arm else "kg", PRIOR_FLOOR["armature"])
        if dynamics.kp is not None:
            add(f"actuator.{joint}.kp", dynamics.kp, f"{torque}/{'rad' if arm else 'm'}")
            add(f"actuator.{joint}.kv", dynamics.kv, f"{torque}*s/{'rad' if arm else 'm'}")
    add("command.delay_s", physics.command_delay_s, "s", PRIOR_FLOOR["delay_s"])
    add("box.mass_kg", physics.box.mass_kg, "kg")
    add("box.friction", physics.box.friction, "1")
    add("finger.friction", physics.finger_friction, "1")
    return ParameterSet(items)


def scene_files(workcell: WorkcellDescription, physics: WorkcellPhysics,
                geometry: GeometryLayer | None = None) -> dict[str, bytes | Path]:
    """The MJCF scene with its meshes and textures, relocated into the bundle (with the
    measured geometry layer applied, and kept as an input, when there is one)."""
    # MjSpec.to_xml() compiles, so it needs the assets where they are now; the file
    # references are rewritten to bundle-relative paths in the written XML instead.
    scene = ET.fromstring(build_workcell_spec(workcell, physics, geometry=geometry).to_xml())
    files: dict[str, bytes | Path] = {}
    for kind, folder in (("mesh", "meshes"), ("texture", "textures")):
        for element in scene.iter(kind):
            if element.get("file"):
                source = Path(element.get("file"))
                relative = f"{folder}/{element.get('name')}{source.suffix}"
                files[relative] = source
                element.set("file", relative)
    compiler = scene.find("compiler")
    for attribute in ("meshdir", "texturedir", "assetdir"):
        if compiler is not None and attribute in compiler.attrib:
            del compiler.attrib[attribute]
    files[SCENE_FILE] = ET.tostring(scene, encoding="unicode").encode()
    files[URDF_FILE] = workcell.urdf_xml.encode()
    if geometry is not None:
        files[GEOMETRY_FILE] = geometry.to_yaml().encode()
    return files


def twin_geometry(bundle: TwinBundle) -> GeometryLayer | None:
    """The measured geometry layer a twin version carries, if any."""
    return load_geometry_layer(bundle.file_path(GEOMETRY_FILE)) if GEOMETRY_FILE in bundle.manifest.files else None


class NominalTwinMismatch(TwinError):
    """v0 exists and is intact, but is not the nominal twin that urdf/ and config/ give now."""


def build_nominal_twin(root: Path, workcell_name: str, *, config_dir: Path | None = None,
                       urdf_path: Path | None = None) -> TwinBundle:
    config_dir = config_dir or default_config_dir()
    return build_twin_from_physics(root, workcell_name, config_dir / "nominal_physics.yaml", version=0,
                                   created_by="nominal", source="nominal",
                                   note="nominal twin from urdf/ and config/ (no recording used)",
                                   config_dir=config_dir, urdf_path=urdf_path)


def build_or_verify_nominal_twin(root: Path, workcell_name: str, *, config_dir: Path | None = None,
                                 urdf_path: Path | None = None) -> tuple[TwinBundle, bool]:
    """Write v0, or verify the v0 that is there: (the twin, True when it was written now).

    An existing v0 must be intact (`TwinIntegrityError` otherwise) and hold exactly what
    urdf/ and config/ give now: the same files, byte for byte, and the same parameters
    (`NominalTwinMismatch` otherwise, naming what differs). Nothing is written then.
    """
    if (Path(root) / workcell_name / "v0").exists():
        existing = load_twin_version(root, workcell_name, 0)
        config_dir = config_dir or default_config_dir()
        files, parameters = _twin_contents(config_dir / "nominal_physics.yaml", source="nominal",
                                           config_dir=config_dir, urdf_path=urdf_path)
        expected = {rel: _sha256(content) for rel, content in files.items()}
        differ = sorted(rel for rel in set(expected) | set(existing.manifest.files)
                        if expected.get(rel) != existing.manifest.files.get(rel))
        changed = sorted(name for name in set(parameters) | set(existing.parameters)
                         if parameters.get(name) != existing.parameters.get(name))
        if changed:
            differ.append(f"{len(changed)} parameter(s), e.g. {changed[0]}")
        if differ:
            raise NominalTwinMismatch(
                f"{existing.path} is not the nominal twin that urdf/ and config/ give now (differs: "
                f"{', '.join(differ)}); twins are immutable: keep it and build later versions on it, "
                f"or write the new nominal twin under another --root")
        return existing, False
    return build_nominal_twin(root, workcell_name, config_dir=config_dir, urdf_path=urdf_path), True


def _sha256(content: bytes | Path) -> str:
    return sha256_of(content) if isinstance(content, Path) else hashlib.sha256(content).hexdigest()


def _twin_contents(physics_path: Path, *, source: str, config_dir: Path | None,
                   urdf_path: Path | None) -> tuple[dict[str, bytes | Path], ParameterSet]:
    """The files and parameters of a twin whose physics are `physics_path`."""
    workcell = load_workcell(config_dir or default_config_dir(), urdf_path)
    physics = load_physics(physics_path)
    files = scene_files(workcell, physics)
    # The inputs travel with the twin (and are hashed), so it is reproducible from itself.
    files["inputs/physics.yaml"] = Path(physics_path)
    files["inputs/workcell.yaml"] = workcell.config_path
    files["inputs/workcell_description.urdf"] = workcell.urdf_path
    return files, physics_parameters(physics, source=source)


def build_twin_from_physics(root: Path, workcell_name: str, physics_path: Path, *, created_by: str,
                            source: str, note: str, version: int | None = None,
                            parent_version: int | None = None, config_dir: Path | None = None,
                            urdf_path: Path | None = None, measured_std_fraction: float | None = None) -> TwinBundle:
    """A twin whose physics are a given hypothesis file (v0 from the nominal one).

    `measured_std_fraction`: every parameter marked identified, with this fraction of its
    mean as its std (a twin of known physics and stated uncertainty, for tests and
    benchmarks that score a stage against it)."""
    files, parameters = _twin_contents(physics_path, source=source, config_dir=config_dir, urdf_path=urdf_path)
    if measured_std_fraction is not None:
        parameters = ParameterSet({n: Parameter(p.mean, measured_std_fraction * abs(p.mean), True, p.unit, source)
                                   for n, p in parameters.items()})
    provenance = Provenance(created_by=created_by, parent_version=parent_version, note=note)
    return write_twin_version(root, workcell_name, parameters=parameters,
                              provenance=provenance, files=files, version=version)


def ensure_nominal_twin(root: Path, workcell_name: str,
                        progress: Callable[[str], None] = lambda _: None) -> TwinBundle:
    """Load (and verify) the newest version, building v0 first when there is none."""
    if latest_version(root, workcell_name) is None:
        progress(f"building the nominal twin {workcell_name} v0 in {root}")
        build_nominal_twin(root, workcell_name)
    return load_twin_version(root, workcell_name)


def load_scene(bundle: TwinBundle) -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(bundle.file_path(SCENE_FILE)))


def load_twin_workcell(bundle: TwinBundle) -> WorkcellDescription:
    """The workcell description a twin was built from, with the twin's own composed URDF."""
    workcell = load_workcell(bundle.file_path("inputs/workcell.yaml"),
                             bundle.file_path("inputs/workcell_description.urdf"))
    return dataclasses.replace(workcell, urdf_xml=bundle.file_path(URDF_FILE).read_text())
