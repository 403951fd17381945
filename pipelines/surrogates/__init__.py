"""The surrogates of a dataset version, from pairs to registered versions: which pairs each
forecaster learns from, is calibrated on and is scored on (`roles`), the classical forecasters
fitted and registered (`classical`), the GRPO reward variants trained or re-used (`grpo`), and
both ends of an LLM surrogate trained on a GPU host (`export`, `code_bundle` write its job out;
`remote_results` brings either run's output back, `registration`, `committed`, `llm` use it). The training itself lives in
models.training; the forecasts of every registered version in pipelines.forecasting. The
training assets each make one call here: `llm.produce_llm_surrogate`,
`grpo.train_grpo_surrogates`, `classical.train_classical_surrogates`."""
