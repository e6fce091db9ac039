"""Spot (preemptible) capacity: bids in job files, market providers.

The lifecycle itself (queue, preemption, requeue, resume, cost) is decided by
the pure engine (``pipeline/trainwarden/engine/spot.py``) from ``MarketUpdate`` events.
"""
