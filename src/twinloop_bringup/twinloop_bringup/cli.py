"""twinloop: one command for the whole suite, in the style of `ros2 <verb>`.

    twinloop <command> [arguments]     # twinloop <command> --help for its own help

Each command lives in its own package and registers itself under the `twinloop.commands`
entry-point group (`<name> = <module>:main`, main taking argv and returning an exit
code); this command only finds and dispatches. The list below is read from the
registered modules' docstrings without importing them, so `twinloop --help` is quick.

Exit codes: those of the command; 2 for an unknown command.
"""
from __future__ import annotations

import ast
import faulthandler
import importlib.util
import sys
from importlib.metadata import EntryPoint, entry_points

GROUP = "twinloop.commands"


def registered_commands() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in sorted(entry_points(group=GROUP), key=lambda ep: ep.name)}


def summary(entry_point: EntryPoint) -> str:
    """First line of the command's docstring, read from its source (no import): the entry
    function's where it names the command ("twinloop trials: ..."; several commands can
    share a module), else the module's."""
    module, _, function = entry_point.value.partition(":")
    try:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            return ""
        with open(spec.origin, encoding="utf-8") as source:
            tree = ast.parse(source.read())
    except (ImportError, OSError, SyntaxError, ValueError):
        return ""
    docs = [ast.get_docstring(node) or "" for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == function.strip()]
    first = _first_line(docs[0]) if docs else ""
    if not first.startswith(f"twinloop {entry_point.name}:"):
        first = _first_line(ast.get_docstring(tree) or "")
    # "twinloop bag: record, inspect, repair bags" (or "`twinloop bag`: ...") -> "record, inspect, repair bags"
    return first.split(":", 1)[1].strip() if first.lstrip("`").startswith("twinloop") and ":" in first else first


def _first_line(doc: str) -> str:
    return doc.strip().splitlines()[0] if doc.strip() else ""


def usage(commands: dict[str, EntryPoint]) -> str:
    width = max((len(name) for name in commands), default=0)
    lines = [line for line in __doc__.strip().splitlines()[:3]]
    lines += ["", "commands:"]
    lines += [f"  {name.ljust(width)}  {summary(ep)}" for name, ep in commands.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = registered_commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(commands))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    # A crash in native code (DDS, MuJoCo, Open3D) prints the Python stack of every thread
    # to stderr instead of only "Segmentation fault", so a report says where it happened.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    if name not in commands:
        print(f"twinloop: unknown command '{name}'; commands: {', '.join(commands) or 'none registered'} "
              "(is the workspace installed? run tools/setup.sh)", file=sys.stderr)
        return 2
    result = commands[name].load()(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
