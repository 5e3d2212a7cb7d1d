#!/bin/bash
# The device check of 2026-11-28 (issue 42's what-if on a GPU run's stream, issue 44's GPU paths), run by the
# `device` tool from the repository's root with $OUT set: bash tests/gpu-runs/2026-11-28-device-check.sh
export PYTHONPATH=$PWD:$PWD/agents:$PWD/dashboard:$PWD/tests/bench PYTHONUNBUFFERED=1
T0=$(date +%s)
lap() { echo "$1 done at +$(( $(date +%s) - T0 )) s" >> "$OUT/env.txt"; }
{ date -u; nvidia-smi -L; nproc; python3 -c "import sys, torch; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; git log -1 --format=%H 2>/dev/null; } > "$OUT/env.txt" 2>&1
SHAPE="--hidden 1024 --layers 4 --batch 8 --seq 512"
if [ "${PARTS:-wtb}" != "${PARTS/w/}" ]; then
  # issue 42: a recorded 1-GPU FSDP2 run at the agent's default device timing, and what-if answers from it
  timeout 90 python3 -m zeromon run --out /tmp/gpu-a -- python3 tests/launch_ranks.py --nproc-per-node 1 \
    --master-port 29611 examples/fsdp2_train.py --steps 40 $SHAPE > "$OUT/whatif.txt" 2>&1
  for c in comm=hidden micro_batch=x2 bandwidth=x2; do timeout 60 python3 -m zeromon whatif /tmp/gpu-a $c >> "$OUT/whatif.txt" 2>&1; done
  timeout 60 python3 -m zeromon whatif /tmp/gpu-a micro_batch=x2 --json > "$OUT/whatif.json" 2>> "$OUT/whatif.txt"
  timeout 60 python3 -m zeromon report /tmp/gpu-a >> "$OUT/whatif.txt" 2>&1
  timeout 90 python3 -m zeromon run --out /tmp/gpu-ddp -- python3 tests/launch_ranks.py --nproc-per-node 1 \
    --master-port 29612 examples/ddp_train.py --steps 40 $SHAPE > "$OUT/whatif-ddp.txt" 2>&1
  for c in comm=hidden micro_batch=x2; do timeout 60 python3 -m zeromon whatif /tmp/gpu-ddp $c >> "$OUT/whatif-ddp.txt" 2>&1; done
  tar -C /tmp -czf "$OUT/gpu-runs.tar.gz" gpu-a gpu-ddp
  lap whatif
  # issue 42: record A, predict B, run B for real, A again; three rounds
  timeout 240 python3 tests/bench/bench_whatif.py --ranks 1 --shapes gpu --pairs ${PAIRS_W:-fsdp2-micro} --rounds ${ROUNDS_W:-3} --steps 40 \
    --json "$OUT/bench_whatif.json" > "$OUT/bench_whatif.txt" 2>&1
  lap bench_whatif
fi
if [ "${PARTS:-wtb}" != "${PARTS/t/}" ]; then
  timeout 150 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/test_gpu_real.py > "$OUT/gpu_tests.txt" 2>&1
  lap gpu_tests
fi
if [ "${PARTS:-wtb}" != "${PARTS/m/}" ]; then
  # issue 44: a memory sample's reads on the GPU (the allocator's totals flattened, as before, and nested, as now)
  timeout 60 python3 tests/bench/bench_memory_sample.py > "$OUT/memory_sample.txt" 2>&1
  lap memory_sample
fi
if [ "${PARTS:-wtb}" != "${PARTS/b/}" ]; then
  # issue 44: the host-bound loop, without the agent, its hot path alone, the whole agent
  timeout ${TIMEOUT_B:-100} python3 tests/bench/bench_gpu_drain.py --real --parts b --runs ${RUNS_B:-9} --loop-collectives ${LOOP_B:-8000} > "$OUT/drain_b.txt" 2>&1
  lap drain_b
fi
