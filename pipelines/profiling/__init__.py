"""GPU profiling: measure kernels against their task's reference, safely, on a bare host.

Imports only the standard library, numpy, torch, triton, pyarrow, `pipelines.tasks` and the
definitions it shares with the warehouse (`warehouse.ids`, `warehouse.formats`,
`warehouse.bin_edges`: stdlib, numpy and pyarrow only), so
`python3 -m pipelines.profiling.worker --batch B.parquet --out O.parquet` runs on a GPU host
with nothing else installed. This package file imports nothing, so its modules stay cheap.

Public API
    worker.run_batch(batch, out, WorkerConfig(...), progress=cb) -> RunSummary   measure a batch
    check.check_source(task, source, timeout_s=, device=) -> CheckOutcome        screen one kernel
    check.check_sources(items, n_workers, timeout_s, progress=cb) -> [CheckOutcome]
    warehouse.formats.BATCH_SCHEMA / RESULT_SCHEMA / FAILURE_KINDS               file contracts
    results.read_results(path) -> list[dict]

Modules
    the parent: worker (run_batch and the command line), worker_loop (its event loop),
        worker_config (a run's settings and batch), run_summary (what a run reports), audit (the
        parent's own account: wall-clock windows, reference timings, speedups), verdicts (the
        verifier's verdicts per job, and the row they settle), results (JSONL + Parquet, resume),
        hardware (fingerprint), check
    children: sandbox (child processes and their channel), sandbox_policy (what a child may use:
        layers, limits, environment, visible paths, uid), layer_probe (which layers this host
        provides), processes (/proc reads and kills), jail (the sandbox layers, applied before a
        child starts: jail_namespaces, jail_mounts, jail_privileges, jail_landlock, jail_libc),
        child (a child's entry point)
    inside a child: runner (the check role and the Measurer), kernel_loading (a kernel's import and
        unload, the integrity watch, failure kinds, the autotune watch), checked_calls (a checked
        call and its verdict), compile_child (the compile role), integrity (identities a kernel
        must not change), inputs (task inputs and torch's switches, shared with the verifier),
        fresh_values (the new values of every timed call, rebuilt by the verifier), taskload (task
        registry + KERNELCAST_TASK_MODULES overrides)
    timing: timing (what the timed loops share: settings, statistics, the one call site;
        protocols: docs/protocols.md), cuda_timing (L2 flush, launch cover, CUDA events, adaptive
        reps), gpumode_timing (GPU MODE's loop, loops by turns), cpu_timing, clock_checks (timings
        held to a second clock), call_feed (each timed call's input values and the outputs kept)
    verification: verify (the plan and the kernel's side), verifier (the verifier process),
        shipping (a kernel's output as a file or CUDA IPC handles: ipc_handles), cuda_ipc (the
        self-test of both ways)

The benchmarks a GPU host runs beside the worker (the harness under both protocols, the fault
battery, throughput and repeatability of result files) live in the top-level benchmarks/ folder.
"""
