"""Synthetic market traces (for benchmarks, tests and trying out bids):
a mean-reverting random walk of the spot price per instance type, with
stock dips, deterministic by seed, written as a trace file with a CSV of prices."""

from __future__ import annotations

import random
from pathlib import Path


def write_trace(directory: Path, *, hours: float = 24.0, step_s: float = 60.0, seed: int = 1,
                types: tuple[tuple[str, float], ...] = (("ecs.g7.xlarge", 1.2),), mean: float = 0.35,
                volatility: float = 0.04, stock: int = 16) -> Path:
    """A trace of ``hours`` with one row per type every ``step_s``; returns the YAML path.
    Prices are ``mean`` x on-demand on average, clamped to 5%..100% of it."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    rows = ["time,instance_type,price,stock"]
    for name, on_demand in types:
        level = mean
        for index in range(int(hours * 3600 / step_s)):
            level += 0.1 * (mean - level) + rng.gauss(0, volatility)
            level = min(1.0, max(0.05, level))
            available = stock if rng.random() > 0.01 else rng.randrange(0, stock)
            rows.append(f"{index * step_s:g},{name},{level * on_demand:.4f},{available}")
    (directory / "prices.csv").write_text("\n".join(rows) + "\n")
    yaml_path = directory / "market.yaml"
    kinds = "\n".join(f"  {name}: {{pool: general, on_demand: {on_demand}}}" for name, on_demand in types)
    yaml_path.write_text(f"pools:\n  general: {{}}\ninstance_types:\n{kinds}\nprices: prices.csv\n")
    return yaml_path
