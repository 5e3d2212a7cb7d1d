"""ZL031 and ZL012 beyond ZeRO and the precision blocks: the value types and the keys of DeepSpeed's other pydantic
config sections (the monitors tensorboard / wandb / csv_monitor / comet, compile, hybrid_engine, comms_logger,
timers.throughput, tensor_parallel and its tp block), checked against the installed DeepSpeed's own models, and
reported by the real ``zeromon lint``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromon.analysis.lint import lint_deepspeed_config
from zeromon.analysis.lint_schema import STATIC_SCHEMA
from zeromon.analysis.lint_types import OTHER_MODEL_SECTIONS, STATIC_TYPES, refusal

from conftest import REPO, refuses_field

DATA = REPO / "tests" / "data" / "lint"


def _section(path: str) -> str | None:
    """The model section ``path`` lies in (tensor_parallel.tp.tp_size: tensor_parallel); None if none."""
    return next((s for s in OTHER_MODEL_SECTIONS if path.startswith(f"{s}.")), None)


NEW_PATHS = sorted(p for p in STATIC_TYPES if _section(p))
# The blocks whose keys DeepSpeed's models check, the tp block under both its spellings.
BLOCKS = sorted(s for s in STATIC_SCHEMA.sections if _section(f"{s}.x") and s != "timers")
CHOICES = ["torch", "liger", "z1", "z3", "autosp", "autotp"]
# The few fields of choices and lists, drawn as often as all the others together.
CHOICE_PATHS = sorted(p for p in NEW_PATHS if STATIC_TYPES[p].kind in ("choice", "list", "object"))

values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20), st.floats(allow_nan=False),
    st.sampled_from([0, 1, 0.0, 1.0, 1.5, -1, 2, "0", "1", "true", "False", "yes", "off", "1.0", "5e8", " 7 ",
                     "x", "", "bf16", "float16", 10**400, 0.5, *CHOICES, "Torch", "LIGER", "Z1", "z2", " z3"]),
    st.text(max_size=6),
    st.lists(st.one_of(st.sampled_from([*CHOICES, "Z3", "all_reduce"]), st.integers(), st.none()), max_size=3),
    st.dictionaries(st.sampled_from(["a", "tp_size"]), st.just(1)))


def _models() -> dict[str, Any]:
    import contextlib
    import io
    import logging

    from zeromon.sources.configs import _other_section_models

    logging.disable(logging.WARNING)  # DeepSpeed's import chatter ("Setting accelerator to CPU")
    with contextlib.redirect_stdout(io.StringIO()):
        models = _other_section_models()
    logging.disable(logging.NOTSET)
    return models


def _nested(path: str, value: Any) -> tuple[str, dict[str, Any], str]:
    """(section, the keyword arguments its model is built from, the field's key) for a value at ``path``."""
    section = _section(path)
    assert section is not None
    *outer, key = path[len(section) + 1:].split(".")
    block: dict[str, Any] = {key: value}
    for name in reversed(outer):  # tensor_parallel.tp.tp_size: {"tp": {"tp_size": value}}
        block = {name: block}
    return section, block, key


def test_every_model_section_has_checked_fields_and_keys() -> None:
    assert {_section(p) for p in NEW_PATHS} == set(OTHER_MODEL_SECTIONS)
    # 4 monitor switches and 9 text fields, comet 2 more, compile 18 (passes), hybrid_engine 7, comms_logger 5
    # (prof_ops), timers.throughput 2, tensor_parallel 17 (the tp block and its fields under both spellings)
    assert len(NEW_PATHS) == 68
    assert {p.rpartition(".")[0] for p in NEW_PATHS} <= set(STATIC_SCHEMA.sections)
    assert {STATIC_TYPES[p].kind for p in NEW_PATHS} == {"bool", "int", "str", "choice", "list", "section", "object"}


@pytest.mark.deepspeed
def test_the_written_down_types_and_keys_are_the_installed_models() -> None:
    pytest.importorskip("deepspeed")
    from zeromon.sources.configs import deepspeed_schema

    schema = deepspeed_schema()
    assert schema is not None
    assert {p: t for p, t in schema.types.items() if _section(p)} == {p: STATIC_TYPES[p] for p in NEW_PATHS}
    assert {s: schema.sections[s] for s in [*BLOCKS, "timers"]} == {
        s: STATIC_SCHEMA.sections[s] for s in [*BLOCKS, "timers"]}


def _near_choices(path: str) -> st.SearchStrategy[Any]:
    """Values around a field's own choices: the choices, their case changed or padded, lists of them."""
    choices = STATIC_TYPES[path].choices or ("torch",)
    near = st.sampled_from(choices).flatmap(lambda c: st.sampled_from([c, c.upper(), c.capitalize(), f" {c}"]))
    return st.one_of(near, st.lists(st.one_of(near, st.integers(0, 3)), max_size=3))


@pytest.mark.deepspeed
@settings(max_examples=400, deadline=None)
@given(path_value=st.one_of(st.sampled_from(NEW_PATHS), st.sampled_from(CHOICE_PATHS)).flatmap(
    lambda path: st.tuples(st.just(path), st.one_of(values, _near_choices(path)))))
def test_the_check_refuses_exactly_what_the_models_refuse(path_value: tuple[str, Any]) -> None:
    path, value = path_value
    pytest.importorskip("deepspeed")
    from pydantic import ValidationError

    section, block, key = _nested(path, value)
    try:
        _models()[section](**block)
        accepted = True
    except ValidationError as exc:
        accepted = not refuses_field(exc, key)
    assert (refusal(STATIC_TYPES[path], value) is None) == accepted, (path, value)


def _misspelt(key: str) -> st.SearchStrategy[str]:
    return st.integers(0, len(key) - 1).map(lambda i: key[:i] + key[i + 1:])


known = sorted({k for s in BLOCKS for k in STATIC_SCHEMA.sections[s]})
keys = st.one_of(st.sampled_from(known), st.sampled_from(known).flatmap(_misspelt),
                 st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10))


@pytest.mark.deepspeed
@settings(max_examples=150, deadline=None)
@given(block=st.sampled_from(BLOCKS), key=keys)
def test_an_unknown_key_is_an_error_exactly_where_the_models_refuse_it(block: str, key: str) -> None:
    pytest.importorskip("deepspeed")
    from pydantic import ValidationError

    section, arguments, _ = _nested(f"{block}.{key}", 1)
    try:
        _models()[section](**arguments)
        refused = False
    except ValidationError as exc:
        refused = any(error["type"] == "extra_forbidden" for error in exc.errors())
    config: dict[str, Any] = {}
    outer, _, last = block.rpartition(".")
    holder = config
    for part in outer.split(".") if outer else ():
        holder = holder.setdefault(part, {})
    holder[last] = {key: 1}
    findings = [f for f in lint_deepspeed_config(config).findings if f.id == "ZL012"]
    assert [(f.severity, f.key) for f in findings] == ([("error", f"{block}.{key}")] if refused else []), key


def _lint(path: Path, exit_code: int = 1) -> dict[tuple[str, str], dict[str, str]]:
    done = subprocess.run([sys.executable, "-m", "zeromon", "lint", str(path), "--json"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == exit_code, done.stderr
    return {(f["id"], f["key"]): f for f in json.loads(done.stdout)["findings"]}


def test_the_cli_reports_each_bad_value(tmp_path: Path) -> None:
    config = {"train_batch_size": 8, "tensorboard": {"enabled": "maybe", "output_path": "/tmp/tb"},
              "hybrid_engine": {"max_out_tokens": 0}, "compile": {"free_activation_threshold": "lots"},
              "comet": {"samples_log_interval": 1.5}, "comms_logger": {"enabled": True, "prof_ops": ["all_reduce"]},
              "timers": {"throughput": {"synchronized": "sometimes"}}, "tensor_parallel": {"tp": {"tp_size": "two"}}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    found = {key: f["message"] for key, f in _lint(path).items() if key[0] == "ZL031"}
    assert set(found) == {("ZL031", "tensorboard.enabled"), ("ZL031", "hybrid_engine.max_out_tokens"),
                          ("ZL031", "compile.free_activation_threshold"), ("ZL031", "comet.samples_log_interval"),
                          ("ZL031", "timers.throughput.synchronized"), ("ZL031", "tensor_parallel.tp.tp_size")}
    assert found[("ZL031", "hybrid_engine.max_out_tokens")] == (
        "hybrid_engine.max_out_tokens is 0: must be an integer > 0; DeepSpeed's config class refuses it and stops "
        "at start-up")


def test_the_cli_reports_choices_text_and_lists() -> None:
    found = _lint(DATA / "section_choices.json")
    assert set(found) == {("ZL031", k) for k in (
        "tensor_parallel.vocab_parallel_ce_backend", "tensor_parallel.dtype", "compile.passes", "comet.mode",
        "comms_logger.prof_ops", "wandb.project", "hybrid_engine")}
    assert found[("ZL031", "tensor_parallel.vocab_parallel_ce_backend")]["message"] == (
        "tensor_parallel.vocab_parallel_ce_backend is \"Torch\": must be 'torch' or 'liger'; DeepSpeed's config "
        "class refuses it and stops at start-up")
    assert found[("ZL031", "compile.passes")]["message"].startswith(
        "compile.passes is [\"z1\", \"Z3\"]: item 1 must be 'z1' or 'z3' or 'autosp' or 'autotp';")
    assert found[("ZL031", "comms_logger.prof_ops")]["fix"] == "set prof_ops to a list [...]"
    assert found[("ZL031", "comet.mode")]["fix"] == "set mode to a string, or null"
    dtype = found[("ZL031", "tensor_parallel.dtype")]
    assert "a Python torch.dtype object, which a JSON value cannot be" in dtype["message"]
    assert dtype["fix"] == "remove dtype"
    assert found[("ZL031", "hybrid_engine")]["message"].startswith("hybrid_engine is null; DeepSpeed reads it as "
                                                                   "an object {...}")


def test_the_cli_names_a_misspelt_key_its_section_and_the_nearest_key() -> None:
    found = _lint(DATA / "section_typos.json")
    assert {(key, f["severity"]) for key, f in found.items()} == {
        (("ZL012", "tensorboard.enabeld"), "error"), (("ZL012", "tensor_parallel.tp.tp_sise"), "error"),
        (("ZL012", "compile.project"), "error")}
    typo = found[("ZL012", "tensorboard.enabeld")]
    assert typo["message"] == ("unknown key tensorboard.enabeld: did you mean tensorboard.enabled?; DeepSpeed "
                               "validates tensorboard strictly and stops at start-up (\"Extra inputs are not "
                               "permitted\")")
    assert typo["fix"] == "rename it to enabled"
    assert found[("ZL012", "tensor_parallel.tp.tp_sise")]["fix"] == "rename it to tp_size"
    assert "project belongs in comet.project or wandb.project" in found[("ZL012", "compile.project")]["message"]
    # DeepSpeed reads timers key by key (get_timers_config): a misspelt throughput is ignored, not refused.
    ignored = _lint(DATA / "timers_typo.json", exit_code=0)[("ZL012", "timers.throughputt")]
    assert ignored["severity"] == "warning"
    assert "silently ignores unknown keys in timers (it reads throughput)" in ignored["message"]
    assert ignored["fix"] == "rename it to throughput"
