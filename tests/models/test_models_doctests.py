"""The examples in the docstrings of the surrogate modules run and hold (pytest does not collect them)."""

import doctest
import importlib

import pytest

MODULES = [
    "models.forecast",
    "models.parsing",
    "models.prompts",
    "models.hardware",
    "models.training.rewards",
    "models.cache",
    "models.tiny",
    "models.backends.transformers_backend",
    "models.backends.openai_backend",
    "models.training.sft",
    "models.training.supervised",
    "models.training.data_parallel",
    "models.training.settings",
    "models.registry.versions",
    "pipelines.promotion.rule",
    "models.registry.tracking",
    "models.registry.home_artifacts",
    "pipelines.profiling.audit",
    "pipelines.profiling.timing",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
