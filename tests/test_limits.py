"""An error quotes at most a short prefix of what it refuses, whatever that
is: a string, a list of a million items, a nested mapping, a huge number."""

from trainwarden.limits import quote, size


def test_a_short_value_is_quoted_whole_as_python_shows_it():
    assert quote("--flag") == "'--flag'"
    assert quote([1, "a"]) == "[1, 'a']"
    assert quote({"k": [True, None]}) == "{'k': [True, None]}"


def test_a_long_string_is_quoted_by_its_first_80_characters_then_dots():
    assert quote("x" * 1_000_000) == "'" + "x" * 80 + "'..."


def test_a_huge_list_or_mapping_is_quoted_in_bounded_text_without_building_its_whole_repr():
    assert len(quote(list(range(1_000_000)))) <= 83
    assert len(quote({f"key-{i}": ["v" * 1000] * 1000 for i in range(1000)})) <= 83
    assert quote([[[[["deep"]]]]]) == "[[[[...]]]]"
    assert quote(10 ** 5000) == "a number of more than 81 digits"


def test_sizes_read_as_people_write_them():
    assert [size(n) for n in (900, 256 * 1024, 4 * 1024 * 1024, 5_557_000)] == ["900 bytes", "256 KiB", "4 MiB",
                                                                                 "5.3 MiB"]
