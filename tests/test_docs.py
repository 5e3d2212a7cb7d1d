"""The README is a page a newcomer reads, the reference in docs/ builds as a site, every link in them
leads somewhere, and nothing a user reads cites a document they cannot look up."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

from zeromon.analysis.lint_schema import RULES

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
PACKAGES = (REPO / "zeromon", REPO / "agents" / "zeromon_agent", REPO / "dashboard" / "zeromon_dashboard")

# Documents that exist only inside the team that wrote zeromon: a user cannot look them up.
INTERNAL = re.compile(r"\bseeds\b|seeds'|\bDESIGN\.md\b|\bSTYLE\.md\b|zero-deep-dive", re.IGNORECASE)
# [text](target) with a target that is no URL and no in-page anchor.
RELATIVE_LINK = re.compile(r"\[[^\]]*\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), REPO / "dashboard" / "grafana" / "README.md",
            REPO / "examples" / "README.md"]


def test_the_readme_is_a_page_in_the_order_a_newcomer_reads() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    order = ["What zeromon answers", "Install", "See it first: `zeromon demo`", "Watch your own job",
             "Prometheus and Grafana", "Plan and lint", "Status", "Documentation"]
    assert headings == order
    # Near the top, one block with three commands: install, the main job, the tests.
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S)
    assert first_block is not None and text.index(first_block.group(0)) < text.index("## What zeromon answers")
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands == ['DS_BUILD_OPS=0 pip install "torch==2.13.0" -e ".[test,deepspeed,trainers]"', "zeromon demo",
                        "python -m pytest -q -n 2"]
    # ... and CI runs that test command, with the extras that line installs (no more, no fewer).
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^python -m pytest -q -n 2 \|\|", ci, flags=re.M)
    ci_extras = {extra for group in re.findall(r'-e "\.\[([a-z,]+)\]"', ci) for extra in group.split(",")}
    assert ci_extras == {"test", "deepspeed", "trainers"}
    # The screenshots are committed, and shown.
    for image in ("docs/images/tui.svg", "docs/images/dashboard.png"):
        assert f"]({image})" in text and (REPO / image).stat().st_size > 10_000


def test_every_relative_link_leads_to_a_file() -> None:
    broken = []
    for path in _markdown_files():
        for target in RELATIVE_LINK.findall(path.read_text()):
            file_part = target.split("#", 1)[0]
            if file_part and not (path.parent / file_part).resolve().exists():
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert not broken, broken
    assert RELATIVE_LINK.findall(README.read_text()), "the check reads the README's links"


def test_the_docs_build_as_a_site_with_no_broken_page_or_anchor(tmp_path: Path) -> None:
    # mkdocs comes with the test extra; --strict fails on a link to a missing page or anchor.
    mkdocs = Path(sys.executable).parent / "mkdocs"
    result = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "plan-and-lint" / "index.html").is_file()


def test_every_docs_page_is_in_the_sites_navigation() -> None:
    config = (REPO / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w-]+\.md)\s*$", config, flags=re.M))
    assert listed == {p.name for p in DOCS.glob("*.md")}


def test_the_lint_rules_page_lists_every_rule() -> None:
    text = (DOCS / "plan-and-lint.md").read_text()
    rows = dict(re.findall(r"^\| (ZL\d{3}) \| (.+) \|$", text, flags=re.M))
    assert rows.keys() == RULES.keys()
    assert all(rows[rule].replace("\\|", "|") == what for rule, what in RULES.items())


def _strings_and_comments(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(tok.start[0], tok.string) for tok in tokens if tok.type in (tokenize.STRING, tokenize.COMMENT)]


def test_no_user_facing_text_cites_an_internal_document() -> None:
    """Messages, help, docstrings and comments in the packages, and every page: sources a reader can
    look up (the ZeRO paper, DeepSpeed's or PyTorch's documentation), or the rule itself."""
    found = []
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            found += [f"{path.relative_to(REPO)}:{line}: {text.strip()[:80]}"
                      for line, text in _strings_and_comments(path) if INTERNAL.search(text)]
    for path in [*_markdown_files(), *sorted((REPO / "dashboard" / "grafana").glob("*.*"))]:
        found += [f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}"
                  for n, line in enumerate(path.read_text().splitlines(), 1) if INTERNAL.search(line)]
    assert not found, "\n".join(found)


def test_the_internal_document_check_can_fail() -> None:
    assert INTERNAL.search("ZeRO-2, the seeds' default") and INTERNAL.search("(seeds)")
    assert INTERNAL.search("see DESIGN.md") and not INTERNAL.search("--seed 0: seed of weights and data")


AGENT = REPO / "agents" / "zeromon_agent"
# zeromon_agent.a.b (a module, else a name in its package), agents/zeromon_agent/a/b.py, and in the design note's
# drawing a path inside the agent (recorder/loop.py).
AGENT_DOTTED = re.compile(r"\bzeromon_agent((?:\.\w+)+)")
AGENT_PATH = re.compile(r"\bzeromon_agent/([\w/]+\.py)\b")
INSIDE_AGENT = re.compile(r"(?<![\w/.])((?:hooks|memory|recorder|live|serve|context)/\w+\.py)\b")


def _agent_name_exists(dotted: str) -> bool:
    """Whether ``.a.b.c`` names a module of the agent (then any attribute of it; a C module by its source, which
    setup.py builds), or a name its package defines."""
    where = AGENT
    for part in dotted.strip(".").split("."):
        if (where / part).is_dir():
            where = where / part
        elif (where / f"{part}.py").is_file() or (where / f"{part}.c").is_file():
            return True
        else:  # a name the package defines or exports (zeromon_agent.attach, zeromon_agent.StepFigures)
            return re.search(rf"^(def|class) {part}\b|^{part} =|\"{part}\"", (where / "__init__.py").read_text(),
                             flags=re.M) is not None
    return True


def test_every_agent_module_the_docs_and_the_code_name_exists() -> None:
    """The agent's modules named in the pages (docs/development.md's data flow above all) and in the packages'
    strings and comments: each exists, so that a reader who follows one finds it."""
    texts = [(path.relative_to(REPO), path.read_text()) for path in _markdown_files()]
    texts += [(path.relative_to(REPO), "\n".join(text for _, text in _strings_and_comments(path)))
              for package in PACKAGES for path in sorted(package.rglob("*.py"))]
    missing = sorted({f"{where}: zeromon_agent{name}" for where, text in texts
                      for name in AGENT_DOTTED.findall(text) if not _agent_name_exists(name)}
                     | {f"{where}: {path}" for where, text in texts
                        for path in AGENT_PATH.findall(text) + INSIDE_AGENT.findall(text)
                        if not (AGENT / path).is_file()})
    assert not missing, "\n".join(missing)
    assert not _agent_name_exists(".live_views") and not _agent_name_exists(".recorder.drain")  # the check can fail
    assert _agent_name_exists(".hooks.state.timed_step") and _agent_name_exists(".attach")
