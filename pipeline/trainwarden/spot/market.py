"""Where spot prices and stock come from: a small protocol, one registry, and
the trace-driven market used by the embedded run, tests and the simulator.

A provider answers "what is on offer ``at`` seconds after the job was
submitted"; the run loop polls it at the edge and hands the answer to the
engine as a ``MarketUpdate``. A cloud provider plugs in with
``register_provider("mycloud", factory)`` and is then opened with
``--market mycloud://...`` (docs/GUIDE.md, "Spot (preemptible) jobs").

Trace file (YAML):

    pools:
      general: {}                                  # compare: market (default)
      lingjun: {discount_only: true, compare: average, notice_s: 5}
    instance_types:
      ecs.g7.xlarge: {pool: general, on_demand: 1.2}
    prices:       # a list, or the name of a CSV file next to this one with the
                  # columns time,instance_type,price,stock[,average_price]
      - {time: 0, instance_type: ecs.g7.xlarge, price: 0.3, stock: 8}
      - {time: 600, instance_type: ecs.g7.xlarge, price: 0.9, stock: 8}

Times are seconds from the job's submission; a row holds until the next row
of its type. Prices are per instance-hour. A pool that compares on the
average price uses the row's ``average_price`` or, without one, the mean of
the type's prices so far.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import io
from pathlib import Path
from typing import Callable, Mapping, Protocol

from trainwarden.events import Offer
from trainwarden.yamlsrc import ConfigError, Fields, LineList, load_yaml_file

COMPARES = ("market", "average")
MAX_NOTICE_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Pool:
    name: str
    discount_only: bool = False
    compare: str = "market"  # the price a bid is held against: market or average
    notice_s: float = 0.0  # advance notice of a release (SIGTERM, then the release)


@dataclasses.dataclass(frozen=True)
class InstanceType:
    name: str
    pool: str
    on_demand: float  # per instance-hour


class MarketProvider(Protocol):
    name: str

    def pools(self) -> Mapping[str, Pool]: ...

    def instance_types(self) -> Mapping[str, InstanceType]: ...

    def offers(self, at: float) -> tuple[Offer, ...]:
        """The offers ``at`` seconds after the job's submission (types not on offer are absent)."""


# scheme -> factory(target) -> provider
_PROVIDERS: dict[str, Callable[[str], MarketProvider]] = {}


def register_provider(scheme: str, factory: Callable[[str], MarketProvider]) -> None:
    """Make ``--market scheme://...`` open with ``factory``."""
    _PROVIDERS[scheme.lower()] = factory


def open_market(target: str) -> MarketProvider:
    """A provider for ``--market``: ``scheme://...`` of a registered provider, or a trace file."""
    if "://" in target:
        scheme = target.split("://", 1)[0].lower()
        if scheme not in _PROVIDERS:
            known = ", ".join(f"{s}://" for s in sorted(_PROVIDERS))
            raise ConfigError(f"--market {target!r} has an unknown scheme {scheme}://",
                              hint=f"give a trace file or one of {known}")
        return _PROVIDERS[scheme](target)
    return TraceMarket.load(target)


@dataclasses.dataclass
class _Series:
    times: list
    offers: list


class TraceMarket:
    """Prices and stock replayed from a file; the same answers for every caller."""

    def __init__(self, name: str, pools: Mapping[str, Pool], types: Mapping[str, InstanceType],
                 rows: list[tuple[float, str, float, int, float]]):
        self.name = name
        self._pools = dict(pools)
        self._types = dict(types)
        self._series: dict[str, _Series] = {}
        sums: dict[str, tuple[float, int]] = {}
        for time_, itype, price, stock, average in sorted(rows, key=lambda r: r[0]):
            kind = self._types[itype]
            pool = self._pools[kind.pool]
            total, count = sums.get(itype, (0.0, 0))
            sums[itype] = (total + price, count + 1)
            if not average and pool.compare == "average":
                average = round(sums[itype][0] / sums[itype][1], 9)
            series = self._series.setdefault(itype, _Series([], []))
            series.times.append(time_)
            series.offers.append(Offer(instance_type=itype, price=price, stock=stock, on_demand=kind.on_demand,
                                       average_price=average, notice_s=pool.notice_s))

    def pools(self) -> Mapping[str, Pool]:
        return self._pools

    def instance_types(self) -> Mapping[str, InstanceType]:
        return self._types

    def offers(self, at: float) -> tuple[Offer, ...]:
        found = []
        for series in self._series.values():
            index = bisect.bisect_right(series.times, at) - 1
            if index >= 0:
                found.append(series.offers[index])
        return tuple(found)

    def change_times(self) -> list[float]:
        """Every time the market changes, in order (for the simulator)."""
        return sorted({t for s in self._series.values() for t in s.times})

    @classmethod
    def load(cls, path: str | Path) -> "TraceMarket":
        path = Path(path)
        top = Fields(load_yaml_file(path), path, "a market trace", known=("pools", "instance_types", "prices"))
        pools = {}
        raw_pools = top.get("pools", dict, {})
        for name in raw_pools:
            fields = Fields(raw_pools[name] or {}, path, f"pool '{name}'", raw_pools.line_of(name),
                            known=("discount_only", "compare", "notice_s"))
            compare = fields.get("compare", str, "market")
            if compare not in COMPARES:
                raise fields.error("compare", f"'compare' must be market or average, not {compare!r}")
            notice = fields.get("notice_s", (int, float), 0)
            if not 0 <= notice <= MAX_NOTICE_S:
                raise fields.error("notice_s", f"'notice_s' must be from 0 to {MAX_NOTICE_S:g} seconds")
            pools[str(name)] = Pool(str(name), fields.get("discount_only", bool, False), compare, float(notice))
        pools.setdefault("default", Pool("default"))
        types = {}
        raw_types = top.get("instance_types", dict)
        for name in raw_types:
            fields = Fields(raw_types[name], path, f"instance type '{name}'", raw_types.line_of(name),
                            known=("pool", "on_demand"))
            pool = fields.get("pool", str, "default")
            if pool not in pools:
                raise fields.error("pool", f"pool {pool!r} is not declared under 'pools'")
            on_demand = fields.get("on_demand", (int, float))
            if not 0 < on_demand < 1e9:
                raise fields.error("on_demand", f"'on_demand' must be a price above 0, not {on_demand}")
            types[str(name)] = InstanceType(str(name), pool, float(on_demand))
        prices = top.get("prices", (list, str))
        top.done()
        if isinstance(prices, str):
            rows = _csv_rows(path.parent / prices, types)
        else:
            rows = [_row(item, path, prices.line_of(i) if isinstance(prices, LineList) else 0, types)
                    for i, item in enumerate(prices)]
        if not rows:
            raise top.error("prices", "the trace has no prices")
        return cls(str(path), pools, types, rows)


def _row(item: object, path: Path, line: int, types: Mapping[str, InstanceType]):
    fields = Fields(item, path, "a price row", line,
                    known=("time", "instance_type", "price", "stock", "average_price"))
    values = (fields.get("time", (int, float)), fields.get("instance_type", str),
              fields.get("price", (int, float)), fields.get("stock", int),
              fields.get("average_price", (int, float), 0))
    problem = _check_row(*values, types)
    if problem:
        raise fields.error(problem[0], problem[1])
    return (float(values[0]), values[1], float(values[2]), values[3], float(values[4]))


def _csv_rows(path: Path, types: Mapping[str, InstanceType]) -> list:
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the price file: {exc}", path) from None
    reader = csv.DictReader(io.StringIO(text))
    required = {"time", "instance_type", "price", "stock"}
    header = set(reader.fieldnames or ())
    if not required <= header or header - required - {"average_price"}:
        raise ConfigError("the columns must be time,instance_type,price,stock[,average_price], not "
                          f"{','.join(reader.fieldnames or ())}", path, 1)
    rows = []
    for record in reader:
        line = reader.line_num
        try:
            values = (float(record["time"]), record["instance_type"], float(record["price"]),
                      int(record["stock"]), float(record.get("average_price") or 0))
        except (TypeError, ValueError):
            raise ConfigError(f"a price row needs numbers for time, price, stock: {record}", path, line) from None
        problem = _check_row(*values, types)
        if problem:
            raise ConfigError(problem[1], path, line)
        rows.append(values)
    return rows


def _check_row(time_, itype, price, stock, average, types) -> tuple[str, str] | None:
    if not 0 <= time_ < 1e9:
        return "time", f"'time' must be seconds from the job's submission (0 or more), not {time_}"
    if itype not in types:
        return "instance_type", f"instance type {itype!r} is not declared under 'instance_types'"
    if not 0 <= price < 1e9:
        return "price", f"'price' must be 0 or more, not {price}"
    if stock < 0:
        return "stock", f"'stock' must be 0 or more, not {stock}"
    if not 0 <= average < 1e9:
        return "average_price", f"'average_price' must be 0 or more, not {average}"
    return None


register_provider("trace", lambda target: TraceMarket.load(target.split("://", 1)[1]))
