"""A document nested deeper than the parser's recursion, in flow or in block
style, is refused naming its file and the deepest line, never a crash."""

from trainwarden.yamlsrc import ConfigError, load_yaml

import pytest


def test_block_nesting_deeper_than_the_parser_can_follow_is_refused_naming_the_deepest_line():
    text = "".join(f"{'  ' * depth}k{depth}:\n" for depth in range(2000)) + f"{'  ' * 2000}leaf\n"
    with pytest.raises(ConfigError, match=r"deep\.yaml:2001: nested too deeply to read"):
        load_yaml(text, "deep.yaml")


def test_json_style_nesting_in_a_yaml_file_is_refused_the_same_way():
    with pytest.raises(ConfigError, match=r"deep\.json:2: nested too deeply to read"):
        load_yaml('{"a": 1,\n "b": ' + "[" * 5000 + "]" * 5000 + "}\n", "deep.json")


def test_ordinary_nesting_still_parses():
    assert load_yaml("a: [[1, [2]], {b: {c: [3]}}]\n") == {"a": [[1, [2]], {"b": {"c": [3]}}]}
