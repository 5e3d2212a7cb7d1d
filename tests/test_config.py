"""ZEROMON_* settings: parsed, validated, and refused with the variable's name."""

from __future__ import annotations

import pytest

from zeromon.errors import ZeromonError
from zeromon.model.units import format_bytes, parse_size
from zeromon_agent.context.config import AgentConfig, load_config


def test_defaults_without_environment() -> None:
    assert load_config({}) == AgentConfig()


def test_values_from_environment_and_overrides() -> None:
    cfg = load_config({"ZEROMON_BUFFER_EVENTS": "2048", "ZEROMON_ACTIVATIONS": "off",
                       "ZEROMON_CPU_CAPACITY": "24GiB", "ZEROMON_MEMORY_EVERY": "auto",
                       "ZEROMON_DEVICE_INTERVAL": "0"}, job="demo")
    assert cfg.buffer_events == 2048 and cfg.activations is False
    assert cfg.cpu_capacity == 24 * 2**30 and cfg.memory_every == 0 and cfg.device_interval_s == 0
    assert cfg.job == "demo"


@pytest.mark.parametrize(("var", "value", "expected"), [
    ("ZEROMON_BUFFER_EVENTS", "12", "must be an integer from 1024 to 16777216"),
    ("ZEROMON_ACTIVATIONS", "maybe", "must be one of 1, 0"),
    ("ZEROMON_FLUSH_INTERVAL", "0", "must be seconds from 0.01 to 3600"),
    ("ZEROMON_FLUSH_INTERVAL", "nan", "is not finite: must be seconds from 0.01 to 3600"),
    ("ZEROMON_FLUSH_INTERVAL", "-1", "must be seconds from 0.01 to 3600"),
    ("ZEROMON_DEVICE_INTERVAL", "inf", "is not finite"),
    ("ZEROMON_CPU_CAPACITY", "lots", "is not a size"),
    ("ZEROMON_CPU_CAPACITY", "24", "has no unit and would be 24 bytes; did you mean 24GiB?"),
    ("ZEROMON_CPU_CAPACITY", "1e400", "must be a memory capacity with a unit, from 1MiB to 1PiB"),
    ("ZEROMON_MEMORY_EVERY", "0", "must be 'auto' or an integer from 1 to 1000000"),
    ("ZEROMON_PORT", "65536", "must be an integer from 1 to 65535, or 0 (any free port)"),
])
def test_bad_values_name_the_variable(var: str, value: str, expected: str) -> None:
    with pytest.raises(ZeromonError) as info:
        load_config({var: value})
    assert f"{var}={value!r}" in info.value.message
    assert expected in str(info.value)


def test_unknown_attach_setting() -> None:
    with pytest.raises(ZeromonError, match="unknown setting 'bufer_events'"):
        load_config({}, bufer_events=3)


def test_sizes() -> None:
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("1.5 GiB") == int(1.5 * 2**30)
    assert parse_size("7e9") == 7 * 10**9
    with pytest.raises(ValueError, match="unknown unit"):
        parse_size("3 parsecs")
    for absurd in ("1e400", "nan", "inf", "-1GiB", "0"):
        with pytest.raises(ValueError):
            parse_size(absurd)
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(None) == "-"
