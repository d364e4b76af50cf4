"""Each layer of torch_pjrt imports only itself and the layers below it (DESIGN.md's
order), read from every module's source: imports inside functions count too. Where a
lower layer needs an upper one, the upper one registers a hook (runtime.on_initialize,
sync.on_synchronize, table.install)."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "torch_pjrt"

# Bottom layer first. A part is a subpackage or a top-level module of torch_pjrt; ""
# is torch_pjrt/__init__.py itself, which imports every layer to start them.
LAYERS = [
    # torch-release differences, settings, metrics, loggers, import hooks: plain Python for
    # every layer
    ("_after_import", "_compat", "_env", "counters", "logs"),
    ("runtime",),
    ("storage",),
    ("lowering",),
    ("eager",),
    ("amp", "compile", "distributed", "kernels", "optim_step"),
    ("", "_autoload", "__main__", "cli", "conformance", "conformance_errors",
     "conformance_known_failures", "demo", "precompile", "profiler", "report"),
    ("integrations",),  # glue for other libraries (Lightning...): imported by users only
]

# (importing module, imported part): deliberate upward imports, each with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("torch_pjrt", "integrations"): "import torch_pjrt installs the Trainer's default-device "
    "hook (integrations/huggingface.py: an import hook that waits for transformers; it "
    "imports no library)",
}

_RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def _module_name(path: pathlib.Path) -> str:
    parts = ("torch_pjrt",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str:
    """'torch_pjrt.eager.graph' -> 'eager'; 'torch_pjrt' -> ''."""
    return module.split(".")[1] if "." in module else ""


def _is_part(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` statement in `package` imports from."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_parts(module: str, is_package: bool, source: str) -> list[tuple[int, str]]:
    """(line, part of torch_pjrt) of every import of torch_pjrt in `source`."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            targets = [(target, tuple(a.name for a in node.names))]
        else:
            continue
        for target, names in targets:
            if target != "torch_pjrt" and not target.startswith("torch_pjrt."):
                continue
            if target == "torch_pjrt" and names:  # from torch_pjrt import runtime, metrics
                found += [(node.lineno, name if _is_part(name) else "") for name in names]
            else:
                found.append((node.lineno, _part(target)))
    return found


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, _module_name(path)


def test_every_part_has_a_layer():
    parts = {_part(name) for _, name in _modules()}
    assert parts - set(_RANK) == set(), "place these in LAYERS"


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path, module in _modules():
        part = _part(module)
        for line, target in imported_parts(module, path.name == "__init__.py",
                                           path.read_text()):
            if _RANK[target] > _RANK[part] and (module, target) not in EXCEPTIONS:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports "
                              f"{target or 'torch_pjrt'} ({part or 'torch_pjrt'} is lower)")
    assert upward == [], "\n".join(upward)


@pytest.mark.parametrize("module, is_package, source, expected", [
    ("torch_pjrt.runtime.sync", False, "def f():\n    from ..eager import graph\n",
     [(2, "eager")]),
    ("torch_pjrt.runtime", True, "from .. import optim_step, counters\n",
     [(1, "optim_step"), (1, "counters")]),
    ("torch_pjrt.storage.table", False, "import torch_pjrt.lowering.checks\n",
     [(1, "lowering")]),
    ("torch_pjrt.eager", True, "from . import graph\nfrom torch_pjrt import metrics\n",
     [(1, "eager"), (2, "")]),
    ("torch_pjrt.lowering.apply", False, "import torch\nfrom jax import numpy\n", []),
])
def test_imports_are_read_with_their_layer(module, is_package, source, expected):
    """The reader sees relative, absolute and in-function imports (else the test above
    could pass by reading nothing)."""
    assert imported_parts(module, is_package, source) == expected


def import_edges(module: str, is_package: bool, source: str) -> list[tuple[int, str, bool]]:
    """(line, imported module, binds a name) of each torch_pjrt import that runs when
    `module` is imported (at module level or in a class body, not in a function). `from .x
    import f` binds a name: it needs x's code to have run to its end; `from . import x` and
    `import a.x` bind a module, which a caller may use later."""
    package = module if is_package else module.rpartition(".")[0]
    found = []

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Import):
                found.extend((node.lineno, a.name, False) for a in node.names
                             if a.name.startswith("torch_pjrt"))
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                if not target.startswith("torch_pjrt"):
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    if _module_path(sub) is not None:
                        found.append((node.lineno, sub, False))
                    else:
                        found.append((node.lineno, target, True))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)  # the body runs for type checkers only
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []) or [])

    visit(ast.parse(source).body)
    return found


def _module_path(module: str) -> pathlib.Path | None:
    rel = pathlib.Path(*module.split(".")[1:])
    for path in (PACKAGE / rel / "__init__.py", PACKAGE / f"{rel}.py"):
        if path.is_file():
            return path
    return None


def test_no_import_cycle_takes_a_name_from_a_half_imported_module():
    """Importing any module first works: where modules import each other at import time,
    each import in the cycle binds the module, never a name from it (`from .x import f`
    from a module that is still running its own imports raises ImportError). Which module
    a process imports first depends on the user (torch_pjrt.kernels, eager.op_cache...)."""
    edges = {}
    for path, module in _modules():
        edges[module] = import_edges(module, path.name == "__init__.py", path.read_text())

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(t for _, t, _ in edges.get(m, ()))
        return False

    fragile = [f"{_module_path(m).relative_to(PACKAGE.parent)}:{line} takes a name from "
               f"{target}, which imports {m} back"
               for m, found in edges.items() for line, target, binds in found
               if binds and target != m and reaches(target, m)]
    assert fragile == [], "\n".join(fragile)


def test_the_cycle_reader_sees_names_and_modules():
    source = ("from .trace import make_trace\nfrom . import graph\nimport torch_pjrt.logs\n"
              "def f():\n    from .tiers import quick\nclass C:\n    from ..storage import views\n"
              "if TYPE_CHECKING:\n    from .schedule import Piece\n")
    assert import_edges("torch_pjrt.eager.op_cache", False, source) == [
        (1, "torch_pjrt.eager.trace", True), (2, "torch_pjrt.eager.graph", False),
        (3, "torch_pjrt.logs", False), (7, "torch_pjrt.storage.views", False)]
