"""One settings object for the whole platform, chosen once by profile.

Profiles (see README):
    smoke    tests and CI: seconds, tiny everything
    default  the README's `make run` on 2 CPU cores: at most ~10 minutes from an empty state
    gpu      a CUDA host: full-size settings (the paper's training settings)

`KERNELCAST_PROFILE` or `--profile` picks one; `KERNELCAST_HOME` says where state lives.
Asset bodies never branch on where they run: they read these numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

PROFILE_NAMES = ("smoke", "default", "gpu")


@dataclass(frozen=True)
class GenerationSettings:
    kernels_per_task: int = 8  # candidates generated per task per run (lineage walk from the seed)
    seed: int = 0
    cpu_check_sample: int = 1  # kernels per task checked under the Triton interpreter
    compile_features: bool = True  # AOT-compile for sm_90 and store regs/spills/smem
    workers: int = 2  # child processes for checks and compiles
    # A kernel with a compile record for the target in the committed compile-features files
    # (data/features/sm_90) takes that record instead of compiling again: the measurement ingest
    # writes those records over the warehouse's anyway. Of the default run's 81 candidates 39
    # have one (2026-12-02; 42 are compiled here, 9 of them the PyTorch references, skipped).
    reuse_committed_features: bool = True
    timeout_s: float = 120.0  # per kernel, checks and compiles


@dataclass(frozen=True)
class ProfilingSettings:
    measure_on_cuda: bool = True  # the asset measures unmeasured candidates when a GPU is present
    timeout_s: float = 120.0  # per kernel
    compile_workers: int = 8
    max_kernels: int = 2000  # per materialisation
    # Fan-out: one measuring step per GPU of the host (CUDA_VISIBLE_DEVICES per step). None:
    # every CUDA device torch sees; a number caps it (or fakes a count in CPU tests).
    gpus: int | None = None
    # "cuda": measure where the host's GPU matches the partition; "cpu": Triton's interpreter
    # on the correctness cases, partition 'cpu' (tests and CI only: CPU timings mean nothing).
    measure_device: str = "cuda"


@dataclass(frozen=True)
class CurationSettings:
    eval_per_bin: int = 12  # bin-balanced eval target per bin per task
    lineage_k: int = 1  # mutations around an eval candidate kept out of training
    holdout_tasks: tuple[str, ...] = ()
    cross_pairs_per_task: int = 200
    seed: int = 0
    # The card whose eval set is the in-distribution headline (pipelines.curation.hardware): every
    # other hardware partition is scored in the cross-hardware settings. A dataset without it
    # takes the card with the most eval pairs.
    reference_hardware: str = "nvidia-h200-sm90"


@dataclass(frozen=True)
class EvaluationSettings:
    n_boot: int = 1000
    repeats: int = 1
    # Processes evaluating forecasters side by side (None: the usable cores). Results are kept
    # under $KERNELCAST_HOME/cache/evaluation, keyed by rows, n_boot, seed and code.
    workers: int | None = None
    # Language models forecast beside the reference forecasters ('smollm2' = the embedded base
    # model, or local checkpoint dirs). Off on CPU: a prompt pair of real kernels is ~3-4k tokens
    # and SmolLM2-135M took 30-50 s per pair on 2 loaded cores (measured 2026-11-29), so even a
    # 9-pair sample would blow the default profile's 10 minutes. The gpu profile turns it on.
    lm_models: tuple[str, ...] = ()
    lm_pairs_per_task: int | None = 2  # None: every eval pair
    lm_prompt_style: str = "full"
    # A folder of fetched third-party results scored as part of the external split
    # (pipelines.surrogates.library_dir; $KERNELCAST_LIBRARY_DIR); None: none.
    library_dir: str | None = None
    # The curve of the cross-hardware report (pipelines.surrogates.cross_hardware): Brier of the
    # reference card's forecasters recalibrated on, and of forecasters fitted on, the first n pairs
    # of another card, for each n here below the card's pool (0 and all are always there).
    cross_hardware_pairs: tuple[int, ...] = (100, 300, 1000)


@dataclass(frozen=True)
class LlmBackendSettings:
    """Which backend answers the LLM forecasts made here, the defaults of the `llm_backend`
    resource (orchestration.resources.LlmBackendResource; kinds in pipelines.forecasting.llm_backend):
    "transformers" (in process), "vllm" (vLLM's offline engine in a child), "openai" (an
    OpenAI-compatible server at base_url serving `model`) or "committed" (the committed GPU
    forecasts alone, no forward pass here). The API key is no setting: a run's config gives it
    (an EnvVar)."""

    kind: str = "transformers"
    base_url: str = ""
    model: str = ""
    vllm_python: str = ""  # the vLLM venv's python; empty: models.backends.vllm_backend finds one


@dataclass(frozen=True)
class SurrogateSettings:
    """The surrogate: base model, which reward variants train, how it is evaluated and promoted."""

    base_model: str = "smollm2"  # 'smollm2' (embedded GGUF), 'tiny' (test model) or a checkpoint dir
    # Reward variants trained, one registered version each ('correctness', 'correctness+brier',
    # 'correctness+crps'). On CPU one variant: a run trains at ~4-5 min per variant.
    variants: tuple[str, ...] = ("correctness+brier",)
    training_profile: str = "default"  # models.training.PROFILES entry
    training_overrides: tuple[tuple[str, Any], ...] = ()  # (field, value) on top of that profile
    force_retrain: bool = False  # False: a version with the same training key is re-used
    # Eval pairs each surrogate version (and the champion) forecasts. 16 on CPU: the logprob
    # readout is one forward pass per pair, ~4-6 s for a ~1,100-token compact prompt of
    # SmolLM2-135M on 2 cores, so 16 pairs (about 2 per task) cost 1-1.5 minutes per version,
    # what is left of make run's budget after ~5 minutes of training. Few pairs make a noisy
    # Brier: the promotion rule compares versions on the same pairs, and the gpu profile
    # forecasts every eval pair (None).
    eval_pairs: int | None = 16
    parse_rate_floor: float = 0.8  # promotion gate (pipelines.promotion.rule)
    min_brier_gain: float = 0.0  # a challenger must beat the champion's Brier by more than this
    # How the LLM surrogate version of a run comes to be:
    #   "committed"   register the LoRA adapter trained on the H200 and committed under data/
    #                 (committed_run), with its H200 forecasts of every eval pair standing in for
    #                 CPU forecasts: on 2 cores a forward pass over one real prompt takes seconds,
    #                 and training at useful scale takes GPU-hours (docs/results/surrogate.md);
    #   "supervised"  train it here with the supervised distributional loss (models.training.supervised);
    #   "grpo"        the format warm-up + GRPO of models.training (the paper's RL stage).
    llm: str = "committed"
    committed_run: str = "training/h200/2026-12-01"  # under the data folder
    committed_adapter: str = "sft-compact-lora"  # the variant whose adapter is registered
    supervised_epochs: int = 6
    supervised_rows: int | None = None  # cap on training and calibration rows (None: every fit and calibration pair)
    supervised_style: str = "compact+features"
    # Classical forecasters trained and registered beside the LLM (models.classical); "ensemble"
    # is the mean of the others and the bin prior, composed after their fits (no fit of its own).
    classical: tuple[str, ...] = ("cost_model", "text_model", "ensemble")
    # (kind, parameter, value) overrides of the classical models' defaults, and a cap on fit
    # pairs (None: all): the smoke profile trains them small, in seconds.
    classical_params: tuple[tuple[str, str, Any], ...] = ()
    classical_max_fit: int | None = None
    # Processes fitting the classical forecasters side by side (None: the usable cores).
    classical_workers: int | None = None
    held_out_task: str | None = "gdn_chunk_fwd_o"  # the held-out-task evaluation (paper's choice)


@dataclass(frozen=True)
class SearchSettings:
    """The search simulation (pipelines/search): which runs `search_simulation` makes."""

    tasks: tuple[str, ...] = ()  # () = every task with measurements on `hardware_id`
    # Seeds per task and mode: 16 simulate in ~2 s, and the neighbourhoods they visit are hardly
    # more than 8 seeds' (670 unmeasured kernels against 637); with 8, the uniform forecaster (a
    # random choice) still "beat" standard on 7 of 9 tasks, with 16 on 3.
    seeds: int = 16
    # GPU measurements per run. 12 (the seed kernel's expansion, then two of its children's) is
    # what the measured space can carry: the complete neighbourhoods those runs visit are 670
    # kernels over nine tasks; 16 would need 2,217 and 24 over 4,400 (docs/search.md).
    budget: int = 12
    # Forecaster of the filtered and selective runs (pipelines.search.forecasters,
    # pipelines.search.registered): the newest registered cost model; "oracle" is the ceiling
    # a bin forecaster can reach, "uniform" a random choice.
    forecaster: str = "kind:cost_model"
    anchor: str = "reference"  # forecast anchor: "reference" (task reference) or "parent"
    hardware_id: str = "nvidia-h200-sm90"


@dataclass(frozen=True)
class Settings:
    profile: str
    home: Path
    data_dir: Path
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    profiling: ProfilingSettings = field(default_factory=ProfilingSettings)
    curation: CurationSettings = field(default_factory=CurationSettings)
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings)
    llm_backend: LlmBackendSettings = field(default_factory=LlmBackendSettings)
    surrogate: SurrogateSettings = field(default_factory=SurrogateSettings)
    search: SearchSettings = field(default_factory=SearchSettings)

    # ---- where state lives -------------------------------------------------------------
    @property
    def warehouse_path(self) -> Path:
        return self.home / "warehouse.duckdb"

    @property
    def mlflow_uri(self) -> str:
        return f"sqlite:///{(self.home / 'mlflow.db').resolve()}"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.home / "mlartifacts"

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    @property
    def inbox(self) -> Path:
        return self.home / "inbox"

    @property
    def reports_dir(self) -> Path:
        return self.home / "reports"

    @property
    def measurements_dir(self) -> Path:
        return self.data_dir / "measurements"


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_home() -> Path:
    return Path(os.environ.get("KERNELCAST_HOME", Path.cwd() / ".kernelcast")).resolve()


def _with_fanout_env(settings: Settings) -> Settings:
    """KERNELCAST_GPUS (measuring steps per host), KERNELCAST_MEASURE_DEVICE (cuda | cpu) and
    KERNELCAST_MAX_KERNELS (kernels per materialisation) on top of the profile: how a host scales
    the fan-out, read by every process of a run alike (the multiprocess executor's step processes
    load the settings again, so a value set only in the launching process would not reach them)."""
    gpus, device = os.environ.get("KERNELCAST_GPUS"), os.environ.get("KERNELCAST_MEASURE_DEVICE")
    limit = os.environ.get("KERNELCAST_MAX_KERNELS")
    if not gpus and not device and not limit:
        return settings
    for name, value in (("KERNELCAST_GPUS", gpus), ("KERNELCAST_MAX_KERNELS", limit)):
        if value and not (value.isdigit() and int(value) > 0):
            raise ValueError(f"{name} must be a whole number above 0, got {value!r}")
    if device and device not in ("cuda", "cpu"):
        raise ValueError(f"KERNELCAST_MEASURE_DEVICE must be cuda or cpu, got {device!r}")
    prof = replace(settings.profiling, **({"gpus": int(gpus)} if gpus else {}),
                   **({"measure_device": device} if device else {}),
                   **({"max_kernels": int(limit)} if limit else {}))
    return replace(settings, profiling=prof)


LLM_MODES = ("committed", "supervised", "grpo")


def _with_llm_env(settings: Settings) -> Settings:
    """KERNELCAST_SURROGATE_LLM (committed | supervised | grpo) on top of the profile: how the
    LLM surrogate version of a run comes to be (SurrogateSettings.llm)."""
    mode = os.environ.get("KERNELCAST_SURROGATE_LLM")
    if not mode:
        return settings
    if mode not in LLM_MODES:
        raise ValueError(f"KERNELCAST_SURROGATE_LLM must be one of {', '.join(LLM_MODES)}, got {mode!r}")
    return replace(settings, surrogate=replace(settings.surrogate, llm=mode))


def _with_library_dir_env(settings: Settings) -> Settings:
    """KERNELCAST_LIBRARY_DIR (a folder of fetched third-party results, docs/method.md) on top of
    the profile (EvaluationSettings.library_dir)."""
    folder = os.environ.get("KERNELCAST_LIBRARY_DIR", "").strip()
    if not folder:
        return settings
    return replace(settings, evaluation=replace(settings.evaluation, library_dir=folder))


def _with_reference_hardware_env(settings: Settings) -> Settings:
    """KERNELCAST_REFERENCE_HARDWARE (a hardware id, e.g. nvidia-h100-80gb-hbm3-sm90) on top of the
    profile (CurationSettings.reference_hardware): the card whose pairs the forecasters learn
    from and are scored on in every split; the others are the cross-hardware settings."""
    card = os.environ.get("KERNELCAST_REFERENCE_HARDWARE", "").strip()
    if not card:
        return settings
    return replace(settings, curation=replace(settings.curation, reference_hardware=card))


def load_settings(profile: str | None = None, home: str | Path | None = None) -> Settings:
    """Resolve the profile (argument, then KERNELCAST_PROFILE, then 'default') into Settings,
    with the environment overrides of the fan-out, the LLM mode, the external folder and the
    reference card on top (the one place the documented KERNELCAST_* variables are read)."""
    return _with_reference_hardware_env(
        _with_library_dir_env(_with_llm_env(_with_fanout_env(_profile_settings(profile, home)))))


def _profile_settings(profile: str | None, home: str | Path | None) -> Settings:
    name = profile or os.environ.get("KERNELCAST_PROFILE", "default")
    if name not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}")
    base = Settings(
        profile=name,
        home=Path(home).resolve() if home else default_home(),
        data_dir=Path(os.environ.get("KERNELCAST_DATA", _repo_root() / "data")).resolve(),
    )
    if name == "smoke":
        return replace(
            base,
            # No interpreter check: one kernel per task under Triton's interpreter was 5-6 s per
            # task, 50 of the 52 s kernel_candidates took (measured 2026-12-02, 2 loaded cores);
            # the check path has tests of its own (tests/orchestration/test_cli.py, tests/profiling/).
            generation=GenerationSettings(kernels_per_task=4, cpu_check_sample=0, workers=1, compile_features=False),
            profiling=ProfilingSettings(max_kernels=20, compile_workers=1),
            curation=CurationSettings(eval_per_bin=3, cross_pairs_per_task=20),
            evaluation=EvaluationSettings(n_boot=20, repeats=1, lm_models=(), workers=1, cross_hardware_pairs=(30,)),
            # The tiny in-process model (models/tiny.py): training and forecasts take seconds.
            # Real pairs' prompts in the compact style; 10 warm-up steps exercise the code (the
            # tiny model does not learn the format from real prompts in 120 steps either).
            # The tiny in-process model trained here with the supervised loss on 12 fit pairs and
            # scored on 12 calibration pairs: real compact prompts run to thousands of the tiny
            # tokenizer's tokens, and with 48 rows training took 90 of a 299 s smoke run (py-spy,
            # 2 cores; attention over the long prompts the most of it); with 24, the forward and
            # backward passes were still most of surrogate_model's time. The classical
            # forecasters train on the smoke data as usual.
            surrogate=SurrogateSettings(base_model="tiny", training_profile="smoke", eval_pairs=12,
                                        training_overrides=(("prompt_style", "compact"), ("sft_steps", 10)),
                                        llm="supervised", supervised_epochs=2, supervised_rows=12,
                                        classical_params=(("cost_model", "max_iter", 40), ("text_model", "max_features", 3000),
                                                          ("text_model", "ngram_max", 1)),
                                        # 4 fits (2 kinds x 2 splits) on 1,500 pairs took 127 s
                                        # of a 664 s smoke run on 2 loaded cores; 500 exercise the same code.
                                        classical_max_fit=500, classical_workers=1),
            # The oracle: tests run the search without training a cost model first.
            search=SearchSettings(tasks=("softmax", "rms_norm"), seeds=3, forecaster="oracle"),
        )
    if name == "gpu":
        return replace(
            base,
            generation=GenerationSettings(kernels_per_task=500, cpu_check_sample=8, workers=8),
            profiling=ProfilingSettings(max_kernels=20000, compile_workers=14),
            evaluation=EvaluationSettings(n_boot=1000, repeats=3, lm_models=("smollm2",), lm_pairs_per_task=None),
            surrogate=SurrogateSettings(
                variants=("correctness", "correctness+brier", "correctness+crps"),
                training_profile="gpu", eval_pairs=None, llm="supervised",
            ),
        )
    return base
