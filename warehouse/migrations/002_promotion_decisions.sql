-- kernelcast warehouse, version 2: every promotion decision, and the scores it was made on.
-- model_promotion writes one decision per run (held back, kept and promoted alike), so the
-- history of @champion is queryable next to the data it was judged on.

CREATE TABLE promotion_decisions (
    decision_id VARCHAR PRIMARY KEY,      -- sha256 prefix of (model, dagster run, decided_at)
    model_name VARCHAR NOT NULL,          -- MLflow registered model
    dataset_version VARCHAR,              -- the eval pairs it was judged on (null: none yet)
    outcome VARCHAR NOT NULL CHECK (outcome IN ('promoted', 'kept', 'held_back', 'no_candidates')),
    champion_before VARCHAR,              -- version (text), null: none
    champion_after VARCHAR,
    candidate VARCHAR,                    -- best eligible version, null: none passed the gates
    reason VARCHAR NOT NULL,              -- one line
    n_pairs INTEGER NOT NULL,             -- common eval pairs every version was scored on
    policy_json JSON NOT NULL,            -- thresholds of the rule
    dagster_run_id VARCHAR,
    decided_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE promotion_scores (
    decision_id VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    kind VARCHAR,                         -- version tag `kind`: llm, cost_model, text_model
    role VARCHAR NOT NULL CHECK (role IN ('champion', 'challenger')),
    n_pairs INTEGER NOT NULL,
    parse_rate DOUBLE,
    brier DOUBLE,                         -- full set: a parse failure scores as uniform
    uniform_brier DOUBLE,                 -- the uniform forecaster on the same pairs
    failed_gates VARCHAR[],               -- empty: eligible
    PRIMARY KEY (decision_id, model_version)
);
