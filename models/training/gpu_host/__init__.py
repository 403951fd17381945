"""The training trip to a GPU host: the job folder written here and read there (`job`, one format
for both runs, its `kind` naming the run), the variants a job of kind "variants" trains
(`variants`), and the host-side trainers (`gpu_job`, `llm_code`, `code_grpo`, `sdpa_check`), run
there as `python3 -m models.training.gpu_host.<module>`."""
