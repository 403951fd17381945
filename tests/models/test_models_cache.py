"""ForecastCache keys and storage; Forecast round trips; the shared PromptAnswerer logic (no model)."""

import pickle
import threading

import pytest

from models.backends import BackendError, ForecastRequest, PromptAnswerer
from models.cache import ForecastCache, cache_key
from models.forecast import Forecast

MSGS = [{"role": "user", "content": "forecast this"}]


def test_key_changes_with_every_component():
    base = cache_key("m", MSGS, "verbalized", {"temperature": 0.0}, 0)
    variants = [
        cache_key("m2", MSGS, "verbalized", {"temperature": 0.0}, 0),
        cache_key(
            "m",
            [{"role": "user", "content": "forecast that"}],
            "verbalized",
            {"temperature": 0.0},
            0,
        ),
        cache_key("m", MSGS, "logprob", {"temperature": 0.0}, 0),
        cache_key("m", MSGS, "verbalized", {"temperature": 0.7}, 0),
        cache_key("m", MSGS, "verbalized", {"temperature": 0.0}, 1),
    ]
    assert len({base, *variants}) == 6 and len(base) == 64


def test_round_trip_and_persistence(tmp_path):
    f = Forecast.from_probabilities([1, 0, 0, 0, 0, 0, 0, 3], predicted_bin=8).with_meta(
        tokens=12, latency_s=0.5
    )
    cache = ForecastCache(tmp_path)
    cache.put("k", f)
    cache.close()
    back = ForecastCache(tmp_path).get("k")
    assert back.cached and back.with_meta(cached=False) == f
    assert Forecast.from_json({**f.to_json(), "new_field": 1}) == f  # old/new layouts still load
    row = f.to_row()
    assert row["p8"] == 0.75 and row["raw_sum"] == 4.0 and row["tokens"] == 12


def test_pickle_and_threads(tmp_path):
    cache = pickle.loads(pickle.dumps(ForecastCache(tmp_path)))

    def work(i):
        cache.put(f"k{i}", Forecast.failure(f"e{i}"))
        assert cache.get(f"k{i}").parse_error == f"e{i}"

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 8 and cache.hits == 8


class Echo(PromptAnswerer):
    """A fake backend: the forecast puts all mass on the bin named by the last digit of the prompt."""

    def __init__(self, cache=None, deterministic=True, fail_on=None):
        self.model_ref, self.readout, self.cache = "echo", "verbalized", cache
        self.deterministic, self.fail_on, self.calls = deterministic, fail_on, []

    def cache_params(self):
        return {}

    def is_deterministic(self):
        return self.deterministic

    def _run(self, items):
        self.calls.extend(items)
        out = []
        for messages, repeat in items:
            text = messages[-1]["content"]
            if text == self.fail_on:
                out.append(BackendError("down"))
                continue
            p = [0.0] * 8
            p[int(text[-1]) - 1] = 1.0
            out.append(Forecast.from_probabilities(p).with_meta(tokens=repeat))
        return out


def req(b):
    return ForecastRequest([{"role": "user", "content": f"bin {b}"}])


def test_order_and_repeats():
    sampler = Echo(deterministic=False)
    out = sampler.forecast([req(3), req(5)], repeats=2)
    assert [(f.predicted_bin, f.repeat, f.tokens) for f in out] == [
        (3, 0, 0),
        (3, 1, 1),
        (5, 0, 0),
        (5, 1, 1),
    ]
    assert len(sampler.calls) == 4
    greedy = Echo()
    assert len(greedy.forecast([req(3), req(3), req(5)], repeats=4)) == 12
    assert (
        len(greedy.calls) == 2
    )  # identical prompts and repeats of a deterministic readout: computed once
    with pytest.raises(ValueError):
        greedy.forecast([req(1)], repeats=0)


def test_failures_raise_after_successes_are_cached(tmp_path):
    cache = ForecastCache(tmp_path)
    flaky = Echo(cache=cache, fail_on="bin 2")
    with pytest.raises(BackendError, match="1 of 3 requests failed"):
        flaky.forecast([req(1), req(2), req(3)])
    assert len(cache) == 2
    healed = Echo(cache=cache)
    out = healed.forecast([req(1), req(2), req(3)])
    assert [f.predicted_bin for f in out] == [1, 2, 3] and len(healed.calls) == 1
    assert [f.cached for f in out] == [True, False, True]
