"""A role's ``spot`` section in a job file, checked strictly:

    roles:
      worker:
        count: 2
        command: [python3, train.py]
        spot:
          SpotStrategy: SpotWithPriceLimit
          SpotDiscountLimit: 0.4        # 0.1 to 0.9 in steps of 0.1 of on-demand
          # SpotPriceLimit: 0.011       # or an absolute price per instance-hour
          instance_type: ecs.g7.xlarge

Whether the instance type exists and its pool accepts the form of the bid is
known only with the market (``check_bids``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from trainwarden.events import SpotBid
from trainwarden.yamlsrc import ConfigError, Fields

if TYPE_CHECKING:
    from trainwarden.spot.market import MarketProvider

STRATEGIES = ("SpotWithPriceLimit",)
DISCOUNT_KEY, PRICE_KEY = "SpotDiscountLimit", "SpotPriceLimit"


@dataclasses.dataclass(frozen=True)
class RoleBid:
    role: str
    instance_type: str
    count: int
    discount: Optional[float]
    price_limit: Optional[float]
    # Where it was written, for errors found later against the market.
    path: str = ""
    type_line: int = 0
    limit_line: int = 0


def valid_discount(value: float) -> bool:
    tenths = value * 10
    return abs(tenths - round(tenths)) < 1e-9 and 1 <= round(tenths) <= 9


def parse_spot(raw: object, path: str | Path, role: str, count: int, line: int) -> RoleBid:
    spot = Fields(raw, path, f"the spot section of role '{role}'", line,
                  known=("SpotStrategy", DISCOUNT_KEY, PRICE_KEY, "instance_type"))
    strategy = spot.get("SpotStrategy", str)
    if strategy not in STRATEGIES:
        raise spot.error("SpotStrategy", f"'SpotStrategy' must be {' or '.join(STRATEGIES)}, not {strategy!r}")
    discount = spot.get(DISCOUNT_KEY, (int, float), None)
    price = spot.get(PRICE_KEY, (int, float), None)
    if discount is not None and price is not None:
        raise spot.error(PRICE_KEY, f"give either '{DISCOUNT_KEY}' or '{PRICE_KEY}', not both",
                         hint="a bid is a discount of the on-demand price or an absolute price limit")
    if discount is None and price is None:
        raise spot.error("SpotStrategy", f"SpotWithPriceLimit needs '{DISCOUNT_KEY}' or '{PRICE_KEY}'")
    if discount is not None and not valid_discount(float(discount)):
        raise spot.error(DISCOUNT_KEY, f"'{DISCOUNT_KEY}' must be 0.1 to 0.9 in steps of 0.1, not {discount}",
                         hint="e.g. 0.3 bids 30% of the on-demand price")
    if price is not None and not 0 < price < 1e9:
        raise spot.error(PRICE_KEY, f"'{PRICE_KEY}' must be a price above 0, not {price}")
    instance_type = spot.get("instance_type", str)
    if not instance_type.strip():
        raise spot.error("instance_type", "'instance_type' is empty")
    spot.done()
    return RoleBid(role=role, instance_type=instance_type, count=count,
                   discount=None if discount is None else round(float(discount), 1),
                   price_limit=None if price is None else float(price), path=str(path),
                   type_line=spot.line("instance_type"),
                   limit_line=spot.line(DISCOUNT_KEY if discount is not None else PRICE_KEY))


def check_bids(bids: tuple[RoleBid, ...], market: "MarketProvider") -> tuple[SpotBid, ...]:
    """The bids as the engine takes them, after the market's rules: the type
    must be on offer, and discount-only pools refuse a price limit."""
    types, pools = market.instance_types(), market.pools()
    out = []
    for bid in bids:
        itype = types.get(bid.instance_type)
        if itype is None:
            raise ConfigError(f"role '{bid.role}': instance type {bid.instance_type!r} is not in the market "
                              f"{market.name}", bid.path, bid.type_line,
                              hint=f"known types: {', '.join(sorted(types)) or 'none'}")
        pool = pools[itype.pool]
        if pool.discount_only and bid.price_limit is not None:
            raise ConfigError(f"role '{bid.role}': pool '{pool.name}' of {bid.instance_type} accepts only "
                              f"'{DISCOUNT_KEY}', not '{PRICE_KEY}'", bid.path, bid.limit_line,
                              hint=f"bid a discount, e.g. {DISCOUNT_KEY}: 0.5")
        out.append(SpotBid(role=bid.role, instance_type=bid.instance_type, count=bid.count,
                           discount=bid.discount, price_limit=bid.price_limit,
                           compare_average=pool.compare == "average", pool=pool.name))
    return tuple(out)
