"""The training trip to a GPU host: the job and bundle files written here (`jobfile`, `bundle`),
the variants a job trains (`variants`), and the host-side trainers (`gpu_job`, `llm_code`,
`code_grpo`, `sdpa_check`), run there as `python3 -m models.training.gpu_host.<module>`."""
