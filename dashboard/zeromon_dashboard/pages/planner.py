"""Planner: `zeromon plan` as a form. Its values live in the URL (``?params=7.5B&gpus_per_node=8...``,
one key per flag), so that a plan is shared as a link; the bars, the table, the recommendation and
its reason are the CLI's own, read through zeromon.views.planning. The page ignores the run.

``--model`` imports and calls user code: it is offered only when the dashboard listens on loopback,
and even then a model named by a link is imported only when the user presses "plan" (or Enter) — a
link alone must not run code (``os:abort`` would stop the dashboard)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dash
import dash_ag_grid as dag
from dash import Input, Output, State, dcc, html

from zeromon.analysis.planner import PlanResult
from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.views.planning import (
    CONVENTION_CHOICES,
    DTYPE_CHOICES,
    OFFLOAD_CHOICES,
    OPTIMIZER_CHOICES,
    PlanRequest,
    convention_lines,
    heading_lines,
    note_lines,
    plan_of,
    plan_table,
    recommendation_lines,
)
from zeromon.views.run_data import RunData
from zeromon.views.whatif import what_if_of_run, what_if_view
from zeromon_dashboard.context import Context, failure_text, guarded
from zeromon_dashboard.figures.planner import TITLE, plan_bars
from zeromon_dashboard.figures.style import empty
from zeromon_dashboard.figures.whatif import MEMORY_TITLE, STEP_TITLE, memory_stacks, step_waterfall
from zeromon_dashboard.pages.common import graph, message, section
from zeromon_dashboard.state import PageState, state_search

if TYPE_CHECKING:
    from dash import Dash

PAGE = "planner"
FormValues = dict[str, Any]  # field -> str (text and choices) or bool (the two switches)


@frozen
class Field:
    name: str  # the URL key and the element id's tail: planner-<name>
    flag: str  # the `zeromon plan` flag it stands for
    label: str
    kind: str  # "text", "choice" or "switch"
    hint: str = ""  # the placeholder of a text field
    choices: tuple[str, ...] = ()


FIELDS = (
    Field("params", "--params", "parameters", "text", "7.5B, 7e9, 350M"),
    Field("model", "--model", "or a model", "text", "MODULE:FACTORY or FILE.py:FACTORY"),
    Field("gpus_per_node", "--gpus-per-node", "GPUs per node", "text", "8"),
    Field("nodes", "--nodes", "nodes", "text", "1"),
    Field("gpu_memory", "--gpu-memory", "GPU memory", "text", "80GiB, 40GB (empty: unknown)"),
    Field("stage", "--stage", "stage", "choice", choices=("all", "0", "1", "2", "3")),
    Field("offload_optimizer", "--offload-optimizer", "offload optimizer", "choice", choices=OFFLOAD_CHOICES),
    Field("offload_params", "--offload-params", "offload params (ZeRO-3)", "choice", choices=OFFLOAD_CHOICES),
    Field("dtype", "--dtype", "dtype", "choice", choices=DTYPE_CHOICES),
    Field("optimizer", "--optimizer", "optimizer", "choice", choices=OPTIMIZER_CHOICES),
    Field("momentum", "--momentum", "SGD momentum", "switch"),
    Field("no_zero_init", "--no-zero-init", "no zero.Init (the model built whole on every rank)", "switch"),
    Field("largest_layer_params", "--largest-layer-params", "largest layer params", "text",
          "ZeRO-3's gathered layer, e.g. 1B"),
    Field("activations", "--activations", "activations", "text", "SEQ,BATCH,HIDDEN,LAYERS,HEADS: 4096,1,4096,32,32"),
    Field("convention", "--convention", "convention", "choice", choices=CONVENTION_CHOICES),
)
BY_NAME = {f.name: f for f in FIELDS}
TEXT_FIELDS = tuple(f.name for f in FIELDS if f.kind == "text")
_CLI = PlanRequest()  # the CLI's defaults: a key missing from the URL is a flag not given
CLI_DEFAULTS: FormValues = {
    "params": "", "model": "", "gpus_per_node": _CLI.gpus_per_node, "nodes": _CLI.nodes, "gpu_memory": "",
    "stage": _CLI.stage, "offload_optimizer": _CLI.offload_optimizer, "offload_params": _CLI.offload_params,
    "dtype": _CLI.dtype, "optimizer": _CLI.optimizer, "momentum": _CLI.momentum, "no_zero_init": not _CLI.zero_init,
    "largest_layer_params": "", "activations": "", "convention": _CLI.convention,
}
# The page opened without a query: the ZeRO paper's Figure 1 model on one node of 80 GiB GPUs.
PAGE_DEFAULTS: FormValues = {**CLI_DEFAULTS, "params": "7.5B", "gpus_per_node": "8", "nodes": "1",
                             "gpu_memory": "80GiB", "stage": "all"}
ALWAYS_IN_URL = ("gpus_per_node", "nodes")  # so that a submitted form never reads as "no query: the defaults"
_TRUE = ("1", "true", "yes", "on")
MODEL_OFF = ("--model imports and runs Python code, so the dashboard offers it only when it listens on loopback "
             "(the default --host 127.0.0.1); this one does not. Give the parameter count, or run "
             "`zeromon plan --model MODULE:FACTORY` in a terminal.")


# --- the form's values: the URL, the request, the command line (pure) ---------------------------------------

def form_values(state: PageState) -> FormValues:
    """The form as the URL says: the page's defaults when it names no planner key, else the CLI's
    defaults for the keys it leaves out (a key missing is a flag not given)."""
    given = {k: v for k, v in state.extra if k in BY_NAME}
    values = dict(CLI_DEFAULTS if given else PAGE_DEFAULTS)
    for name, text in given.items():
        values[name] = text.strip().lower() in _TRUE if BY_NAME[name].kind == "switch" else text
    return values


def form_search(values: Mapping[str, Any], state: PageState) -> str:
    """The URL query for the form: the text fields given, the choices and switches not the CLI's default."""
    pairs: list[tuple[str, str]] = []
    for f in FIELDS:
        value = values.get(f.name, CLI_DEFAULTS[f.name])
        if f.kind == "switch":
            if bool(value):
                pairs.append((f.name, "1"))
            continue
        text = _text(value)
        if f.name in ALWAYS_IN_URL:
            pairs.append((f.name, text or str(CLI_DEFAULTS[f.name])))
        elif text and text != CLI_DEFAULTS[f.name]:
            pairs.append((f.name, text))
    others = tuple((k, v) for k, v in state.extra if k not in BY_NAME)
    return state_search(state.with_(extra=others + tuple(pairs)))


def plan_request(values: Mapping[str, Any]) -> PlanRequest:
    """The request the form makes: a blank field is a flag not given."""
    text = {name: _text(values.get(name)) for name in TEXT_FIELDS}
    choice = {f.name: _text(values.get(f.name)) or str(CLI_DEFAULTS[f.name]) for f in FIELDS if f.kind == "choice"}
    return PlanRequest(
        params=text["params"] or None, model=text["model"] or None,
        gpus_per_node=text["gpus_per_node"] or _CLI.gpus_per_node, nodes=text["nodes"] or _CLI.nodes,
        gpu_memory=text["gpu_memory"] or None, largest_layer_params=text["largest_layer_params"] or None,
        activations=text["activations"] or None, momentum=bool(values.get("momentum")),
        zero_init=not values.get("no_zero_init"), **choice)


def cli_args(values: Mapping[str, Any]) -> list[str]:
    """The `zeromon plan` arguments that make the same plan (shown on the page, for a terminal)."""
    request = plan_request(values)
    args: list[str] = []
    for f in FIELDS:
        if f.kind == "switch":
            args += [f.flag] if values.get(f.name) else []
            continue
        value = getattr(request, f.name)
        default = getattr(_CLI, f.name)
        if value is not None and (value != default or f.name in ALWAYS_IN_URL):
            args += [f.flag, value]
    return args


def planned(values: Mapping[str, Any], allow_model_import: bool) -> PlanResult:
    """The plan of the form's values, as `zeromon plan` makes it; ZeromonError names the flag."""
    request = plan_request(values)
    if request.model and not allow_model_import:
        raise ZeromonError(f"--model: {MODEL_OFF}")
    return plan_of(request)


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


# --- what the page shows ---------------------------------------------------------------------------------------

def table_columns(header: list[str]) -> list[dict[str, Any]]:
    """Stage and offload left-aligned, the numbers right-aligned, as `zeromon plan` aligns them."""
    return [{"field": f"c{i}", "headerName": name,
             **({"type": "rightAligned"} if i >= 2 else {"minWidth": 90 if i == 0 else 170})}
            for i, name in enumerate(header)]


def table_records(rows: list[list[str]]) -> list[dict[str, str]]:
    return [{f"c{i}": cell for i, cell in enumerate(row)} for row in rows]


def words(result: PlanResult, model: str | None) -> list[Any]:
    """The plan's words as `zeromon plan` prints them: what was planned, the recommendation and why,
    the notes, the convention."""
    heading = heading_lines(result, model)
    rec, why = recommendation_lines(result)
    return [html.Div("\n".join(heading), className="plan-heading", id="planner-heading", style={"whiteSpace": "pre-line"}),
            html.P([html.B(rec)], id="planner-recommendation-text"),
            html.P(why.strip(), id="planner-why"),
            html.Ul([html.Li(n) for n in note_lines(result)], id="planner-notes"),
            html.Div("\n".join(convention_lines(result)), id="planner-convention",
                     style={"whiteSpace": "pre-wrap", "color": "#4b5563"})]


def draw(values: Mapping[str, Any], allow_model_import: bool, import_model: bool = True) -> tuple[Any, ...]:
    """(bars, table columns, table rows, recommendation, error, command line) for the form's values.
    ``import_model``: False for a model named by a link, not yet confirmed by the user."""
    command = "zeromon plan " + shlex.join(cli_args(values))
    request = plan_request(values)
    if request.model and allow_model_import and not import_model:
        why = (f"Press plan to import {request.model} and count its parameters: that runs its code "
               "(a link alone does not).")
        return (empty(TITLE, "press plan to count the model"), [], [], "", message(why, "info"), command)
    try:
        result = planned(values, allow_model_import)
    except ZeromonError as exc:
        return (empty(TITLE, "no plan: see the message above the chart"), [], [], "",
                message(str(exc), "error", element_id="planner-error-text"), command)
    header, rows = plan_table(result)
    return (plan_bars(result), table_columns(header), table_records(rows), words(result, request.model),
            "", command)


# --- layout and callbacks ------------------------------------------------------------------------------------

def _control(f: Field, value: Any, ctx: Context) -> html.Div:
    element_id = f"{PAGE}-{f.name}"
    label = html.Label([f.label, " ", html.Code(f.flag)], htmlFor=element_id)
    if f.kind == "switch":
        return html.Div(dcc.Checklist(id=element_id, options=[{"label": f"{f.label} ({f.flag})", "value": "on"}],
                                      value=["on"] if value else [], className="switch"), className="control")
    if f.kind == "choice":
        box: Any = dcc.Dropdown(id=element_id, options=list(f.choices), value=value, clearable=False,
                                searchable=False)
        return html.Div([label, box], className="control")
    disabled = f.name == "model" and not ctx.allow_model_import
    box = dcc.Input(id=element_id, type="text", value=value, placeholder=f.hint, debounce=False, n_submit=0,
                    disabled=disabled, autoComplete="off", spellCheck=False)
    why = [html.Small(MODEL_OFF, id=f"{PAGE}-model-why", className="hint")] if disabled else []
    return html.Div([label, box, *why], className="control")


def form(values: FormValues, ctx: Context, command: str) -> html.Div:
    return html.Div([html.Div([_control(f, values[f.name], ctx) for f in FIELDS], className="form-grid"),
                     html.Div([html.Button("plan", id=f"{PAGE}-submit", n_clicks=0, className="submit"),
                               html.Code(command, id=f"{PAGE}-command", className="command")],
                              className="controls", style={"marginTop": "0.8em"})],
                    id=f"{PAGE}-form")


OUTPUTS = ((f"{PAGE}-bars", "figure"), (f"{PAGE}-table", "columnDefs"), (f"{PAGE}-table", "rowData"),
           (f"{PAGE}-recommendation", "children"), (f"{PAGE}-error", "children"), (f"{PAGE}-command", "children"))


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    values = form_values(state)
    bars, columns, records, rec, error, command = draw(values, ctx.allow_model_import, import_model=False)
    grid = dag.AgGrid(id=f"{PAGE}-table", rowData=records, columnDefs=columns, columnSize="responsiveSizeToFit",
                      defaultColDef={"sortable": False, "resizable": True},
                      dashGridOptions={"domLayout": "autoHeight"}, style={"height": None},
                      className="ag-theme-alpine")
    return html.Div([
        dcc.Store(id=f"{PAGE}-asked"),
        section("Plan ZeRO memory (zeromon plan)", form(values, ctx, command)),
        html.Div(error, id=f"{PAGE}-error"),
        section("Memory per GPU", graph(f"{PAGE}-bars", bars)),
        section("Recommendation", html.Div(rec, id=f"{PAGE}-recommendation")),
        section("Per stage", grid),
        whatif_section(data),
    ], id="page-planner")


# --- from this run: zeromon whatif ------------------------------------------------------------------------------

WHATIF = f"{PAGE}-whatif"
WHATIF_PROMPT = "Press predict: the run's recording is read again and replayed with the change."


def default_change(data: RunData) -> str:
    """The change the run's framework most likely asks about: keeping the parameters gathered for FSDP."""
    info = next((r for r in (data.report.ranks if data.report is not None else ())), None)
    framework = info.framework if info is not None else ""
    return {"fsdp2": "reshard_after_forward=false", "fsdp1": "sharding_strategy=SHARD_GRAD_OP"}.get(framework,
                                                                                                  "comm=hidden")


def whatif_section(data: RunData) -> html.Section:
    title = "From this run (zeromon whatif): a change's step time and peak memory"
    if data.run_dir is None:
        return section(title, message("Open a recorded run (zeromon dashboard RUN_DIR) to predict a change from it: "
                                      "reshard_after_forward=false, comm=hidden, bandwidth=x2, micro_batch=x2.",
                                      element_id=f"{WHATIF}-summary"), element_id=WHATIF)
    form_row = html.Div([
        dcc.Input(id=f"{WHATIF}-changes", type="text", value=default_change(data), debounce=False,
                  placeholder="reshard_after_forward=false comm=hidden bandwidth=x2 micro_batch=x2",
                  style={"width": "32em"}),
        html.Button("predict", id=f"{WHATIF}-submit", n_clicks=0),
    ], className="form-row")
    return section(title, form_row, message(WHATIF_PROMPT, element_id=f"{WHATIF}-summary"),
                   graph(f"{WHATIF}-step", empty(STEP_TITLE, WHATIF_PROMPT)),
                   graph(f"{WHATIF}-memory", empty(MEMORY_TITLE, WHATIF_PROMPT)), element_id=WHATIF)


def predicted(data: RunData, text: str | None) -> tuple[Any, Any, Any]:
    """The summary, the step's waterfall and the memory's stacks for the changes typed (space-separated)."""
    if data.run_dir is None:
        raise dash.exceptions.PreventUpdate
    try:
        view = what_if_view(what_if_of_run(data.run_dir, (text or "").split()))
    except ZeromonError as exc:
        return (message(exc.message, "error", element_id=f"{WHATIF}-summary-text"),
                empty(STEP_TITLE, "no prediction"), empty(MEMORY_TITLE, "no prediction"))
    return (message(view.summary, element_id=f"{WHATIF}-summary-text"), step_waterfall(view), memory_stacks(view))


def _form_of(args: tuple[Any, ...]) -> FormValues:
    """The form's values from the callback's States, in FIELDS order (switches come as checklists)."""
    return {f.name: (bool(v) if f.kind == "switch" else v) for f, v in zip(FIELDS, args, strict=True)}


def _fallback(exc: Exception) -> tuple[Any, ...]:
    text = failure_text(exc)
    return (empty(TITLE, text), [], [], "", message(text, "error"), dash.no_update,
            *[dash.no_update] * len(FIELDS))


def register(app: Dash, ctx: Context) -> None:
    @app.callback(Output(f"{WHATIF}-summary", "children"), Output(f"{WHATIF}-step", "figure"),
                  Output(f"{WHATIF}-memory", "figure"), Input(f"{WHATIF}-submit", "n_clicks"),
                  Input(f"{WHATIF}-changes", "n_submit"), State(f"{WHATIF}-changes", "value"),
                  prevent_initial_call=True)
    @guarded(lambda exc: (message(failure_text(exc), "error"), dash.no_update, dash.no_update))
    def predict(clicks: int | None, submits: int | None, text: str | None) -> tuple[Any, Any, Any]:
        if not clicks and not submits:  # the form just rendered
            raise dash.exceptions.PreventUpdate
        return predicted(ctx.data(), text)

    @app.callback(Output("url", "search", allow_duplicate=True), Output(f"{PAGE}-asked", "data"),
                  Input(f"{PAGE}-submit", "n_clicks"), *[Input(f"{PAGE}-{n}", "n_submit") for n in TEXT_FIELDS],
                  *[State(f"{PAGE}-{f.name}", "value") for f in FIELDS],
                  State("url", "pathname"), State("url", "search"), State(f"{PAGE}-asked", "data"),
                  prevent_initial_call=True)
    @guarded(lambda exc: (dash.no_update, dash.no_update))
    def ask(*args: Any) -> tuple[Any, Any]:
        """The form into the URL (what a shared link holds), and the form itself, asked for by the user."""
        if not any(args[:1 + len(TEXT_FIELDS)]):  # the form just rendered (Dash fires then): nothing asked yet
            raise dash.exceptions.PreventUpdate
        values = _form_of(args[1 + len(TEXT_FIELDS): 1 + len(TEXT_FIELDS) + len(FIELDS)])
        pathname, search, asked = args[-3:]
        state = ctx.state(pathname, search)
        if state.page != PAGE:
            raise dash.exceptions.PreventUpdate
        new = form_search(values, state)
        count = (asked or {}).get("count", 0) + 1  # a new value each time: the same plan asked again redraws
        return (new if new != (search or "") else dash.no_update), {"values": values, "count": count}

    @app.callback(*[Output(i, p) for i, p in OUTPUTS], *[Output(f"{PAGE}-{f.name}", "value") for f in FIELDS],
                  Input("url", "search"), Input(f"{PAGE}-asked", "data"), State("url", "pathname"),
                  prevent_initial_call=True)
    @guarded(_fallback)
    def show(search: str | None, asked: dict[str, Any] | None, pathname: str | None) -> tuple[Any, ...]:
        """Draw what the user asked for (the form as typed, the model imported), or what the URL says
        when it changed on its own (back, forward): then the form shows the URL's values."""
        state = ctx.state(pathname, search)
        if state.page != PAGE:
            raise dash.exceptions.PreventUpdate
        if f"{PAGE}-asked.data" in dash.ctx.triggered_prop_ids:
            if asked is None:  # the page just rendered (Dash fires then), drawn by its layout already
                raise dash.exceptions.PreventUpdate
            return (*draw(asked["values"], ctx.allow_model_import), *[dash.no_update] * len(FIELDS))
        values = form_values(state)
        shown = [(["on"] if values[f.name] else []) if f.kind == "switch" else values[f.name] for f in FIELDS]
        return (*draw(values, ctx.allow_model_import, import_model=False), *shown)
