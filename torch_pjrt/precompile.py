"""`python -m torch_pjrt precompile SCRIPT [ARGS]`: a script's first steps, run to fill the
compile cache that other machines of the same platform and versions then start from.

The script runs as itself (its own data, its own shapes: the programs it will need are
the ones its first steps compile) until its training loop reaches a steady state: the
end of the first optimizer step, from the second on, in which nothing compiled or came
from the cache (`--steps auto`, the default); `--steps N` stops it after N optimizer
steps, `--steps 0` lets it run to its end (a script without an optimizer, such as one
that only generates, always does). The programs and torch.compile's entries are then on
disk under the cache directory; `--export FILE` packs them for other machines
(`python -m torch_pjrt cache import FILE` there).

Not done: a dry run with fake data. What a program is depends on every shape and dtype
the script's data gives it and on the branches its values take; made-up inputs compile
programs the real run does not use and miss the ones it does. Pass the script arguments
that make its first steps short instead (a few batches, a small evaluation).
"""

from __future__ import annotations

import argparse
import os
import sys


class _Stop(BaseException):
    """Raised out of the optimizer step that ends the run (not an Exception: the script's
    own `except Exception` does not swallow it)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", default="auto",
                   help="stop after this many optimizer steps; auto (default): after the "
                        "first step, from the second on, that compiled nothing; 0: run the "
                        "script to its end")
    p.add_argument("--cache-dir", default=None,
                   help="the cache directory to fill (default: TORCH_PJRT_CACHE_DIR's)")
    p.add_argument("--export", default=None, metavar="FILE",
                   help="then pack the cache into FILE (as `cache export FILE`)")
    p.add_argument("-m", dest="module", action="store_true",
                   help="run a module (like python -m) instead of a script")
    p.add_argument("target", help="the script (or, with -m, the module) to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")


def _stopper(steps: str):
    """The step hook that ends the run, per --steps (None: let the script end)."""
    from .runtime import watch

    if steps == "auto":
        def hook() -> None:
            done = watch.steps()
            if done >= 2 and (done - 1) not in watch.compile_steps()[-64:]:
                raise _Stop(f"steady after {done} optimizer steps")
        return hook
    try:
        limit = int(steps)
    except ValueError:
        raise SystemExit(f"precompile: --steps takes a number of steps, 0 or auto, not "
                         f"{steps!r}") from None
    if limit <= 0:
        return None

    def hook() -> None:
        if watch.steps() >= limit:
            raise _Stop(f"after {limit} optimizer steps")
    return hook


def run(args: argparse.Namespace) -> int:
    if args.cache_dir:
        os.environ["TORCH_PJRT_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    import torch

    from . import cli
    from .runtime import cache_bundle, compile_cache, watch

    if not compile_cache.enabled():
        print(f"precompile: the compile cache is off (TORCH_PJRT_COMPILE_CACHE) or its "
              f"directory {compile_cache.root()} is refused: nothing would be kept",
              file=sys.stderr)
        return 2
    hook = _stopper(args.steps)
    if hook is not None:
        watch.on_step(hook)
    status = cli.run_target(args.target, args.args, args.module, stop=_Stop)
    if status:
        print(f"precompile: {args.target} failed (exit status {status}); the programs it "
              "compiled before are kept", file=sys.stderr)
    torch.pjrt.synchronize()  # every program launched has compiled, and is on disk
    progs = watch.programs()
    compiled = sum(p.compiles for p in progs)
    loaded = sum(p.loads for p in progs)
    info = compile_cache.info()
    print(f"precompile: {args.target} ran {watch.steps()} optimizer steps; {compiled} programs "
          f"compiled, {loaded} already in the cache; {info['directory']} holds "
          f"{info['entries']} programs ({info['bytes'] / 1e6:.1f} MB)", file=sys.stderr)
    if args.export:
        done = cache_bundle.export(args.export)
        print(f"precompile: exported {done['files']} files ({done['bytes'] / 1e6:.1f} MB) to "
              f"{args.export}", file=sys.stderr)
    return status
