"""Surrogate training inputs and outputs: the pairs each forecaster learns from and is scored on
(roles), the classical forecasters, and both ends of training an LLM surrogate on a GPU host."""
