"""parse_forecast: the last JSON answer in free text, validated, renormalised, never raising."""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.forecast import Forecast
from models.parsing import json_objects, parse_forecast

UNIFORM = [0.125] * 8
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def answer(predicted_bin=5, p=None, **extra):
    return json.dumps(
        {
            "predicted_bin": predicted_bin,
            "p": UNIFORM if p is None else p,
            "reasoning": "r",
            **extra,
        }
    )


# --- property-based -------------------------------------------------------------------------

probabilities = st.lists(
    st.floats(min_value=0, max_value=1, allow_nan=False), min_size=8, max_size=8
).filter(lambda p: sum(p) > 1e-9)
# Noise that cannot open a JSON object of its own.
noise = st.text(
    alphabet=st.characters(blacklist_characters="{}", blacklist_categories=("Cs",)), max_size=200
)


@SETTINGS
@given(bin_=st.integers(1, 8), p=probabilities, before=noise, after=noise, fenced=st.booleans())
def test_valid_answer_in_noise_always_parses(bin_, p, before, after, fenced):
    body = answer(bin_, p)
    text = f"{before}\n```json\n{body}\n```\n{after}" if fenced else f"{before}{body}{after}"
    f = parse_forecast(text)
    assert f.parse_ok, f.parse_error
    assert f.predicted_bin == bin_  # kept as stated
    assert math.isclose(sum(f.p), 1.0, abs_tol=1e-9)
    assert math.isclose(f.raw_sum, math.fsum(p), rel_tol=1e-9)
    for written, normalised in zip(p, f.p):
        assert math.isclose(normalised, written / f.raw_sum, rel_tol=1e-9, abs_tol=1e-12)
    assert f.p[f.argmax_bin - 1] == max(f.p)


@SETTINGS
@given(text=st.text(max_size=300))
def test_garbage_never_raises(text):
    f = parse_forecast(text)
    assert isinstance(f, Forecast)
    if not f.parse_ok:
        assert f.parse_error and "\n" not in f.parse_error and f.p is None


@SETTINGS
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
        lambda children: (
            st.lists(children, max_size=9)
            | st.dictionaries(st.sampled_from(["p", "predicted_bin", "x"]), children)
        ),
        max_leaves=20,
    )
)
def test_arbitrary_json_values_never_raise(value):
    f = parse_forecast("answer: " + json.dumps(value, allow_nan=True))
    assert isinstance(f, Forecast)
    if f.parse_ok:
        assert 1 <= f.predicted_bin <= 8 and math.isclose(sum(f.p), 1.0)


# --- hand-written cases ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,reason",
    [
        (json.dumps({"p": UNIFORM}), "missing key 'predicted_bin'"),
        (json.dumps({"predicted_bin": 3}), "missing key 'p'"),
        (answer(3, [0.125] * 7), "p has 7 entries, expected 8"),
        (answer(3, [-0.1] + [0.2] * 7), "p[0] = -0.1 outside [0, 1]"),
        (answer(3, [1.5] + [0.0] * 7), "p[0] = 1.5 outside [0, 1]"),
        ('{"predicted_bin": 3, "p": [NaN, 0, 0, 0, 0, 0, 0, 1]}', "p[0] is not finite: nan"),
        (answer(3, ["0.5"] + [0.0] * 7), "p[0] is not a number: '0.5'"),
        (answer(3, [True] + [0.0] * 7), "p[0] is not a number: True"),
        (answer("3"), "predicted_bin is not an integer: '3'"),
        (answer(2.5), "predicted_bin is not an integer: 2.5"),
        (answer(0), "predicted_bin 0 outside 1..8"),
        (answer(9), "predicted_bin 9 outside 1..8"),
        (answer(3, [0.0] * 8), "p is all zeros"),
        (answer(3, {"a": 1}), "p is not a list: dict"),
        ('{"predicted_bin": 3, "p": [0.1, 0.2', "no JSON object found"),
        ("", "no JSON object found"),
    ],
)
def test_malformed_answers_are_recorded_failures(text, reason):
    f = parse_forecast(text)
    assert not f.parse_ok
    assert f.parse_error == reason
    assert f.p is None and f.predicted_bin is None and f.text == text


def test_non_text_is_a_failure():
    assert parse_forecast(None).parse_error == "completion is not text: NoneType"


def test_last_answer_wins():
    first, second = answer(2, [0, 1, 0, 0, 0, 0, 0, 0]), answer(7, [0, 0, 0, 0, 0, 0, 0.5, 0.5])
    f = parse_forecast(f"draft {first}\nfinal {second} done")
    assert f.predicted_bin == 7 and f.p[6] == 0.5
    # ...also when the last one is invalid: the model's final word is what counts.
    assert parse_forecast(f"{first} {answer(9)}").parse_error == "predicted_bin 9 outside 1..8"


def test_trailing_unrelated_object_does_not_hide_the_answer():
    f = parse_forecast(answer(4) + ' and {"note": "thanks"}')
    assert f.parse_ok and f.predicted_bin == 4


def test_nested_braces_and_braces_in_strings():
    text = (
        "Think {a} {b\n"
        + json.dumps(
            {
                "predicted_bin": 6,
                "p": [0, 0, 0, 0, 0.2, 0.6, 0.2, 0],
                "reasoning": "uses {tile} } {",
                "meta": {"k": {"x": 1}},
            }
        )
        + "\n} trailing }"
    )
    f = parse_forecast(text)
    assert f.parse_ok and f.predicted_bin == 6 and f.p[5] == pytest.approx(0.6)


def test_code_fence_and_unbalanced_prefix():
    text = "Unbalanced { here.\n```json\n" + answer(1, [2e-1, 0, 0, 0, 0, 0, 0, 0]) + "\n```"
    f = parse_forecast(text)
    assert f.parse_ok and f.p[0] == 1.0 and f.raw_sum == pytest.approx(0.2)


def test_renormalised_and_stated_bin_kept_apart_from_argmax():
    f = parse_forecast(answer(2, [0.1, 0.1, 0.4, 0.2, 0, 0, 0, 0]))
    assert f.raw_sum == pytest.approx(0.8)
    assert f.p[2] == pytest.approx(0.5)
    assert (f.predicted_bin, f.argmax_bin) == (2, 3)


def test_json_objects_skips_nested_hits():
    assert json_objects('{"a": {"b": 1}} {"c": 2}') == [{"a": {"b": 1}}, {"c": 2}]


def test_deeply_nested_input_does_not_crash():
    f = parse_forecast("{" * 5000 + "}" * 5000)
    assert not f.parse_ok
