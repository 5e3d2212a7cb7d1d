"""The agent runs inside training processes: importing it must stay light (DESIGN.md layers)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

UI_MODULES = ("textual", "dash", "plotly")


def _imported_after(statement: str) -> dict[str, bool]:
    code = f"import sys\n{statement}\nimport json\nprint(json.dumps({{m: m in sys.modules for m in {UI_MODULES!r} + ('torch',)}}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("statement", [
    "import zeromon_agent",
    "import zeromon_agent.agent",
    "import zeromon_agent.collectives, zeromon_agent.recorder, zeromon_agent.phases, zeromon_agent.memory",
    "import zeromon.model, zeromon.analysis.recording_summary",
    "import zeromon.cli",
])
def test_no_ui_library_is_imported(statement: str) -> None:
    imported = _imported_after(statement)
    assert not any(imported[m] for m in UI_MODULES), imported


def test_package_root_does_not_import_torch() -> None:
    # `import zeromon_agent` costs milliseconds: torch is imported when the agent starts.
    assert _imported_after("import zeromon_agent")["torch"] is False


def test_the_layers_hold_as_import_contracts() -> None:
    """DESIGN.md's layers as import-linter contracts (pyproject.toml [tool.importlinter]): the
    dashboard and the TUI never import each other, the views and everything below them import no UI
    library, the agent nothing above the analysis."""
    from pathlib import Path

    lint_imports = Path(sys.executable).parent / "lint-imports"  # installed with the test extra, beside python
    result = subprocess.run([str(lint_imports), "--no-cache"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_the_dashboard_package_loads_lazily() -> None:
    imported = _imported_after("import zeromon_dashboard")
    assert not imported["dash"] and not imported["plotly"], imported
