"""Recording profiles: named sets of topics (explicit names and regular expressions).

A profile file (config/recording.yaml) looks like::

    profiles:
      calibration:
        description: camera + robot data for intrinsics and hand-eye
        topics: [/joint_states, /tf_static]        # exact names; each is expected to appear
        regex: ["/(wrist|static)_camera/.*"]       # re.fullmatch against topic names
        exclude: ["/rosout"]                        # re.fullmatch; wins over topics and regex
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PROFILE_KEYS = {"description", "topics", "regex", "exclude"}


class ProfileError(ValueError):
    """A profile file or profile name is unusable; the message says what to fix."""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    topics: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    _compiled: tuple[re.Pattern, ...] = field(default=(), repr=False, compare=False)
    _excluded: tuple[re.Pattern, ...] = field(default=(), repr=False, compare=False)

    def matches(self, topic: str) -> bool:
        if any(p.fullmatch(topic) for p in self._excluded):
            return False
        return topic in self.topics or any(p.fullmatch(topic) for p in self._compiled)

    def missing(self, seen_topics) -> list[str]:
        """The explicit topics of this profile that are not among `seen_topics`."""
        seen = set(seen_topics)
        return [t for t in self.topics if t not in seen]


def _strings(value, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ProfileError(f"{where}: expected a list of non-empty strings, got {value!r}")
    return tuple(value)


def _compile(patterns: tuple[str, ...], where: str) -> tuple[re.Pattern, ...]:
    out = []
    for pattern in patterns:
        try:
            out.append(re.compile(pattern))
        except re.error as error:
            raise ProfileError(f"{where}: invalid regular expression {pattern!r}: {error}") from error
    return tuple(out)


def parse_profiles(raw: object, source: str = "<profiles>") -> dict[str, Profile]:
    if not isinstance(raw, dict) or not isinstance(raw.get("profiles"), dict) or not raw["profiles"]:
        raise ProfileError(f"{source}: expected a top-level 'profiles:' mapping of profile name -> topics")
    profiles = {}
    for name, spec in raw["profiles"].items():
        where = f"{source}: profile '{name}'"
        if not isinstance(spec, dict):
            raise ProfileError(f"{where}: expected a mapping with keys {sorted(PROFILE_KEYS)}")
        unknown = set(spec) - PROFILE_KEYS
        if unknown:
            raise ProfileError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(PROFILE_KEYS)})")
        topics = _strings(spec.get("topics"), f"{where}.topics")
        bad = [t for t in topics if not t.startswith("/")]
        if bad:
            raise ProfileError(f"{where}.topics: topic names must be absolute (start with '/'): {bad}")
        regex = _strings(spec.get("regex"), f"{where}.regex")
        exclude = _strings(spec.get("exclude"), f"{where}.exclude")
        if not topics and not regex:
            raise ProfileError(f"{where}: selects nothing; give 'topics' and/or 'regex'")
        profiles[str(name)] = Profile(str(name), str(spec.get("description", "")), topics, regex, exclude,
                                      _compile(regex, f"{where}.regex"), _compile(exclude, f"{where}.exclude"))
    return profiles


def load_profiles(path: Path | str) -> dict[str, Profile]:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as error:
        raise ProfileError(f"profile file {path} does not exist; pass profiles_file or create it") from error
    except yaml.YAMLError as error:
        raise ProfileError(f"{path}: not valid YAML: {error}") from error
    return parse_profiles(raw, str(path))


def select_profile(profiles: dict[str, Profile], name: str) -> Profile:
    if name not in profiles:
        raise ProfileError(f"unknown recording profile '{name}'; known profiles: {sorted(profiles)}")
    return profiles[name]
