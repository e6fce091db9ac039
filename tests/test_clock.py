"""clock.py on pinned wall and monotonic clocks: a wall-clock step is
logged once, with its size, and the time handed out never jumps."""

import pytest

from trainwarden import clock
from trainwarden.clock import StepWatch

WALL0 = 1_800_000_000.0


class Clocks:
    def __init__(self):
        self.wall_s = WALL0
        self.mono_s = 100.0
        self.said: list[str] = []

    def advance(self, seconds: float) -> None:
        self.wall_s += seconds
        self.mono_s += seconds

    def watch(self) -> StepWatch:
        return StepWatch(wall=lambda: self.wall_s, mono=lambda: self.mono_s, say=self.said.append)


def test_a_forward_step_of_the_wall_clock_is_logged_once_with_its_size_and_time_does_not_jump():
    clocks = Clocks()
    watch = clocks.watch()
    clocks.advance(5.0)
    assert watch.now() == WALL0 + 5.0 and clocks.said == []
    clocks.wall_s += 3600.0  # NTP steps the wall clock an hour forward
    clocks.advance(1.0)
    assert watch.now() == WALL0 + 6.0  # our time went on by the monotonic clock alone
    [said] = clocks.said
    assert said.startswith("the wall clock stepped +3600.0 s") and "3600.0 s behind the wall clock" in said
    for _ in range(5):
        clocks.advance(1.0)
        watch.now()
    assert len(clocks.said) == 1 and watch.steps == 1 and watch.offset == 3600.0


def test_a_backward_step_and_then_another_are_each_logged_once():
    clocks = Clocks()
    watch = clocks.watch()
    clocks.wall_s -= 4.0
    clocks.advance(1.0)
    assert watch.now() == WALL0 + 1.0
    clocks.wall_s += 10.0
    clocks.advance(1.0)
    watch.now()
    assert [line.split(" (")[0] for line in clocks.said] == ["the wall clock stepped -4.0 s",
                                                            "the wall clock stepped +10.0 s"]
    assert "6.0 s behind the wall clock" in clocks.said[1]


def test_a_slew_under_a_second_is_not_a_step_and_checks_are_at_most_once_a_second():
    clocks = Clocks()
    watch = clocks.watch()
    clocks.wall_s += 0.4
    clocks.advance(1.0)
    watch.now()
    clocks.wall_s += 50.0  # within the second since the last check: noticed at the next
    clocks.advance(0.5)
    watch.now()
    assert clocks.said == []
    clocks.advance(0.5)
    watch.now()
    assert len(clocks.said) == 1 and "+50.0 s" in clocks.said[0] and watch.offset == pytest.approx(50.4)


def test_the_process_clock_is_a_step_watch_on_the_real_clocks():
    first = clock.now()
    assert clock.now() >= first and clock.wall_offset() == clock._watch.offset
