"""The ZeRO memory planner: the paper's numbers, DeepSpeed's estimators to the byte, the recommendation,
and `zeromon plan` as a user runs it."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from types import ModuleType

import pytest

from zeromon.analysis.planner import (
    ActivationShape,
    PlanInputError,
    PlanInputs,
    activation_bytes,
    parse_param_count,
    plan,
    smallest_fitting_stage,
)

from conftest import REPO, zeromon

TINY_MODEL = REPO / "tests" / "data" / "tiny_model.py"
GIB = 2**30


def load_tiny_model() -> ModuleType:
    spec = importlib.util.spec_from_file_location("zeromon_test_tiny_model", TINY_MODEL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def by_stage(inputs: PlanInputs) -> dict[int, object]:
    return {sp.stage: sp for sp in plan(inputs).stages}


# ---------------------------------------------------------------------------------------------
# zero-paper convention


def test_zero_paper_reproduces_figure_1_of_the_zero_paper() -> None:
    # Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
    # (arXiv:1910.02054), Figure 1: Ψ = 7.5B, N_d = 64, K = 12 -> 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    # By hand: 16Ψ = 120e9; 4Ψ + 12Ψ/64 = 30e9 + 1.40625e9; 2Ψ + 14Ψ/64 = 15e9 + 1.640625e9; 16Ψ/64 = 1.875e9.
    stages = by_stage(PlanInputs(params=7.5e9, gpus_per_node=8, nodes=8))
    assert [stages[s].gpu_bytes for s in range(4)] == [120_000_000_000, 31_406_250_000, 16_640_625_000,
                                                       1_875_000_000]
    assert [round(stages[s].gpu_bytes / 1e9, 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]
    two = stages[2]
    assert (two.params_bytes, two.grads_bytes, two.optimizer_bytes) == (15_000_000_000, 234_375_000, 1_406_250_000)
    assert all(sp.fits is None for sp in stages.values())  # no capacity given


@pytest.mark.parametrize("dtype, optimizer, momentum, per_param", [
    ("bf16", "adam", False, 16),  # 2 + 2 + (4 master + 4 m + 4 v)
    ("fp16", "adam", False, 16),
    ("fp32", "adam", False, 16),  # 4 + 4 + (4 m + 4 v): no separate master copy
    ("bf16", "sgd", False, 8),  # 2 + 2 + 4 master
    ("bf16", "sgd", True, 12),  # ... + 4 momentum
    ("fp32", "sgd", False, 8),  # 4 + 4, no state
    ("fp32", "sgd", True, 12),
])
def test_bytes_per_parameter_by_dtype_and_optimizer(dtype: str, optimizer: str, momentum: bool,
                                                    per_param: int) -> None:
    stages = by_stage(PlanInputs(params=1000, gpus_per_node=4, dtype=dtype, optimizer=optimizer,
                                 sgd_momentum=momentum))
    assert stages[0].gpu_bytes == per_param * 1000
    assert stages[3].gpu_bytes == per_param * 250
    p = 4 if dtype == "fp32" else 2
    assert stages[2].params_bytes == p * 1000 and stages[2].grads_bytes == p * 250
    assert stages[1].optimizer_bytes == (per_param - 2 * p) * 250


def test_partitions_are_padded_to_whole_parameters() -> None:
    stages = by_stage(PlanInputs(params=10, gpus_per_node=3))  # ⌈10/3⌉ = 4 parameters per rank
    assert stages[3].gpu_bytes == 16 * 4
    assert stages[1].optimizer_bytes == 12 * 4


def test_offload_moves_state_to_the_host_and_nvme() -> None:
    psi, gpn = 7_500_000_000, 8
    shard = psi // 64
    cpu = by_stage(PlanInputs(params=psi, gpus_per_node=gpn, nodes=8, offload_optimizer="cpu"))
    # ZeRO-Offload: GPU keeps the 16-bit parameters; the host the optimizer state and gradient partition.
    assert (cpu[2].params_bytes, cpu[2].grads_bytes, cpu[2].optimizer_bytes) == (2 * psi, 0, 0)
    assert cpu[2].cpu_bytes == max(4 * psi, 14 * shard) * gpn  # the fp32 construction copy dominates here
    assert cpu[1].grads_bytes == 2 * psi  # stage 1 does not shard gradients
    assert cpu[0].offload == "none" and cpu[0].gpu_bytes == 16 * psi  # DDP cannot offload
    both = by_stage(PlanInputs(params=psi, gpus_per_node=gpn, nodes=8, offload_optimizer="nvme",
                               offload_params="nvme", stages=(3,)))
    assert both[3].gpu_bytes == 0 and both[3].offload == "optimizer=nvme,params=nvme"
    assert both[3].nvme_bytes == 16 * shard * gpn and both[3].cpu_bytes == 0  # zero.Init: no full copy
    no_init = by_stage(PlanInputs(params=psi, gpus_per_node=gpn, nodes=8, zero_init=False, stages=(3,)))
    assert no_init[3].cpu_bytes == 4 * psi * gpn


def test_nvme_optimizer_offload_below_zero3_is_modeled_as_deepspeed_runs_it() -> None:
    # DeepSpeed's ZeRO-1/2 optimizer offloads to CPU for any device but none (stage_1_and_2.py cpu_offload).
    psi, gpn = 70_000_000_000, 8
    result = plan(PlanInputs(params=psi, gpus_per_node=gpn, nodes=2, gpu_memory_bytes=80 * GIB,
                             offload_optimizer="nvme"))
    stages = {sp.stage: sp for sp in result.stages}
    cpu = by_stage(PlanInputs(params=psi, gpus_per_node=gpn, nodes=2, offload_optimizer="cpu"))
    for stage in (1, 2):
        assert stages[stage].offload == "optimizer=cpu" and stages[stage].nvme_bytes == 0
        assert (stages[stage].gpu_bytes, stages[stage].cpu_bytes) == (cpu[stage].gpu_bytes, cpu[stage].cpu_bytes)
    assert stages[3].offload == "optimizer=nvme" and stages[3].nvme_bytes > 0  # ZeRO-Infinity
    assert any("DeepSpeed keeps it in CPU memory" in note and "NVMe needs ZeRO-3" in note for note in result.notes)


def test_zero3_adds_the_gathered_largest_layer_when_known() -> None:
    without = by_stage(PlanInputs(params=8e9, gpus_per_node=8, stages=(3,)))[3]
    with_layer = by_stage(PlanInputs(params=8e9, gpus_per_node=8, stages=(3,), largest_layer_params=5e8))[3]
    assert with_layer.gpu_bytes - without.gpu_bytes == 4 * 500_000_000  # 16-bit layer + its full gradient


def test_activations_follow_korthikanti() -> None:
    # GPT-3 175B shapes: s = 2048, b = 1, h = 12288, a = 96, 96 layers. 5·a·s/h = 80, so a layer holds
    # (34 + 80)·s·b·h = 114 · 25,165,824 = 2,868,903,936 bytes; 96 layers 275,414,777,856 bytes.
    shape = ActivationShape(seq_len=2048, micro_batch=1, hidden=12288, layers=96, heads=96)
    assert activation_bytes(shape) == 275_414_777_856
    # fp32: the 2-byte tensors double, the 1-byte dropout masks do not: 66 + 9·a·s/h = 66 + 144 = 210 per sbh.
    assert activation_bytes(shape, "fp32") == 210 * 2048 * 12288 * 96
    stages = by_stage(PlanInputs(params=1e9, gpus_per_node=8, activations=(2048, 1, 12288, 96, 96)))
    assert all(sp.activations_bytes == 275_414_777_856 for sp in stages.values())
    assert stages[3].gpu_bytes == 16 * 1_000_000_000 // 8 + 275_414_777_856


# ---------------------------------------------------------------------------------------------
# deepspeed convention: DeepSpeed's own functions are the oracle


def test_deepspeed_convention_matches_deepspeeds_estimators_exactly() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as zero3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as zero2

    checked = 0
    sizes = [1, 7, 999, 123_456_789, 1_300_000_000, 7e9, 70_000_000_001, 175e9, 1_000_000_000_007]
    for params in sizes:
        for largest in sorted({1, int(params) // 3 + 1, int(params)}):
            for gpus_per_node, nodes in itertools.product((1, 2, 3, 8, 16), (1, 2, 3, 7, 64)):
                for cpu_offload, cpu_offload_params, zero_init in itertools.product((True, False), repeat=3):
                    result = plan(PlanInputs(
                        params=params, gpus_per_node=gpus_per_node, nodes=nodes, largest_layer_params=largest,
                        offload_optimizer="cpu" if cpu_offload else "none",
                        offload_params="cpu" if cpu_offload_params else "none", zero_init=zero_init,
                        convention="deepspeed", stages=(2, 3)))
                    two, three = result.stages
                    assert (two.cpu_bytes, two.gpu_bytes) == zero2(
                        params, gpus_per_node, nodes, cpu_offload=cpu_offload), (params, gpus_per_node, nodes)
                    cpu_mem, gpu_mem, _ = zero3(params, largest, gpus_per_node, nodes, cpu_offload=cpu_offload,
                                                cpu_offload_params=cpu_offload_params, zero_init=zero_init)
                    assert (three.cpu_bytes, three.gpu_bytes) == (cpu_mem, gpu_mem), (
                        params, largest, gpus_per_node, nodes, cpu_offload, cpu_offload_params, zero_init)
                    for sp in result.stages:  # our split adds up to DeepSpeed's total
                        assert sp.params_bytes + sp.grads_bytes + sp.optimizer_bytes == sp.gpu_bytes
                        assert min(sp.params_bytes, sp.grads_bytes, sp.optimizer_bytes) >= 0
                    checked += 1
    assert checked == (8 * 3 + 1) * 25 * 8  # a 1-parameter model has one possible largest layer


def test_deepspeed_columns_split_the_totals_by_one_rule() -> None:
    # params: the 16-bit parameters; optimizer: 12 B per parameter of the partition (fp32 master + m + v);
    # grads: the rest of DeepSpeed's total: 6P/N at stage 2, 4P/N + 2L at stage 3, whose total is 2P/N less.
    psi, n, layer = 7_000_000_000, 16, 100_000_000
    stages = by_stage(PlanInputs(params=psi, gpus_per_node=8, nodes=2, largest_layer_params=layer,
                                 convention="deepspeed"))
    assert [stages[s].params_bytes for s in range(4)] == [2 * psi] * 3 + [2 * layer + 2 * psi // n]
    assert [stages[s].optimizer_bytes for s in range(4)] == [12 * psi] + [12 * psi // n] * 3
    assert [stages[s].grads_bytes for s in range(4)] == [6 * psi, 2 * psi + 4 * psi // n, 6 * psi // n,
                                                         2 * layer + 4 * psi // n]
    offloaded = by_stage(PlanInputs(params=psi, gpus_per_node=8, nodes=2, largest_layer_params=layer,
                                    convention="deepspeed", offload_optimizer="cpu"))
    assert all(offloaded[s].optimizer_bytes == 0 for s in (1, 2, 3))
    assert (offloaded[3].params_bytes, offloaded[3].grads_bytes) == (2 * layer + 2 * psi // n, 2 * layer)
    # Where the partitions do not divide evenly the rule still holds; the rounding lands in grads.
    for psi, gpus in itertools.product((7, 999, 123_456_789), (3, 7)):
        uneven = by_stage(PlanInputs(params=psi, gpus_per_node=gpus, convention="deepspeed"))
        assert all(uneven[s].optimizer_bytes == int(12 * psi / gpus) for s in (1, 2, 3)), (psi, gpus)


def test_deepspeed_convention_differs_from_the_paper_as_documented() -> None:
    psi = 7_000_000_000
    paper = by_stage(PlanInputs(params=psi, gpus_per_node=8, stages=(2,)))[2]
    deepspeed = by_stage(PlanInputs(params=psi, gpus_per_node=8, stages=(2,), convention="deepspeed"))[2]
    assert paper.gpu_bytes == 2 * psi + 14 * psi // 8
    assert deepspeed.gpu_bytes == 2 * psi + 18 * psi // 8  # + a 4-byte fp32 gradient partition
    assert deepspeed.cpu_bytes == int(psi * 4 * 8 * 1.5)  # every rank loads the fp32 model, × 1.5


def test_deepspeed_convention_refuses_what_its_estimators_do_not_model() -> None:
    for field_name, kwargs in (("dtype", {"dtype": "fp32"}), ("optimizer", {"optimizer": "sgd"}),
                               ("offload_optimizer", {"offload_optimizer": "nvme"})):
        with pytest.raises(PlanInputError) as info:
            PlanInputs(params=1e9, gpus_per_node=8, convention="deepspeed", **kwargs)
        assert info.value.field == field_name
    alone = plan(PlanInputs(params=1e9, gpus_per_node=8, convention="deepspeed", offload_params="cpu",
                            stages=(3,)))
    assert alone.stages[0].offload == "none"  # DeepSpeed ignores parameter offload without optimizer offload
    assert any("ignores parameter offload" in n for n in alone.notes)


# ---------------------------------------------------------------------------------------------
# recommendation


def recommend(**kwargs: object) -> tuple[int, str, str, str]:
    rec = plan(PlanInputs(**kwargs)).recommendation  # type: ignore[arg-type]
    return rec.stage, rec.offload_optimizer, rec.offload_params, rec.reason


def test_recommends_ddp_when_it_fits() -> None:
    stage, opt, params, reason = recommend(params=125e6, gpus_per_node=1, gpu_memory_bytes=80 * GIB)
    assert (stage, opt, params) == (0, "none", "none") and "no ZeRO needed" in reason


def test_recommendation_keeps_headroom() -> None:
    # ZeRO-1 needs 31.4 GB = 29.25 GiB: under 32 GiB, but over 90% of it, so ZeRO-2 (15.5 GiB).
    result = plan(PlanInputs(params=7.5e9, gpus_per_node=8, nodes=8, gpu_memory_bytes=32 * GIB))
    assert {sp.stage: sp.fits for sp in result.stages} == {0: False, 1: True, 2: True, 3: True}
    assert smallest_fitting_stage(result) == 1
    assert (result.recommendation.stage, result.recommendation.offload_optimizer) == (2, "none")
    assert "ZeRO-1 needs 29.25 GiB" in result.recommendation.reason


def test_recommends_offload_only_when_no_stage_fits() -> None:
    # 13B on one 80 GiB GPU: 208 GB of model states at any stage; ZeRO-Offload keeps 26 GB on the GPU.
    stage, opt, params, reason = recommend(params=13e9, gpus_per_node=1, gpu_memory_bytes=80 * GIB)
    assert (stage, opt, params) == (2, "cpu", "none")
    assert "host memory per node" in reason and "slower" in reason
    # 70B on 8 x 80 GiB: ZeRO-3 needs 140 GB; ZeRO-2 + offload still holds 140 GB of bf16 parameters.
    assert recommend(params=70e9, gpus_per_node=8, gpu_memory_bytes=80 * GIB)[:3] == (3, "cpu", "none")


def test_recommendation_when_tight_or_nothing_fits() -> None:
    # Activations 30.6e9 bytes. ZeRO-2 + offload keeps 4e9 of bf16 parameters: 34.6e9 > 32 GiB = 34.4e9.
    # With parameters offloaded too and a 100M-parameter layer gathered, 31.0e9: fits, but not with 10% headroom.
    stage, opt, params, reason = recommend(params=2e9, gpus_per_node=1, gpu_memory_bytes=32 * GIB,
                                           largest_layer_params=1e8, activations=(2048, 1, 4096, 32, 32))
    assert (stage, opt, params) == (3, "cpu", "cpu") and "tightly" in reason
    stage, _, _, reason = recommend(params=7e9, gpus_per_node=8, gpu_memory_bytes=80 * GIB,
                                    activations=(32768, 8, 4096, 32, 32))
    assert stage == 3 and reason.startswith("nothing fits") and "activations alone" in reason


def test_zero2_is_recommended_over_zero1_with_or_without_capacity() -> None:
    # docs/plan-and-lint.md's example, the paper's Figure 1: ZeRO-1 (29.25 GiB) and ZeRO-2 (15.50 GiB) both fit 80 GiB.
    # ZeRO-2 is the default (the paper, §7: ZeRO-1's volume, never more memory), as without --gpu-memory; the reason names ZeRO-1 and when to prefer it.
    with_capacity = plan(PlanInputs(params=7.5e9, gpus_per_node=8, nodes=8, gpu_memory_bytes=80 * GIB))
    without = plan(PlanInputs(params=7.5e9, gpus_per_node=8, nodes=8))
    assert with_capacity.recommendation.stage == without.recommendation.stage == 2
    reason = with_capacity.recommendation.reason
    assert reason.startswith("ZeRO-2 is the first choice") and "(DDP needs 111.76 GiB)" in reason
    assert "ZeRO-1 fits too (29.25 GiB)" in reason and "gradient accumulation" in reason
    assert "leaves more room" not in reason  # the old text that argued against its own choice
    # A small model still gets DDP when it fits, and ZeRO-1 is never the recommendation.
    assert recommend(params=1e9, gpus_per_node=8, gpu_memory_bytes=80 * GIB)[0] == 0
    for params in (1e9, 3e9, 7e9, 13e9, 30e9, 70e9):
        assert recommend(params=params, gpus_per_node=8, gpu_memory_bytes=80 * GIB)[0] != 1


def test_the_recommendation_names_what_the_table_does_not_show() -> None:
    # 13B on 8 x 40 GiB with NVMe offload asked for: the table shows offload rows (ZeRO-2 optimizer=cpu
    # 24.21 GiB), but ZeRO-3 without offload fits (16Ψ/8 = 24.21 GiB too), and the ladder weighs every
    # stage without offload first. The reason quotes those plans as such and says they are not rows.
    result = plan(PlanInputs(params=13e9, gpus_per_node=8, gpu_memory_bytes=40 * GIB, offload_optimizer="nvme"))
    assert [sp.offload for sp in result.stages] == ["none", "optimizer=cpu", "optimizer=cpu", "optimizer=nvme"]
    rec = result.recommendation
    assert (rec.stage, rec.offload_optimizer, rec.offload_params) == (3, "none", "none")
    assert rec.reason.startswith("ZeRO-3 without offload is the first choice")
    assert "(DDP needs 193.72 GiB; ZeRO-1 without offload needs 66.59 GiB; ZeRO-2 without offload needs " \
           "45.40 GiB)" in rec.reason
    assert rec.reason.endswith("ZeRO-1, ZeRO-2 and ZeRO-3 without offload are not in the table above, which shows "
                               "the offload asked for (optimizer=nvme): the recommendation weighs every stage without "
                               "offload before any offload.")
    # The DDP figure is the table's own row.
    assert result.stages[0].offload == "none" and result.stages[0].gpu_bytes == 16 * 13_000_000_000

    # Only some stages asked for: the others are named.
    only_two = plan(PlanInputs(params=13e9, gpus_per_node=8, gpu_memory_bytes=40 * GIB, stages=(2,)))
    assert only_two.recommendation.stage == 3
    assert only_two.recommendation.reason.endswith(
        "DDP, ZeRO-1 and ZeRO-3 are not in the table above, which shows only stage 2.")
    # No offload asked for, offload recommended: the recommended plan itself is not a row.
    offload = plan(PlanInputs(params=13e9, gpus_per_node=1, gpu_memory_bytes=80 * GIB))
    assert offload.recommendation.reason.endswith(
        "ZeRO-2 (optimizer=cpu) is not in the table above, which shows the offload asked for (none).")
    # Where the table shows everything quoted, nothing is added (docs/plan-and-lint.md's example).
    shown = plan(PlanInputs(params=7.5e9, gpus_per_node=8, nodes=8, gpu_memory_bytes=80 * GIB))
    assert "not in the table" not in shown.recommendation.reason and "without offload" not in \
        shown.recommendation.reason.split(";")[0]


def test_without_capacity_the_30b_rule_of_thumb_applies() -> None:
    assert recommend(params=7e9, gpus_per_node=8)[:3] == (2, "none", "none")
    assert recommend(params=70e9, gpus_per_node=8)[:3] == (3, "none", "none")
    result = plan(PlanInputs(params=7e9, gpus_per_node=8))
    assert smallest_fitting_stage(result) is None


def test_the_api_the_config_lint_calls() -> None:
    result = plan(PlanInputs(params=7e9, gpus_per_node=8, nodes=1, gpu_memory_bytes=80 * 2**30, dtype="bf16",
                             optimizer="adam", offload_optimizer="none", offload_params="none", zero_init=True,
                             largest_layer_params=None, activations=None, convention="zero-paper",
                             stages=(0, 1, 2, 3)))
    assert [sp.stage for sp in result.stages] == [0, 1, 2, 3]
    assert [sp.fits for sp in result.stages] == [False, True, True, True]  # DDP 112 GB > 80 GiB
    assert smallest_fitting_stage(result) == 1 and result.recommendation.stage == 2


@pytest.mark.parametrize("text, count", [("7e9", 7_000_000_000), ("7B", 7_000_000_000), ("1.3b", 1_300_000_000),
                                         ("13B", 13_000_000_000), ("350M", 350_000_000), ("1_000", 1000),
                                         ("1.5T", 1_500_000_000_000), ("7000000000", 7_000_000_000)])
def test_parameter_counts(text: str, count: int) -> None:
    assert parse_param_count(text) == count


@pytest.mark.parametrize("text", ["0", "-7e9", "abc", "7GB", "", "nan", "1e400", "0.4"])
def test_bad_parameter_counts(text: str) -> None:
    with pytest.raises(ValueError):
        parse_param_count(text)


# ---------------------------------------------------------------------------------------------
# the CLI


def test_plan_json_through_the_cli() -> None:
    out = zeromon("plan", "--params", "7B", "--gpus-per-node", "8", "--gpu-memory", "80GiB", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) >= {"stages", "recommendation", "inputs", "convention"}
    assert doc["convention"] == "zero-paper" and doc["inputs"]["params"] == 7_000_000_000
    assert [s["stage"] for s in doc["stages"]] == [0, 1, 2, 3]
    keys = {"stage", "offload", "gpu_bytes", "cpu_bytes", "fits", "params_bytes", "grads_bytes", "optimizer_bytes",
            "activations_bytes"}
    for stage in doc["stages"]:
        assert keys <= set(stage) and stage["offload"] == "none"
        assert stage["gpu_bytes"] == (stage["params_bytes"] + stage["grads_bytes"] + stage["optimizer_bytes"]
                                      + stage["activations_bytes"])
    assert doc["stages"][2]["gpu_bytes"] == 2 * 7_000_000_000 + 14 * 7_000_000_000 // 8
    assert [s["fits"] for s in doc["stages"]] == [False, True, True, True]
    assert set(doc["recommendation"]) == {"stage", "offload_optimizer", "offload_params", "reason"}
    assert doc["recommendation"]["stage"] == 2


def test_plan_text_output() -> None:
    out = zeromon("plan", "--params", "70B", "--gpus-per-node", "8", "--nodes", "2", "--gpu-memory", "80GiB",
                  "--activations", "4096,1,8192,80,64", "--largest-layer-params", "1B", "--convention", "deepspeed")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(line for line in lines if line.startswith("stage"))
    for column in ("params", "grads", "optimizer", "activations", "GPU total", "fits", "CPU/node"):
        assert column in header
    assert any(line.startswith("0 (DDP)") and " NO " in line for line in lines)
    assert "GiB" in out.stdout and "convention deepspeed" in out.stdout and "2P + 18P/N" in out.stdout
    assert any(line.startswith("recommendation: ZeRO-3") for line in lines)
    assert "  why: " in out.stdout


def test_plan_help_explains_both_conventions() -> None:
    out = zeromon("plan", "--help")
    assert out.returncode == 0
    assert "zero-paper" in out.stdout and "2Ψ + 18Ψ/N" in out.stdout and "2Ψ + 14Ψ/N" in out.stdout


@pytest.mark.parametrize("spec", [f"{TINY_MODEL}:build", "tests.data.tiny_model:build"])
def test_plan_counts_a_real_model(spec: str) -> None:
    tiny_model = load_tiny_model()
    out = zeromon("plan", "--model", spec, "--gpus-per-node", "2", "--stage", "3", "--json")
    assert out.returncode == 0, out.stderr
    inputs = json.loads(out.stdout)["inputs"]
    assert inputs["params"] == tiny_model.TOTAL_PARAMS == 12096
    assert inputs["largest_layer_params"] == tiny_model.LARGEST_LAYER_PARAMS == 4608
    assert inputs["model"] == spec


def test_model_counts_agree_with_deepspeed() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import model_to_params

    from zeromon.sources.model_spec import count_model_params

    model = load_tiny_model().build()
    assert count_model_params(model) == model_to_params(model) == (12096, 4608)


BAD_INPUTS = [
    (["--params", "-7"], "--params"),
    (["--params=-7e9"], "--params"),
    (["--params", "0"], "--params"),
    (["--params", "seven"], "--params"),
    (["--params", "7e9", "--stage", "4"], "--stage"),
    (["--params", "7e9", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["--params", "7e9", "--nodes", "0"], "--nodes"),
    (["--params", "7e9", "--nodes", "two"], "--nodes"),
    (["--params", "7e9", "--activations", "4096,1,4096"], "--activations"),
    (["--params", "7e9", "--activations", "4096,1,4096,32,x"], "--activations"),
    (["--params", "7e9", "--gpu-memory", "eighty"], "--gpu-memory"),
    (["--params", "7e9", "--gpu-memory", "80"], "--gpu-memory"),
    (["--params", "7e9", "--largest-layer-params", "8e9"], "--largest-layer-params"),
    (["--params", "7e9", "--convention", "deepspeed", "--dtype", "fp32"], "--dtype"),
    (["--params", "7e9", "--stage", "1", "--offload-params", "cpu"], "--offload-params"),
    (["--params", "7e9", "--stage", "2", "--offload-optimizer", "nvme"], "--offload-optimizer nvme"),
    (["--params", "7e9", "--stage", "1", "--offload-optimizer", "nvme"], "--offload-optimizer nvme"),
    (["--params", "7e9", "--momentum"], "--optimizer sgd"),
    (["--params", "7e9", "--momentum"], "--momentum"),
    (["--params", "-7e9"], "--params"),  # a negative value after the flag reaches the flag's own check
    (["--params", "-7B"], "--params"),
    (["--params", "7e9", "--gpu-memory", "-80GiB"], "--gpu-memory"),
    (["--params", "7e9", "--gpu-memory", "0"], "--gpu-memory"),
    (["--params", "7e9", "--nodes", "-2"], "--nodes"),
    (["--model", "no_such_module_zeromon:build"], "--model"),
    (["--model", f"{TINY_MODEL}:broken"], "--model"),
    (["--model", f"{TINY_MODEL}:not_a_module"], "--model"),
    (["--model", f"{TINY_MODEL}:missing"], "--model"),
    (["--model", "no-colon"], "--model"),
    ([], "--params"),
]


@pytest.mark.parametrize("args, flag", BAD_INPUTS, ids=[" ".join(a) or "nothing" for a, _ in BAD_INPUTS])
def test_bad_input_names_the_flag_and_exits_2(args: list[str], flag: str) -> None:
    out = zeromon("plan", *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    first = out.stderr.splitlines()[0]
    assert first.startswith("zeromon: error:") and flag in first
    assert "expected one argument" not in first
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_plan_nvme_offload_with_all_stages_shows_cpu_below_zero3() -> None:
    out = zeromon("plan", "--params", "70B", "--gpus-per-node", "8", "--nodes", "2", "--gpu-memory", "80GiB",
                  "--offload-optimizer", "nvme")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line and line[0] in "0123"}
    assert rows["1"][1] == rows["2"][1] == "optimizer=cpu" and rows["3"][1] == "optimizer=nvme"
    assert rows["1"][-1] == rows["2"][-1] == "B" and rows["1"][-2] == "0"  # NVMe/node: 0 B
    assert "note: ZeRO-1/2 cannot offload the optimizer to NVMe" in out.stdout
    # ZeRO-3 without offload fits (70 GB of 80 GiB): the reason says which of its figures are not rows.
    assert out.stdout.splitlines()[-2] == "recommendation: ZeRO-3, no offload"
    assert "ZeRO-2 without offload needs" in out.stdout
    assert out.stdout.rstrip().endswith("are not in the table above, which shows the offload asked for "
                                        "(optimizer=nvme): the recommendation weighs every stage without offload before "
                                        "any offload.")
    doc = json.loads(zeromon("plan", "--params", "70B", "--gpus-per-node", "8", "--offload-optimizer", "nvme",
                             "--json").stdout)
    assert [s["offload_optimizer"] for s in doc["stages"]] == ["none", "cpu", "cpu", "nvme"]
    assert any("NVMe needs ZeRO-3" in note for note in doc["notes"])


def test_planner_stays_pure() -> None:
    import subprocess

    code = "import sys, zeromon.analysis.planner; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
