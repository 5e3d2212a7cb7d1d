"""`zeromon plan`: ZeRO model-state and activation memory per GPU and per node, per stage, and which stage to use."""

from __future__ import annotations

import argparse
import json

NAME = "plan"
HELP = "plan ZeRO memory per GPU and per node for each stage, and recommend one"

DESCRIPTION = """\
Estimate parameters, gradients, optimizer state and activations per GPU, host memory per node, and
whether each ZeRO stage (0 = DDP) fits the GPU; recommend the first of DDP, ZeRO-2, ZeRO-3 that fits
with 10% headroom, then the same with offload (fastest first; ZeRO-2 is preferred to ZeRO-1, which
never needs less memory and moves the same volume: the ZeRO paper, Rajbhandari et al. 2020, §7).
NVMe optimizer offload is ZeRO-3's: at stages 1 and 2 DeepSpeed keeps the optimizer state in CPU
memory, and so does the plan.

conventions:
  zero-paper  the ZeRO paper (Rajbhandari et al. 2020): Ψ params, N GPUs, mixed-precision Adam with
              2 + 2 + 12 bytes per parameter: DDP 16Ψ, stage 1 4Ψ + 12Ψ/N, stage 2 2Ψ + 14Ψ/N,
              stage 3 16Ψ/N (fp32: 4 + 4 + 8; SGD: master copy 4, +4 with --momentum).
  deepspeed   DeepSpeed's estimate_zero2/3_model_states_mem_needs, reproduced exactly: stage 2
              2Ψ + 18Ψ/N (it also counts a 4-byte fp32 gradient partition), stage 3
              4·L + 18Ψ/N (L = largest layer, gathered), host memory × 1.5
              (additional_buffer_factor) including the fp32 model each rank loads; stages 0 and 1
              extrapolated in the same accounting; bf16/fp16 Adam and cpu offload only.
activations (--activations seq,batch,hidden,layers,heads): Korthikanti et al. 2022 without
recomputation, s·b·h·(34 + 5·a·s/h) bytes per layer, times layers.
"""

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--params", metavar="N", help="parameter count: 7e9, 7B, 1.3b, 350M")
    size.add_argument("--model", metavar="MODULE:FACTORY",
                      help="count a real model: import MODULE (or a .py path) and call FACTORY() for an nn.Module; "
                           "also gives the largest layer (the module with the most direct parameters, as DeepSpeed)")
    parser.add_argument("--gpus-per-node", default="1", metavar="G", help="GPUs per node (default 1)")
    parser.add_argument("--nodes", default="1", metavar="N", help="nodes (default 1)")
    parser.add_argument("--stage", default="all", choices=("0", "1", "2", "3", "all"), help="stage (default all)")
    parser.add_argument("--offload-optimizer", default="none", choices=("none", "cpu", "nvme"))
    parser.add_argument("--offload-params", default="none", choices=("none", "cpu", "nvme"),
                        help="ZeRO-3 only")
    parser.add_argument("--no-zero-init", dest="zero_init", action="store_false",
                        help="the model is built whole on every rank (no deepspeed.zero.Init)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--optimizer", default="adam", choices=("adam", "sgd"))
    parser.add_argument("--momentum", action="store_true", help="SGD keeps a momentum buffer (default: none)")
    parser.add_argument("--largest-layer-params", metavar="N", help="parameters of the largest layer (ZeRO-3)")
    parser.add_argument("--activations", metavar="SEQ,BATCH,HIDDEN,LAYERS,HEADS",
                        help="add transformer activations per GPU, e.g. 4096,1,4096,32,32")
    parser.add_argument("--gpu-memory", metavar="SIZE", help="GPU capacity, e.g. 80GiB, 40GB")
    parser.add_argument("--convention", default="zero-paper", choices=("zero-paper", "deepspeed"))
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from zeromon.analysis.planner import plan
    from zeromon.views.planning import PlanRequest, format_plan, plan_inputs, plan_payload

    request = PlanRequest(
        params=args.params, model=args.model, gpus_per_node=args.gpus_per_node, nodes=args.nodes, stage=args.stage,
        offload_optimizer=args.offload_optimizer, offload_params=args.offload_params, zero_init=args.zero_init,
        dtype=args.dtype, optimizer=args.optimizer, momentum=args.momentum,
        largest_layer_params=args.largest_layer_params, activations=args.activations, gpu_memory=args.gpu_memory,
        convention=args.convention)
    result = plan(plan_inputs(request))
    if args.json:
        print(json.dumps(plan_payload(result, args.model), indent=2))
    else:
        print(format_plan(result, model=args.model))
    return 0
