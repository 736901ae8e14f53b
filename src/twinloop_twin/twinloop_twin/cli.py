"""twinloop twin: inspect, verify, build and export twin versions.

    twinloop twin build-nominal [--root twins] [--workcell emulated]
    twinloop twin list [--root twins] [--workcell emulated]
    twinloop twin show twins/emulated/v0          # provenance and parameters (mean ± std)
    twinloop twin verify twins/emulated/v0        # re-hash every file
    twinloop twin export-usd twins/emulated/v0 out.usda
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from twinloop_twin.bundle import TwinError, list_versions, load_twin


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
    except (TwinError, FileNotFoundError, ValueError) as error:
        print(f"twinloop twin: {error}", file=sys.stderr)
        return 2


def _run(args) -> int:
    if args.command == "build-nominal":
        from twinloop_twin.nominal import build_nominal_twin
        bundle = build_nominal_twin(Path(args.root), args.workcell)
        print(f"wrote {bundle.path}")
    elif args.command == "list":
        for version in list_versions(Path(args.root), args.workcell):
            print(f"{args.workcell} v{version}")
    elif args.command == "verify":
        bundle = load_twin(Path(args.twin))
        print(f"{bundle.path}: {len(bundle.manifest.files)} files match their sha256")
    elif args.command == "show":
        bundle = load_twin(Path(args.twin))
        provenance = bundle.manifest.provenance
        print(f"{bundle.workcell} v{bundle.version}  created {provenance.created_at} by {provenance.created_by}"
              f"  parent {provenance.parent_version}")
        for bag in provenance.source_bags:
            print(f"  source bag {bag.path} ({bag.split}, {bag.purpose}) sha256 {bag.sha256[:12]}")
        for name, p in bundle.parameters.items():
            flag = "" if p.identifiable else "  (not identified)"
            print(f"  {name:40s} {p.mean:12.6g} ± {p.std:<10.3g} {p.unit}{flag}")
    elif args.command == "export-usd":
        from twinloop_twin.usd_export import export_twin_usd
        print(f"wrote {export_twin_usd(load_twin(Path(args.twin)), Path(args.output))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
