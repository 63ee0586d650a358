"""The package's layering: no import circles (lazy imports included); vLLM's internals
imported only by the access layer (with the runtime seams) and the patches; the algorithm
imports nothing of the package above it; `patches/` holds registered patches only; the
rooms (retrieval, trees, verification) reach each other only as ROOM_DEPENDENCIES allows
and never the proposer, which only the runner's patch builds; the kernel tests import no vLLM
(`scripts/gpu_check.sh` runs them on CUDA machines that have torch and no vLLM)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import specextend_vllm

PACKAGE_ROOT = Path(specextend_vllm.__file__).parent
VLLM_LAYERS = ("specextend_vllm.vllm_access", "specextend_vllm.patches")
ROOM_DEPENDENCIES = {"retrieval": set(), "verification": set(), "trees": {"verification"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULE_NAMES = {module_name(path) for path in PACKAGE_ROOT.rglob("*.py")}
COMPILED_MODULES = {"specextend_vllm._C"}  # built by setup.py, not a source file


def absolute_module(path: Path, node: ast.ImportFrom) -> str:
    """The module an `ImportFrom` names, a relative one resolved from `path`'s package."""
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_names(path: Path) -> set[str]:
    """`from package import submodule` depends on the submodule, not on the package;
    relative imports and `importlib.import_module("...")` count as imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = absolute_module(path, node)
            submodules = {f"{module}.{alias.name}" for alias in node.names} & (
                MODULE_NAMES | COMPILED_MODULES
            )
            names.update(submodules or {module})
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


MODULES = {module_name(path): imported_names(path) for path in PACKAGE_ROOT.rglob("*.py")}


def internal_edges(module: str) -> set[str]:
    return {name for name in MODULES[module] if name in MODULES and name != module}


def test_no_import_circles() -> None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in done:
            return
        assert module not in visiting, " -> ".join(visiting[visiting.index(module) :] + [module])
        visiting.append(module)
        for dependency in internal_edges(module):
            visit(dependency)
        visiting.pop()
        done.add(module)

    for module in MODULES:
        visit(module)


def test_vllm_internals_only_in_the_access_layer_and_the_patches() -> None:
    offenders = {
        module: sorted(name for name in names if name.startswith("vllm."))
        for module, names in MODULES.items()
        if not module.startswith(VLLM_LAYERS)
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_the_algorithm_imports_no_vllm_at_all() -> None:
    for module, names in MODULES.items():
        if module.startswith("specextend_vllm.algorithm"):
            assert not any(name == "vllm" or name.startswith("vllm.") for name in names), module


def test_the_algorithm_imports_nothing_above_it() -> None:
    for module, names in MODULES.items():
        if module.startswith("specextend_vllm.algorithm"):
            above = sorted(
                name for name in names
                if name.startswith("specextend_vllm") and not name.startswith("specextend_vllm.algorithm")
            )
            assert above == [], module


def test_patches_hold_registered_patches_only() -> None:
    """Every patch class is in the registry's list; outside `patches/`, only the package
    root imports them (through the registry), and the mechanism's error type may be
    imported."""
    import importlib

    from specextend_vllm.patches import registry
    from specextend_vllm.patches.base import VllmPatch

    for path in sorted((PACKAGE_ROOT / "patches").glob("*.py")):
        module = importlib.import_module(module_name(path))
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, VllmPatch) and value.__module__ == module.__name__:
                assert value in registry.ALL_PATCHES or path.stem == "base", value.__name__
    importers = {
        (module, name)
        for module, names in MODULES.items()
        if not module.startswith("specextend_vllm.patches")
        for name in names
        if name.startswith("specextend_vllm.patches") and name != "specextend_vllm.patches.base"
    }
    assert importers == {("specextend_vllm", "specextend_vllm.patches.registry")}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOM_DEPENDENCIES else None


def test_rooms_reach_only_the_rooms_they_build_on() -> None:
    crossings = {
        (module, name)
        for module, names in MODULES.items()
        if (room := room_of(module)) is not None
        for name in names
        if room_of(name) not in (None, room, *ROOM_DEPENDENCIES[room])
    }
    assert crossings == set()


def test_only_the_runner_patch_builds_the_proposer() -> None:
    importers = {
        module for module, names in MODULES.items() if "specextend_vllm.proposer" in names
    }
    assert importers == {"specextend_vllm.patches.runner"}


WITHOUT_VLLM = """
import importlib.abc, sys
class NoVllm(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "vllm":
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoVllm())
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests/kernels"]))
"""


def test_the_kernel_tests_import_no_vllm() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_VLLM], cwd=PACKAGE_ROOT.parent, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:]


def test_relative_imports_count_as_the_modules_they_name() -> None:
    """The layering tests read relative imports too: `from ..vllm_access import x` in
    the algorithm is the access layer, not a module named `vllm_access`."""
    sampling = PACKAGE_ROOT / "algorithm" / "sampling.py"
    package_root = PACKAGE_ROOT / "__init__.py"
    cases = {
        (sampling, "from ..vllm_access.attention_seam import AttentionLayerSeam"): (
            "specextend_vllm.vllm_access.attention_seam"
        ),
        (sampling, "from . import token_tree"): "specextend_vllm.algorithm",
        (package_root, "from .patches import registry"): "specextend_vllm.patches",
        (sampling, "from torch import nn"): "torch",
    }
    for (path, source), module in cases.items():
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ImportFrom)
        assert absolute_module(path, node) == module, source
