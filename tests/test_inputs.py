"""Every number a person types: flags, ZEROMON_* variables, config files. Any input gives a value in its
documented range or one clear line (exit code 2 from the CLI), never a traceback, never a hang.

Property-based (hypothesis) over the parsers of zeromon.model.numbers, every numeric flag's parser, the
agent's settings and the config linter (JSON and YAML text, huge numbers, NaN/Infinity, wrong types, deep
nesting, bytes that are not UTF-8), run in this process; a few real subprocesses check the exit codes,
and a real one-rank run checks that a bad setting and an open bind are notices in the recording.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from zeromon.analysis.lint import lint_deepspeed_config
from zeromon.analysis.lint_schema import STATIC_SCHEMA
from zeromon.analysis.lint_types import STATIC_TYPES, refusal
from zeromon.cli import build_parser, main
from zeromon.errors import ZeromonError
from zeromon.model import numbers
from zeromon.model.codec import read_recording
from zeromon.sources.live import LiveSource
from zeromon.sources.replay import ReplaySource
from zeromon_agent.context.config import ENV, AgentConfig, load_config

from conftest import REPO, child_env, ranks_args, refuses_field, zeromon

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Text a person might type for a number: real numbers, their edge cases, units, junk.
number_words = st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e-400", "0", "-0",
                                "-1", "1e999999999", "0x10", "1_000", "", " ", "1.5", "80", "80GiB", "1e30GiB",
                                "99999999999", "7B", "1e-9", "0.05", "86400", "1e9", "200GB/s", "-.5", "٣"])
typed = st.one_of(
    number_words,
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.builds(lambda n, u: f"{n}{u}", st.floats(min_value=-1e40, max_value=1e40).map(lambda f: f"{f:g}"),
              st.sampled_from(["", "B", "KiB", "MiB", "GiB", "TiB", "GB", "TB", "/s", "GB/s", "k", "M", "B", "x"])),
    st.text(max_size=30),
)

SPECS: dict[str, Any] = {
    "POLL_SECONDS": numbers.POLL_SECONDS, "REFRESH_SECONDS": numbers.REFRESH_SECONDS,
    "REPLAY_SPEED": numbers.REPLAY_SPEED, "GPU_MEMORY": numbers.GPU_MEMORY, "CAPACITY": numbers.CAPACITY,
    "BUS_BANDWIDTH": numbers.BUS_BANDWIDTH, "GPUS_PER_NODE": numbers.GPUS_PER_NODE, "NODES": numbers.NODES,
    "GPUS": numbers.GPUS, "PORT": numbers.PORT, "LAYER_SIZE": numbers.LAYER_SIZE, "PARAMS": numbers.PARAMS,
}


def _bounds(spec: Any) -> tuple[float, float]:
    if isinstance(spec, numbers.ParamCount):
        return 1, spec.maximum
    return spec.minimum, spec.maximum


# --- the parsers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SPECS))
@FAST
@given(text=typed)
def test_a_parser_gives_a_value_in_range_or_one_line(name: str, text: str) -> None:
    spec = SPECS[name]
    try:
        value = spec.parse(text)
    except ValueError as exc:
        message = str(exc)
        assert message and "\n" not in message and len(message) < 300
        return
    low, high = _bounds(spec)
    assert math.isfinite(value) and (low <= value <= high or (value == 0 and getattr(spec, "zero", None)))


def test_the_issues_inputs_are_refused_with_the_flag_and_the_range() -> None:
    cases: list[tuple[Callable[[str], Any], str, str]] = [
        (numbers.flag("--interval", numbers.POLL_SECONDS), "1e-9", "--interval '1e-9': must be seconds from 0.05"),
        (numbers.flag("--interval", numbers.POLL_SECONDS), "nan", "--interval 'nan': is not finite"),
        (numbers.flag("--capacity", numbers.CAPACITY), "1e30GiB", "--capacity '1e30GiB': is more than 2^70 bytes"),
        (numbers.flag("--capacity", numbers.CAPACITY), "80", "did you mean 80GiB?"),
        (numbers.flag("--gpus-per-node", numbers.GPUS_PER_NODE), "100000000", "must be an integer from 1 to 4096"),
        (numbers.flag("--peak-busbw", numbers.BUS_BANDWIDTH), "200", "did you mean 200GB/s?"),
    ]
    for parse, text, expected in cases:
        with pytest.raises(ZeromonError) as info:
            parse(text)
        assert expected in info.value.message and "\n" not in info.value.message
    assert numbers.flag("--peak-busbw", numbers.BUS_BANDWIDTH)("200GB/s") == 200 * 10**9
    assert numbers.GPU_MEMORY.parse("80GiB") == 80 * 2**30 and numbers.PORT.parse("0") == 0


# --- every numeric flag, through the real argument parser -----------------------------------------------

NUMERIC_FLAGS = [
    ("attach", "--interval"), ("attach", "--speed"), ("live", "--interval"), ("targets", "--interval"),
    ("dashboard", "--interval"), ("dashboard", "--speed"), ("dashboard", "--port"), ("dashboard", "--capacity"),
    ("dashboard", "--peak-busbw"), ("report", "--capacity"), ("report", "--peak-busbw"), ("lint", "--gpus"),
    ("lint", "--world-size"), ("lint", "--params"), ("lint", "--gpu-memory"),
]
_PARSER = build_parser()[0]


@pytest.mark.parametrize(("command", "flag"), NUMERIC_FLAGS)
@FAST
@given(text=typed)
def test_every_numeric_flag_parses_or_names_itself_in_one_line(command: str, flag: str, text: str) -> None:
    positional = {"lint": ["x.json"], "report": ["runs/x"]}.get(command, [])
    try:
        args, _ = _PARSER.parse_known_args([command, *positional, f"{flag}={text}"])
    except ZeromonError as exc:
        assert exc.message.startswith(f"{flag} ") or exc.message.startswith(f"zeromon {command}: "), exc.message
        assert "\n" not in exc.message and exc.exit_code == 2
        return
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    assert isinstance(value, int | float) and math.isfinite(value)


PLAN_FLAGS = ["--params", "--gpus-per-node", "--nodes", "--gpu-memory", "--largest-layer-params", "--activations"]


@pytest.mark.parametrize("flag", PLAN_FLAGS)
@FAST
@given(text=st.one_of(typed, st.lists(typed, min_size=5, max_size=5).map(",".join)))
def test_plan_answers_or_refuses_in_one_line(flag: str, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--json"] + ([] if flag == "--params" else ["--params", "7B"]) + [f"{flag}={text}"]
    code = main(args)
    out, err = capsys.readouterr()
    assert code in (0, 2), err
    if code == 2:
        assert err.startswith("zeromon: error: ") and "Traceback" not in err and len(err.splitlines()) <= 2
    else:
        plan = json.loads(out)
        assert all(math.isfinite(s["gpu_bytes"]) for s in plan["stages"])


def test_absurd_plan_sizes_are_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for args, flag in ((["--gpus-per-node", "100000000"], "--gpus-per-node"),
                       (["--activations", "99999999999,1,4096,32,32"], "--activations"),
                       (["--nodes", "1e400"], "--nodes"), (["--gpu-memory", "1e30GiB"], "--gpu-memory")):
        assert main(["plan", "--params", "7B", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"zeromon: error: {flag} '"), err


# --- the agent's settings --------------------------------------------------------------------------------

@FAST
@given(var=st.sampled_from(sorted(s.var for s in ENV.values())), text=typed)
def test_a_bad_setting_in_training_is_a_notice_and_the_default(var: str, text: str) -> None:
    assume(text != "")  # empty: the default, by design
    notices: list[str] = []
    config = load_config({var: text}, notices=notices)  # never raises
    name = next(n for n, s in ENV.items() if s.var == var)
    if notices:
        assert getattr(config, name) == getattr(AgentConfig(), name)
        assert notices[0].startswith(f"{var}={text!r}: ") and "zeromon uses" in notices[0]
    else:
        with_strict = load_config({var: text})  # the same verdict where a command checks them
        assert getattr(with_strict, name) == getattr(config, name)
    for value in (config.flush_interval_s, config.device_interval_s):
        assert math.isfinite(value)


def test_the_issues_settings_are_refused_by_zeromon_run_and_kept_at_default_in_training() -> None:
    for var, text in (("ZEROMON_FLUSH_INTERVAL", "nan"), ("ZEROMON_CPU_CAPACITY", "24"),
                      ("ZEROMON_FLUSH_INTERVAL", "inf"), ("ZEROMON_DEVICE_INTERVAL", "1e-9")):
        with pytest.raises(ZeromonError, match=f"^{var}={text!r}: "):
            load_config({var: text})
        notices: list[str] = []
        assert load_config({var: text}, notices=notices) == AgentConfig() and len(notices) == 1
    # attach() keywords keep raising: they are the caller's own code.
    with pytest.raises(ZeromonError, match=r"attach\(flush_interval_s=nan\): is not finite"):
        load_config({}, flush_interval_s=float("nan"))
    with pytest.raises(ZeromonError, match=r"attach\(cpu_capacity=24\): must be a memory capacity"):
        load_config({}, cpu_capacity=24)
    assert load_config({}, flush_interval_s=1, cpu_capacity="24GiB", out_dir=Path("runs")).cpu_capacity == 24 * 2**30


# --- the config linter -------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["auto", "cpu", "nvme", "none", "5e8", "true",
                                                                     "", "1", "NaN"]),
    st.text(max_size=8))
known_keys = sorted({p.rsplit(".", 1)[-1] for p in STATIC_TYPES} | set(STATIC_SCHEMA.sections[""]))
config_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(known_keys), inner, max_size=4)), max_leaves=12)
configs = st.fixed_dictionaries({}, optional={
    "train_batch_size": scalars, "train_micro_batch_size_per_gpu": scalars, "gradient_accumulation_steps": scalars,
    "fp16": config_values, "bf16": config_values,
    "zero_optimization": st.one_of(config_values, st.fixed_dictionaries({}, optional={
        "stage": scalars, "reduce_bucket_size": scalars, "overlap_comm": scalars,
        "offload_optimizer": st.one_of(scalars, st.dictionaries(st.sampled_from(["device", "pin_memory", "ratio",
                                                                                 "nvme_path"]), scalars)),
        "offload_param": st.one_of(scalars, st.dictionaries(st.sampled_from(["device", "buffer_count"]), scalars)),
        "stage3_max_live_parameters": scalars}))})


def _lint_cli(tmp_path: Path, name: str, data: bytes, capsys: pytest.CaptureFixture[str], *extra: str) -> int:
    path = tmp_path / name
    path.write_bytes(data)
    code = main(["lint", str(path), *extra])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (code, err)
    if code == 2:  # one line, and a hint line at most (a name may hold any character but a newline)
        assert err.startswith("zeromon: error: ") and err.count("\n") <= 2 and "Traceback" not in err, err
        assert out == ""
    elif "--json" in extra:
        assert err == "" and json.loads(out)["summary"]["errors"] == (code == 1) * len(
            [f for f in json.loads(out)["findings"] if f["severity"] == "error"])
    else:
        assert err == "" and out.startswith("zeromon lint:")
    return code


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configs)
def test_lint_reports_any_json_config_as_findings(config: dict[str, Any], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps(config)  # NaN, Infinity and -Infinity as Python writes them, which DeepSpeed reads too
    code = _lint_cli(tmp_path, "ds.json", text.encode(), capsys, "--json")
    assert code in (0, 1)
    parsed = json.loads(text)
    report = lint_deepspeed_config(parsed)
    if any(isinstance(v, float) and not math.isfinite(v) for v in _leaves(parsed)):
        assert any(f.id == "ZL030" for f in report.findings)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block=st.dictionaries(st.sampled_from(["zero_stage", "gradient_accumulation_steps", "gradient_clipping",
                                              "offload_optimizer_device", "offload_param_device",
                                              "zero3_save_16bit_model", "deepspeed_config_file"]), scalars),
       processes=scalars)
# Found by this test (2026-11-25): '~0' names the home of a user this machine does not have; Path.expanduser raised.
@example(block={"deepspeed_config_file": "~0"}, processes=None)
def test_lint_reports_any_accelerate_yaml_as_findings(block: dict[str, Any], processes: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"distributed_type": "DEEPSPEED", "num_processes": processes, "deepspeed_config": block}
    _lint_cli(tmp_path, "acc.yaml", yaml.safe_dump(doc).encode(), capsys)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                      st.integers(1, 3000).map(lambda n: ("[" * n).encode()),
                      st.integers(1, 3000).map(lambda n: ('{"a":' * n + "1" + "}" * n).encode()),
                      st.integers(4301, 6000).map(lambda n: ('{"train_batch_size": ' + "9" * n + "}").encode()),
                      st.sampled_from([b"\xff\xfe{}", b"{\"a\": NaN}", b"{\"a\": 1e400}", b"- - -", b"{", b"null"])),
       suffix=st.sampled_from(["json", "yaml"]))
def test_lint_never_crashes_on_any_bytes(data: bytes, suffix: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _lint_cli(tmp_path, f"config.{suffix}", data, capsys)


def test_lint_finds_what_the_issue_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for text, expected in (('{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1e400}', "ZL030"),
                           ('{"train_micro_batch_size_per_gpu": NaN}', "ZL030"),
                           ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, '
                            '"offload_optimizer": "cpu"}}', "ZL031"),
                           ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, '
                            '"offload_param": {"device": 5}}}', "ZL031")):
        assert _lint_cli(tmp_path, "ds.json", text.encode(), capsys, "--json") == 1
        assert expected in {f["id"] for f in json.loads((main(["lint", str(tmp_path / "ds.json"), "--json"]),
                                                         capsys.readouterr().out)[1])["findings"]}


# --- DeepSpeed's config classes as the oracle of the value types --------------------------------------------

def _deepspeed_models() -> dict[str, Any]:
    import contextlib
    import io
    import logging

    logging.disable(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        from zeromon.sources.configs import _other_section_models

        value_only = _other_section_models()  # tensorboard, ..., timers.throughput
    logging.disable(logging.NOTSET)
    timers = value_only.pop("timers.throughput")  # built from the block under "timers": {"throughput": ...}
    return {"zero_optimization": DeepSpeedZeroConfig, "fp16": DeepSpeedFP16Config, "bf16": DeepSpeedBF16Config,
            **value_only, "timers": lambda **block: timers(**block.get("throughput", {}))}


type_values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20), st.floats(allow_nan=False),
    st.sampled_from([0, 1, 0.0, 1.0, 1.5, -1, 2, "0", "1", "true", "False", "yes", "off", "1.0", "5e8", " 7 ",
                     "cpu", "nvme", "none", "CPU", "/nvme", "x", 10**400, 0.5, 1.0000001]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.sampled_from(["device"]), st.just("cpu")))


@pytest.mark.deepspeed
@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(sorted(STATIC_TYPES)), value=type_values)
def test_the_type_check_refuses_exactly_what_deepspeeds_config_classes_refuse(path: str, value: Any) -> None:
    pytest.importorskip("deepspeed")
    models = _deepspeed_models()
    top, _, rest = path.partition(".")
    block: dict[str, Any] = {}
    inner = block
    parts = rest.split(".")
    for part in parts[:-1]:
        inner = inner.setdefault(part, {})
    inner[parts[-1]] = value
    if parts[-1] in ("cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory"):
        assume(value is None or isinstance(value, bool))  # deprecated: DeepSpeed rewrites them into other blocks
    from pydantic import ValidationError

    try:
        models[top](**block)
        accepted = True
    except ValidationError as exc:
        # The field's own errors; a model validator's (loc ()) weighs several fields (offload ratio < 1 needs
        # stage 3, compute_grad_norm false stage 1 or 2): not a value type.
        accepted = not refuses_field(exc, parts[-1])
    except Exception:  # noqa: BLE001 - a validator of DeepSpeed's own raising on this value (TypeError, ...)
        accepted = False
    assert (refusal(STATIC_TYPES[path], value) is None) == accepted, (path, value)


@pytest.mark.deepspeed
def test_the_static_types_are_the_installed_deepspeeds() -> None:
    pytest.importorskip("deepspeed")
    from zeromon.sources.configs import deepspeed_schema

    schema = deepspeed_schema()
    assert schema is not None and dict(schema.types) == STATIC_TYPES


# --- the real CLI and a real run ---------------------------------------------------------------------------------

def test_the_real_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    for args in (["attach", "--interval", "1e-9"], ["live", "--once", "--interval", "nan"],
                 ["report", "runs/none", "--capacity", "1e30GiB"], ["plan", "--params", "7B", "--gpus-per-node",
                                                                    "100000000"]):
        out = zeromon(*args, timeout=60)
        assert out.returncode == 2 and out.stdout == "", (args, out.stderr)
        assert out.stderr.startswith("zeromon: error: ") and "Traceback" not in out.stderr, out.stderr
    (tmp_path / "nan.json").write_text('{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": NaN}')
    out = zeromon("lint", str(tmp_path / "nan.json"), timeout=60)
    assert out.returncode == 1 and "ZL030" in out.stdout and out.stderr == ""


def test_a_bad_setting_and_an_open_bind_are_notices_of_the_run(tmp_path: Path) -> None:
    """In a real rank started by attach(): the training goes on, with the default and a notice of each."""
    scenario = REPO / "tests" / "scenarios" / "live_train.py"
    env = child_env(ZEROMON_OUT=str(tmp_path / "run"), ZEROMON_FLUSH_INTERVAL="nan", ZEROMON_CPU_CAPACITY="24",
                    ZEROMON_BIND="0.0.0.0", ZEROMON_REGISTRY=str(tmp_path / "registry"))
    done = subprocess.run(ranks_args(1, scenario, "--steps", "3", "--sleep", "0"), env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ZEROMON_FLUSH_INTERVAL='nan'" in done.stderr and "Traceback" not in done.stderr
    rec = read_recording(tmp_path / "run" / "rank-0.jsonl")
    assert len(rec.steps) == 3
    settings_notices = [n.message for n in rec.notices if n.source == "settings"]
    assert any(m.startswith("ZEROMON_FLUSH_INTERVAL='nan': is not finite") for m in settings_notices)
    assert any(m.startswith("ZEROMON_CPU_CAPACITY='24': has no unit") for m in settings_notices)
    open_bind = [n for n in rec.notices if n.source == "endpoint" and "without ZEROMON_TOKEN" in n.message]
    assert open_bind and open_bind[0].level == "warning"
    summary = zeromon("summary", str(tmp_path / "run"), timeout=60)
    assert "without ZEROMON_TOKEN" in summary.stdout and "ZEROMON_CPU_CAPACITY='24'" in summary.stdout


@pytest.mark.parametrize(("make", "says"), [
    (lambda: LiveSource(targets=["127.0.0.1:1"], interval_s=math.nan), "interval nan: is not finite: must be seconds"),
    (lambda: LiveSource(targets=["127.0.0.1:1"], interval_s=1e-9), "interval 1e-09: must be seconds from 0.01"),
    (lambda: LiveSource(targets=["127.0.0.1:1"], interval_s="1"), "interval '1': must be seconds from 0.01"),
    (lambda: ReplaySource("/nonexistent", interval_s=math.inf), "replay interval inf: is not finite"),
    (lambda: ReplaySource("/nonexistent", speed=1e9), "replay speed 1000000000.0: must be a speed factor from"),
    (lambda: ReplaySource("/nonexistent", speed=True), "replay speed True: must be a speed factor from"),
])
def test_the_sources_check_their_interval_and_speed_with_the_flags_parsers(make: Callable[[], Any], says: str) -> None:
    """What a flag refuses, a source given it in code refuses too, in the same words (not only > 0)."""
    with pytest.raises(ZeromonError) as info:
        make()
    assert says in info.value.message and info.value.exit_code == 2


def test_a_registry_under_an_unknown_users_home_is_taken_as_written() -> None:
    """ZEROMON_REGISTRY='~name/...' of a user this machine does not know: the path as written (as a shell leaves
    it), not Path.expanduser's RuntimeError in the agent and every command that lists runs."""
    from zeromon.model.registry import registry_dir

    assert registry_dir({"ZEROMON_REGISTRY": "~nosuchuser0/agents"}) == Path("~nosuchuser0/agents")
    assert registry_dir({"ZEROMON_REGISTRY": "~/agents"}) == Path.home() / "agents"
