"""The agent as a design a newcomer can walk (docs/development.md, "The agent's data flow"): a top folder of a
dozen entries, each for one job; imports one way between them, with no circle, type-only imports included (the
import-linter contracts in pyproject.toml, tried here against an upward import and a circle); a public face
(``zeromon_agent.__all__``) that the rest of zeromon goes through."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zeromon_agent

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "agents" / "zeromon_agent"
# Each entry of the agent's top folder, for one job (the subpackages' docstrings say which).
TOP = {"__init__.py", "agent.py", "exits.py", "compact.py", "hooks", "memory", "recorder", "live", "serve",
       "context", "bootstrap", "integrations"}
AGENT_CONTRACT = "the agent imports one way"
ACYCLIC_CONTRACT = "no import circle anywhere"


def test_the_agents_top_folder_is_a_dozen_entries_each_named_in_the_design_note() -> None:
    entries = {p.name for p in AGENT.iterdir() if p.name != "__pycache__"}
    assert entries == TOP and len(entries) <= 12
    note = (REPO / "docs" / "development.md").read_text()
    for entry in sorted(TOP - {"__init__.py"}):
        package = AGENT / entry
        if package.is_dir():  # each subpackage says what runs where, in its docstring
            assert ast.get_docstring(ast.parse((package / "__init__.py").read_text())), entry
        assert f"`{entry.removesuffix('.py')}" in note or f"{entry.removesuffix('.py')}/" in note, entry


def test_the_public_face_is_all_that_zeromon_needs() -> None:
    assert set(zeromon_agent.__all__) == {"Agent", "AgentConfig", "StepFigures", "__version__", "attach", "detach",
                                          "get_agent", "load_config", "step"}
    for name in zeromon_agent.__all__:  # each resolves, the lazy ones included
        assert getattr(zeromon_agent, name) is not None, name
    assert zeromon_agent.load_config(notices=[]).port_tries > 0
    with pytest.raises(AttributeError, match="recorder_thread"):
        zeromon_agent.recorder_thread  # noqa: B018 - no such name: the usual AttributeError
    # zeromon's own modules import the agent only through its face, and its bootstrap (a contract, and here
    # read from the source, so that a failure names the line).
    reached = []
    for root in (REPO / "zeromon", REPO / "dashboard" / "zeromon_dashboard"):
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                         [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                reached += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names
                            if n.startswith("zeromon_agent.") and n != "zeromon_agent.bootstrap"]
    assert reached == []


def _agent_layers() -> list[str]:
    """The agent's layers contract's layers, as pyproject.toml says them (read without tomllib: Python 3.10)."""
    text = (REPO / "pyproject.toml").read_text()
    block = text[text.index(f'name = "{AGENT_CONTRACT}'):]
    listed = block[block.index("layers = [") + len("layers = ["):block.index("]")]
    layers = re.findall(r'"([^"]+)"', listed)
    assert layers and ACYCLIC_CONTRACT in text
    return layers


def _lint_agent_copy(tmp_path: Path, change: tuple[str, str] | None) -> subprocess.CompletedProcess[str]:
    """lint-imports on a copy of the agent, with the agent's own contracts (the acyclic one on the agent alone);
    ``change``: (a module's path in the agent, a line added to its end)."""
    copy = tmp_path / "agents" / "zeromon_agent"
    shutil.copytree(AGENT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if change is not None:
        with (copy / change[0]).open("a") as module:
            module.write(f"\n{change[1]}\n")
    layers = ", ".join(f'"{layer}"' for layer in _agent_layers())
    lines = ['[tool.importlinter]', 'root_packages = ["zeromon_agent"]', '',
             '[[tool.importlinter.contracts]]', f'name = "{AGENT_CONTRACT}"', 'type = "layers"',
             f'layers = [{layers}]', '',
             '[[tool.importlinter.contracts]]', f'name = "{ACYCLIC_CONTRACT}"', 'type = "acyclic_siblings"',
             'ancestors = ["zeromon_agent"]']
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    lint_imports = Path(sys.executable).parent / "lint-imports"
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(tmp_path / "agents")}
    return subprocess.run([str(lint_imports), "--no-cache", str(tmp_path / "pyproject.toml")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


# (the change, the contracts it breaks, what the report names): an upward import also closes a circle.
@pytest.mark.parametrize(("change", "broken", "names"), [
    (None, (), ""),
    # The compact records, at the bottom, reaching up into the recorder that makes them.
    (("compact.py", "from zeromon_agent.recorder import loop"), (AGENT_CONTRACT, ACYCLIC_CONTRACT),
     "zeromon_agent.compact -> zeromon_agent.recorder.loop"),
    # A hook on the training thread reaching the endpoint.
    (("hooks/collectives.py", "def _late() -> None:\n    from zeromon_agent.serve import endpoint"),
     (AGENT_CONTRACT, ACYCLIC_CONTRACT),
     "zeromon_agent.hooks.collectives -> zeromon_agent.serve.endpoint"),
    # A circle inside one layer, through a type-only import: the layers allow it, the acyclic contract does not.
    (("live/recent.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from zeromon_agent.live import published"),
     (ACYCLIC_CONTRACT,), ".recent -> .published"),
], ids=["as-it-is", "upward", "upward-in-a-function", "type-only-circle"])
def test_an_upward_import_or_a_circle_breaks_the_agents_contracts(
        tmp_path: Path, change: tuple[str, str] | None, broken: tuple[str, ...], names: str) -> None:
    result = _lint_agent_copy(tmp_path, change)
    out = result.stdout + result.stderr
    assert f"{len(broken)} broken" in out and result.returncode == (1 if broken else 0), out[-3000:]
    if broken:
        report = out[out.index("Broken contracts"):]
        assert all(name in report for name in broken) and names in report, report[-3000:]
