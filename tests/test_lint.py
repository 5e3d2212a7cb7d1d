"""`zeromon lint`: one fixture per pitfall (tests/data/lint/), the pure rules, DeepSpeed as the oracle for
what it refuses, and the real CLI for output shape, exit codes and bad input."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from zeromon.analysis.lint import (
    RULES,
    STATIC_SCHEMA,
    LintOptions,
    LintReport,
    lint_deepspeed_config,
)
from zeromon.analysis.lint_accelerate import lint_accelerate_config
from zeromon.analysis.lint_accelerate_fsdp import lint_accelerate_fsdp_config
from zeromon.analysis.lint_schema import STATIC_SCHEMA_VERSION
from zeromon.errors import ZeromonError
from zeromon.sources.configs import deepspeed_schema, load_config

from conftest import REPO, zeromon

DATA = REPO / "tests" / "data" / "lint"
ACC = DATA / "accelerate"
GiB = 2**30


@pytest.fixture(scope="module")
def ds_schema() -> Any:
    schema = deepspeed_schema()
    if schema is None:
        pytest.skip("DeepSpeed is not importable: its own schema cannot be read")
    return schema


def lint_file(path: Path, **options: Any) -> LintReport:
    loaded = load_config(path)
    opts = LintOptions(**options)
    if loaded.kind == "accelerate-fsdp":  # tests/test_lint_fsdp.py has their cases
        assert loaded.accelerate is not None
        return lint_accelerate_fsdp_config(loaded.accelerate, opts)
    if loaded.kind == "deepspeed":
        assert loaded.deepspeed is not None
        return lint_deepspeed_config(loaded.deepspeed, opts, loaded.duplicate_keys)
    assert loaded.accelerate is not None
    return lint_accelerate_config(loaded.accelerate, loaded.deepspeed, opts, loaded.duplicate_keys,
                                  relative_file=loaded.relative_deepspeed_file)


def triples(report: LintReport) -> set[tuple[str, str, str]]:
    return {(f.id, f.severity, f.key) for f in report.findings}


# One fixture per pitfall: exactly these findings (id, severity, key path), nothing else.
CASES: list[tuple[str, dict[str, Any], set[tuple[str, str, str]]]] = [
    ("clean.json", {}, set()),
    ("zero3_no_gather.json", {},
     {("ZL001", "warning", "zero_optimization.stage3_gather_16bit_weights_on_model_save")}),
    ("batch_mismatch.json", {"world_size": 8, "world_size_from": "--gpus"},
     {("ZL002", "error", "train_batch_size")}),
    ("batch_mismatch.json", {"world_size": 4}, set()),  # 64 = 4 x 4 x 4
    ("batch_implied_world.json", {}, {("ZL003", "info", "train_batch_size")}),
    ("batch_no_world.json", {}, {("ZL003", "error", "train_batch_size")}),
    ("no_batch.json", {}, {("ZL004", "error", "train_micro_batch_size_per_gpu")}),
    ("no_batch.json", {"hf": True}, set()),  # the Trainer fills the batch sizes
    ("bad_batch_value.json", {}, {("ZL028", "error", "train_micro_batch_size_per_gpu")}),
    ("fp16_zero3.json", {}, {("ZL006", "warning", "fp16.enabled")}),
    ("fp16_bf16.json", {}, {("ZL007", "error", "bf16.enabled")}),
    ("overlap_off.json", {}, {("ZL008", "warning", "zero_optimization.overlap_comm")}),
    ("overlap_default.json", {}, {("ZL008", "warning", "zero_optimization.overlap_comm")}),
    ("offload_no_pin.json", {}, {("ZL009", "warning", "zero_optimization.offload_optimizer.pin_memory"),
                                 ("ZL009", "info", "zero_optimization.offload_param.pin_memory")}),
    ("nvme_no_path.json", {}, {("ZL010", "error", "zero_optimization.offload_optimizer.nvme_path")}),
    ("auto_values.json", {}, {("ZL011", "error", "train_batch_size"),
                              ("ZL011", "error", "train_micro_batch_size_per_gpu"),
                              ("ZL011", "error", "gradient_accumulation_steps"),
                              ("ZL011", "warning", "bf16.enabled"),
                              ("ZL011", "warning", "zero_optimization.reduce_bucket_size")}),
    ("auto_values.json", {"hf": True}, set()),
    ("typos.json", {}, {("ZL012", "error", "zero_optimization.stage3_max_live_paramters"),
                        ("ZL012", "warning", "zero_optimisation")}),
    ("misplaced.json", {}, {("ZL012", "warning", "overlap_comm"), ("ZL012", "error", "bf16.loss_scale"),
                            ("ZL012", "error", "zero_optimization.pin_memory")}),
    ("removed_deprecated.json", {}, {("ZL013", "error", "amp"),
                                     ("ZL014", "info", "zero_optimization.cpu_offload")}),
    ("stage_mismatch_options.json", {}, {("ZL016", "warning", "zero_optimization.offload_param"),
                                         ("ZL016", "info", "zero_optimization.stage3_max_live_parameters")}),
    ("buckets.json", {}, {("ZL017", "warning", "zero_optimization.reduce_bucket_size")}),
    ("buckets.json", {"gpu_memory_bytes": 16 * GiB},
     {("ZL017", "warning", "zero_optimization.reduce_bucket_size"),
      ("ZL017", "warning", "zero_optimization.allgather_bucket_size")}),
    ("live_params.json", {}, set()),
    ("live_params.json", {"gpu_memory_bytes": 16 * GiB},
     {("ZL018", "warning", "zero_optimization.stage3_max_live_parameters"),
      ("ZL018", "warning", "zero_optimization.stage3_prefetch_bucket_size")}),
    ("live_params.json", {"gpu_memory_bytes": 40 * GiB},
     {("ZL018", "warning", "zero_optimization.stage3_max_live_parameters")}),
    ("fp16_static.json", {}, {("ZL019", "info", "fp16.loss_scale"), ("ZL019", "info", "gradient_clipping")}),
    ("max_grad_norm.json", {}, {("ZL020", "warning", "optimizer.params.max_grad_norm")}),
    ("bad_stage.json", {}, {("ZL021", "error", "zero_optimization.stage")}),
    ("sum_zero3.json", {}, {("ZL022", "error", "gradient_allreduce_op")}),
    ("duplicate_key.json", {}, {("ZL023", "error", "zero_optimization.stage"),
                                ("ZL001", "warning", "zero_optimization.stage3_gather_16bit_weights_on_model_save")}),
    # NaN where DeepSpeed takes any float (gradient_clipping): not finite, and DeepSpeed computes with it; an
    # infinity where it wants an integer: also refused (ZL031), as DeepSpeedConfig does.
    ("non_finite.json", {}, {("ZL030", "error", "gradient_clipping"),
                             ("ZL030", "error", "zero_optimization.reduce_bucket_size"),
                             ("ZL031", "error", "zero_optimization.reduce_bucket_size"),
                             ("ZL030", "error", "zero_optimization.allgather_bucket_size"),
                             ("ZL031", "error", "zero_optimization.allgather_bucket_size")}),
    ("wrong_types.json", {}, {("ZL031", "error", "fp16"), ("ZL031", "error", "zero_optimization.offload_optimizer"),
                              ("ZL031", "error", "zero_optimization.offload_param.device"),
                              ("ZL031", "error", "zero_optimization.overlap_comm"),
                              ("ZL031", "error", "zero_optimization.reduce_bucket_size"),
                              ("ZL031", "error", "zero_optimization.stage3_max_live_parameters")}),
    # Combinations DeepSpeed's validators refuse; the same values where they are allowed pass.
    ("partial_offload_stage2.json", {}, {("ZL032", "error", "zero_optimization.offload_optimizer.ratio")}),
    ("grad_norm_stage3.json", {}, {("ZL032", "error", "zero_optimization.compute_grad_norm")}),
    ("dynamic_scale_bounds.json", {}, {("ZL032", "error", "fp16.loss_scale_window"),
                                       ("ZL032", "error", "fp16.min_loss_scale")}),
    ("static_scale_bounds.json", {}, {("ZL019", "info", "fp16.loss_scale")}),
    # DeepSpeed's other model sections (tests/test_lint_sections.py has the messages): their choices, text and
    # lists, their misspelt keys (refused), and a misspelt key under timers (which DeepSpeed reads key by key).
    ("section_choices.json", {}, {("ZL031", "error", k) for k in (
        "tensor_parallel.vocab_parallel_ce_backend", "tensor_parallel.dtype", "compile.passes", "comet.mode",
        "comms_logger.prof_ops", "wandb.project", "hybrid_engine")}),
    ("section_typos.json", {}, {("ZL012", "error", "tensorboard.enabeld"),
                                ("ZL012", "error", "tensor_parallel.tp.tp_sise"),
                                ("ZL012", "error", "compile.project")}),
    ("timers_typo.json", {}, {("ZL012", "warning", "timers.throughputt")}),
]


@pytest.mark.parametrize(("name", "options", "expected"), CASES,
                         ids=[f"{c[0]}-{'-'.join(f'{k}' for k in c[1]) or 'plain'}" for c in CASES])
def test_each_pitfall_fixture_gives_exactly_its_findings(name: str, options: dict[str, Any],
                                                         expected: set[tuple[str, str, str]]) -> None:
    report = lint_file(DATA / name, **options)
    assert triples(report) == expected
    assert report.has_errors == any(sev == "error" for _, sev, _ in expected)


def test_every_rule_has_a_fixture_and_every_finding_a_known_id() -> None:
    covered = {rule for _, _, expected in CASES for rule, _, _ in expected}
    accelerate_only = {"ZL005", "ZL024", "ZL025", "ZL026", "ZL027"}  # tested on the accelerate fixtures
    planner = {"ZL015"}
    inline = {"ZL029"}  # test_nvme_optimizer_offload_below_zero3_is_cpu_offload
    fsdp = {f"ZL{n:03d}" for n in range(33, 48)}  # tests/test_lint_fsdp.py
    assert set(RULES) == covered | accelerate_only | planner | inline | fsdp
    for path in [*DATA.glob("*.json"), *ACC.glob("*.yaml")]:
        try:
            report = lint_file(path, gpu_memory_bytes=16 * GiB, world_size=8, params=1e9)
        except ZeromonError:
            continue
        assert {f.id for f in report.findings} <= set(RULES)
        assert all(f.message and f.fix and f.key for f in report.findings)


def test_findings_come_errors_first() -> None:
    report = lint_file(DATA / "misplaced.json")
    assert [f.severity for f in report.findings] == ["error", "error", "warning"]


# --- details of single rules --------------------------------------------------------------------------


def test_typos_get_the_nearest_key_from_the_static_list_and_from_deepspeed(ds_schema: Any) -> None:
    for schema in (STATIC_SCHEMA, ds_schema):
        report = lint_file(DATA / "typos.json", schema=schema)
        by_key = {f.key: f for f in report.findings}
        assert "did you mean zero_optimization.stage3_max_live_parameters?" in \
            by_key["zero_optimization.stage3_max_live_paramters"].message
        assert by_key["zero_optimization.stage3_max_live_paramters"].fix == \
            "rename it to stage3_max_live_parameters"
        assert "did you mean zero_optimization?" in by_key["zero_optimisation"].message
        assert "silently ignores" in by_key["zero_optimisation"].message  # top level: ignored, not refused


def test_misplaced_keys_name_the_section_they_belong_in() -> None:
    by_key = {f.key: f for f in lint_file(DATA / "misplaced.json").findings}
    assert "belongs in zero_optimization.overlap_comm" in by_key["overlap_comm"].message
    assert "fp16.loss_scale" in by_key["bf16.loss_scale"].message  # bf16 has no loss scaling
    assert "offload_optimizer.pin_memory" in by_key["zero_optimization.pin_memory"].message


def test_batch_arithmetic_names_the_numbers_and_the_world_size_source() -> None:
    finding = lint_file(DATA / "batch_mismatch.json", world_size=8, world_size_from="--gpus").findings[0]
    assert "64 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 4 x world size 8 (--gpus) = 128" \
        in finding.message
    assert finding.fix == "set train_batch_size to 128, or gradient_accumulation_steps to 2"
    implied = lint_file(DATA / "batch_implied_world.json").findings[0]
    assert "runs only on 8 data-parallel ranks" in implied.message
    assert "no world size satisfies" in lint_file(DATA / "batch_no_world.json").findings[0].message


@pytest.mark.parametrize(("config", "world", "expected"), [
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 2, {"ZL002"}),  # 30 % (4 x 2)
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, set()),  # accumulation 4 derived
    ({"train_batch_size": 32, "gradient_accumulation_steps": 3}, 2, {"ZL002"}),
    ({"train_batch_size": 12}, 8, {"ZL002"}),  # micro batch 12 // 8 derived, then 8 x 1 x 8 != 12
    ({"train_batch_size": 16}, 8, set()),
    ({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5}, 7, set()),  # derived: consistent
    ({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4}, None, {"ZL003"}),  # 6 = world x accumulation
    ({"train_batch_size": "32", "train_micro_batch_size_per_gpu": 4}, None, {"ZL028"}),  # a string in JSON
])
def test_batch_rules_follow_deepspeeds_derivation(config: dict[str, Any], world: int | None,
                                                  expected: set[str]) -> None:
    config = {**config, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True}}
    report = lint_deepspeed_config(config, LintOptions(world_size=world, world_size_from="test"))
    assert {f.id for f in report.findings} == expected


@pytest.mark.parametrize(("config", "world", "message"), [
    # Without a world size: the product of what is given, and "= N" only where there is a product.
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, None,
     "train_batch_size 30 is not a multiple of train_micro_batch_size_per_gpu 4: no world size"),
    ({"train_batch_size": 30, "gradient_accumulation_steps": 4}, None,
     "train_batch_size 30 is not a multiple of gradient_accumulation_steps 4: no world size"),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, None,
     "train_batch_size 30 is not a multiple of train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 "
     "= 8: no world size"),
    ({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, None,
     "train_batch_size 24 = train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 3: "
     "this config runs only on 3 data-parallel ranks"),
    ({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4}, None,
     "train_batch_size 24 / train_micro_batch_size_per_gpu 4 = 6 = world size x gradient_accumulation_steps"),
    # With one: the divisor written out, and what DeepSpeed's integer division derives.
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 4,
     "train_batch_size 30 is not divisible by train_micro_batch_size_per_gpu 4 x world size 4 (test) = 16; "
     "DeepSpeed derives gradient_accumulation_steps by integer division (30 // 16 = 1)"),
    ({"train_batch_size": 30, "gradient_accumulation_steps": 4}, 4,
     "train_batch_size 30 is not divisible by gradient_accumulation_steps 4 x world size 4 (test) = 16; "
     "DeepSpeed derives train_micro_batch_size_per_gpu by integer division (30 // 16 = 1)"),
    ({"train_batch_size": 12}, 8,
     "train_batch_size 12 is not divisible by world size 8 (test); DeepSpeed derives "
     "train_micro_batch_size_per_gpu by integer division (12 // 8 = 1)"),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4,
     "train_batch_size 30 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 4 "
     "(test) = 32"),
])
def test_batch_messages_write_the_arithmetic_out(config: dict[str, Any], world: int | None, message: str) -> None:
    config = {**config, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True}}
    report = lint_deepspeed_config(config, LintOptions(world_size=world, world_size_from="test"))
    [finding] = report.findings
    assert finding.message.startswith(message), finding.message
    assert " = 4 = " not in finding.message and not any(f" {n} = {n}:" in finding.message for n in (4, 8, 16))


def test_every_bad_batch_value_is_reported_at_once() -> None:
    config = {"train_micro_batch_size_per_gpu": -4, "gradient_accumulation_steps": 0, "train_batch_size": "8",
              "zero_optimization": {"stage": 7}}
    assert triples(lint_deepspeed_config(config)) == {
        ("ZL021", "error", "zero_optimization.stage"),
        ("ZL028", "error", "train_batch_size"),
        ("ZL028", "error", "train_micro_batch_size_per_gpu"),
        ("ZL028", "error", "gradient_accumulation_steps"),
    }


NVME_OPTIMIZER = {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True}


@pytest.mark.parametrize("stage", [1, 2])
def test_nvme_optimizer_offload_below_zero3_is_cpu_offload(stage: int) -> None:
    config = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
              "zero_optimization": {"stage": stage, "overlap_comm": True, "offload_optimizer": NVME_OPTIMIZER}}
    report = lint_deepspeed_config(config)
    assert triples(report) == {("ZL029", "warning", "zero_optimization.offload_optimizer.device")}
    assert "CPU memory" in report.findings[0].message and "stage 3" in report.findings[0].fix
    # Without nvme_path: nothing swaps below ZeRO-3, so that is no error (ZL010) here; at stage 3 it is.
    no_path = {**config["zero_optimization"], "offload_optimizer": {"device": "nvme", "pin_memory": True}}
    assert {f.id for f in lint_deepspeed_config({**config, "zero_optimization": no_path}).findings} == {"ZL029"}
    stage3 = {**no_path, "stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
    assert {f.id for f in lint_deepspeed_config({**config, "zero_optimization": stage3}).findings} == {"ZL010"}
    cpu = {**config["zero_optimization"], "offload_optimizer": {**NVME_OPTIMIZER, "device": "cpu"}}
    assert lint_deepspeed_config({**config, "zero_optimization": cpu}).findings == ()


def test_nvme_optimizer_offload_below_zero3_in_an_accelerate_block() -> None:
    accelerate = {"distributed_type": "DEEPSPEED", "num_processes": 2, "mixed_precision": "bf16",
                  "deepspeed_config": {"zero_stage": 2, "offload_optimizer_device": "nvme",
                                       "gradient_accumulation_steps": 1}}
    ids = {(f.id, f.key, f.file) for f in lint_accelerate_config(accelerate, None).findings}
    assert ("ZL029", "deepspeed_config.offload_optimizer_device", "accelerate") in ids
    assert not any(rule == "ZL010" for rule, _, _ in ids)  # nvme_path 'none' is not read below ZeRO-3


def test_overlap_comm_message_gives_deepspeeds_default_for_the_stage(ds_schema: Any) -> None:
    finding = lint_file(DATA / "overlap_default.json", schema=ds_schema).findings[0]
    assert "DeepSpeed's default for stage 2 is false (true only for stage 3)" in finding.message
    assert ds_schema.overlap_comm_default == (False, False, False, True)
    stage3 = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}
    assert lint_deepspeed_config(stage3, LintOptions(schema=ds_schema)).findings == ()


def test_pin_memory_default_decides_the_severity() -> None:
    old = STATIC_SCHEMA.__class__(**{**{f: getattr(STATIC_SCHEMA, f) for f in STATIC_SCHEMA.__slots__},
                                     "pin_memory_default": False, "origin": "DeepSpeed 0.14 (test)"})
    by_key = {f.key: f for f in lint_file(DATA / "offload_no_pin.json", schema=old).findings}
    finding = by_key["zero_optimization.offload_param.pin_memory"]
    assert finding.severity == "warning" and "default false in DeepSpeed 0.14 (test)" in finding.message


def test_zero3_where_zero2_fits_uses_the_planner() -> None:
    pytest.importorskip("zeromon.analysis.planner", reason="the planner (zeromon/analysis/planner.py) is not there")
    small = lint_file(DATA / "zero3_small_model.json", params=1.3e9, world_size=8, gpu_memory_bytes=80 * GiB)
    assert triples(small) == {("ZL015", "warning", "zero_optimization.stage")}
    message = small.findings[0].message
    assert "ZeRO-3 where ZeRO-2 fits (even DDP fits)" in message and "1.3B parameters on 8 GPUs" in message
    # 70B on 8 x 80 GiB: ZeRO-2 needs 2 x 70e9 bytes for the parameters alone; ZeRO-3 is right.
    assert lint_file(DATA / "zero3_small_model.json", params=70e9, world_size=8,
                     gpu_memory_bytes=80 * GiB).findings == ()
    # Without all three inputs the rule cannot judge and stays silent.
    assert lint_file(DATA / "zero3_small_model.json", params=1.3e9, world_size=8).findings == ()
    # A ZeRO-2 plan inside the planner's 10% headroom is only worth an info.
    tight = lint_file(DATA / "zero3_small_model.json", params=21e9, world_size=8, gpu_memory_bytes=80 * GiB)
    assert [(f.id, f.severity) for f in tight.findings] == [("ZL015", "info")]


def test_zero3_where_zero2_fits_suggests_a_plan_command_that_runs() -> None:
    config = json.loads((DATA / "zero3_small_model.json").read_text())
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    report = lint_deepspeed_config(config, LintOptions(params=1.3e9, world_size=16, nodes=2,
                                                       gpu_memory_bytes=80 * GiB))
    fix = next(f.fix for f in report.findings if f.id == "ZL015")
    command = fix.split("`")[1]
    assert command.startswith("zeromon plan --params 1.3B --gpus-per-node 8 --nodes 2 --gpu-memory 80.00GiB")
    assert "--offload-optimizer cpu" in command and "--activations" not in command
    proc = zeromon(*shlex.split(command)[1:])
    assert proc.returncode == 0, proc.stderr
    assert "optimizer=cpu" in proc.stdout and "recommendation: " in proc.stdout


# --- accelerate -------------------------------------------------------------------------------------------


def test_seed_zero2_yaml_deepspeed_keys_are_ignored_by_accelerate() -> None:
    report = lint_file(ACC / "seed_zero2.yaml")
    assert report.world_size == 8 and "num_processes" in report.world_size_from
    ignored = {f.key for f in report.findings if f.id == "ZL024"}
    assert ignored == {"deepspeed_config.overlap_comm", "deepspeed_config.reduce_scatter",
                       "deepspeed_config.allgather_bucket_size", "deepspeed_config.reduce_bucket_size"}
    overlap = next(f for f in report.findings if f.id == "ZL008")
    assert overlap.file == "accelerate" and "deepspeed_config_file" in overlap.fix


def test_seed_zero3_yaml_points_to_accelerates_own_save_flag() -> None:
    report = lint_file(ACC / "seed_zero3.yaml")
    save = next(f for f in report.findings if f.id == "ZL001")
    assert save.key == "deepspeed_config.zero3_save_16bit_model"
    renamed = next(f for f in report.findings if f.key == "deepspeed_config.stage3_gather_16bit_weights_on_model_save")
    assert renamed.id == "ZL024" and renamed.fix == "use zero3_save_16bit_model: true"


def test_accelerate_with_deepspeed_file_conflicts() -> None:
    report = lint_file(ACC / "with_file_conflicts.yaml")
    assert triples(report) == {
        ("ZL002", "error", "train_batch_size"),  # 32 != 4 x 2 x 8 (num_processes)
        ("ZL005", "error", "deepspeed_config.gradient_accumulation_steps"),  # 8 here, 2 in the JSON
        ("ZL025", "error", "deepspeed_config.zero_stage"),
        ("ZL027", "info", "deepspeed_config.deepspeed_config_file"),
    }
    by_id = {f.id: f for f in report.findings}
    assert by_id["ZL002"].file == "deepspeed" and by_id["ZL005"].file == "accelerate"
    assert "mixed_precision" in by_id["ZL025"].message
    assert "(num_processes in the accelerate file)" in by_id["ZL002"].message


def test_accelerate_equal_accumulation_next_to_the_file_is_still_refused() -> None:
    accelerate = {"distributed_type": "DEEPSPEED", "num_processes": 4,
                  "deepspeed_config": {"deepspeed_config_file": "/abs/ds.json", "gradient_accumulation_steps": 2}}
    ds = json.loads((ACC / "ds_explicit.json").read_text())
    report = lint_accelerate_config(accelerate, ds)
    assert triples(report) == {("ZL025", "error", "deepspeed_config.gradient_accumulation_steps")}


def test_accelerate_inline_config_is_linted_as_accelerate_builds_it() -> None:
    report = lint_file(ACC / "inline_offload.yaml")
    assert triples(report) == {
        ("ZL010", "error", "deepspeed_config.offload_optimizer_nvme_path"),
        ("ZL006", "warning", "mixed_precision"),
        ("ZL019", "info", "deepspeed_config.gradient_clipping"),
        ("ZL009", "info", "zero_optimization.offload_optimizer.pin_memory"),
        ("ZL009", "info", "zero_optimization.offload_param.pin_memory"),
    }
    nvme = next(f for f in report.findings if f.id == "ZL010")
    assert "none/" in nvme.message and nvme.file == "accelerate"


def test_accelerate_clean_and_not_deepspeed() -> None:
    assert lint_file(ACC / "clean_zero3.yaml").findings == ()
    # "auto" is fine through accelerate; only the relative path is worth a note.
    assert triples(lint_file(ACC / "with_file_clean.yaml")) == {
        ("ZL027", "info", "deepspeed_config.deepspeed_config_file")}
    assert triples(lint_file(ACC / "not_deepspeed.yaml")) == {("ZL026", "warning", "distributed_type")}


# --- DeepSpeed as the oracle --------------------------------------------------------------------------

# Rules whose errors DeepSpeedConfig itself raises when it parses the config (ZL010 fails later, in the engine).
PARSE_TIME_ERRORS = {"ZL002", "ZL003", "ZL004", "ZL007", "ZL011", "ZL012", "ZL013", "ZL021", "ZL022", "ZL023",
                     "ZL028", "ZL031", "ZL032"}


@pytest.mark.deepspeed
def test_lint_errors_match_what_deepspeed_refuses(ds_schema: Any) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    checked = 0
    for path in sorted(DATA.glob("*.json")):
        try:
            report = lint_file(path, world_size=1, world_size_from="test", schema=ds_schema)
        except ZeromonError:
            continue  # malformed: not a config
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                DeepSpeedConfig(str(path))  # no process group: world size 1
            refused = False
        except Exception:
            refused = True
        predicted = any(f.severity == "error" and f.id in PARSE_TIME_ERRORS for f in report.findings)
        assert predicted == refused, (path.name, triples(report))
        checked += 1
    assert checked >= 25


@pytest.mark.deepspeed
def test_static_schema_matches_the_installed_deepspeed(ds_schema: Any) -> None:
    from deepspeed.runtime import config as ds_config

    from zeromon.sources.configs import _top_level_keys

    assert dict(ds_schema.sections) == {**STATIC_SCHEMA.sections, "": ds_schema.sections[""]}
    assert _top_level_keys(ds_config) <= STATIC_SCHEMA.sections[""]
    assert dict(ds_schema.removed) == dict(STATIC_SCHEMA.removed)  # DeepSpeed's own reasons, word for word
    assert ds_schema.deprecated.keys() == STATIC_SCHEMA.deprecated.keys()
    assert ds_schema.overlap_comm_default == STATIC_SCHEMA.overlap_comm_default
    assert ds_schema.pin_memory_default == STATIC_SCHEMA.pin_memory_default


# --- reading files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "expected"), [
    (DATA / "malformed.json", "malformed.json:3:36: Expecting property name enclosed in double quotes"),
    (ACC / "malformed.yaml", "malformed.yaml:4:24: mapping values are not allowed here"),
    (ACC / "bad_json_target.yaml", "malformed.json:3:36:"),
    (DATA / "list_top.json", "the top level is a list, expected a JSON object"),
    (DATA / "does_not_exist.json", "does_not_exist.json: no such config file"),
    (DATA, "is a directory"),
    (ACC / "no_block.yaml", "no deepspeed_config or fsdp_config block (distributed_type: MULTI_GPU)"),
    (ACC / "missing_file.yaml", "deepspeed_config_file 'does_not_exist.json': no such file"),
    # '~name' of a user this machine does not know stays as written, as a shell leaves it
    (ACC / "unknown_home.yaml", "deepspeed_config_file '~nosuchuser0/ds.json': no such file"),
])
def test_bad_input_is_one_precise_error(path: Path, expected: str) -> None:
    with pytest.raises(ZeromonError) as info:
        load_config(path)
    assert expected in info.value.message and "\n" not in info.value.message


def test_relative_deepspeed_file_is_read_from_the_yaml_folder(tmp_path: Path) -> None:
    loaded = load_config(ACC / "with_file_clean.yaml")
    assert loaded.deepspeed_path == ACC / "ds_for_accelerate.json" and loaded.relative_deepspeed_file
    assert loaded.deepspeed is not None and loaded.deepspeed["zero_optimization"]["stage"] == 3
    # A file without a suffix is sniffed: '{' starts JSON.
    plain = tmp_path / "ds_config"
    plain.write_text('{"train_micro_batch_size_per_gpu": 1}')
    assert load_config(plain).kind == "deepspeed"


# --- the real CLI ---------------------------------------------------------------------------------------


def test_cli_clean_config_exits_0() -> None:
    proc = zeromon("lint", str(DATA / "clean.json"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("0 findings: 0 errors, 0 warnings, 0 info (clean)")
    assert "ZeRO stage 2" in proc.stdout


def test_cli_text_groups_by_severity_and_exits_1_on_errors() -> None:
    proc = zeromon("lint", str(DATA / "misplaced.json"))
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert out.index("errors:") < out.index("  ZL012 bf16.loss_scale") < out.index("warnings:") \
        < out.index("  ZL012 overlap_comm")
    assert "fix: move it to zero_optimization.overlap_comm" in out
    assert out.rstrip().endswith("3 findings: 2 errors, 1 warning, 0 info")


def test_cli_json_shape_and_clean_stdout() -> None:
    proc = zeromon("lint", str(ACC / "with_file_conflicts.yaml"), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)  # nothing but the JSON on stdout (DeepSpeed's import chatter goes to stderr)
    assert doc["file"] == str(ACC / "with_file_conflicts.yaml") and doc["kind"] == "accelerate"
    assert doc["deepspeed_file"] == str(ACC / "ds_explicit.json")
    for finding in doc["findings"]:
        assert set(finding) == {"id", "severity", "key", "message", "fix", "file"}
    files = {f["id"]: f["file"] for f in doc["findings"]}
    assert files["ZL002"].endswith("ds_explicit.json") and files["ZL005"].endswith("with_file_conflicts.yaml")
    summary = doc["summary"]
    assert (summary["errors"], summary["warnings"], summary["info"]) == (3, 0, 1)
    assert summary["world_size"] == 8 and summary["zero_stage"] == 2


def test_cli_flags_feed_the_planner_and_the_batch_check() -> None:
    proc = zeromon("lint", str(DATA / "zero3_small_model.json"), "--params", "1.3B", "--gpus", "8",
                   "--gpu-memory", "80GiB", "--json")
    assert proc.returncode == 0, proc.stderr
    ids = [f["id"] for f in json.loads(proc.stdout)["findings"]]
    if (REPO / "zeromon" / "analysis" / "planner.py").exists():
        assert ids == ["ZL015"]
    proc = zeromon("lint", str(DATA / "batch_mismatch.json"), "--world-size", "8", "--gpus", "16")
    assert proc.returncode == 1 and "world size 8 (--world-size)" in proc.stdout


def test_cli_params_without_gpus_or_memory_is_refused_not_ignored() -> None:
    proc = zeromon("lint", str(DATA / "zero3_small_model.json"), "--params", "1.3B")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "zeromon: error: --params needs --gpus and --gpu-memory too" in proc.stderr
    proc = zeromon("lint", str(DATA / "zero3_small_model.json"), "--params", "1.3B", "--gpus", "8")
    assert proc.returncode == 2 and "zeromon: error: --params needs --gpu-memory too" in proc.stderr
    # An accelerate file's num_processes gives the GPUs.
    proc = zeromon("lint", str(ACC / "seed_zero3.yaml"), "--params", "1.3B", "--gpu-memory", "80GiB", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    assert "ZL015" in {f["id"] for f in json.loads(proc.stdout)["findings"]}


def test_installed_deepspeed_of_the_static_lists_version_is_not_imported() -> None:
    code = ("import logging, sys; from zeromon.sources.configs import installed_schema; s = installed_schema(); "
            "print('deepspeed' in sys.modules, 'torch' in sys.modules, s.origin)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    try:
        version = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        assert out.stdout.split("\n")[0] == f"False False {STATIC_SCHEMA.origin}"
        return
    if version != STATIC_SCHEMA_VERSION:
        pytest.skip(f"DeepSpeed {version} installed: its schema is read from its classes")
    assert out.stdout.strip() == f"False False DeepSpeed {version} (installed)"
    assert out.stderr == ""


@pytest.mark.deepspeed
def test_reading_deepspeeds_schema_keeps_its_import_chatter_quiet(ds_schema: Any) -> None:
    code = ("import logging; from zeromon.sources.configs import deepspeed_schema; s = deepspeed_schema(); "
            "print(s is not None, logging.root.manager.disable)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["True", "0"]  # read, and logging is enabled again afterwards
    assert "[WARNING]" not in out.stderr and "Setting accelerator" not in out.stderr, out.stderr


def test_cli_stderr_is_empty_for_a_clean_lint() -> None:
    proc = zeromon("lint", str(DATA / "clean.json"))
    assert proc.returncode == 0 and proc.stderr == ""


@pytest.mark.parametrize(("args", "expected"), [
    (["tests/data/lint/malformed.json"], "zeromon: error: tests/data/lint/malformed.json:3:36: "),
    (["tests/data/lint/accelerate/malformed.yaml"], "zeromon: error: tests/data/lint/accelerate/malformed.yaml:4:24: "),
    (["tests/data/lint/nope.json"], "zeromon: error: tests/data/lint/nope.json: no such config file"),
    (["tests/data/lint"], "zeromon: error: tests/data/lint: is a directory"),
    (["tests/data/lint/list_top.json"], "the top level is a list"),
    (["tests/data/lint/accelerate/no_block.yaml"], "no deepspeed_config or fsdp_config block"),
    (["tests/data/lint/clean.json", "--gpus", "0"], "zeromon: error: --gpus '0': must be an integer from 1 to"),
    (["tests/data/lint/clean.json", "--gpu-memory", "lots"], "zeromon: error: --gpu-memory 'lots': is not a size"),
    (["tests/data/lint/clean.json", "--params", "many"], "zeromon: error: --params 'many': is not a parameter count"),
    (["tests/data/lint/clean.json", "--params", "-7e9"], "zeromon: error: --params '-7e9': must be at least 1"),
    (["tests/data/lint/clean.json", "--gpu-memory", "-80GiB"],
     "zeromon: error: --gpu-memory '-80GiB': must be more than 0 bytes"),
    (["tests/data/lint/clean.json", "--gpus", "-8"], "zeromon: error: --gpus '-8': must be an integer from 1 to"),
    (["tests/data/lint/clean.json", "--gpus", "1e400"], "zeromon: error: --gpus '1e400': must be an integer from 1 to"),
    (["tests/data/lint/clean.json", "--bogus"], "hint: see `zeromon lint --help`"),
])
def test_cli_bad_input_exits_2_with_one_line(args: list[str], expected: str) -> None:
    proc = zeromon("lint", *args)
    assert proc.returncode == 2
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
