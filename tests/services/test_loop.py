"""The one service loop: an iteration that fails is reported and paused
after, and the pause grows only while iterations keep failing."""

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
