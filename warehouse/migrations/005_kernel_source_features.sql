-- kernelcast warehouse, version 5: features derived from a kernel's source alone, for any kernel
-- (pipelines.forecasting.source_features): the sm_90 compile (resources, PTX instruction mix) and
-- a trace of one call per benchmark shape on fake tensors (launches, programs, bytes, torch ops).
-- `features` is a JSON object of numbers (its keys are FEATURE_COLUMNS of that module), so the
-- feature set can grow without a migration; warehouse.kernels reads it back as columns.
CREATE TABLE kernel_source_features (
    kernel_id VARCHAR NOT NULL,
    target VARCHAR NOT NULL,          -- e.g. "sm_90"
    status VARCHAR NOT NULL CHECK (status IN ('ok', 'partial', 'failed')),
    compile_status VARCHAR,           -- compiled | compile_failed | rejected | skipped (not Triton) | not_run
    features VARCHAR NOT NULL,        -- JSON object: feature name -> number (unknown ones absent)
    error VARCHAR,                    -- one line
    seconds DOUBLE,                   -- wall time of the extraction, s
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kernel_id, target)
);
