"""ZL031 beyond ZeRO and the precision blocks: the value types of DeepSpeed's other pydantic config sections
(the monitors tensorboard / wandb / csv_monitor / comet, compile, hybrid_engine, comms_logger,
timers.throughput, tensor_parallel), checked
against the installed DeepSpeed's own models, and reported by the real ``zeromon lint``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromon.analysis.lint_types import STATIC_TYPES, VALUE_ONLY_SECTIONS, refusal


def _section(path: str) -> str | None:
    """The value-only section ``path`` lies in (tensor_parallel.tp.tp_size: tensor_parallel); None if none."""
    return next((s for s in VALUE_ONLY_SECTIONS if path.startswith(f"{s}.")), None)


NEW_PATHS = sorted(p for p in STATIC_TYPES if _section(p))

values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20), st.floats(allow_nan=False),
    st.sampled_from([0, 1, 0.0, 1.0, 1.5, -1, 2, "0", "1", "true", "False", "yes", "off", "1.0", "5e8", " 7 ",
                     "x", 10**400, 0.5]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.sampled_from(["a"]), st.just(1)))


def _models() -> dict[str, Any]:
    import contextlib
    import io
    import logging

    from zeromon.sources.configs import _value_only_models

    logging.disable(logging.WARNING)  # DeepSpeed's import chatter ("Setting accelerator to CPU")
    with contextlib.redirect_stdout(io.StringIO()):
        models = _value_only_models()
    logging.disable(logging.NOTSET)
    return models


def test_every_value_only_section_has_checked_fields() -> None:
    assert {_section(p) for p in NEW_PATHS} == set(VALUE_ONLY_SECTIONS)
    # 4 monitor switches, comet 2 more, compile 17, hybrid_engine 7, comms_logger 4, timers.throughput 2,
    # tensor_parallel 10 (kernel_inject and tensor_parallel/tp: a field's two spellings)
    assert len(NEW_PATHS) == 46


@pytest.mark.deepspeed
def test_the_written_down_types_are_the_installed_models() -> None:
    pytest.importorskip("deepspeed")
    from zeromon.sources.configs import deepspeed_schema

    schema = deepspeed_schema()
    assert schema is not None
    assert {p: t for p, t in schema.types.items() if _section(p)} == {
        p: STATIC_TYPES[p] for p in NEW_PATHS}
    assert not set(VALUE_ONLY_SECTIONS) & set(schema.sections)  # values only: their keys stay unlisted


@pytest.mark.deepspeed
@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(NEW_PATHS), value=values)
def test_the_check_refuses_exactly_what_the_models_refuse(path: str, value: Any) -> None:
    pytest.importorskip("deepspeed")
    from pydantic import ValidationError

    section = _section(path)
    assert section is not None
    *outer, key = path[len(section) + 1:].split(".")
    block: dict[str, Any] = {key: value}
    for name in reversed(outer):  # tensor_parallel.tp.tp_size: {"tp": {"tp_size": value}}
        block = {name: block}
    try:
        _models()[section](**block)
        accepted = True
    except ValidationError as exc:
        accepted = not any(error["loc"] and error["loc"][-1] == key for error in exc.errors())
    assert (refusal(STATIC_TYPES[path], value) is None) == accepted, (path, value)


def test_the_cli_reports_each_bad_value(tmp_path: Path) -> None:
    config = {"train_batch_size": 8, "tensorboard": {"enabled": "maybe", "output_path": "/tmp/tb"},
              "hybrid_engine": {"max_out_tokens": 0}, "compile": {"free_activation_threshold": "lots"},
              "comet": {"samples_log_interval": 1.5}, "comms_logger": {"enabled": True, "prof_ops": ["all_reduce"]},
              "timers": {"throughput": {"synchronized": "sometimes"}}, "tensor_parallel": {"tp": {"tp_size": "two"}}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-m", "zeromon", "lint", str(path), "--json"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    found = {(f["id"], f["key"]): f["message"] for f in json.loads(done.stdout)["findings"] if f["id"] == "ZL031"}
    assert set(found) == {("ZL031", "tensorboard.enabled"), ("ZL031", "hybrid_engine.max_out_tokens"),
                          ("ZL031", "compile.free_activation_threshold"), ("ZL031", "comet.samples_log_interval"),
                          ("ZL031", "timers.throughput.synchronized"), ("ZL031", "tensor_parallel.tp.tp_size")}
    assert found[("ZL031", "hybrid_engine.max_out_tokens")] == (
        "hybrid_engine.max_out_tokens is 0: must be an integer > 0; DeepSpeed's config class refuses it and stops "
        "at start-up")
