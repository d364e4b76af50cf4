"""`python -m torch_pjrt <command>`: info, demo, ops (coverage), cache, report, precompile."""

from __future__ import annotations

import argparse
import sys


def info(args: argparse.Namespace) -> int:
    """Devices, versions and settings."""
    from . import cli

    return cli.run_info(args)


def demo(args: argparse.Namespace) -> int:
    """Train a small GPT on the pjrt device (the main job)."""
    from .demo.train import run

    return run(args)


def ops(args: argparse.Namespace) -> int:
    """OpInfo coverage: every op_db op on pjrt against the CPU."""
    from . import cli

    return cli.run_ops(args)


def cache(args: argparse.Namespace) -> int:
    """The persistent compile cache: info, clear, export FILE or import FILE."""
    from . import cli

    return cli.run_cache(args)


def report(args: argparse.Namespace) -> int:
    """Run a Python script (or -m module) and print torch_pjrt.metrics.report() at its end."""
    from . import cli

    return cli.run_report(args)


def precompile(args: argparse.Namespace) -> int:
    """Run a script's first steps to fill the compile cache (to export to other machines)."""
    from .precompile import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    from . import cli

    parser = argparse.ArgumentParser(prog="python -m torch_pjrt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for fn in (info, demo, ops, cache, report, precompile):
        p = sub.add_parser(fn.__name__, help=fn.__doc__, description=fn.__doc__)
        p.set_defaults(func=fn)
        if fn is ops:
            cli.add_ops_arguments(p)
        elif fn is demo:
            from .demo.train import add_arguments

            add_arguments(p)
        elif fn is cache:
            p.add_argument("action", choices=("info", "clear", "export", "import"))
            p.add_argument("file", nargs="?", help="export / import: the packed cache (a tar "
                           "file; .gz or .tgz: compressed)")
        elif fn is report:
            cli.add_report_arguments(p)
        elif fn is precompile:
            from .precompile import add_arguments as add_precompile_arguments

            add_precompile_arguments(p)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
