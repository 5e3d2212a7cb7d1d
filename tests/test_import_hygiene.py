"""The layers of docs/development.md hold at run time, for every module, not a hand-picked few.

The agent runs inside every training process (and its bootstrap in every Python process that
`zeromon run` starts): importing it must stay light and must never load a UI library or anything of
zeromon above the analysis layer. The model, the analysis, the sources and the views are what the
TUI and the dashboard share: no UI library there either. The modules are walked from the packages,
so a new module is covered without editing this file.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UI_MODULES = ("textual", "dash", "plotly", "dash_ag_grid", "tsdownsample")
CLIENTS = ("zeromon.tui", "zeromon.commands", "zeromon.cli", "zeromon_dashboard")
ABOVE_ANALYSIS = ("zeromon.sources", "zeromon.exporters", "zeromon.views", *CLIENTS)

# package -> what importing any one of its modules must not load.
FORBIDDEN_BY_PACKAGE: dict[str, tuple[str, ...]] = {
    "zeromon_agent": UI_MODULES + ABOVE_ANALYSIS,
    "zeromon.model": UI_MODULES + ("zeromon.analysis",) + ABOVE_ANALYSIS,
    "zeromon.analysis": UI_MODULES + ABOVE_ANALYSIS,
    "zeromon.sources": UI_MODULES + ("zeromon.views",) + CLIENTS,
    "zeromon.views": UI_MODULES + CLIENTS,
    # the demo's scenarios and its training script (run in the demo's ranks: torch, never zeromon's clients)
    "zeromon.demo": UI_MODULES + ("zeromon.views",) + CLIENTS,
}

# Runs in a fresh interpreter: for each module, a forked child (a copy of an interpreter that has
# loaded only the preloads) imports it and reports which forbidden modules are then loaded. A fork is
# far cheaper than a fresh interpreter that imports torch again for each of the agent's modules.
_CHILD = r"""
import json, os, sys, traceback
plan = json.loads(sys.argv[1])
for preload in sys.argv[2:]:
    __import__(preload)
results = {}
for module, forbidden in plan.items():
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            __import__(module)
            loaded = sorted(m for m in sys.modules
                            if any(m == f or m.startswith(f + ".") for f in forbidden))
            answer = {"loaded": loaded}
        except BaseException:
            answer = {"error": traceback.format_exc(limit=3)}
        os.write(write_fd, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    results[module] = json.loads(b"".join(chunks) or b'{"error": "the child died"}')
print(json.dumps(results))
"""


def _modules_of(package: str) -> list[str]:
    spec = find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    walked = pkgutil.walk_packages(list(spec.submodule_search_locations), prefix=package + ".")
    return [package] + sorted(info.name for info in walked)


def _import_each(plan: dict[str, tuple[str, ...]], preload: tuple[str, ...] = ()) -> dict[str, dict[str, object]]:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(plan), *preload], capture_output=True,
                         text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_module_of_the_lower_layers_imports_nothing_above_it() -> None:
    plan = {module: forbidden for package, forbidden in FORBIDDEN_BY_PACKAGE.items()
            for module in _modules_of(package)}
    # The walk finds what these layers are made of (so that it cannot silently find nothing).
    assert {"zeromon_agent.agent", "zeromon_agent.bootstrap", "zeromon_agent.serve.endpoint", "zeromon.model.codec",
            "zeromon.analysis.oom", "zeromon.sources.live", "zeromon.views.fleet"} <= set(plan)
    assert len(plan) > 60, sorted(plan)
    # What the agent runs in, the training (torch) and the agent's core, is loaded once before the forks, and numpy
    # before the other layers': a forbidden module that a preloaded one loads is in every fork's answer all the same.
    torch_side = {m: f for m, f in plan.items() if m.split(".")[0] == "zeromon_agent" or m.startswith("zeromon.demo")}
    results = _import_each(torch_side, preload=("torch", "zeromon_agent.agent"))
    results.update(_import_each({m: f for m, f in plan.items() if m not in torch_side}, preload=("numpy",)))
    assert set(results) == set(plan)
    errors = {m: r["error"] for m, r in results.items() if "error" in r}
    assert not errors, errors
    offenders = {m: r["loaded"] for m, r in results.items() if r["loaded"]}
    assert not offenders, f"imported across the layers: {offenders}"


def test_the_check_sees_a_forbidden_import() -> None:
    # The same machinery on a module that does load a UI library: the check can fail.
    results = _import_each({"zeromon.tui.app": ("textual",), "zeromon.model.units": ("textual",)})
    assert "textual" in results["zeromon.tui.app"]["loaded"]
    assert results["zeromon.model.units"]["loaded"] == []


def test_the_bootstrap_that_zeromon_run_injects_stays_light() -> None:
    """`zeromon run` puts bootstrap/site first on PYTHONPATH, so its sitecustomize runs in every Python
    process the command starts, torchrun's launcher included: it must not import torch until the
    program does, and neither it nor the patched torch.distributed may load a UI library or anything
    of zeromon above the analysis layer."""
    import zeromon_agent.bootstrap

    site_dir = Path(zeromon_agent.bootstrap.__file__).parent / "site"
    forbidden = UI_MODULES + ABOVE_ANALYSIS
    code = ("import json, sys\n"
            "def loaded(): return sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') "
            f"for f in {forbidden!r}))\n"
            "before = {'sitecustomize': 'sitecustomize' in sys.modules, 'torch': 'torch' in sys.modules, "
            "'loaded': loaded()}\n"
            "import torch, torch.distributed as dist\n"
            "after = {'patched': hasattr(dist.all_reduce, '__zeromon_original__'), "
            "'loaded': loaded()}\n"
            "print(json.dumps({'before': before, 'after': after}))")
    env = dict(os.environ, ZEROMON_ENABLE="1", PYTHONPATH=os.pathsep.join(
        [str(site_dir)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["before"] == {"sitecustomize": True, "torch": False, "loaded": []}, result
    assert result["after"]["loaded"] == [], result
    assert result["after"]["patched"], "the bootstrap ran: torch.distributed's collectives are wrapped"


def _imported_after(statement: str) -> dict[str, bool]:
    code = f"import sys\n{statement}\nimport json\nprint(json.dumps({{m: m in sys.modules for m in {UI_MODULES!r} + ('torch',)}}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_package_root_does_not_import_torch() -> None:
    # `import zeromon_agent` costs milliseconds: torch is imported when the agent starts.
    assert _imported_after("import zeromon_agent")["torch"] is False


def test_the_layers_hold_as_import_contracts() -> None:
    """The layers as import-linter contracts (pyproject.toml [tool.importlinter]): the dashboard and
    the TUI never import each other, the views and everything below them import no UI library, the
    agent nothing above the analysis. Static, so it also sees imports inside functions."""
    lint_imports = Path(sys.executable).parent / "lint-imports"  # installed with the test extra, beside python
    result = subprocess.run([str(lint_imports), "--no-cache"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("package", ["zeromon_dashboard", "zeromon"])
def test_the_package_roots_load_lazily(package: str) -> None:
    imported = _imported_after(f"import {package}")
    assert not any(imported[m] for m in UI_MODULES), imported


LIBRARY = (REPO / "zeromon", REPO / "agents" / "zeromon_agent", REPO / "dashboard" / "zeromon_dashboard")
OWN_PACKAGES = ("zeromon", "zeromon_agent", "zeromon_dashboard")


def borrowed_private_names(roots: tuple[Path, ...] = LIBRARY) -> list[str]:
    """'file:line: module._name' for each underscore name a library module imports from another of zeromon's:
    a name another module needs is public (or moves to the module both use)."""
    import ast

    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OWN_PACKAGES:
                    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                    found += [f"{where}:{node.lineno}: {node.module}.{alias.name}"
                              for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_borrows_another_modules_private_names(tmp_path: Path) -> None:
    assert borrowed_private_names() == []
    (tmp_path / "m.py").write_text("from zeromon.model.kinds import GETTERS, _dumps, __version__\n")  # the check sees one
    assert borrowed_private_names((tmp_path,)) == [f"{tmp_path / 'm.py'}:1: zeromon.model.kinds._dumps"]
