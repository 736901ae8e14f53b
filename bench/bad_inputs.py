"""Bad-input benchmark: the whole corpus of test/test_bad_inputs.py against every CLI.

Every generated bad input (damaged bags, spoiled configs and data sets, tampered twins,
out-of-range options, outputs that exist) is run against every command that reads it, each
run in a folder of its own. Prints what the issue counted: bad inputs tried, runs, clear
errors, tracebacks (and how many distinct), runs that changed their inputs, and every run
that did not end as expected.

    .venv/bin/python bench/bad_inputs.py               # in this process, through each main(argv)
    .venv/bin/python bench/bad_inputs.py --subprocess  # each run as a real `twinloop` process (slower)
    .venv/bin/python bench/bad_inputs.py --only bag/   # runs whose name starts with this
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

CORPUS_FILE = Path(__file__).resolve().parents[1] / "test" / "test_bad_inputs.py"


def load_corpus():
    spec = importlib.util.spec_from_file_location("bad_input_corpus", CORPUS_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file loads
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subprocess", action="store_true", help="run each command as a `twinloop` process")
    parser.add_argument("--only", default="", help="run only runs whose name starts with this")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (their path is printed)")
    args = parser.parse_args()
    corpus = load_corpus()
    runs = [r for r in corpus.corpus() if r.name.startswith(args.only)]
    work = Path(tempfile.mkdtemp(prefix="twinloop-bad-inputs-"))
    started = time.monotonic()
    base = corpus.make_base(work / "base")
    base_before = corpus.snapshot(base.root)
    print(f"base inputs made in {time.monotonic() - started:.1f} s; {len(runs)} runs "
          f"({'subprocesses' if args.subprocess else 'in process'})", flush=True)
    outcomes = []
    started = time.monotonic()
    for index, run in enumerate(runs):
        outcome = corpus.execute(run, base, work / f"run{index:03d}", in_process=not args.subprocess)
        outcomes.append(outcome)
        if outcome.problems():
            print(f"  {run.name}: {'; '.join(outcome.problems())}", flush=True)
    elapsed = time.monotonic() - started

    inputs = {o.run.input for o in outcomes}
    errors = [o for o in outcomes if o.code not in (0, None)]
    clear_errors = [o for o in errors if o.clear]
    accepted = [o for o in outcomes if o.code == 0 and o.run.expect == 0 and not o.traceback]
    tracebacks = [o for o in outcomes if o.traceback]
    distinct = Counter(o.stderr.strip().splitlines()[-1] if o.stderr.strip() else "no output" for o in tracebacks)
    changed = [o for o in outcomes if o.changed]
    unexpected = [o for o in outcomes if not o.traceback and o.code != o.run.expect]
    print()
    print(f"bad inputs tried:        {len(inputs)}")
    print(f"runs (input x command):  {len(outcomes)} in {elapsed:.1f} s "
          f"({elapsed / max(1, len(outcomes)) * 1e3:.0f} ms per run)")
    print(f"clear errors:            {len(clear_errors)} of {len(errors)} errors (expected exit code, one line "
          "naming the command, no traceback)")
    print(f"accepted, harmless:      {len(accepted)} (exit 0 where the input does not concern the command, "
          "e.g. bag info on a whole bag without /joint_states; repair of a damaged bag)")
    print(f"tracebacks:              {len(tracebacks)} ({len(distinct)} distinct)")
    for line, count in distinct.most_common():
        print(f"    {count} x {line}")
    print(f"inputs changed:          {len(changed)}")
    print(f"unexpected exit codes:   {len(unexpected)}")
    print(f"shared good inputs:      {'unchanged' if corpus.snapshot(base.root) == base_before else 'CHANGED'}")
    by_kind = Counter(o.run.name.split("/")[0] for o in outcomes)
    print("runs by kind:            " + ", ".join(f"{kind} {count}" for kind, count in sorted(by_kind.items())))
    if args.keep:
        print(f"run folders kept in {work}")
    else:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not (tracebacks or changed or unexpected) else 1


if __name__ == "__main__":
    sys.exit(main())
