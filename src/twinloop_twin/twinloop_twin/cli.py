"""twinloop twin: inspect, verify, build and export twin versions.

    twinloop twin build-nominal [--root twins] [--workcell emulated]   # writes v0, or verifies it
    twinloop twin list [--root twins] [--workcell emulated]   # versions, each current / STALE / not checked
    twinloop twin show twins/emulated/v0          # status, provenance and parameters (mean ± std)
    twinloop twin verify twins/emulated/v0        # re-hash every file
    twinloop twin export-usd twins/emulated/v0 out.usda   # never over an existing file

Exit codes: 0 done (build-nominal: v0 written, or already there and verified); 2 bad input
(no such twin or twins root, a twin whose files do not match their sha256 or whose
twin.yaml is malformed, an existing output); 4 build-nominal found a v0 that is intact but
is not the nominal twin urdf/ and config/ give now. On an error one line on stderr says
what is wrong and what to do.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from twinloop_twin.bundle import TwinError, list_versions, load_twin

MISMATCH_EXIT = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop twin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build-nominal", "list"):
        command = sub.add_parser(name)
        command.add_argument("--root", default="twins", help="root folder of twin versions")
        command.add_argument("--workcell", default="emulated")
    for name in ("show", "verify"):
        sub.add_parser(name).add_argument("twin", help="a twin version folder")
    export = sub.add_parser("export-usd")
    export.add_argument("twin")
    export.add_argument("output", help="USD file to write (.usda or .usdc)")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (TwinError, OSError, ValueError) as error:
        print(f"twinloop twin: error: {one_line(error)}", file=sys.stderr)
        return 2


def one_line(error: BaseException) -> str:
    """A multi-line message (a twin's list of mismatched files, a YAML error) on one line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and line.strip() != "^"]
    return "".join(line if not i else (" " if lines[i - 1].endswith(":") else "; ") + line
                   for i, line in enumerate(lines)) or type(error).__name__


def _run(args) -> int:
    if args.command == "build-nominal":
        from twinloop_twin.nominal import NominalTwinMismatch, build_or_verify_nominal_twin
        try:
            bundle, written = build_or_verify_nominal_twin(Path(args.root), args.workcell)
        except NominalTwinMismatch as error:
            print(f"twinloop twin: error: {one_line(error)}", file=sys.stderr)
            return MISMATCH_EXIT
        print(f"wrote {bundle.path}" if written else
              f"verified {bundle.path}: intact, and the nominal twin urdf/ and config/ give now")
    elif args.command == "list":
        if not (Path(args.root) / args.workcell).is_dir():
            raise TwinError(f"no twins of workcell '{args.workcell}' under {Path(args.root)}; check --root and "
                            "--workcell, or write v0 with `twinloop twin build-nominal`")
        from twinloop_twin.status import describe, load_verdicts
        verdicts = load_verdicts(Path(args.root), args.workcell)
        for version in list_versions(Path(args.root), args.workcell):
            print(f"{args.workcell} v{version}: {describe(verdicts.get(version))}")
    elif args.command == "verify":
        bundle = load_twin(Path(args.twin))
        print(f"{bundle.path}: {len(bundle.manifest.files)} files match their sha256")
    elif args.command == "show":
        bundle = load_twin(Path(args.twin))
        provenance = bundle.manifest.provenance
        from twinloop_twin.status import describe, load_verdicts
        print(f"{bundle.workcell} v{bundle.version}  created {provenance.created_at} by {provenance.created_by}"
              + (f"  parent v{provenance.parent_version}" if provenance.parent_version is not None
                 else "  (no parent: the first version)"))
        verdict = load_verdicts(bundle.path.parent.parent, bundle.workcell).get(bundle.version)
        print(f"  status: {describe(verdict)}" + (f"; round {verdict.round}" if verdict else ""))
        if provenance.note:
            print(f"  note: {provenance.note}")
        for bag in provenance.source_bags:
            print(f"  source bag {bag.path} ({bag.split}, {bag.purpose}) sha256 {bag.sha256[:12]}")
        for name, p in bundle.parameters.items():
            flag = "" if p.identifiable else "  (not identified)"
            print(f"  {name:40s} {p.mean:12.6g} ± {p.std:<10.3g} {p.unit}{flag}")
    elif args.command == "export-usd":
        print(f"wrote {_export_usd(Path(args.twin), Path(args.output))}")
    return 0


def _export_usd(twin_path: Path, output: Path) -> Path:
    """Export into a temporary file beside `output`, then link it into place: an existing
    file is never replaced and a failed export leaves nothing behind."""
    from twinloop_twin.usd_export import export_twin_usd
    if output.exists() or output.is_symlink():
        raise FileExistsError(f"{output} exists already; give another output file or move the old one away")
    if not output.parent.is_dir():
        raise FileNotFoundError(f"folder {output.parent} does not exist; create it or give another output file")
    if output.suffix not in (".usda", ".usdc", ".usd"):
        raise ValueError(f"{output}: the output must end in .usda, .usdc or .usd")
    twin = load_twin(twin_path)
    partial = output.with_name(f".{output.stem}.partial-{os.getpid()}{output.suffix}")
    try:
        export_twin_usd(twin, partial)
        os.link(partial, output)  # fails if output appeared meanwhile: nothing is overwritten
    finally:
        partial.unlink(missing_ok=True)
    return output


if __name__ == "__main__":
    sys.exit(main())
