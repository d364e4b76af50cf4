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


def imported_parts(module: str, is_package: bool, source: str) -> list[tuple[int, str]]:
    """(line, part of torch_pjrt) of every import of torch_pjrt in `source`."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
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
