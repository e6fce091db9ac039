"""The one service loop: an iteration that fails is reported and paused
after, and the pause grows only while iterations keep failing; a service
with timers is ticked every TICK_S, after the item in hand, and never waits
for input past its next tick."""

from trainwarden.services import loop


class _Flaky:
    """Fails on the iterations listed; stops the loop after ``iterations``."""

    def __init__(self, failing: set[int], iterations: int):
        self.failing = failing
        self.iterations = iterations
        self.calls = 0
        self.closed = False
        self.counters = type("Counters", (), {})()

    def run_once(self) -> None:
        self.calls += 1
        if self.calls in self.failing:
            raise RuntimeError(f"iteration {self.calls}")

    def close(self) -> None:
        self.closed = True


def _serve(service, monkeypatch) -> tuple[list[float], list[tuple[str, str]]]:
    pauses: list[float] = []
    said: list[tuple[str, str]] = []
    monkeypatch.setattr(loop, "_pause", lambda seconds, stopping: pauses.append(seconds))
    loop.serve(service, lambda: service.calls >= service.iterations, lambda level, text: said.append((level, text)))
    return pauses, said


def test_the_pause_after_a_failed_iteration_starts_small_again_once_an_iteration_succeeds(monkeypatch):
    service = _Flaky(failing={1, 2, 3, 5}, iterations=6)
    pauses, said = _serve(service, monkeypatch)
    assert pauses == [0.5, 1.0, 1.5, 0.5]
    assert [text for level, text in said if level == "error"][-1].endswith("(error 4; continuing)")
    assert service.closed


def test_the_pause_never_exceeds_30_seconds_however_long_iterations_keep_failing(monkeypatch):
    service = _Flaky(failing=set(range(1, 101)), iterations=100)
    pauses, _ = _serve(service, monkeypatch)
    assert max(pauses) == 30.0 and len(pauses) == 100


class _Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class _Timed:
    """A service with timers on a pinned clock. An iteration with input
    waiting works on one item for ``work_s``; without, it waits out the
    whole wait it is given (nothing comes)."""

    def __init__(self, clock: _Clock, items: int = 0, work_s: float = 0.0, failing_ticks: int = 0):
        self.clock = clock
        self.items = items
        self.work_s = work_s
        self.failing_ticks = failing_ticks
        self.waits: list[float] = []
        self.ticks: list[float] = []
        self.taken: list[float] = []  # when each item was taken
        self.counters = type("Counters", (), {})()

    def run_once(self, timeout_s: float) -> None:
        self.waits.append(timeout_s)
        if self.items:
            self.items -= 1
            self.clock.now += self.work_s
            self.taken.append(self.clock.now)
        else:
            self.clock.now += timeout_s

    def tick(self) -> None:
        if self.failing_ticks:
            self.failing_ticks -= 1
            raise RuntimeError("a tick failed")
        self.ticks.append(self.clock.now)

    def close(self) -> None:
        pass


def test_a_quiet_service_with_timers_is_ticked_every_tick_period_and_waits_for_input_until_the_next_tick():
    clock = _Clock()
    start = clock.now
    service = _Timed(clock)
    turns = loop.ServiceLoop(service, clock)
    turns.until(lambda: clock.now - start >= 10 * loop.TICK_S - 1e-9)
    assert [round(t - start, 6) for t in service.ticks] == [round(loop.TICK_S * n, 6) for n in range(1, 11)]
    assert all(0.0 <= wait <= loop.TICK_S + 1e-6 for wait in service.waits)


def test_a_busy_service_with_timers_is_ticked_after_the_item_in_hand_and_at_most_one_item_late():
    clock = _Clock()
    start = clock.now
    service = _Timed(clock, items=100, work_s=0.07)
    loop.ServiceLoop(service, clock).until(lambda: service.items == 0)
    # A full period of input between two ticks, and a tick once an item taken makes one due.
    assert len(service.ticks) >= 7 // (loop.TICK_S + 0.07)
    due = start + loop.TICK_S
    for tick in service.ticks:
        assert due - 1e-6 <= tick < due + 0.07 + 1e-6, (tick - start, due - start)
        assert tick in service.taken  # right after an item, never in the middle of one
        due = tick + loop.TICK_S


def test_serve_ticks_a_service_with_timers_and_a_failed_tick_is_reported_and_tried_again(monkeypatch):
    clock = _Clock()
    service = _Timed(clock, failing_ticks=1)
    said: list[tuple[str, str]] = []
    monkeypatch.setattr(loop, "_pause", lambda seconds, stopping: None)
    loop.serve(service, lambda: len(service.ticks) >= 3, lambda level, text: said.append((level, text)),
               clock=clock)
    assert [text for level, text in said if level == "error"] == [
        "internal error RuntimeError('a tick failed') (error 1; continuing)"]
    # The failed tick is due still: the next iteration waits for nothing and ticks.
    assert service.waits[1] == 0.0 and len(service.ticks) == 3


def test_a_service_without_timers_is_given_no_wait_and_never_ticked():
    service = _Flaky(failing=set(), iterations=3)
    turns = loop.ServiceLoop(service)
    assert not turns.ticking
    turns.until(lambda: service.calls >= service.iterations)
    assert service.calls == 3
