"""The Forecast: one surrogate answer about one (anchor, candidate) pair, whatever the readout.

Both readouts of method.md section 2 produce it: the verbalized one (the model writes a JSON
answer, `models.parsing.parse_forecast`) and the logprob one (the next-token probabilities of
the eight bin labels, `Forecast.from_label_logprobs`). A parse failure is a Forecast too
(`parse_ok=False`, a one-line `parse_error`, no probabilities): an outcome the metrics count,
never an exception and never a dropped row.

>>> f = Forecast.from_probabilities([0, 0, 0, 2, 2, 0, 0, 0], predicted_bin=5)
>>> f.p[3], f.raw_sum, f.predicted_bin, f.argmax_bin
(0.5, 4.0, 5, 4)
>>> Forecast.failure("no JSON object found").parse_ok
False
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from models.bins import NUM_BINS

VERBALIZED = "verbalized"
LOGPROB = "logprob"


@dataclass(frozen=True)
class Forecast:
    """A forecast distribution over the eight speedup bins (or a recorded failure).

    Attributes:
        predicted_bin: the bin the model stated (verbalized) or the argmax (logprob); 1..8.
        p: eight probabilities, renormalised to sum to 1; None on failure.
        raw_sum: sum of the probabilities as written (verbalized) or the total next-token
            mass on the eight labels (logprob), before renormalising.
        argmax_bin: the most probable bin, first maximum on ties (lowest bin).
        parse_ok: False when no valid answer could be read.
        parse_error: one line saying why, on failure.
        readout: "verbalized" or "logprob".
        text: the raw completion text (verbalized), when known.
        tokens: completion tokens generated (0 for the logprob readout: nothing is generated).
        prompt_tokens: tokens of the prompt, when known.
        latency_s: seconds of model time, amortised over the batch it ran in.
        repeat: repeat index of this forecast for its request (0-based).
        attempts: model calls spent on it (more than 1 after retries on parse failure).
        cached: True when it came from a ForecastCache rather than the model.
    """

    predicted_bin: int | None
    p: tuple[float, ...] | None
    raw_sum: float | None
    argmax_bin: int | None
    parse_ok: bool
    parse_error: str | None = None
    readout: str = VERBALIZED
    text: str | None = None
    tokens: int | None = None
    prompt_tokens: int | None = None
    latency_s: float | None = None
    repeat: int = 0
    attempts: int = 1
    cached: bool = False

    @classmethod
    def failure(cls, error: str, text: str | None = None, readout: str = VERBALIZED) -> Forecast:
        """A recorded parse failure; `error` is flattened to one line."""
        line = " ".join(str(error).split())[:300] or "parse failure"
        return cls(None, None, None, None, False, line, readout=readout, text=text)

    @classmethod
    def from_probabilities(
        cls,
        raw_p: Sequence[float],
        predicted_bin: int | None = None,
        readout: str = VERBALIZED,
        text: str | None = None,
    ) -> Forecast:
        """Renormalise eight non-negative numbers into a Forecast.

        Args:
            raw_p: eight finite, non-negative numbers with a positive sum.
            predicted_bin: the stated bin 1..8; None means the argmax.
            readout: "verbalized" or "logprob".
            text: the raw completion, kept for inspection.
        Returns:
            A parsed Forecast (parse_ok True).
        Raises:
            ValueError: wrong length, a negative or non-finite value, or a zero sum. Parsers
                catch it and record a failure instead.

        >>> Forecast.from_probabilities([1, 1, 0, 0, 0, 0, 0, 0]).p[:2]
        (0.5, 0.5)
        """
        values = [float(v) for v in raw_p]
        if len(values) != NUM_BINS:
            raise ValueError(f"expected {NUM_BINS} probabilities, got {len(values)}")
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError("probabilities must be finite and non-negative")
        total = math.fsum(values)
        if total <= 0:
            raise ValueError("probabilities sum to 0")
        p = tuple(v / total for v in values)
        argmax = max(range(NUM_BINS), key=lambda i: (p[i], -i)) + 1  # first maximum on ties
        stated = argmax if predicted_bin is None else int(predicted_bin)
        return cls(stated, p, total, argmax, True, None, readout=readout, text=text)

    @classmethod
    def from_label_logprobs(cls, logprobs: Sequence[float | None]) -> Forecast:
        """The logprob readout: next-token log-probabilities of the labels "1".."8".

        Args:
            logprobs: eight natural-log probabilities under the full-vocabulary softmax; None
                (or -inf) for a label the server did not return (e.g. outside its top-k).
        Returns:
            A Forecast whose raw_sum is the total mass on the eight labels and whose
            predicted_bin is the argmax; a failure when no label has any mass.

        >>> import math
        >>> f = Forecast.from_label_logprobs([math.log(0.1)] * 4 + [math.log(0.3)] + [None] * 3)
        >>> f.predicted_bin, round(f.raw_sum, 6), round(f.p[4], 6)
        (5, 0.7, 0.428571)
        """
        if len(logprobs) != NUM_BINS:
            return cls.failure(
                f"expected {NUM_BINS} label logprobs, got {len(logprobs)}", readout=LOGPROB
            )
        mass = [
            0.0 if lp is None or math.isnan(lp) else math.exp(min(float(lp), 0.0))
            for lp in logprobs
        ]
        if math.fsum(mass) <= 0:
            return cls.failure("no probability mass on the bin labels", readout=LOGPROB)
        return cls.from_probabilities(mass, readout=LOGPROB)

    def with_meta(self, **changes: Any) -> Forecast:
        """A copy with some fields replaced (tokens, latency_s, repeat, ...)."""
        return dataclasses.replace(self, **changes)

    def retry_of(self, before: Forecast) -> Forecast:
        """This answer as the retry of `before`: one attempt more, the tokens and latency of both.

        >>> Forecast.failure("x").with_meta(tokens=5).retry_of(Forecast.failure("y").with_meta(tokens=3)).tokens
        8
        """
        return self.with_meta(
            attempts=before.attempts + 1,
            tokens=(before.tokens or 0) + (self.tokens or 0),
            latency_s=(before.latency_s or 0.0) + (self.latency_s or 0.0),
        )

    def to_row(self) -> dict[str, Any]:
        """The columns of the warehouse `forecasts` table this forecast fills (no pair or model).

        >>> sorted(Forecast.failure("x").to_row())[:3]
        ['argmax_bin', 'latency_s', 'p1']
        """
        row: dict[str, Any] = {
            "repeat": self.repeat,
            "predicted_bin": self.predicted_bin,
            "argmax_bin": self.argmax_bin,
            "raw_sum": self.raw_sum,
            "parse_ok": self.parse_ok,
            "parse_error": self.parse_error,
            "tokens": self.tokens,
            "latency_s": self.latency_s,
        }
        for b in range(NUM_BINS):
            row[f"p{b + 1}"] = None if self.p is None else self.p[b]
        return row

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON values (the cache stores this)."""
        out = dataclasses.asdict(self)
        out["p"] = None if self.p is None else list(self.p)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Forecast:
        """Inverse of `to_json`; unknown keys are ignored so old cache rows still load."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        if kwargs.get("p") is not None:
            kwargs["p"] = tuple(float(v) for v in kwargs["p"])
        return cls(**kwargs)
