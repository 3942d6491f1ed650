"""The shared checks of JSON fields (``scaledl.json_fields``) on their own:
values shown short and safely, and each check's verdict and message."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from scaledl.json_fields import (
    SHOWN_CHARS, integer, is_duration, is_number, is_object, is_whole, json_list, json_object,
    number, shown, string)


@pytest.fixture
def digit_limit() -> Iterator[None]:
    """Python's limit on the digits of an integer's text (3.11; 0 turns it off), at its
    default, so a 5000-digit integer cannot be written whatever the environment says."""
    if not hasattr(sys, "set_int_max_str_digits"):
        pytest.skip("this Python has no limit on an integer's digits")
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(4300)
    yield
    sys.set_int_max_str_digits(before)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value,expected", [
    ("cpu", '"cpu"'),
    (None, "null"),
    (math.nan, "NaN"),
    (math.inf, "Infinity"),
    ([3, -1], "[3, -1]"),
])
def test_shown_is_the_json_text(value: object, expected: str) -> None:
    assert shown(value) == expected


@pytest.mark.parametrize("value,expected", [
    ("x", "'x'"), (None, "None"), (math.nan, "nan"), (-math.inf, "-inf")])
def test_shown_can_be_pythons_repr(value: object, expected: str) -> None:
    assert shown(value, repr) == expected


@pytest.mark.parametrize("value", [
    "x" * 10_000, list(range(10_000)), 10 ** 400, {"a": {"b": ["c" * 100]}}],
    ids=["string", "list", "huge-integer", "nested"])
@pytest.mark.parametrize("text", [repr, None], ids=["repr", "json"])
def test_a_long_value_is_cut_to_one_short_line(value: object, text: Any) -> None:
    line = shown(value) if text is None else shown(value, text)
    assert len(line) == SHOWN_CHARS and line.endswith("...") and "\n" not in line


@pytest.mark.parametrize("value,expected", [
    (b"\x89PNG", "<bytes>"),
    (_nested(100_000), "<list>"),
    ({1, 2}, "<set>"),
], ids=["binary", "nested-too-deeply", "set"])
def test_a_value_json_cannot_write_is_shown_by_its_type(value: object, expected: str) -> None:
    assert shown(value) == expected


@pytest.mark.usefixtures("digit_limit")
def test_an_integer_of_too_many_digits_is_shown_by_its_type() -> None:
    assert shown(10 ** 5000) == "<int>" and shown(10 ** 5000, repr) == "<int>"


def test_repr_of_binary_is_safe() -> None:
    assert shown(b"\x89PNG", repr) == "b'\\x89PNG'"


@pytest.mark.parametrize("value,number_,whole,duration", [
    (1, True, True, True),
    (0, True, True, False),
    (2.5, True, False, True),
    (-1.0, True, False, False),
    (math.nan, True, False, False),
    (math.inf, True, False, False),
    (10 ** 400, True, True, False),  # beyond any float
    (True, False, False, False),
    ("1", False, False, False),
    (None, False, False, False),
])
def test_predicates(value: object, number_: bool, whole: bool, duration: bool) -> None:
    assert is_number(value) is number_
    assert is_whole(value) is whole
    assert is_duration(value) is duration


def test_is_object_is_a_dict_only() -> None:
    assert is_object({}) and is_object({"a": 1})
    assert not any(is_object(v) for v in ([], "x", None, 1))


def test_number_is_finite_and_at_least_zero() -> None:
    assert number(0, "x") == 0.0 and number(2, "x") == 2.0 and number(0.5, "x") == 0.5
    with pytest.raises(ValueError, match=r'^jitter_cv "x" must be a number$'):
        number("x", "jitter_cv")
    with pytest.raises(ValueError, match=r"^x true must be a number$"):
        number(True, "x")
    for bad, text in ((math.nan, "NaN"), (math.inf, "Infinity"), (-1, "-1")):
        with pytest.raises(ValueError, match=f"^x {text} must be a finite number >= 0$"):
            number(bad, "x")
    with pytest.raises(ValueError, match=r"^interference 1000.*\.\.\. must be a finite number"):
        number(10 ** 400, "interference")


def test_integer_has_a_minimum_and_is_no_boolean() -> None:
    assert integer(3, "n") == 3 and integer(0, "n") == 0
    with pytest.raises(ValueError, match=r"^num_classes 0 must be an integer >= 1$"):
        integer(0, "num_classes", 1)
    with pytest.raises(ValueError, match=r"^batch 2.5 must be an integer >= 1$"):
        integer(2.5, "batch", 1)
    with pytest.raises(ValueError, match=r"^n false must be an integer >= 0$"):
        integer(False, "n")


def test_json_list_checks_the_count_when_given() -> None:
    assert json_list([1, 2], "a") == [1, 2] and json_list([1], "a", 1) == [1]
    with pytest.raises(ValueError, match=r"^activation_bytes must be a list of 2$"):
        json_list([1], "activation_bytes", 2)
    with pytest.raises(ValueError, match=r"^modules must be a list$"):
        json_list({"a": 1}, "modules")


def test_string_and_object() -> None:
    assert string("lenet", "model") == "lenet"
    with pytest.raises(ValueError, match=r"^model 7 must be a string$"):
        string(7, "model")
    device = {"type": "cpu"}
    copy = json_object(device, "device")
    assert copy == device and copy is not device
    with pytest.raises(ValueError, match=r'^device "cpu" must be an object$'):
        json_object("cpu", "device")
    with pytest.raises(ValueError, match=r"^device <bytes> must be an object$"):
        json_object(b"\xff" * 1000, "device")
