"""The engine on a virtual clock: nothing runs and nothing sleeps.

``cluster`` plays the runtime's part (instances start when asked, decisions
take effect at once, time moves only when the caller says so); the rule unit
tests (``rule_tests``, ``trainwarden rules test``) and the spot simulator
(``spot_job``, ``trainwarden simulate``) drive it. It stands above the engine,
the rules, the spot market and the job file that it puts together.
"""
