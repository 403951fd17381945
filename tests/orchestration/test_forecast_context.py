"""`kernelcast forecast` refuses, in one line, a prompt longer than the model's context."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from orchestration.cli import app


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_refused_in_one_line(tmp_path, monkeypatch):
    from models.tiny import build_tiny_model
    from pipelines.generation import registry

    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    model_dir = build_tiny_model(tmp_path / "tiny")
    config = json.loads((model_dir / "config.json").read_text())
    config["max_position_embeddings"] = 256  # far below a real kernel pair's prompt
    (model_dir / "config.json").write_text(json.dumps(config))
    kernel = tmp_path / "k.py"
    kernel.write_text(registry.render_point(registry.seed_point("softmax")))
    res = CliRunner().invoke(app, ["forecast", "--task", "softmax", "--anchor", str(kernel), "--candidate", str(kernel),
                                   "--model", str(model_dir), "--style", "full"])
    assert res.exit_code == 2
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("error: the prompt is ") and "more than the model's context of 256 tokens" in line
