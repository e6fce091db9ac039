"""Spot jobs: the bidding queue, preemption, re-queue and resume, and cost.

A spot job waits (``queued``) until every spot role's bid is at or above the
price of its instance type and the stock covers its count; it then starts.
When the price rises above a bid or stock runs out, its instances are
released: with fault tolerance on, the job goes back to the queue by itself
(``requeue``, a fault record of source ``preemption`` that no restart or
same-error limit counts) and resumes when the market allows; with it off
(``--fault-tolerant-policy=Never``) the job fails. Cost is accrued from the
observed prices: market price x time held per instance, against on-demand.

Market observations arrive as ``MarketUpdate`` events; nothing here polls.
"""

from __future__ import annotations

import msgspec

from trainwarden.engine.decide import apply, make_decision
from trainwarden.engine.state import JobState, SpotPhase, SpotState
from trainwarden.events import (
    Decision,
    DecisionKind,
    ErrorSource,
    JobSubmitted,
    MarketUpdate,
    Offer,
    Reason,
    SpotBid,
    SpotCost,
)
from trainwarden.settings import FaultTolerantPolicy

LIFECYCLE = frozenset({DecisionKind.QUEUE_JOB, DecisionKind.START_JOB, DecisionKind.REQUEUE,
                       DecisionKind.RESUME_JOB, DecisionKind.COMPLETE_JOB, DecisionKind.FAIL_JOB})
SECONDS_PER_HOUR = 3600.0
# The state a spot job is in after each lifecycle decision.
SPOT_STATES = {
    DecisionKind.QUEUE_JOB: "queued", DecisionKind.START_JOB: "running", DecisionKind.REQUEUE: "requeued",
    DecisionKind.RESUME_JOB: "running", DecisionKind.COMPLETE_JOB: "succeeded", DecisionKind.FAIL_JOB: "failed",
}


def new_spot_state(state: JobState, event: JobSubmitted, now: float) -> SpotState:
    return SpotState(bids=event.spot, since=now, spec=event.spec, instances=event.instances, args=event.args,
                     fault_tolerant=state.settings.fault_tolerant_policy is not FaultTolerantPolicy.NEVER)


def queued(state: JobState) -> bool:
    """A spot job waiting in the bidding queue: it runs nothing anywhere."""
    return state.spot is not None and state.spot.phase is SpotPhase.QUEUED


def queue_decision(state: JobState, now: float, detected_at: float) -> Decision:
    roles = ", ".join(f"{b.role}: {b.count} x {b.instance_type}" for b in state.spot.bids)
    return make_decision(state, DecisionKind.QUEUE_JOB, Reason.SPOT_QUEUED, "spot_queue", now,
                         fault_key=("queue",), message=f"waiting in the bidding queue ({roles})",
                         detected_at=detected_at)


def bid_limit(bid: SpotBid, offer: Offer) -> float:
    if bid.price_limit is not None:
        return bid.price_limit
    return round(bid.discount * offer.on_demand, 9)


def shortfall(spot: SpotState) -> tuple[str, float]:
    """Why the job may not hold its instances now ("" if it may), and the
    longest release notice among the offers concerned."""
    notice = 0.0
    for bid in spot.bids:
        offer = spot.offers.get(bid.instance_type)
        if offer is None:
            return f"{bid.role}: no market data for {bid.instance_type}", 0.0
        notice = max(notice, offer.notice_s)
        basis, price = ("average", offer.average_price) if bid.compare_average and offer.average_price > 0 \
            else ("market", offer.price)
        limit = bid_limit(bid, offer)
        if limit < price:
            return (f"{bid.role}: bid {limit:g} is below the {basis} price {price:g} of {bid.instance_type}",
                    offer.notice_s)
        if offer.stock < bid.count:
            return (f"{bid.role}: stock of {bid.instance_type} is {offer.stock}, short of {bid.count}",
                    offer.notice_s)
    return "", notice


def accrue(spot: SpotState, now: float) -> None:
    """Bill the time since the last accrual at the prices in force during it."""
    elapsed = now - spot.since
    if elapsed <= 0:
        return
    spot.since = now
    if spot.phase is SpotPhase.QUEUED:
        spot.queued_s += elapsed
    elif spot.phase is SpotPhase.RUNNING:
        spot.held_s += elapsed
        hours = elapsed / SECONDS_PER_HOUR
        for bid in spot.bids:
            offer = spot.offers.get(bid.instance_type)
            if offer is not None:
                spot.paid += offer.price * bid.count * hours
                spot.on_demand += offer.on_demand * bid.count * hours


def cost(spot: SpotState) -> SpotCost:
    return SpotCost(paid=round(spot.paid, 6), on_demand=round(spot.on_demand, 6), held_s=round(spot.held_s, 3),
                    queued_s=round(spot.queued_s, 3), preemptions=spot.preemptions, resumes=spot.resumes)


def settle(state: JobState, decisions: list[Decision], now: float) -> list[Decision]:
    """Apply the decisions of a spot job, each lifecycle one carrying the
    cost as of its own effect (a requeue counts itself)."""
    spot = state.spot
    accrue(spot, now)
    out = []
    for decision in decisions:
        apply(state, decision)
        if decision.kind in LIFECYCLE:
            decision = msgspec.structs.replace(decision, cost=cost(spot))
        out.append(decision)
    return out


def on_market(state: JobState, event: MarketUpdate, now: float) -> list[Decision]:
    spot = state.spot
    if spot is None or spot.phase is SpotPhase.DONE:
        return []
    accrue(spot, now)  # the time up to now is billed at the prices it had
    for offer in event.offers:
        spot.offers[offer.instance_type] = offer
    why, notice = shortfall(spot)
    if spot.phase is SpotPhase.QUEUED and not why:
        if not spot.started:
            decision = make_decision(state, DecisionKind.START_JOB, Reason.BID_ACCEPTED, "spot_bid_accepted", now,
                                     fault_key=("start",), detected_at=event.time, message=_granted(spot))
            return [msgspec.structs.replace(decision, spec=spot.spec, instances=spot.instances,
                                            args=spot.args)]
        return [make_decision(state, DecisionKind.RESUME_JOB, Reason.BID_ACCEPTED, "spot_resume", now,
                              fault_key=("resume", state.round), detected_at=event.time,
                              message=_granted(spot))]
    if spot.phase is SpotPhase.RUNNING and why:
        return [preempted(state, why, notice, now, event.time)]
    return []


def preempted(state: JobState, why: str, notice: float, now: float, detected_at: float) -> Decision:
    spot = state.spot
    how = f"with {notice:g} s notice" if notice > 0 else "without notice"
    if spot.fault_tolerant:
        kind, rule, then = DecisionKind.REQUEUE, "spot_requeue", "back to the bidding queue"
    else:
        kind, rule, then = DecisionKind.FAIL_JOB, "spot_preempted_no_fault_tolerance", \
            "the job fails (fault tolerance is off: --fault-tolerant-policy=Never)"
    message = f"preempted: {why}; instances released {how}; {then}"
    decision = make_decision(state, kind, Reason.PREEMPTED, rule, now, fault_key=("preempt", state.round),
                             source=ErrorSource.PREEMPTION, message=message, category="preemption",
                             signature="preemption", detected_at=detected_at)
    return msgspec.structs.replace(decision, notice_s=notice)


def _granted(spot: SpotState) -> str:
    parts = []
    for bid in spot.bids:
        offer = spot.offers[bid.instance_type]
        parts.append(f"{bid.role}: {bid.count} x {bid.instance_type} at {offer.price:g} (bid {bid_limit(bid, offer):g})")
    return "bid accepted: " + "; ".join(parts)


