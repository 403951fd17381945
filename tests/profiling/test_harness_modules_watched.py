"""Every function and class of the harness that a child imports is watched by the integrity check.

integrity.Watch watches the harness modules by name (integrity.HARNESS_MODULES): a module left off
that list holds code a kernel could replace unseen (a timing loop, the Feed, the Measurer, a
verdict). These tests import what a child imports (the modules child.py names, as a clean process
would) and require every function and class defined in those modules, and every method of those
classes, to be in the watch's snapshot, unless the module is one of the few listed below with the
reason it holds no code a kernel's patch could use. A new module split out of a harness module and
not added to HARNESS_MODULES fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Modules a child imports that are not harness code, each with why a kernel's patch of them changes
# no verdict and no timing. Anything else a child imports from pipelines.profiling must be watched.
NOT_HARNESS = {
    "pipelines.profiling.jail": "the sandbox, applied before the child's program starts; the child reads a constant",
    "pipelines.profiling.jail_landlock": "a sandbox layer, applied before the child's program starts",
    "pipelines.profiling.jail_libc": "the sandbox's system calls, made before the child's program starts",
    "pipelines.profiling.jail_mounts": "a sandbox layer, applied before the child's program starts",
    "pipelines.profiling.jail_namespaces": "a sandbox layer, applied before the child's program starts",
    "pipelines.profiling.jail_privileges": "a sandbox layer, applied before the child's program starts",
    "pipelines.profiling.layer_probe": "the parent's probe of the sandbox layers, imported with sandbox_policy",
    "pipelines.profiling.processes": "/proc reads of the parent and of the child's own start",
    "pipelines.profiling.results": "result files and protocol names, written by the parent",
    "pipelines.profiling.sandbox": "the parent's handle on a child, imported for its exceptions",
    "pipelines.profiling.sandbox_policy": "the parent's sandbox settings; the child uses one_line and GIB",
    "pipelines.profiling.taskload": "the task registry; the task modules it loads are watched (integrity.Watch)",
}

# Runs in a clean interpreter: imports what child.py imports, takes the watch's snapshot with the
# harness modules named on the command line, and reports every function, class and method defined
# in a pipelines.profiling module that is not in the snapshot.
_PROBE = r"""
import ast, importlib, inspect, json, sys
from pathlib import Path

import pipelines.profiling.child as child
from pipelines.profiling import integrity

roots = set()
for node in ast.walk(ast.parse(Path(child.__file__).read_text())):
    if isinstance(node, ast.ImportFrom) and node.module == "pipelines.profiling":
        roots |= {f"pipelines.profiling.{a.name}" for a in node.names}
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipelines.profiling."):
        roots.add(node.module)
for name in sorted(roots):
    importlib.import_module(name)
integrity.HARNESS_MODULES = tuple(json.loads(sys.argv[1]))
keys = set(integrity.snapshot())
imported = sorted(m for m in sys.modules if m.startswith("pipelines.profiling."))
defined = {}
for name in imported:
    out = []
    for attr, value in vars(sys.modules[name]).items():
        if (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == name:
            out.append(f"{name}.{attr}")
            if inspect.isclass(value):
                out += [f"{name}.{attr}.{m}" for m in vars(value)]
    defined[name] = out
print(json.dumps({"imported": imported, "unwatched": {m: [d for d in ds if d not in keys] for m, ds in defined.items()},
                  "defined": defined}))
"""


def _probe(harness_modules: tuple[str, ...]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERNELCAST_DEVICE": "cpu"}
    res = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(harness_modules))], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _unwatched_harness(report: dict) -> dict[str, list[str]]:
    return {m: names for m, names in report["unwatched"].items() if names and m not in NOT_HARNESS}


def test_every_function_and_class_a_child_imports_from_the_harness_is_watched():
    from pipelines.profiling.integrity import HARNESS_MODULES

    report = _probe(HARNESS_MODULES)
    assert _unwatched_harness(report) == {}
    # The split harness modules are among what a child imports, with code in each.
    for name in ("runner", "kernel_loading", "checked_calls", "compile_child", "timing", "call_feed",
                 "clock_checks", "cuda_timing", "gpumode_timing", "cpu_timing", "verify", "verifier"):
        assert report["defined"].get(f"pipelines.profiling.{name}"), name
    # The list of exceptions names only modules a child imports (no stale entries).
    assert set(NOT_HARNESS) <= set(report["imported"]), set(NOT_HARNESS) - set(report["imported"])


def test_a_harness_module_left_off_the_watch_is_reported_with_its_functions_and_methods():
    from pipelines.profiling.integrity import HARNESS_MODULES

    left_out = ("pipelines.profiling.call_feed", "pipelines.profiling.cuda_timing")
    report = _probe(tuple(m for m in HARNESS_MODULES if m not in left_out))
    missing = _unwatched_harness(report)
    assert set(missing) == set(left_out)
    assert {"pipelines.profiling.call_feed.Feed", "pipelines.profiling.call_feed.Feed.took",
            "pipelines.profiling.call_feed.top_up_steps"} <= set(missing["pipelines.profiling.call_feed"])
    assert "pipelines.profiling.cuda_timing.cuda_steps" in missing["pipelines.profiling.cuda_timing"]
