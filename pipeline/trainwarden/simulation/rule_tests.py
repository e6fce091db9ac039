"""Rule unit tests, in the spirit of ``promtool test rules``.

A test file lists tests; each gives a job (arguments string and roles), a
timeline of input events at whole or fractional seconds, and the decisions
expected at given seconds. The job runs on a VirtualCluster with a tick every
``tick`` seconds; every decision the engine takes must be expected, and every
expected decision must happen: an empty ``expect`` asserts silence.

    rule_files: ..            # optional: rules directory, relative to this file
    tick: 1
    tests:
      - name: silence over the interval restarts a sync job
        args: --enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=60
        roles: {worker: 2}
        until: 130
        events:
          - {at: 10, log: worker-0, text: "step 1"}
          - {at: 20, sdk: worker-1, hang_interval: 180}
          - {at: 25, sdk: worker-0, progress: 100}     # report_progress(100)
          - {at: 30, exit: worker-1, code: 1, tail: ["RuntimeError: NCCL error"]}
          - {at: 31, exit: worker-0, code: 143, stale: true}   # from before the restart
        expect:
          - {at: 70, action: restart_job, reason: job_hang}
        outcome: running

A spot job names its bid (for every role) and plays market observations:

        spot: {instance_type: ecs.g7.xlarge, on_demand: 1.2, discount: 0.5}   # or price_limit: 0.6
        events:
          - {at: 0, market: 0.3, stock: 8}        # price per instance-hour; notice_s, average_price optional
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from trainwarden.events import DecisionKind, Offer, SdkOp, SpotBid
from trainwarden.rules.loader import load_rules
from trainwarden.rules.model import RulePack
from trainwarden.simulation.cluster import VirtualCluster, instance_specs
from trainwarden.spot.spec import valid_discount
from trainwarden.yamlsrc import ConfigError, Fields, load_yaml_file

EXPECT_KEYS = ("action", "reason", "rule", "instance", "error_source", "category", "error_code", "verdict",
               "consequences")
EVENT_KINDS = ("log", "exit", "sdk", "node_lost", "c4d", "market", "preempted")
# Not faults: compared only when a test asks for them.
_LIFECYCLE = (DecisionKind.COMPLETE_JOB, DecisionKind.START_JOB, DecisionKind.QUEUE_JOB, DecisionKind.RESUME_JOB)


@dataclasses.dataclass(frozen=True)
class TimelineEvent:
    at: float
    kind: str  # log, exit, sdk
    instance: str
    fields: dict
    line: int


@dataclasses.dataclass(frozen=True)
class Expectation:
    at: float
    match: dict  # key -> expected string
    line: int

    def describe(self) -> str:
        return f"at {self.at:g}: " + ", ".join(f"{k}={v}" for k, v in self.match.items())


@dataclasses.dataclass(frozen=True)
class RuleTest:
    name: str
    args: str
    framework: str
    roles: tuple[tuple[str, int], ...]
    events: tuple[TimelineEvent, ...]
    expect: tuple[Expectation, ...]
    until: float
    outcome: Optional[str]
    line: int
    spot: Optional[dict] = None  # instance_type, on_demand, discount or price_limit, compare_average


@dataclasses.dataclass(frozen=True)
class TestFile:
    path: Path
    rules_dir: Optional[Path]
    tick: float
    tests: tuple[RuleTest, ...]


@dataclasses.dataclass
class TestResult:
    file: Path
    name: str
    passed: bool
    problems: list


def parse_test_file(path: str | Path) -> TestFile:
    path = Path(path)
    top = Fields(load_yaml_file(path), path, "a rule test file")
    rule_files = top.get("rule_files", str, None)
    tick = float(top.get("tick", (int, float), 1))
    if tick <= 0:
        raise top.error("tick", "'tick' must be positive")
    raw_tests = top.get("tests", list)
    tests = tuple(_parse_test(Fields(t, path, "a test", raw_tests.line_of(i)), tick)
                  for i, t in enumerate(raw_tests))
    top.done()
    rules_dir = (path.parent / rule_files).resolve() if rule_files else None
    return TestFile(path=path, rules_dir=rules_dir, tick=tick, tests=tests)


def _parse_test(fields: Fields, tick: float) -> RuleTest:
    roles_raw = fields.get("roles", dict, {"worker": 1})
    roles = []
    for role, count in roles_raw.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise fields.error("roles", f"role {role!r} needs a positive instance count, not {count!r}")
        roles.append((str(role), count))
    events = tuple(_parse_event(fields.path, e, fields.get("events", list, []).line_of(i))
                   for i, e in enumerate(fields.get("events", list, [])))
    expect_raw = fields.get("expect", list, [])
    expect = tuple(_parse_expect(fields.path, e, expect_raw.line_of(i)) for i, e in enumerate(expect_raw))
    latest = max([e.at for e in events] + [x.at for x in expect] + [0.0])
    until = float(fields.get("until", (int, float), latest + tick))
    outcome = fields.get("outcome", str, None)
    if outcome not in (None, "running", "succeeded", "failed"):
        raise fields.error("outcome", "'outcome' must be running, succeeded or failed")
    test = RuleTest(
        name=fields.get("name", str),
        args=fields.get("args", str, ""),
        framework=fields.get("framework", str, "pytorch"),
        roles=tuple(roles),
        events=tuple(sorted(events, key=lambda e: e.at)),
        expect=expect,
        until=until,
        outcome=outcome,
        line=fields.line(),
        spot=_parse_spot(fields),
    )
    fields.done()
    return test


def _parse_spot(fields: Fields) -> Optional[dict]:
    raw = fields.get("spot", dict, None)
    if raw is None:
        return None
    spot = Fields(raw, fields.path, "a test's spot bid", fields.line("spot"),
                  known=("instance_type", "on_demand", "discount", "price_limit", "compare_average"))
    bid = {"instance_type": spot.get("instance_type", str, "spot-type"),
           "on_demand": float(spot.get("on_demand", (int, float))),
           "discount": spot.get("discount", (int, float), None),
           "price_limit": spot.get("price_limit", (int, float), None),
           "compare_average": spot.get("compare_average", bool, False)}
    if (bid["discount"] is None) == (bid["price_limit"] is None):
        raise spot.error(None, "a spot bid needs exactly one of: discount, price_limit")
    if bid["discount"] is not None and not valid_discount(float(bid["discount"])):
        raise spot.error("discount", f"'discount' must be 0.1 to 0.9 in steps of 0.1, not {bid['discount']}")
    return bid


def _parse_event(path: Path, raw: Any, line: int) -> TimelineEvent:
    fields = Fields(raw, path, "an event", line)
    at = float(fields.get("at", (int, float)))
    kinds = [k for k in EVENT_KINDS if k in fields.mapping]
    if len(kinds) != 1:
        raise fields.error(None, "an event needs exactly one of: log, exit, sdk (naming the instance), "
                                 "node_lost (naming an instance on the lost node), c4d (naming an instance), "
                                 "market (a price), preempted (the scheduler's reason)")
    kind = kinds[0]
    extra: dict = {}
    instance = "" if kind in ("market", "preempted") else fields.get(kind, str)
    if kind == "preempted":
        extra["reason"] = fields.get("preempted", str)
    elif kind == "market":
        extra["price"] = float(fields.get("market", (int, float)))
        extra["stock"] = fields.get("stock", int, 1_000_000)
        extra["average_price"] = float(fields.get("average_price", (int, float), 0))
        extra["notice_s"] = float(fields.get("notice_s", (int, float), 0))
    elif kind == "node_lost":
        pass
    elif kind == "c4d":
        extra["kind"] = fields.get("kind", str, "RankCommHang")
        extra["level"] = fields.get("level", str, "Error")
    elif kind == "log":
        extra["text"] = fields.get("text", str)
    elif kind == "exit":
        extra["code"] = fields.get("code", int)
        extra["tail"] = [str(x) for x in fields.get("tail", list, [])]
        # From the incarnation before the current one (e.g. a process being stopped).
        extra["stale"] = fields.get("stale", bool, False)
    else:
        ops = [k for k in ("message", "keywords", "hang_interval", "progress") if k in fields.mapping]
        if len(ops) != 1:
            raise fields.error(None, "an sdk event needs exactly one of: message, keywords, hang_interval, progress")
        op = ops[0]
        if op == "message":
            extra["message"] = fields.get("message", str)
        elif op == "keywords":
            extra["keywords"] = tuple(str(k) for k in fields.get("keywords", list))
        elif op == "progress":
            step = fields.get("progress", int)
            if isinstance(step, bool) or step < 0:
                raise fields.error("progress", "'progress' is the step the job reports: an integer from 0")
            extra["progress"] = step
        else:
            value = fields.get("hang_interval", (int, str))
            if isinstance(value, str) and value != "default":
                raise fields.error("hang_interval", "'hang_interval' is seconds, -1 (off) or 'default'")
            extra["hang_interval"] = None if value == "default" else value
    fields.done()
    return TimelineEvent(at=at, kind=kind, instance=instance, fields=extra, line=fields.line())


def _parse_expect(path: Path, raw: Any, line: int) -> Expectation:
    fields = Fields(raw, path, "an expectation", line)
    at = float(fields.get("at", (int, float)))
    match = {}
    for key in EXPECT_KEYS:
        value = fields.get(key, (str, int), None)
        if value is not None:
            match[key] = str(value)
    if "action" not in match:
        raise fields.error(None, "an expectation needs 'action'")
    valid = {k.value for k in DecisionKind}
    if match["action"] not in valid:
        raise fields.error("action", f"'action' must be one of {', '.join(sorted(valid))}")
    fields.done()
    return Expectation(at=at, match=match, line=fields.line())


# ------------------------------------------------------------------ run


def run_test(test: RuleTest, pack: RulePack, tick: float) -> list[str]:
    spot = test.spot
    bids = () if spot is None else tuple(
        SpotBid(role=role, instance_type=spot["instance_type"], count=count, discount=spot["discount"],
                price_limit=spot["price_limit"], compare_average=spot["compare_average"])
        for role, count in test.roles)
    cluster = VirtualCluster(pack, job_id=f"ruletest-{test.line}", args=test.args,
                             instances=instance_specs(test.roles), framework=test.framework, spot=bids)
    problems: list[str] = []
    pending = list(test.events)
    now = 0.0
    while now <= test.until + 1e-9:
        while pending and pending[0].at <= now + 1e-9:
            event = pending.pop(0)
            cluster.advance(event.at)
            problem = _play(cluster, event, spot)
            if problem:
                problems.append(problem)
        cluster.advance(now)
        cluster.tick()
        now = round(now + tick, 9)
    problems.extend(_compare(test.expect, cluster))
    if test.outcome is not None:
        actual = cluster.state.status.value
        if actual != test.outcome:
            problems.append(f"outcome: expected {test.outcome}, got {actual}")
    return problems


def _play(cluster: VirtualCluster, event: TimelineEvent, spot: Optional[dict] = None) -> str:
    if event.kind == "market":
        if spot is None:
            return f"line {event.line}: a market event needs the test's 'spot' bid"
        f = event.fields
        if not cluster.state.finished:
            cluster.market((Offer(instance_type=spot["instance_type"], price=f["price"], stock=f["stock"],
                                  on_demand=spot["on_demand"], average_price=f["average_price"],
                                  notice_s=f["notice_s"]),))
        return ""
    if event.kind == "preempted":
        if not cluster.state.finished:
            cluster.preempted(event.fields["reason"])
        return ""
    if event.instance not in cluster.state.instances:
        return f"line {event.line}: no instance {event.instance!r} in this job"
    if cluster.state.finished:
        return ""
    f = event.fields
    if event.kind == "node_lost":
        cluster.node_lost(event.instance)
    elif event.kind == "c4d":
        cluster.c4d(event.instance, f["kind"], f["level"])
    elif event.kind == "log":
        cluster.log(event.instance, f["text"])
    elif event.kind == "exit":
        cluster.exit(event.instance, f["code"], f["tail"], stale=f["stale"])
    elif "message" in f:
        cluster.sdk(event.instance, SdkOp.CUSTOM_MESSAGE, content=f["message"])
    elif "keywords" in f:
        cluster.sdk(event.instance, SdkOp.SET_RETRYABLE_ERRORS, keywords=f["keywords"])
    elif "progress" in f:
        cluster.sdk(event.instance, SdkOp.REPORT_PROGRESS, step=f["progress"])
    else:
        cluster.sdk(event.instance, SdkOp.SET_HANG_INTERVAL, interval=f["hang_interval"])
    return ""


def _actual_fields(decision) -> dict:
    return {
        "action": decision.kind.value,
        "reason": decision.reason.value,
        "rule": decision.rule,
        "instance": decision.instance,
        "error_source": decision.error_source.value if decision.error_source else "",
        "category": decision.category,
        "error_code": str(decision.error_code),
        "verdict": decision.verdict,
        # "worker-0: connection_lost; worker-2: connection_lost"
        "consequences": "; ".join(decision.consequences),
    }


def _compare(expected: tuple[Expectation, ...], cluster: VirtualCluster) -> list[str]:
    # Starting and completing are not faults: compared only when a test asks for them.
    asked = {e.match["action"] for e in expected}
    actual = [(td.at, _actual_fields(td.decision)) for td in cluster.decisions
              if td.decision.kind not in _LIFECYCLE or td.decision.kind.value in asked]
    unmatched = list(actual)
    problems = []
    for exp in expected:
        for index, (at, fields) in enumerate(unmatched):
            if abs(at - exp.at) < 1e-6 and all(fields[k] == v for k, v in exp.match.items()):
                unmatched.pop(index)
                break
        else:
            problems.append(f"line {exp.line}: expected {exp.describe()}; got " + (
                "; ".join(_describe(a, f) for a, f in actual) or "no decisions"))
    for at, fields in unmatched:
        problems.append(f"unexpected decision {_describe(at, fields)}")
    return problems


def _describe(at: float, fields: dict) -> str:
    shown = {k: fields[k] for k in ("action", "reason", "rule", "instance") if fields[k]}
    return f"at {at:g}: " + ", ".join(f"{k}={v}" for k, v in shown.items())


def run_files(paths: list[Path], rules_dir: Optional[Path] = None) -> list[TestResult]:
    results = []
    packs: dict[Optional[Path], RulePack] = {}
    for path in paths:
        test_file = parse_test_file(path)
        directory = rules_dir or test_file.rules_dir
        if directory not in packs:
            packs[directory] = load_rules(directory)
        for test in test_file.tests:
            try:
                problems = run_test(test, packs[directory], test_file.tick)
            except ConfigError:
                raise
            results.append(TestResult(path, test.name, not problems, problems))
    return results
