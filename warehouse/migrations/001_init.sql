-- kernelcast warehouse, version 1: the tables every stage shares (design: architecture.md).
-- Applied in one transaction by warehouse.db.apply_migrations; never edit after release,
-- add 002_... instead.

-- Kernel tasks: the contract every kernel of a task is measured against.
CREATE TABLE tasks (
    task VARCHAR PRIMARY KEY,
    description VARCHAR NOT NULL,
    contract_version INTEGER NOT NULL DEFAULT 1,
    source VARCHAR,                -- "gpumode" | "paper" | "kernelcast"
    correctness_cases JSON,        -- list of case objects (CPU, Triton interpreter)
    benchmark_cases JSON,          -- list of case objects (GPU)
    tolerances JSON,               -- e.g. {"atol": 0.02, "rtol": 0.02}
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Kernels, content-addressed: kernel_id = sha256 of the normalised source (warehouse.ids).
-- The task's PyTorch reference is a kernel too (generator 'reference').
CREATE TABLE kernels (
    kernel_id VARCHAR PRIMARY KEY,
    task VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    language VARCHAR,              -- "triton" | "pytorch"
    generator VARCHAR,             -- "reference" | "kernelcast-space" | "llm:<model>" | ...
    generator_version VARCHAR,
    algorithm VARCHAR,             -- family id within the task
    knobs_json JSON,               -- knob values, sorted keys
    parent_kernel_id VARCHAR,      -- null for seeds and references
    mutation VARCHAR,              -- e.g. "BLOCK_N:256->512"
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Static features from compiling a kernel for a target (no GPU needed).
CREATE TABLE kernel_features (
    kernel_id VARCHAR NOT NULL,
    target VARCHAR NOT NULL,       -- e.g. "sm_90"
    status VARCHAR NOT NULL CHECK (status IN ('compiled', 'compile_failed', 'rejected')),
    n_regs INTEGER,                -- registers per thread
    n_spills INTEGER,              -- spill stores + loads, bytes
    shared_bytes BIGINT,           -- static + dynamic shared memory per block, bytes
    error VARCHAR,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kernel_id, target)
);

-- Pre-GPU checks of a kernel (e.g. correctness under the Triton CPU interpreter).
CREATE TABLE kernel_checks (
    kernel_id VARCHAR NOT NULL,
    check_kind VARCHAR NOT NULL,   -- e.g. "cpu_interpreter"
    ok BOOLEAN NOT NULL,
    failure_kind VARCHAR,
    message VARCHAR,
    seconds DOUBLE,                -- wall time of the check, s
    checked_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kernel_id, check_kind)
);

-- Device types; hardware_id is the measurement partition key, e.g. "nvidia-h200-sm90".
-- The first fingerprint seen is kept; each batch keeps its own in `batches`.
CREATE TABLE hardware (
    hardware_id VARCHAR PRIMARY KEY,
    device_name VARCHAR,
    capability VARCHAR,            -- "9.0"; null for CPU
    sm_count INTEGER,
    memory_gb DOUBLE,              -- GiB
    l2_bytes BIGINT,
    memory_bandwidth_gbps DOUBLE,  -- GB/s, if known
    sm_clock_mhz DOUBLE,
    mem_clock_mhz DOUBLE,
    driver_version VARCHAR,
    cuda_version VARCHAR,
    torch_version VARCHAR,
    triton_version VARCHAR,
    fingerprint_json JSON NOT NULL,
    first_seen TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Profiling runs: one hardware fingerprint per batch.
CREATE TABLE batches (
    batch_id VARCHAR PRIMARY KEY,
    hardware_id VARCHAR NOT NULL,
    hardware_json JSON NOT NULL,
    protocol VARCHAR,
    harness_version VARCHAR,
    source_file VARCHAR,           -- the file it was first ingested from
    ingested_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Measurements, append-only. Per-case lists are aligned with case_ids (RESULT_SCHEMA).
CREATE TABLE measurements (
    measurement_id VARCHAR PRIMARY KEY,   -- formats.measurement_id(batch_id, kernel_id)
    kernel_id VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    hardware_id VARCHAR NOT NULL,
    batch_id VARCHAR NOT NULL,
    status VARCHAR NOT NULL CHECK (status IN ('ok', 'failed')),
    failure_kind VARCHAR,
    error VARCHAR,
    case_ids VARCHAR[],
    kernel_median_ms DOUBLE[],
    kernel_mean_ms DOUBLE[],
    kernel_stderr_ms DOUBLE[],
    kernel_reps INTEGER[],
    ref_median_ms DOUBLE[],
    ref_mean_ms DOUBLE[],
    ref_stderr_ms DOUBLE[],
    ref_reps INTEGER[],
    case_speedups DOUBLE[],        -- t_ref / t_kernel per case, medians
    speedup DOUBLE,                -- geometric mean over cases, vs the task reference
    needs_recheck BOOLEAN,
    protocol VARCHAR NOT NULL,
    harness_version VARCHAR NOT NULL,
    measured_at TIMESTAMPTZ NOT NULL,
    compile_s DOUBLE,
    check_s DOUBLE,
    time_s DOUBLE,
    source_file VARCHAR,
    ingested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- No speedup without correctness; a correct kernel always has a usable one.
    CHECK ((status = 'ok' AND speedup IS NOT NULL AND speedup > 0 AND failure_kind IS NULL)
        OR (status = 'failed' AND speedup IS NULL AND failure_kind IS NOT NULL))
);

-- Every file ingested, by content: the same bytes under another name add nothing.
CREATE TABLE ingested_files (
    file_sha256 VARCHAR PRIMARY KEY,
    path VARCHAR NOT NULL,
    kind VARCHAR NOT NULL CHECK (kind IN ('results', 'kernels')),
    rows BIGINT NOT NULL,
    added BIGINT NOT NULL,
    ingested_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Forecasting pairs of a dataset version: S = speedup(candidate) / speedup(anchor), same hardware.
CREATE TABLE pairs (
    pair_id VARCHAR PRIMARY KEY,
    dataset_version VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    hardware_id VARCHAR NOT NULL,
    anchor_kernel_id VARCHAR NOT NULL,
    candidate_kernel_id VARCHAR NOT NULL,
    anchor_measurement_id VARCHAR,
    candidate_measurement_id VARCHAR,
    speedup DOUBLE NOT NULL CHECK (speedup > 0 AND isfinite(speedup)),
    true_bin INTEGER NOT NULL CHECK (true_bin BETWEEN 1 AND 8),
    pair_type VARCHAR NOT NULL CHECK (pair_type IN ('reference', 'parent', 'cross')),
    split VARCHAR NOT NULL CHECK (split IN ('train', 'eval', 'discovery'))
);

-- Frozen dataset snapshots and the measurements behind each.
CREATE TABLE dataset_versions (
    dataset_version VARCHAR PRIMARY KEY,
    content_digest VARCHAR NOT NULL,
    counts JSON,
    n_measurements BIGINT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE dataset_measurements (
    dataset_version VARCHAR NOT NULL,
    measurement_id VARCHAR NOT NULL,
    PRIMARY KEY (dataset_version, measurement_id)
);

-- Forecasts of a model (or baseline) on pairs; a parse failure is a row with parse_ok = false.
CREATE TABLE forecasts (
    pair_id VARCHAR NOT NULL,
    model_ref VARCHAR NOT NULL,    -- e.g. "models:/kernelcast-surrogate/3" or "baseline:uniform"
    repeat INTEGER NOT NULL,
    predicted_bin INTEGER CHECK (predicted_bin BETWEEN 1 AND 8),
    argmax_bin INTEGER CHECK (argmax_bin BETWEEN 1 AND 8),
    p1 DOUBLE, p2 DOUBLE, p3 DOUBLE, p4 DOUBLE,
    p5 DOUBLE, p6 DOUBLE, p7 DOUBLE, p8 DOUBLE,   -- renormalised
    raw_sum DOUBLE,                -- sum of p as written, before renormalising
    parse_ok BOOLEAN NOT NULL,
    parse_error VARCHAR,
    tokens INTEGER,
    latency_s DOUBLE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (pair_id, model_ref, repeat)
);

-- Registered surrogate versions and the data they learned from.
CREATE TABLE model_lineage (
    model_name VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    mlflow_run_id VARCHAR,
    dataset_version VARCHAR NOT NULL,
    base_model VARCHAR,
    git_commit VARCHAR,
    dagster_run_id VARCHAR,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (model_name, model_version)
);
