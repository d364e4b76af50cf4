"""A long fuzz sweep that keeps going past differences and reports them, grouped:
`python tests/fuzz/sweep.py --examples 5000 --seed 1 [--compile]` (docs/reliability.md).

Programs run in worker processes of `--chunk` programs each (seeds seed, seed+1, ...): the
op cache of one process grows with every new signature (about 2 MB each on XLA:CPU).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _kind(diff: str) -> str:
    """A difference without its particulars: what groups the report."""
    diff = re.sub(r"`[^`]*`", "`...`", diff)
    diff = re.sub(r"\([^()]*\)", "(...)", diff)
    return re.sub(r"\b[xv]\d+\b|\d+", "#", diff)[:160]


def _worker(examples: int, seed_: int, modes: tuple[str, ...]) -> dict:
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from fuzz.differential import check
    from fuzz.programs import programs

    result = {"ran": 0, "known": collections.Counter(), "new": []}

    @seed(seed_)
    @settings(max_examples=examples, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate,))
    @given(program=programs())
    def sweep(program):
        result["ran"] += 1
        verdict = check(program, modes)
        for mode, name in verdict.known.items():
            result["known"][f"{mode}: {name}"] += 1
        for mode, diffs in verdict.new.items():
            result["new"].append({"mode": mode, "lines": len(program.all_lines),
                                  "source": program.source(mode), "diffs": diffs})

    sweep()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=250, help="programs per worker process")
    parser.add_argument("--compile", action="store_true", help="also under torch.compile")
    parser.add_argument("--show", type=int, default=1, help="programs shown per kind")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    modes = ("strict", "fused", "debug") + (("compile",) if args.compile else ())
    if args.worker:
        print(json.dumps(_worker(args.examples, args.seed, modes)))
        return

    start = time.time()
    ran, known, new = 0, collections.Counter(), collections.defaultdict(list)
    for i, first in enumerate(range(0, args.examples, args.chunk)):
        n = min(args.chunk, args.examples - first)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--examples", str(n),
               "--seed", str(args.seed + i)] + (["--compile"] if args.compile else [])
        done = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True)
        part = json.loads(done.stdout.strip().splitlines()[-1])
        ran += part["ran"]
        known.update(part["known"])
        for item in part["new"]:
            new[_kind(item["diffs"][0])].append(item)
        print(f"worker {i}: {part['ran']} programs, {len(part['new'])} new differences "
              f"({time.time() - start:.0f} s)", file=sys.stderr, flush=True)

    print(f"programs run: {ran} ({time.time() - start:.0f} s), modes: {', '.join(modes)}")
    print(f"known differences: {sum(known.values())} (program x mode)")
    for name, n in sorted(known.items()):
        print(f"  {n:5d}  {name}")
    print(f"new differences: {sum(len(v) for v in new.values())} (program x mode), "
          f"{len(new)} kinds")
    for kind, items in sorted(new.items(), key=lambda kv: -len(kv[1])):
        by_mode = collections.Counter(item["mode"] for item in items)
        print(f"\n=== {len(items)} x {dict(by_mode)}: {kind}")
        for item in sorted(items, key=lambda it: it["lines"])[:args.show]:
            print(item["source"])
            print("\n".join("# " + d for d in item["diffs"][:6]))


if __name__ == "__main__":
    main()
