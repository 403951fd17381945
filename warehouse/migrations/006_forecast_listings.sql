-- kernelcast warehouse, version 6: what the forecasts asset forecast for a dataset version (the
-- forecasters, the pairs of each report split and why a split is empty), stored beside the
-- forecasts it describes, so the evaluation and promotion read it from here, never from a file.
CREATE TABLE forecast_listings (
    dataset_version VARCHAR PRIMARY KEY,
    listing VARCHAR NOT NULL,          -- JSON object: held_out_task, pairs, empty, external_dir, forecasters
    written_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
