"""Moved to pipelines.forecasting.context (the forecaster adapters check their prompts there);
the names stay importable from here."""

from pipelines.forecasting.context import (  # noqa: F401
    LOGPROB_ANSWER_TOKENS,
    check_checkpoint_fits,
    check_prompt_fits,
    context_length,
)
