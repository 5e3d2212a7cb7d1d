"""`zeromon lint` for FSDP: accelerate's fsdp_config (tests/data/lint/accelerate/fsdp*.yaml) and Lightning's
FSDPStrategy (tests/data/lint/lightning/). One fixture per pitfall with exactly its findings; accelerate's own
launcher and plugin as the oracle of what it refuses and of the setup it builds; the static lists against the
installed accelerate and torch; the real CLI for output, exit codes and bad input. Pure parsing: no training."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from zeromon.analysis.lint import LintOptions, LintReport
from zeromon.analysis.lint_accelerate_fsdp import lint_accelerate_fsdp_config, resolve_accelerate_fsdp
from zeromon.analysis.lint_fsdp_schema import (
    FSDP_ARGS_SET_BY_LIGHTNING,
    FSDP_KWARGS,
    STATIC_ACCELERATE_FSDP,
    STATIC_ACCELERATE_VERSION,
)
from zeromon.analysis.lint_lightning import lint_lightning_config
from zeromon.cli import main
from zeromon.errors import ZeromonError
from zeromon.sources.accelerate_schema import accelerate_schema
from zeromon.sources.configs import load_config

from conftest import REPO, zeromon

ACC = REPO / "tests" / "data" / "lint" / "accelerate"
LIT = REPO / "tests" / "data" / "lint" / "lightning"
GiB = 2**30
FSDP_RULES = {f"ZL{n:03d}" for n in range(33, 48)}


def lint_file(path: Path, **options: Any) -> LintReport:
    loaded = load_config(path)
    if loaded.kind == "lightning":
        assert loaded.lightning is not None
        return lint_lightning_config(loaded.lightning, LintOptions(**options))
    assert loaded.kind == "accelerate-fsdp" and loaded.accelerate is not None
    return lint_accelerate_fsdp_config(loaded.accelerate, LintOptions(**options))


def triples(report: LintReport) -> set[tuple[str, str, str]]:
    return {(f.id, f.severity, f.key) for f in report.findings}


FC = "fsdp_config"
TS = "trainer.strategy.init_args"
# One fixture per pitfall: exactly these findings (id, severity, key path), nothing else.
CASES: list[tuple[Path, dict[str, Any], set[tuple[str, str, str]]]] = [
    (ACC / "fsdp_clean.yaml", {}, set()),
    (ACC / "fsdp2_clean.yaml", {}, set()),
    (ACC / "fsdp_no_shard.yaml", {}, {("ZL035", "warning", f"{FC}.fsdp_sharding_strategy")}),
    (ACC / "fsdp_shard_grad_op.yaml", {}, {("ZL036", "info", f"{FC}.fsdp_sharding_strategy")}),
    # written without the fsdp_ prefix, as the launcher also reads it: the finding names the key as written
    (ACC / "fsdp_hybrid_one_machine.yaml", {}, {("ZL037", "info", f"{FC}.sharding_strategy")}),
    (ACC / "fsdp_offload.yaml", {}, {("ZL038", "info", f"{FC}.fsdp_offload_params")}),
    (ACC / "fsdp_defaults.yaml", {}, {("ZL039", "warning", f"{FC}.fsdp_auto_wrap_policy"),
                                      ("ZL040", "info", f"{FC}.fsdp_state_dict_type")}),
    (ACC / "fsdp_ram_loading_no_sync.yaml", {}, {("ZL041", "error", f"{FC}.fsdp_sync_module_states")}),
    (ACC / "fsdp_checkpointing_no_wrap.yaml", {}, {("ZL039", "warning", f"{FC}.fsdp_auto_wrap_policy"),
                                                   ("ZL042", "warning", f"{FC}.fsdp_activation_checkpointing"),
                                                   ("ZL042", "info", f"{FC}.fsdp_activation_checkpointing")}),
    (ACC / "fsdp2_checkpointing_no_wrap.yaml", {}, {("ZL039", "warning", f"{FC}.fsdp_auto_wrap_policy"),
                                                    ("ZL042", "error", f"{FC}.fsdp_activation_checkpointing"),
                                                    ("ZL042", "info", f"{FC}.fsdp_activation_checkpointing")}),
    (ACC / "fsdp1_checkpointing_offload.yaml", {}, {("ZL042", "error", f"{FC}.fsdp_activation_checkpointing_offload")}),
    (ACC / "fsdp_orig_params_off.yaml", {}, {("ZL043", "warning", f"{FC}.fsdp_use_orig_params")}),
    (ACC / "fsdp2_fsdp1_keys.yaml", {}, {("ZL044", "warning", f"{FC}.fsdp_transformer_layer_cls_to_wrap"),
                                         ("ZL044", "info", f"{FC}.fsdp_backward_prefetch"),
                                         ("ZL044", "info", f"{FC}.fsdp_sharding_strategy"),
                                         ("ZL044", "info", f"{FC}.fsdp_use_orig_params")}),
    (ACC / "fsdp1_reshard_after_forward.yaml", {}, {("ZL045", "error", f"{FC}.fsdp_reshard_after_forward")}),
    (ACC / "fsdp2_sharding_strategy.yaml", {}, {("ZL045", "error", f"{FC}.fsdp_sharding_strategy")}),
    (ACC / "fsdp_multi_gpu.yaml", {}, {("ZL046", "warning", "distributed_type")}),
    (ACC / "fsdp_docs_example.yaml", {}, {("ZL033", "warning", f"{FC}.fsdp_backward_prefetch_policy")}),
    (ACC / "fsdp_typos.yaml", {}, {("ZL033", "error", "fsdp_sharding_strategy"), ("ZL033", "error", "num_process"),
                                   ("ZL033", "warning", f"{FC}.fsdp_offload_param"),
                                   ("ZL033", "warning", f"{FC}.mixed_precision")}),
    # A value refused leaves the settings that depend on it unjudged (no wrap-policy finding after a bad policy).
    (ACC / "fsdp_bad_values.yaml", {}, {("ZL034", "error", f"{FC}.{k}") for k in (
        "fsdp_auto_wrap_policy", "fsdp_backward_prefetch", "fsdp_offload_params", "fsdp_sharding_strategy",
        "fsdp_state_dict_type")}),
    (ACC / "fsdp2_bad_values.yaml", {}, {("ZL034", "error", f"{FC}.{k}") for k in (
        "fsdp_reshard_after_forward", "fsdp_state_dict_type", "fsdp_transformer_layer_cls_to_wrap")}),
    (ACC / "fsdp_bad_version.yaml", {}, {("ZL034", "error", "distributed_type"),
                                         ("ZL034", "error", f"{FC}.fsdp_version"),
                                         ("ZL034", "error", f"{FC}.fsdp_min_num_params")}),
    # 7B parameters on 8 x 80 GiB: NO_SHARD's 104 GiB cannot fit; FULL_SHARD fits where SHARD_GRAD_OP does
    # too; CPU offload where FULL_SHARD fits; 70B on 16 x 40 GiB fits only with offload.
    (ACC / "fsdp_size_7b.yaml", {"params": 7e9, "gpu_memory_bytes": 80 * GiB},
     {("ZL035", "warning", f"{FC}.fsdp_sharding_strategy"), ("ZL047", "error", f"{FC}.fsdp_sharding_strategy")}),
    (ACC / "fsdp_clean.yaml", {"params": 7e9, "gpu_memory_bytes": 80 * GiB},
     {("ZL047", "info", f"{FC}.fsdp_sharding_strategy")}),
    (ACC / "fsdp_offload.yaml", {"params": 7e9, "gpu_memory_bytes": 80 * GiB},
     {("ZL038", "info", f"{FC}.fsdp_offload_params"), ("ZL047", "warning", f"{FC}.fsdp_offload_params")}),
    (LIT / "clean.yaml", {"params": 70e9, "gpu_memory_bytes": 40 * GiB},
     {("ZL047", "error", f"{TS}.sharding_strategy")}),
    (LIT / "clean.yaml", {}, set()),
    (LIT / "fabric_clean.yaml", {}, set()),
    (LIT / "by_name.yaml", {}, {("ZL039", "warning", f"{TS}.auto_wrap_policy"),
                                ("ZL040", "info", f"{TS}.state_dict_type")}),
    (LIT / "no_shard.yaml", {}, {("ZL035", "warning", f"{TS}.sharding_strategy")}),
    (LIT / "cpu_offload.yaml", {}, {("ZL038", "info", f"{TS}.cpu_offload")}),
    (LIT / "hybrid_without_mesh.yaml", {}, {("ZL037", "error", f"{TS}.sharding_strategy"),
                                            ("ZL039", "warning", f"{TS}.auto_wrap_policy")}),
    (LIT / "device_mesh_mismatch.yaml", {}, {("ZL037", "error", f"{TS}.device_mesh")}),
    (LIT / "bad_values.yaml", {}, {("ZL034", "error", f"{TS}.{k}") for k in (
        "sharding_strategy", "state_dict_type", "cpu_offload")}),
    (LIT / "typos.yaml", {}, {("ZL033", "error", f"{TS}.{k}") for k in (
        "auto_wrap_polcy", "fsdp_offload_params", "device_id", "precision")}
     | {("ZL039", "warning", f"{TS}.auto_wrap_policy")}),
    (LIT / "checkpointing_both.yaml", {}, {("ZL042", "error", f"{TS}.activation_checkpointing"),
                                           ("ZL042", "info", f"{TS}.activation_checkpointing_policy")}),
    (LIT / "orig_params_off.yaml", {}, {("ZL043", "warning", "trainer.strategy.dict_kwargs.use_orig_params")}),
]


@pytest.mark.parametrize(("path", "options", "expected"), CASES,
                         ids=[f"{c[0].parent.name}/{c[0].stem}-{'-'.join(c[1]) or 'plain'}" for c in CASES])
def test_each_fsdp_pitfall_fixture_gives_exactly_its_findings(path: Path, options: dict[str, Any],
                                                              expected: set[tuple[str, str, str]]) -> None:
    report = lint_file(path, **options)
    assert triples(report) == expected
    assert report.has_errors == any(severity == "error" for _, severity, _ in expected)
    assert all(f.message and f.fix and f.file == ("lightning" if path.parent == LIT else "accelerate")
               for f in report.findings)


def test_every_fsdp_rule_has_a_fixture() -> None:
    covered = {rule for _, _, expected in CASES for rule, _, _ in expected}
    assert FSDP_RULES <= covered


# --- what the findings say ------------------------------------------------------------------------------


def _by_key(path: Path, **options: Any) -> dict[tuple[str, str], Any]:
    return {(f.id, f.key): f for f in lint_file(path, **options).findings}


def test_misspelt_keys_get_the_nearest_name_or_the_block_they_belong_in() -> None:
    acc = _by_key(ACC / "fsdp_typos.yaml")
    assert acc[("ZL033", "fsdp_config.fsdp_offload_param")].fix == "rename it to fsdp_offload_params"
    assert "no effect" in acc[("ZL033", "fsdp_config.fsdp_offload_param")].message
    assert acc[("ZL033", "num_process")].fix == "rename it to num_processes"
    assert "refuses a config file with unknown keys" in acc[("ZL033", "num_process")].message
    assert acc[("ZL033", "fsdp_sharding_strategy")].fix == "move it into fsdp_config as fsdp_sharding_strategy"
    assert acc[("ZL033", "fsdp_config.mixed_precision")].fix == "move mixed_precision to the top level"
    # accelerate's own usage guide writes fsdp_backward_prefetch_policy, a key its launcher does not read
    docs = _by_key(ACC / "fsdp_docs_example.yaml")
    assert docs[("ZL033", "fsdp_config.fsdp_backward_prefetch_policy")].fix == "rename it to fsdp_backward_prefetch"
    lit = {key.rsplit(".", 1)[1]: f.fix for (rule, key), f in _by_key(LIT / "typos.yaml").items() if rule == "ZL033"}
    assert lit == {"auto_wrap_polcy": "rename it to auto_wrap_policy", "fsdp_offload_params": "rename it to cpu_offload",
                   "device_id": "remove device_id", "precision": "move it to trainer.precision"}


def test_values_outside_the_choices_name_them_and_the_nearest() -> None:
    acc = _by_key(ACC / "fsdp_bad_values.yaml")
    strategy = acc[("ZL034", "fsdp_config.fsdp_sharding_strategy")]
    assert "'FULL_SHRAD'" in strategy.message and "HYBRID_SHARD_ZERO2 (or their numbers 1-5)" in strategy.message
    assert strategy.fix == "set fsdp_sharding_strategy to FULL_SHARD"
    assert acc[("ZL034", "fsdp_config.fsdp_state_dict_type")].fix == "set fsdp_state_dict_type to SHARDED_STATE_DICT"
    assert "str_to_bool" in acc[("ZL034", "fsdp_config.fsdp_offload_params")].message
    fsdp2 = _by_key(ACC / "fsdp2_bad_values.yaml")
    assert fsdp2[("ZL034", "fsdp_config.fsdp_reshard_after_forward")].fix.startswith(
        "set fsdp_reshard_after_forward: false (what accelerate to-fsdp2 makes of SHARD_GRAD_OP)")
    assert "FSDP2 does not support LOCAL_STATE_DICT" in fsdp2[("ZL034", "fsdp_config.fsdp_state_dict_type")].message
    assert "class named \"['GPT2Block'\"" in fsdp2[("ZL034", "fsdp_config.fsdp_transformer_layer_cls_to_wrap")].message
    lit = _by_key(LIT / "bad_values.yaml")
    assert lit[("ZL034", f"{TS}.state_dict_type")].fix == "set state_dict_type to sharded"


def test_fsdp1_reshard_after_forward_says_what_runs_instead() -> None:
    [finding] = lint_file(ACC / "fsdp1_reshard_after_forward.yaml").findings
    assert "asks for SHARD_GRAD_OP" in finding.message and "this run shards FULL_SHARD" in finding.message
    assert finding.fix == "write fsdp_sharding_strategy: SHARD_GRAD_OP and remove fsdp_reshard_after_forward"
    [fsdp2] = lint_file(ACC / "fsdp2_sharding_strategy.yaml").findings
    assert "fsdp_reshard_after_forward decides, true unless set" in fsdp2.message
    assert fsdp2.fix.startswith("write fsdp_reshard_after_forward: false")


def test_memory_findings_give_the_numbers_and_the_strategy_that_fits() -> None:
    [error] = [f for f in lint_file(ACC / "fsdp_size_7b.yaml", params=7e9, gpu_memory_bytes=80 * GiB).findings
               if f.id == "ZL047"]
    assert "NO_SHARD needs 104.31 GiB of model states per GPU, more than its 80.00 GiB" in error.message
    assert error.fix == "use fsdp_sharding_strategy: SHARD_GRAD_OP (24.45 GiB per GPU)"
    [big] = lint_file(LIT / "clean.yaml", params=70e9, gpu_memory_bytes=40 * GiB).findings
    assert big.fix.startswith("use sharding_strategy: FULL_SHARD and cpu_offload: true")
    state = _by_key(ACC / "fsdp_defaults.yaml", params=7e9)[("ZL040", "fsdp_config.fsdp_state_dict_type")]
    assert "not set (accelerate's default: FULL_STATE_DICT)" in state.message and "7B parameters" in state.message
    assert state.fix.startswith("fsdp_state_dict_type: SHARDED_STATE_DICT")


def test_hybrid_sharding_in_lightning_needs_a_mesh_the_size_of_the_world() -> None:
    [mesh] = lint_file(LIT / "device_mesh_mismatch.yaml").findings
    assert "holds 16 ranks, and the world size is 32 (trainer.devices x trainer.num_nodes)" in mesh.message
    assert mesh.fix.startswith("set device_mesh to [4, 8]")
    # a mesh of the right size, and hybrid on one machine
    data = load_config(LIT / "device_mesh_mismatch.yaml").lightning
    assert data is not None
    data["trainer"]["strategy"]["init_args"]["device_mesh"] = [4, 8]
    assert lint_lightning_config(data).findings == ()
    data["trainer"]["num_nodes"] = 1
    data["trainer"]["strategy"]["init_args"]["device_mesh"] = [1, 8]
    assert triples(lint_lightning_config(data)) == {("ZL037", "info", f"{TS}.sharding_strategy")}


# --- accelerate as the oracle ---------------------------------------------------------------------------


def _accelerate_launch(path: Path) -> tuple[str | None, Any]:
    """(why accelerate refused the file or None, the FullyShardedDataParallelPlugin its training processes
    build, or None when the launcher does not enable FSDP): its launcher's own code, then its plugin."""
    import torch
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    try:
        args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
        with contextlib.redirect_stderr(io.StringIO()):
            env = prepare_multi_gpu_env(_validate_launch_command(args)[0])
    except Exception as exc:
        return f"launch: {exc!r}", None
    if env.get("ACCELERATE_USE_FSDP") != "true":
        return None, None
    # sync_module_states asks for the current CUDA device; this machine may have none
    with mock.patch.dict(os.environ, env, clear=True), \
            mock.patch("accelerate.utils.dataclasses.is_cuda_available", return_value=True), \
            mock.patch.object(torch.cuda, "current_device", return_value=0):
        try:
            return None, FullyShardedDataParallelPlugin()
        except Exception as exc:
            return f"plugin: {exc!r}", None


def _refused_by_accelerate(report: LintReport) -> bool:
    """Whether lint says accelerate refuses the file before training: at launch or when the plugin is made
    (a wrong layer class name, or activation checkpointing without a policy, fail later, in prepare())."""
    return any(f.severity == "error" and (f.id in ("ZL033", "ZL034", "ZL041") or f.key.endswith("_offload"))
               and not f.key.endswith("transformer_layer_cls_to_wrap") for f in report.findings)


def _plugin_setup(plugin: Any) -> dict[str, Any]:
    policy = getattr(plugin.auto_wrap_policy, "__name__", None)
    return {
        "version": plugin.fsdp_version,
        "strategy": (plugin.sharding_strategy.name.lstrip("_") if plugin.fsdp_version == 1 else
                     "FULL_SHARD" if plugin.reshard_after_forward else "SHARD_GRAD_OP"),
        "offload": type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy" or
        getattr(plugin.cpu_offload, "offload_params", False) is True,
        "wrap": {None: "NO_WRAP", "transformer_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                 "size_based_auto_wrap_policy": "SIZE_BASED_WRAP"}[policy],
        "state_dict": plugin.state_dict_type.name,
        "activation_checkpointing": plugin.activation_checkpointing,
        "use_orig_params": plugin.use_orig_params,
    }


@pytest.fixture(scope="module")
def installed_accelerate() -> Any:
    return pytest.importorskip("accelerate", reason="accelerate is not installed: its own parser cannot be read")


@pytest.mark.accelerate
def test_lint_errors_and_setups_match_what_accelerate_does(installed_accelerate: Any) -> None:
    """Every accelerate FSDP fixture through accelerate's launcher and plugin: lint predicts exactly the files
    it refuses, and for the others the setup lint resolves is the one the plugin builds."""
    checked = 0
    for path in sorted(ACC.glob("fsdp*.yaml")):
        try:
            loaded = load_config(path)
        except ZeromonError:
            continue
        assert loaded.accelerate is not None
        report = lint_accelerate_fsdp_config(loaded.accelerate)
        refused, plugin = _accelerate_launch(path)
        assert _refused_by_accelerate(report) == (refused is not None), (path.name, refused, triples(report))
        if plugin is None:
            assert refused is not None or "ZL046" in {f.id for f in report.findings}, path.name
            continue
        setup = resolve_accelerate_fsdp(loaded.accelerate)
        assert _plugin_setup(plugin) == {
            "version": setup.version, "strategy": setup.strategy.value, "offload": setup.offload.value,
            "wrap": setup.wrap.value, "state_dict": setup.state_dict.value,
            "activation_checkpointing": setup.activation_checkpointing.value,
            "use_orig_params": setup.use_orig_params.value}, path.name
        checked += 1
    assert checked >= 12


@pytest.mark.accelerate
def test_static_accelerate_list_matches_the_installed_accelerate(installed_accelerate: Any) -> None:
    schema = accelerate_schema()
    assert schema is not None, "accelerate is installed but its FSDP lists could not be read"
    assert schema.origin == f"accelerate {installed_accelerate.__version__} (installed)"
    if installed_accelerate.__version__ != STATIC_ACCELERATE_VERSION:
        pytest.skip(f"accelerate {installed_accelerate.__version__} installed; the static list is "
                    f"{STATIC_ACCELERATE_VERSION}'s")
    assert dataclasses.replace(schema, origin=STATIC_ACCELERATE_FSDP.origin) == STATIC_ACCELERATE_FSDP


def test_lightnings_fsdp_keyword_arguments_are_torchs() -> None:
    """FullyShardedDataParallel.__init__'s parameters as the installed torch's source declares them (read, not
    imported: importing torch.distributed.fsdp costs seconds)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent / "distributed" / "fsdp" / "fully_sharded_data_parallel.py"
    tree = ast.parse(source.read_text())
    fsdp = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FullyShardedDataParallel")
    init = next(n for n in fsdp.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    accepted = {a.arg for a in [*init.args.args, *init.args.kwonlyargs]} - {"self"}
    assert accepted == FSDP_KWARGS | FSDP_ARGS_SET_BY_LIGHTNING


def test_the_static_lists_version_of_accelerate_is_not_imported() -> None:
    code = ("import sys; from zeromon.sources.accelerate_schema import installed_accelerate_schema as s; "
            "o = s().origin; print('accelerate' in sys.modules, 'torch' in sys.modules, o)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    try:
        import importlib.metadata

        version = importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        assert out.stdout.strip() == f"False False {STATIC_ACCELERATE_FSDP.origin}"
        return
    if version != STATIC_ACCELERATE_VERSION:
        pytest.skip(f"accelerate {version} installed: its lists are read from it")
    assert out.stdout.strip() == f"False False accelerate {version} (installed)"


# --- reading files and the CLI --------------------------------------------------------------------------


def test_the_deepspeed_path_of_accelerate_is_unchanged() -> None:
    """A file with a deepspeed_config block and distributed_type: DEEPSPEED is still read as before."""
    for name, kind in (("clean_zero3.yaml", "accelerate"), ("not_deepspeed.yaml", "accelerate"),
                       ("fsdp_clean.yaml", "accelerate-fsdp"), ("fsdp_multi_gpu.yaml", "accelerate-fsdp")):
        assert load_config(ACC / name).kind == kind, name
    assert load_config(LIT / "clean.yaml").kind == "lightning"


@pytest.mark.parametrize(("path", "expected"), [
    (ACC / "fsdp_not_a_mapping.yaml", "fsdp_not_a_mapping.yaml: fsdp_config is a string, expected a mapping"),
    (LIT / "ddp.yaml", "ddp.yaml: trainer.strategy is 'ddp': zeromon lint checks Lightning's FSDPStrategy"),
    (LIT / "no_strategy.yaml", "no_strategy.yaml: no trainer.strategy"),
    (LIT / "init_args_list.yaml", "trainer.strategy.init_args is a list, expected a mapping"),
])
def test_bad_fsdp_input_is_one_line_exit_2(path: Path, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"zeromon: error: {path}") and expected in err.splitlines()[0]
    assert "Traceback" not in err


def test_cli_accelerate_fsdp_text_exits_1_and_names_file_key_and_fix() -> None:
    proc = zeromon("lint", str(ACC / "fsdp1_reshard_after_forward.yaml"))
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"zeromon lint: {ACC / 'fsdp1_reshard_after_forward.yaml'} (accelerate config for "
                               "FSDP; FSDP1, FULL_SHARD; world size 2 from num_processes in the accelerate file; "
                               "keys checked against accelerate")
    assert "  ZL045 fsdp_config.fsdp_reshard_after_forward" in lines
    assert "      fix: write fsdp_sharding_strategy: SHARD_GRAD_OP and remove fsdp_reshard_after_forward" in lines
    assert lines[-1] == "1 finding: 1 error, 0 warnings, 0 info"


def test_cli_lightning_json_exits_0_with_warnings_and_the_setup() -> None:
    proc = zeromon("lint", str(LIT / "by_name.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "lightning" and doc["file"] == str(LIT / "by_name.yaml")
    assert [(f["id"], f["severity"], f["key"], f["file"]) for f in doc["findings"]] == [
        ("ZL039", "warning", f"{TS}.auto_wrap_policy", str(LIT / "by_name.yaml")),
        ("ZL040", "info", f"{TS}.state_dict_type", str(LIT / "by_name.yaml"))]
    assert doc["findings"][0]["fix"].startswith("set auto_wrap_policy to the class of your model's repeated block")
    assert doc["summary"] == {"errors": 0, "warnings": 1, "info": 1, "fsdp": "FSDP1, FULL_SHARD", "world_size": 4,
                              "world_size_from": "trainer.devices x trainer.num_nodes",
                              "keys_checked_against": doc["summary"]["keys_checked_against"]}
    assert "Lightning 2.6 documentation" in doc["summary"]["keys_checked_against"]


@pytest.mark.parametrize(("args", "code", "last"), [
    ([str(ACC / "fsdp_clean.yaml")], 0, "0 findings: 0 errors, 0 warnings, 0 info (clean)"),
    ([str(ACC / "fsdp2_clean.yaml")], 0, "0 findings: 0 errors, 0 warnings, 0 info (clean)"),
    ([str(LIT / "clean.yaml")], 0, "0 findings: 0 errors, 0 warnings, 0 info (clean)"),
    ([str(LIT / "fabric_clean.yaml")], 0, "0 findings: 0 errors, 0 warnings, 0 info (clean)"),
    ([str(ACC / "fsdp_size_7b.yaml"), "--params", "7B", "--gpu-memory", "80GiB"], 1,
     "2 findings: 1 error, 1 warning, 0 info"),
    ([str(LIT / "clean.yaml"), "--params", "7B", "--gpu-memory", "80GiB"], 0,
     "1 finding: 0 errors, 0 warnings, 1 info"),
])
def test_cli_exit_codes(args: list[str], code: int, last: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", *args]) == code
    out, err = capsys.readouterr()
    assert out.rstrip().splitlines()[-1] == last and err == ""


def test_cli_params_need_the_gpus_a_lightning_file_gives(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(LIT / "fabric_clean.yaml"), "--params", "7B"]) == 2
    assert "--params needs --gpu-memory too" in capsys.readouterr().err  # fabric.devices gave the GPUs
