"""Physical parameters of a twin, each a mean with a standard deviation.

A twin carries its own uncertainty: randomization later samples from these
distributions instead of invented ranges, so a parameter is never a bare number.
Pure Python; never imports rclpy.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["Parameter", "ParameterError", "ParameterSet", "PARAMETER_NAME_PATTERN"]

# `<group>.<...>.<quantity>`, e.g. `joint.panda_joint1.damping`, `command.delay_s`.
# The group is a lower-case word; later parts may carry URDF joint/link names,
# which use upper case and hyphens in the wild.
PARAMETER_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[A-Za-z0-9_][A-Za-z0-9_\-]*)+$")


class ParameterError(ValueError):
    """A parameter or parameter set is invalid; the message says which and what to do."""


@dataclass(frozen=True)
class Parameter:
    """One physical quantity as mean ± std (one standard deviation, same unit as mean).

    `identifiable` says whether the recorded data can pin this value down; an
    unidentifiable parameter keeps its prior and its std should say so.
    `source` says where the value came from: "nominal", "identified", "calibrated", ...
    """

    mean: float
    std: float
    identifiable: bool
    unit: str
    source: str
    note: str | None = None

    def __post_init__(self) -> None:
        # bool is an int subclass; True as a mass is a bug, not a number.
        for attr in ("mean", "std"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ParameterError(
                    f"{attr} must be a real number, got {type(value).__name__} {value!r}; "
                    f"give a plain float"
                )
            # Store plain floats so YAML dumps and equality never see numpy scalars.
            object.__setattr__(self, attr, float(value))
        if not math.isfinite(self.mean):
            raise ParameterError(
                f"mean is {self.mean}; give a finite value (use a large std for an unknown value)"
            )
        if not math.isfinite(self.std) or self.std < 0.0:
            raise ParameterError(
                f"std is {self.std}; give a finite standard deviation >= 0 (0 means exactly known)"
            )
        if not isinstance(self.identifiable, bool):
            raise ParameterError(
                f"identifiable must be true or false, got {self.identifiable!r}"
            )
        for attr in ("unit", "source"):
            if not isinstance(getattr(self, attr), str):
                raise ParameterError(f"{attr} must be a string, got {getattr(self, attr)!r}")
        if not self.source:
            raise ParameterError(
                'source is empty; say where the value came from, e.g. "nominal" or "identified"'
            )
        if self.note is not None and not isinstance(self.note, str):
            raise ParameterError(f"note must be a string or absent, got {self.note!r}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mean": self.mean,
            "std": self.std,
            "identifiable": self.identifiable,
            "unit": self.unit,
            "source": self.source,
        }
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Parameter":
        if not isinstance(data, Mapping):
            raise ParameterError(
                f"expected a mapping with keys mean, std, identifiable, unit, source; got {data!r}"
            )
        known = {f.name for f in fields(cls)}
        required = known - {"note"}
        missing = sorted(required - data.keys())
        unknown = sorted(set(data.keys()) - known)
        if missing:
            raise ParameterError(f"missing key(s) {missing}; every parameter needs {sorted(required)}")
        if unknown:
            # A typo like `stdev` would otherwise silently drop the uncertainty.
            raise ParameterError(f"unknown key(s) {unknown}; allowed keys are {sorted(known)}")
        return cls(**dict(data))


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not PARAMETER_NAME_PATTERN.match(name):
        raise ParameterError(
            f"parameter name {name!r} is not a dotted name; use `<group>.<...>.<quantity>` "
            f"such as `joint.panda_joint1.damping` or `command.delay_s`"
        )


class ParameterSet(Mapping[str, Parameter]):
    """An ordered, immutable mapping of dotted parameter names to `Parameter`.

    Order is kept (insertion order) so twin.yaml lists parameters the way the
    stage that wrote them grouped them, and diffs between versions stay readable.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Parameter] | None = None) -> None:
        checked: dict[str, Parameter] = {}
        for name, param in (items or {}).items():
            _check_name(name)
            if not isinstance(param, Parameter):
                raise ParameterError(
                    f"parameter {name!r}: expected a Parameter, got {type(param).__name__}; "
                    f"build it with Parameter(mean=..., std=..., ...) or use ParameterSet.from_dict"
                )
            checked[name] = param
        self._items = checked

    # Mapping protocol
    def __getitem__(self, name: str) -> Parameter:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        # Order is part of the value: it is what the file shows.
        if isinstance(other, ParameterSet):
            return list(self._items.items()) == list(other._items.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"ParameterSet({self._items!r})"

    def means(self) -> dict[str, float]:
        return {name: p.mean for name, p in self._items.items()}

    def stds(self) -> dict[str, float]:
        return {name: p.std for name, p in self._items.items()}

    def with_updates(self, updates: Mapping[str, Parameter]) -> "ParameterSet":
        """A new set: existing names keep their position, new names go at the end."""
        merged = dict(self._items)
        merged.update(updates)
        return ParameterSet(merged)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: p.to_dict() for name, p in self._items.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ParameterSet":
        if not isinstance(data, Mapping):
            raise ParameterError(
                f"parameters must be a mapping of dotted names to parameters, got {type(data).__name__}"
            )
        items: dict[str, Parameter] = {}
        for name, raw in data.items():
            _check_name(name)
            try:
                items[name] = Parameter.from_dict(raw)
            except ParameterError as exc:
                raise ParameterError(f"parameter {name!r}: {exc}") from None
        return cls(items)
