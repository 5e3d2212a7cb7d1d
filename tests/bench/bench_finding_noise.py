"""How often a healthy run raises a straggler or step-skew finding (the false-alarm rate), and how often a
run with a real straggler is named (the detection power), on real 2-rank gloo runs beside busy processes.

Each run is tests/scenarios/straggler.py under torchrun: healthy (``--delay 0``) or with one rank late by
``--late-ms`` every step. ``--busy`` processes spin beside the runs for the whole bench (CPU contention: on a
2-core machine the ranks are descheduled now and then, which is what made a coin flip read as a straggler).
Every run is judged three ways: `zeromon report`'s findings (zeromon.analysis.stragglers), the live views'
straggler finding over the run's last steps (zeromon.analysis.live_stragglers), and the rule before issue 35
(a wait of 5% of the peers' step time, twice what the other ranks cause, waited for most in more than half
the steps: no test against chance), for comparison.

    python tests/bench/bench_finding_noise.py [--healthy 40] [--straggler 20] [--steps 20] [--late-ms 30] [--busy 2] [--parallel 3]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from zeromon.analysis.live_stragglers import straggler_finding
from zeromon.analysis.stragglers import Imbalance, analyze_imbalance
from zeromon.model import read_run

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "tests" / "scenarios" / "straggler.py"


@dataclass(frozen=True)
class Verdict:
    report: str  # "" (nothing), or the worst straggler/skew finding's severity and rank: "warn:1"
    live: str
    old_rule: str
    seconds: float


def start_busy(count: int) -> list[subprocess.Popen[bytes]]:
    """Processes that spin on a core each: the contention a shared machine gives."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run_once(out: Path, steps: int, late_s: float, slow_rank: int) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROMON_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", ZEROMON_PORT="0",
               ZEROMON_OUT=str(out), ZEROMON_REGISTRY=str(out.parent / "registry"))
    from benchlib import free_port

    port = free_port()
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
            str(SCENARIO), "--delay", str(late_s), "--slow-rank", str(slow_rank), "--extra-mb", "0",
            "--steps", str(steps)]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600,
                            cwd=SCENARIO.parent)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return out


def old_rule(imbalance: Imbalance, step_s: dict[int, float]) -> str:
    """The straggler rule before issue 35, from the same tallies (``step_s``: each rank's time in the
    steps after the first)."""
    arrivals = imbalance.ranks
    for a in arrivals:
        others = [b.steady_caused_wait_s for b in arrivals if b.rank != a.rank]
        typical = sum(others) / len(others) if others else 0.0
        peers_s = sum(step_s.values()) - step_s.get(a.rank, 0.0)
        share = a.steady_caused_wait_s / peers_s if peers_s > 0 else 0.0
        if (share >= 0.05 and a.steady_caused_wait_s >= 2 * typical
                and a.steps_most_waited_for > 0.5 * imbalance.steady_steps):
            return f"{'warn' if share < 0.2 else 'critical'}:{a.rank}"
    return ""


def judge(run: Path, seconds: float) -> Verdict:
    recordings = read_run(run)
    imbalance = analyze_imbalance(recordings)
    found = [f for f in imbalance.findings if f.kind in ("straggler", "step_skew")]
    worst = max(found, key=lambda f: f.severity.rank, default=None)
    report = f"{worst.severity.value}:{worst.rank}" if worst else ""
    live = straggler_finding({r.rank: list(r.steps) for r in recordings})
    return Verdict(report=report, live=f"{live.severity.value}:{live.rank}" if live else "",
                   old_rule=old_rule(imbalance, {r.rank: sum(s.duration_s for s in r.steps if s.step >= 1)
                                                 for r in recordings}),
                   seconds=seconds)


def upper_95(hits: int, runs: int) -> float:
    """The one-sided 95% upper bound on a rate seen ``hits`` times in ``runs`` (Clopper-Pearson, by bisection
    on the exact binomial lower tail)."""
    if hits >= runs:
        return 1.0
    low, high = hits / runs, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        tail = sum(math.comb(runs, i) * mid**i * (1 - mid) ** (runs - i) for i in range(hits + 1))
        low, high = (mid, high) if tail > 0.05 else (low, mid)
    return high


def summarize(name: str, verdicts: list[Verdict], expect_rank: int | None) -> list[str]:
    lines = [f"{name}: {len(verdicts)} runs, median {sorted(v.seconds for v in verdicts)[len(verdicts) // 2]:.1f} s a run"]
    for judge_name in ("report", "live", "old_rule"):
        said = [getattr(v, judge_name) for v in verdicts]
        if expect_rank is None:
            warned = sum(1 for s in said if s.startswith(("warn", "critical")))
            any_finding = sum(1 for s in said if s)
            lines.append(f"  {judge_name:8s} false alarms (warn or critical): {warned} of {len(said)} "
                         f"(95% upper bound {upper_95(warned, len(said)):.0%}); any finding (info too): {any_finding}")
        else:
            named = sum(1 for s in said if s.endswith(f":{expect_rank}") and s.startswith(("warn", "critical")))
            wrong = sum(1 for s in said if s and not s.endswith(f":{expect_rank}"))
            lines.append(f"  {judge_name:8s} named rank {expect_rank}: {named} of {len(said)}; "
                         f"another rank named: {wrong}")
        lines.append("           " + " ".join(s or "-" for s in said))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--healthy", type=int, default=40)
    parser.add_argument("--straggler", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--late-ms", type=float, default=30.0)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=3, help="runs at once")
    args = parser.parse_args()
    busy = start_busy(args.busy)
    results: dict[str, list[Verdict]] = {"healthy": [], "straggler": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # Interleaved, so that both kinds of run see the same machine over the bench.
            order = _interleave(args.healthy, args.straggler)
            def one(i: int) -> tuple[str, Verdict]:
                t0 = time.perf_counter()
                late = args.late_ms / 1e3 if order[i] == "straggler" else 0.0
                run = run_once(Path(tmp) / f"run{i}" / "run", args.steps, late, slow_rank=1)
                return order[i], judge(run, time.perf_counter() - t0)

            # A few runs at once: each is contention for the others too, as jobs sharing a machine are.
            with ThreadPoolExecutor(args.parallel) as pool:
                for i, (kind, verdict) in enumerate(pool.map(one, range(len(order)))):
                    results[kind].append(verdict)
                    print(f"{i + 1}/{len(order)} {kind}: report {verdict.report or '-'}, live {verdict.live or '-'}, "
                          f"old rule {verdict.old_rule or '-'} ({verdict.seconds:.1f} s)", file=sys.stderr, flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"bench_finding_noise: 2 ranks (gloo), {args.steps} steps a run, {args.busy} busy processes beside, "
          f"{args.parallel} runs at once, straggler late by {args.late_ms:g} ms a step; load at the end: "
          f"{os.getloadavg()[0]:.1f}")
    for line in summarize("healthy", results["healthy"], None) + summarize("straggler", results["straggler"], 1):
        print(line)


def _interleave(healthy: int, straggler: int) -> list[str]:
    """The runs in an order that spreads the straggler runs evenly among the healthy ones."""
    total = healthy + straggler
    return ["straggler" if (i + 1) * straggler // total > i * straggler // total else "healthy"
            for i in range(total)]


if __name__ == "__main__":
    main()
