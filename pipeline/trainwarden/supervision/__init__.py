"""One supervision core for every place a job runs.

``intake`` is the deciding half (pure): every input of a job -- output lines,
exits, SDK requests, diagnostic lines -- goes through one guarded engine step
and comes out as decisions plus the history rows to keep. ``acting`` is the
acting half: stack report before a hang's stop, the actuator, job records and
notifications. ``trainwarden run`` runs both halves in one loop; on a cluster
the processor runs the first and the actuator service the second.
"""
