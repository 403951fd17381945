"""Budgeted search: PUCT over the generator's mutation graph, with a forecaster filtering what
reaches the GPU (docs/method.md section 6).

    config.py        SearchConfig: task, mode (standard | filtered | random | selective), seed, budget
    events.py        the append-only event log (typed events, JSON lines)
    puct.py          PUCT scores, rank prior, lineage-blocked parent batches, archive admission
    engine.py        replay (fold of the log) and next_action (a pure decision)
    space.py         kernels of the task's space by id, their neighbourhoods and kernel mappings
    forecasters.py   the forecasters by name (references, files, registered versions), scores
    measure.py       SimulatedMeasurer (the measured table), LiveMeasurer (the profiling worker)
    driver.py        SearchRun and drive: runs in lockstep, one measurement batch per round
    table.py         the measured table from the warehouse or the committed Parquet files
    simulate.py      every mode x seed x task on the measured table; summaries and intervals
    coverage.py      coverage of proposals, the reachable frontier, the neighbourhood batch
    report.py        search_report (asset and CLI), curves figure, tables, the CLI's JSON
    simulation_run.py  the asset's simulation: report and curves written, one MLflow run logged
    live.py          python3 -m pipelines.search.live: live search on a GPU host
    autotune.py      prune_configs_by hook for @triton.autotune backed by a forecaster
                     (pruned against exhaustive: python3 -m benchmarks.autotune_demo)

No Dagster here; the GPU-host path (live, measure, autotune) imports no polars, duckdb or mlflow.
"""
