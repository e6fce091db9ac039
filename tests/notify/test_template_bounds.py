"""A subscription's template cannot compute without bound: each bomb is
refused at once, naming the file and line, and ordinary templates render."""

import time

import pytest

from trainwarden.notify.events import sample_event
from trainwarden.notify.templates import RenderError, TemplateSet

BOMBS = {
    "power": "{{ 9 ** (9 ** 9) }}",
    "repeated string": "{{ 'a' * 100000000 }}",
    "repeated list": "{{ [1] * 100000000 }}",
    "nested ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "doubling": "{% set a = 'a' * 200000 %}{% set a = a + a %}{{ a }}",
    "padding": "{{ 'x' | center(1000000000) }}",
    "printf width": "{{ '%0999999999d' % 1 }}",
    "format width": "{{ '{:>99999999}'.format(1) }}",
    "replacements": "{{ 'a'" + "|replace('a', 'aaaa')" * 12 + " }}",
}


@pytest.mark.parametrize("source", BOMBS.values(), ids=BOMBS.keys())
def test_a_template_bomb_is_refused_at_once_naming_the_file_and_line(source):
    template = TemplateSet([]).inline_template("bomb", source, "subs.yaml", 7)
    started = time.monotonic()
    with pytest.raises(RenderError, match=r"^subs\.yaml:7: .*SecurityError: .*may not make values that large"):
        template.render(sample_event("job.failed").payload(0, 0.0), "ops")
    assert time.monotonic() - started < 1.0


def test_ordinary_arithmetic_loops_and_filters_still_render():
    source = ("{{ 2 ** 10 }} {{ 'ab' * 3 }} {{ range(3) | list }} {{ 'x' | center(5) }} {{ '%05d' % 42 }}"
              "{% for i in range(3) %}{% for j in range(3) %}.{% endfor %}{% endfor %}")
    template = TemplateSet([]).inline_template("fine", source, "subs.yaml", 1)
    assert template.render(sample_event("job.failed").payload(0, 0.0), "ops") == \
        "1024 ababab [0, 1, 2]   x   00042........."
