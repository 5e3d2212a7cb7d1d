"""The Planner page: `zeromon plan` as a form. Its plan is the CLI's (`zeromon plan --json` through the
real CLI, for the same inputs), its table and words are the CLI's lines, a bad value shows the CLI's
message naming the flag, the bars are the plan's bytes, the form survives a trip through the URL, and
a model is imported only where the dashboard allows it and only when the user asks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from zeromon.errors import ZeromonError
from zeromon.sources.fleet import FleetView
from zeromon.views.planning import plan_payload
from zeromon.views.run_data import RunData, StaticFeed
from zeromon_dashboard.figures.planner import PARTS, plan_bars
from zeromon_dashboard.pages import planner as page
from zeromon_dashboard.state import PageState, parse_state

from conftest import REPO, zeromon

TINY_MODEL = REPO / "tests" / "data" / "tiny_model.py"


def form(**changes: Any) -> dict[str, Any]:
    """The form as a user leaves it: the CLI's defaults, with ``changes`` typed or chosen."""
    return {**page.CLI_DEFAULTS, **changes}


# (form values, the `zeromon plan` arguments a user would type for them, written by hand)
CASES = [
    (dict(page.PAGE_DEFAULTS),
     ["--params", "7.5B", "--gpus-per-node", "8", "--nodes", "1", "--gpu-memory", "80GiB"]),
    (form(params="70B", gpus_per_node="8", nodes="2", gpu_memory="80GiB", largest_layer_params="1B",
          activations="4096,1,8192,80,64", convention="deepspeed"),
     ["--params", "70B", "--gpus-per-node", "8", "--nodes", "2", "--gpu-memory", "80GiB",
      "--largest-layer-params", "1B", "--activations", "4096,1,8192,80,64", "--convention", "deepspeed"]),
    (form(params="70B", gpus_per_node="8", nodes="2", gpu_memory="80GiB", offload_optimizer="nvme"),
     ["--params", "70B", "--gpus-per-node", "8", "--nodes", "2", "--gpu-memory", "80GiB",
      "--offload-optimizer", "nvme"]),
    (form(params="350M", gpu_memory="24GiB", dtype="fp32", optimizer="sgd", momentum=True, no_zero_init=True),
     ["--params", "350M", "--gpus-per-node", "1", "--nodes", "1", "--gpu-memory", "24GiB", "--dtype", "fp32",
      "--optimizer", "sgd", "--momentum", "--no-zero-init"]),
    (form(params="175B", gpus_per_node="8", nodes="4", gpu_memory="80GiB", stage="3", offload_optimizer="cpu",
          offload_params="cpu"),
     ["--params", "175B", "--gpus-per-node", "8", "--nodes", "4", "--gpu-memory", "80GiB", "--stage", "3",
      "--offload-optimizer", "cpu", "--offload-params", "cpu"]),
    (form(model=f"{TINY_MODEL}:build", gpus_per_node="2"),
     ["--model", f"{TINY_MODEL}:build", "--gpus-per-node", "2", "--nodes", "1"]),
]
CASE_IDS = ["defaults", "deepspeed-activations", "nvme", "fp32-sgd-momentum", "zero3-offload", "model"]


def _cli_json(args: list[str]) -> dict[str, Any]:
    out = zeromon("plan", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("values, args", CASES, ids=CASE_IDS)
def test_the_pages_plan_is_zeromon_plan_json_for_the_same_inputs(values: dict[str, Any], args: list[str]) -> None:
    result = page.planned(values, allow_model_import=True)
    model = values["model"] or None
    assert plan_payload(result, model) == _cli_json(args)
    assert page.cli_args(values) == args  # the command line the page shows is the one typed by hand


def test_the_table_and_the_words_are_zeromon_plans_lines() -> None:
    values, args = CASES[2]  # nvme: the NVMe/node column and notes
    out = zeromon("plan", *args)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    bars, columns, records, words, error, command = page.draw(values, allow_model_import=True)
    assert error == "" and command == "zeromon plan " + " ".join(args)
    table = [re.split(r" {2,}", line.strip()) for line in lines[3:3 + 1 + len(records)]]
    assert [c["headerName"] for c in columns] == table[0] and table[0][-1] == "NVMe/node"
    assert [[r[c["field"]] for c in columns] for r in records] == table[1:]
    texts = _texts(words)
    heading, rec, why, notes, convention = texts
    assert heading.splitlines() == lines[:2]
    assert rec == lines[-2] and rec.startswith("recommendation: ZeRO-3")
    assert "  " + why == lines[-1] and why.startswith("why: ")
    assert notes and all(note in lines for note in notes.split("\n"))
    assert convention.splitlines() == [line for line in lines if line.startswith(("convention", "  CPU/node"))]


def _texts(children: list[Any]) -> list[str]:
    """Each top-level element's text; an element with several children (the notes' list) joins them by line."""
    def text(node: Any) -> str:
        if isinstance(node, str):
            return node
        inner = getattr(node, "children", None)
        if isinstance(inner, list):
            return "\n".join(text(c) for c in inner) if node.__class__.__name__ == "Ul" else "".join(
                text(c) for c in inner)
        return "" if inner is None else text(inner)
    return [text(c) for c in children]


BAD = [
    (form(params="7e9", gpu_memory="80"), ["--params", "7e9", "--gpu-memory", "80"], "--gpu-memory"),
    (form(params="seven"), ["--params", "seven"], "--params"),
    (form(params="7e9", nodes="two"), ["--params", "7e9", "--nodes", "two"], "--nodes"),
    (form(params="7e9", gpus_per_node="0"), ["--params", "7e9", "--gpus-per-node", "0"], "--gpus-per-node"),
    (form(params="7e9", activations="4096,1,4096"), ["--params", "7e9", "--activations", "4096,1,4096"],
     "--activations"),
    (form(params="7e9", largest_layer_params="8e9"), ["--params", "7e9", "--largest-layer-params", "8e9"],
     "--largest-layer-params"),
    (form(params="7e9", convention="deepspeed", dtype="fp32"),
     ["--params", "7e9", "--convention", "deepspeed", "--dtype", "fp32"], "--dtype"),
    (form(params="7e9", stage="1", offload_params="cpu"), ["--params", "7e9", "--stage", "1", "--offload-params",
                                                           "cpu"], "--offload-params"),
    (form(params="7e9", momentum=True), ["--params", "7e9", "--momentum"], "--momentum"),
    (form(model=f"{TINY_MODEL}:broken"), ["--model", f"{TINY_MODEL}:broken"], "--model"),
    (form(), [], "--params"),
]


@pytest.mark.parametrize("values, args, flag", BAD, ids=[b[2] + ("" if b[1] else " (nothing)") for b in BAD])
def test_a_bad_value_shows_the_clis_message_naming_the_flag(values: dict[str, Any], args: list[str],
                                                             flag: str) -> None:
    out = zeromon("plan", *args)
    assert out.returncode == 2, out.stdout
    said = out.stderr.rstrip("\n").removeprefix("zeromon: error: ")
    bars, columns, records, words, error, command = page.draw(values, allow_model_import=True)
    assert error.children == said and flag in said.splitlines()[0]
    assert "Traceback" not in error.children
    assert not bars.data and records == [] and words == ""  # no plan drawn beside the message


def test_the_bars_are_the_plans_bytes_per_gpu() -> None:
    result = page.planned(CASES[1][0], allow_model_import=True)  # activations, a capacity, every stage
    fig = plan_bars(result)
    parts = {t.meta["part"]: t for t in fig.data if (t.meta or {}).get("kind") == "part"}
    assert list(parts) == [field for field, _, _ in PARTS]
    for field, trace in parts.items():
        assert list(trace.customdata) == [getattr(sp, field) for sp in result.stages]
        scale = trace.meta["scale"]
        assert [y * scale for y in trace.y] == pytest.approx([getattr(sp, field) for sp in result.stages])
    stacked = [sum(parts[f].customdata[i] for f in parts) for i in range(len(result.stages))]
    assert stacked == [sp.gpu_bytes for sp in result.stages]
    marks = next(t for t in fig.data if (t.meta or {}).get("kind") == "fits")
    assert list(marks.customdata) == [sp.gpu_bytes for sp in result.stages]
    assert [_mark(text) for text in marks.text] == ["does not fit" if sp.fits is False else "fits"
                                                    for sp in result.stages]
    assert [sp.fits for sp in result.stages] == [False, False, False, False]  # 70B on 16 GPUs with activations
    lines = {shape.name: shape.y0 * scale for shape in fig.layout.shapes}
    capacity = result.inputs.gpu_memory_bytes
    assert capacity is not None
    assert lines["capacity"] == pytest.approx(capacity)
    budget = next(v for k, v in lines.items() if "budget" in k)
    assert budget == pytest.approx(capacity * 0.9)


def _mark(text: str) -> str:
    return re.sub(r"<[^>]+>", " ", text).split("  ")[0].strip()


def test_bars_mark_what_fits_the_recommended_row_and_an_unknown_capacity() -> None:
    result = page.planned(page.PAGE_DEFAULTS, allow_model_import=False)  # 7.5B on 8 x 80 GiB
    marks = next(t for t in plan_bars(result).data if (t.meta or {}).get("kind") == "fits")
    assert [sp.fits for sp in result.stages] == [False, True, True, True]
    assert [_mark(t) for t in marks.text] == ["does not fit", "fits", "fits", "fits"]
    recommended = [i for i, t in enumerate(marks.text) if "recommended" in t]
    assert recommended == [2] and result.recommendation.stage == 2
    unknown = page.planned(form(params="7.5B", gpus_per_node="8"), allow_model_import=False)
    fig = plan_bars(unknown)
    marks = next(t for t in fig.data if (t.meta or {}).get("kind") == "fits")
    assert {_mark(t) for t in marks.text} == {"fits: unknown"} and not fig.layout.shapes
    assert "activations_bytes" not in [(t.meta or {}).get("part") for t in fig.data]  # none asked for


ROUND_TRIPS = [values for values, _ in CASES] + [
    form(params="7e9", gpu_memory="40GB", stage="2", offload_optimizer="cpu", convention="deepspeed"),
    form(params="13B", nodes="4", momentum=True, optimizer="sgd", activations="2048,2,5120,40,40"),
]


@pytest.mark.parametrize("values", ROUND_TRIPS)
def test_the_form_survives_the_url(values: dict[str, Any]) -> None:
    state = PageState(page="planner", ranks=(0, 1), step=3)  # what other pages keep is kept too
    search = page.form_search(values, state)
    back = parse_state("/planner", search)
    assert page.form_values(back) == values
    assert (back.ranks, back.step) == (state.ranks, state.step)
    assert plan_payload(page.planned(page.form_values(back), True)) == plan_payload(page.planned(values, True))


def test_the_default_page_is_7_5b_on_one_node_of_eight_80gib_gpus() -> None:
    values = page.form_values(PageState(page="planner"))
    assert values == page.PAGE_DEFAULTS
    assert page.form_search(values, PageState(page="planner")) == "?params=7.5B&gpus_per_node=8&nodes=1&gpu_memory=80GiB"
    inputs = page.planned(values, False).inputs
    assert (inputs.params, inputs.gpus_per_node, inputs.nodes, inputs.gpu_memory_bytes, inputs.stages) == (
        7_500_000_000, 8, 1, 80 * 2**30, (0, 1, 2, 3))
    # A URL that names any field is a command line: what it leaves out is the CLI's default.
    only = page.form_values(parse_state("/planner", "?params=7B"))
    assert (only["gpus_per_node"], only["gpu_memory"]) == ("1", "")
    # A blank field is a flag not given, in the URL as in the plan.
    blank = form(params="7B", gpus_per_node="", gpu_memory="  ")
    assert page.form_search(blank, PageState(page="planner")) == "?params=7B&gpus_per_node=1&nodes=1"
    assert page.planned(blank, False).inputs.gpus_per_node == 1


def _importing_model(tmp_path: Path) -> tuple[str, Path]:
    """A model file that leaves a mark when it is imported (its code runs)."""
    mark = tmp_path / "imported"
    source = tmp_path / "marked_model.py"
    source.write_text(f"from pathlib import Path\nPath({str(mark)!r}).write_text('yes')\n"
                      f"exec(open({str(TINY_MODEL)!r}).read())\n")
    return f"{source}:build", mark


def test_a_model_is_imported_only_on_loopback_and_only_when_asked(tmp_path: Path) -> None:
    spec, mark = _importing_model(tmp_path)
    values = form(model=spec, gpus_per_node="2")
    with pytest.raises(ZeromonError, match="^--model: .*loopback"):
        page.planned(values, allow_model_import=False)
    _, _, records, _, error, _ = page.draw(values, allow_model_import=False)
    assert records == [] and error.children.startswith("--model:") and not mark.exists()
    # A link that names a model fills the form and waits for the user's "plan".
    _, _, records, _, error, _ = page.draw(values, allow_model_import=True, import_model=False)
    assert records == [] and "Press plan" in error.children and not mark.exists()
    _, _, records, _, error, _ = page.draw(values, allow_model_import=True)
    assert error == "" and mark.exists() and len(records) == 4


def _ids(node: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list | tuple):
            stack.extend(item)
            continue
        element_id = getattr(item, "id", None)
        if isinstance(element_id, str):
            found[element_id] = item
        children = getattr(item, "children", None)
        if children is not None and not isinstance(children, str):
            stack.append(children)
    return found


def _empty_data(kind: str) -> RunData:
    return RunData(kind=kind, source="nothing", version=1,
                   fleet=FleetView(t_ns=0, source="nothing", ranks=(), looked_at=()), finished=True)


@pytest.mark.parametrize("kind", ["recording", "replay", "live", "trace"])
@pytest.mark.parametrize("allow", [True, False])
def test_the_page_has_its_form_and_outputs_whatever_the_run(kind: str, allow: bool) -> None:
    ctx = SimpleNamespace(allow_model_import=allow)
    state = parse_state("/planner", "?params=13B&gpus_per_node=8&nodes=2&gpu_memory=40GiB&stage=3")
    ids = _ids(page.layout(state, _empty_data(kind), ctx))  # type: ignore[arg-type]
    for name in ("planner-bars", "planner-table", "planner-recommendation", "planner-error", "planner-submit",
                 *[f"planner-{f.name}" for f in page.FIELDS]):
        assert name in ids, name
    assert ids["planner-params"].value == "13B" and ids["planner-stage"].value == "3"
    assert ids["planner-gpu_memory"].value == "40GiB" and ids["planner-submit"].children == "plan"
    assert len(ids["planner-table"].rowData) == 1 and ids["planner-table"].rowData[0]["c0"] == "3"
    assert bool(ids["planner-model"].disabled) is not allow
    assert ("planner-model-why" in ids) is not allow


# --- the callbacks, through the real app's HTTP endpoint ------------------------------------------------------

class Page:
    """The planner's callbacks as the browser calls them: POST /_dash-update-component."""

    def __init__(self, allow_model_import: bool = True) -> None:
        from zeromon_dashboard.app import create_app

        self.app = create_app(StaticFeed(_empty_data("recording")), allow_model_import=allow_model_import)
        self.client = self.app.server.test_client()

    def _key(self, output: str) -> str:
        return next(k for k in self.app.callback_map if output in k and "planner" in k)

    def call(self, output: str, values: dict[str, Any], changed: list[str]) -> dict[str, Any]:
        key = self._key(output)
        spec = self.app.callback_map[key]
        outputs = [dict(zip(("id", "property"), part.rsplit(".", 1), strict=True))
                   for part in key.strip(".").split("...")]
        body = {"output": key, "outputs": outputs, "changedPropIds": changed,
                "inputs": [{**i, "value": values.get(f"{i['id']}.{i['property']}")} for i in spec["inputs"]],
                "state": [{**s, "value": values.get(f"{s['id']}.{s['property']}")} for s in spec["state"]]}
        response = self.client.post("/_dash-update-component", json=body)
        if response.status_code == 204:  # PreventUpdate
            return {}
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.get_json()["response"]  # type: ignore[no-any-return]


def _as_form(values: dict[str, Any]) -> dict[str, Any]:
    return {f"planner-{f.name}.value": (["on"] if values[f.name] else []) if f.kind == "switch" else values[f.name]
            for f in page.FIELDS}


def test_plan_writes_the_form_into_the_url_and_draws_it_keeping_what_was_typed() -> None:
    p = Page()
    typed = form(params="13B", gpus_per_node="8", gpu_memory="40GiB", stage="2", offload_optimizer="cpu")
    url = {"url.pathname": "/planner", "url.search": "?params=7.5B&gpus_per_node=8&nodes=1&gpu_memory=80GiB"}
    # Dash fires the callbacks when the page renders: nothing was asked, nothing changes.
    assert p.call("planner-asked.data", {**_as_form(typed), **url, "planner-submit.n_clicks": 0},
                  ["planner-submit.n_clicks"]) == {}
    asked = p.call("planner-asked.data", {**_as_form(typed), **url, "planner-gpu_memory.n_submit": 1},
                   ["planner-gpu_memory.n_submit"])  # Enter in a field
    search = asked["url"]["search"]
    assert search == "?params=13B&gpus_per_node=8&nodes=1&gpu_memory=40GiB&stage=2&offload_optimizer=cpu"
    shown = p.call("planner-bars.figure", {"url.search": search, "url.pathname": "/planner",
                                           "planner-asked.data": asked["planner-asked"]["data"]},
                   ["url.search", "planner-asked.data"])
    assert not any(k.startswith("planner-") and k.split("-", 1)[1] in page.BY_NAME for k in shown)  # form kept
    rows = shown["planner-table"]["rowData"]
    expected = _cli_json(page.cli_args(typed))["stages"]
    assert [r["c0"] for r in rows] == ["2"] and expected[0]["stage"] == 2
    assert shown["planner-bars"]["figure"]["data"][0]["customdata"] == [expected[0]["params_bytes"]]
    assert shown["planner-error"]["children"] == ""


def test_a_bad_value_keeps_the_form_and_says_the_flag_in_the_page() -> None:
    p = Page()
    typed = form(params="7.5B", gpus_per_node="8", gpu_memory="80")
    url = {"url.pathname": "/planner", "url.search": ""}
    asked = p.call("planner-asked.data", {**_as_form(typed), **url, "planner-submit.n_clicks": 1},
                   ["planner-submit.n_clicks"])
    shown = p.call("planner-bars.figure", {"url.search": asked["url"]["search"], "url.pathname": "/planner",
                                           "planner-asked.data": asked["planner-asked"]["data"]},
                   ["url.search", "planner-asked.data"])
    error = json.dumps(shown["planner-error"]["children"])
    assert "--gpu-memory '80': has no unit" in error and "Traceback" not in error
    assert "planner-gpu_memory" not in shown and shown["planner-table"]["rowData"] == []


def test_back_and_forward_fill_the_form_from_the_url() -> None:
    p = Page()
    shown = p.call("planner-bars.figure", {"url.search": "?params=70B&gpus_per_node=8&nodes=2&momentum=1&optimizer=sgd",
                                           "url.pathname": "/planner", "planner-asked.data": {"values": {}, "count": 3}},
                   ["url.search"])
    assert shown["planner-params"]["value"] == "70B" and shown["planner-nodes"]["value"] == "2"
    assert shown["planner-momentum"]["value"] == ["on"] and shown["planner-gpu_memory"]["value"] == ""
    assert [r["c0"] for r in shown["planner-table"]["rowData"]] == ["0 (DDP)", "1", "2", "3"]
