"""DuckDB vs Polars vs numpy on the hot operations of `zeromon report` at 1,024 ranks x 10,000 steps.

Not run by run_all.py: DuckDB and Polars are not zeromon's dependencies. To re-measure:

    pip install --target /tmp/engines duckdb polars
    PYTHONPATH=/tmp/engines:. python tests/bench/engines_fleet.py

The operations, on synthetic values of the generated run's shape:
- per rank (in each worker, 10,000 step summaries): the steps' derived columns (step time, exposed
  share, overlap ratio, idle) and the medians of five of them over the steps after the first;
- across ranks (in the parent, 10,240,000 step times): per step the median, slowest and fastest
  rank's time and the slowest rank; per rank its median step time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

RANKS, STEPS = 1024, 10_000


def _best_of(fn: Callable[[], object], rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def per_rank_columns() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    start = np.cumsum(rng.integers(90_000_000, 95_000_000, STEPS)).astype(np.int64)
    return {"step": np.arange(STEPS, dtype=np.int64), "start_ns": start,
            "end_ns": start + rng.integers(85_000_000, 90_000_000, STEPS),
            "comm_s": rng.uniform(0.05, 0.07, STEPS), "comp_s": rng.uniform(0.02, 0.04, STEPS),
            "overlap_s": rng.uniform(0, 0.01, STEPS), "exposed_s": rng.uniform(0.04, 0.06, STEPS),
            "blocked_s": rng.uniform(0.04, 0.06, STEPS)}


def per_rank_numpy(c: dict[str, np.ndarray]) -> list[float]:
    step_s = (c["end_ns"] - c["start_ns"]) / 1e9
    steady = c["step"] >= 1
    share = np.where(step_s > 0, c["exposed_s"] / np.where(step_s > 0, step_s, 1), np.nan)
    ratio = np.where(c["comm_s"] > 0, c["overlap_s"] / np.where(c["comm_s"] > 0, c["comm_s"], 1), np.nan)
    idle = np.maximum(0.0, step_s - (c["comm_s"] + c["comp_s"] - c["overlap_s"]))
    out = [float(np.median(v[steady & ~np.isnan(v)])) for v in (step_s, c["exposed_s"], share, ratio, c["blocked_s"])]
    return [*out, float(idle.sum())]


def per_rank_polars(c: dict[str, np.ndarray]) -> list[float]:
    import polars as pl

    frame = pl.DataFrame(c).with_columns(step_s=(pl.col("end_ns") - pl.col("start_ns")) / 1e9)
    frame = frame.with_columns(share=pl.when(pl.col("step_s") > 0).then(pl.col("exposed_s") / pl.col("step_s")),
                               ratio=pl.when(pl.col("comm_s") > 0).then(pl.col("overlap_s") / pl.col("comm_s")),
                               idle=(pl.col("step_s") - (pl.col("comm_s") + pl.col("comp_s") - pl.col("overlap_s")))
                               .clip(lower_bound=0.0))
    row = frame.filter(pl.col("step") >= 1).select(
        pl.col("step_s").median(), pl.col("exposed_s").median(), pl.col("share").median(),
        pl.col("ratio").median(), pl.col("blocked_s").median(), pl.col("idle").sum()).row(0)
    return list(row)


def per_rank_duckdb(c: dict[str, np.ndarray]) -> list[float]:
    import duckdb

    frame = c  # noqa: F841  (DuckDB reads the local dict of numpy arrays by name)
    row = duckdb.sql("""
        SELECT median(step_s), median(exposed_s), median(share), median(ratio), median(blocked_s), sum(idle)
        FROM (SELECT step, (end_ns - start_ns) / 1e9 AS step_s, exposed_s, blocked_s,
                     CASE WHEN end_ns > start_ns THEN exposed_s / ((end_ns - start_ns) / 1e9) END AS share,
                     CASE WHEN comm_s > 0 THEN overlap_s / comm_s END AS ratio,
                     greatest(0.0, (end_ns - start_ns) / 1e9 - (comm_s + comp_s - overlap_s)) AS idle
              FROM frame) WHERE step >= 1""").fetchall()
    return list(row[0]) if row else []


def fleet_matrix() -> np.ndarray:
    return np.random.default_rng(1).uniform(0.09, 0.12, (RANKS, STEPS))


def fleet_numpy(m: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    median = np.median(m, axis=0)
    skew = (m.max(axis=0) - m.min(axis=0)) / median
    return float(np.median(skew)), np.bincount(m.argmax(axis=0), minlength=RANKS), np.median(m, axis=1)


def fleet_polars(m: np.ndarray) -> object:
    import polars as pl

    long = pl.DataFrame({"rank": np.repeat(np.arange(RANKS), STEPS), "step": np.tile(np.arange(STEPS), RANKS),
                         "step_s": m.ravel()})
    per_step = long.group_by("step").agg(
        med=pl.col("step_s").median(), hi=pl.col("step_s").max(), lo=pl.col("step_s").min(),
        slowest=pl.col("rank").sort_by("step_s").last())
    skew = ((per_step["hi"] - per_step["lo"]) / per_step["med"]).median()
    per_rank = long.group_by("rank").agg(pl.col("step_s").median())
    return skew, per_step["slowest"].value_counts(), per_rank


def fleet_duckdb(m: np.ndarray) -> object:
    import duckdb

    long = {"rank": np.repeat(np.arange(RANKS), STEPS), "step": np.tile(np.arange(STEPS), RANKS),  # noqa: F841
            "step_s": m.ravel()}
    skew = duckdb.sql("""SELECT median((hi - lo) / med) FROM (SELECT max(step_s) AS hi, min(step_s) AS lo,
                         median(step_s) AS med, arg_max(rank, step_s) AS slowest FROM long GROUP BY step)""").fetchall()
    per_rank = duckdb.sql("SELECT rank, median(step_s) FROM long GROUP BY rank").fetchnumpy()
    return skew, per_rank


def main() -> None:
    t = time.perf_counter()
    import duckdb  # noqa: F401
    duck_import = time.perf_counter() - t
    t = time.perf_counter()
    import polars  # noqa: F401
    polars_import = time.perf_counter() - t
    print(f"import: duckdb {duck_import * 1e3:.0f} ms, polars {polars_import * 1e3:.0f} ms")
    c = per_rank_columns()
    for name, fn in (("numpy", per_rank_numpy), ("polars", per_rank_polars), ("duckdb", per_rank_duckdb)):
        print(f"per rank (10,000 steps): {name:<7} {_best_of(lambda fn=fn: fn(c)) * 1e3:8.2f} ms")
    m = fleet_matrix()
    for name, gn in (("numpy", fleet_numpy), ("polars", fleet_polars), ("duckdb", fleet_duckdb)):
        print(f"across ranks (1,024 x 10,000): {name:<7} {_best_of(lambda gn=gn: gn(m), rounds=3) * 1e3:8.0f} ms")


if __name__ == "__main__":
    main()
