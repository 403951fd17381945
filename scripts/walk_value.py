"""Follow one value through a real, small run of the product: every project function that receives
it as an argument, in call order, with its file and room.

    python3 scripts/walk_value.py kernel [--repo DIR] [--value KERNEL_ID] [--json OUT.json]
    python3 scripts/walk_value.py model  [--repo DIR] [--json OUT.json]
    python3 scripts/walk_value.py draw --before OLD.json --after NEW.json --out docs/images/F.png

`kernel` follows a kernel id: a few rows of the committed H200 kernels and results files are
ingested into a fresh DuckDB warehouse, curated into pairs, and the reference forecasters forecast
the eval pairs into `forecasts`, as the forecasts step does. `model` follows a model reference
`models:/kernelcast-surrogate@champion`: a tiny cost model (the toy pairs of
tests/forecasting/test_forecasting_models.py) is registered in a fresh MLflow sqlite store, given
the alias, and `kernelcast forecast --model <ref>` runs in this process on two softmax files.

A function "receives" the value when one of its arguments (`self` left out) equals it, or holds it:
an item or key of a list, tuple, set or dict (three levels deep), a string or list-of-strings
column of a polars, pyarrow or pandas frame, or a field of a dataclass. Calls are caught with
sys.settrace (this thread and the threads started under it); the child processes the product
starts (the kernel-file readers) are not followed. A room is a package one level below a floor
(pipelines.curation, models.registry, ...), a floor's own modules one room named after the floor,
as scripts/draw_structure.py draws them; the rooms of pipelines/ are those of
tests/test_import_structure.py (ROOMS).

`--repo` runs the flow on another checkout (e.g. a `git worktree` of an older commit) with this
tracer: the flows adapt to the few entry points that moved (`_entry`), and say which they used.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
FLOORS = ("orchestration", "assets", "pipelines", "models", "warehouse")
MODEL_NAME = "kernelcast-surrogate"
MODEL_REF = f"models:/{MODEL_NAME}@champion"
DATA = HERE / "data" / "measurements" / "h200"
KERNELS_FILE, RESULTS_FILE = "kernels-2026-11-29-harness1.parquet", "results-2026-11-29-harness1-run-b.parquet"
WALK_TASK = "softmax"
MAX_ITEMS = 100_000  # longer containers are not searched: the tracer stays cheap
DEPTH = 3
COLOURS = ("#3a5fcd", "#d2691e", "#2e8b57")  # the followed values, in order


# ---- where a function lives -----------------------------------------------------------------
@dataclass(frozen=True)
class Place:
    file: str  # relative to the checkout
    module: str
    room: str


class Project:
    """Maps a code object's file to its place in the checkout `root` (None outside its floors)."""

    def __init__(self, root: Path, floors: tuple[str, ...] = FLOORS):
        self.root = root.resolve()
        self.floors = floors
        self._seen: dict[str, Place | None] = {}

    def place(self, filename: str) -> Place | None:
        if filename in self._seen:
            return self._seen[filename]
        found = None
        try:
            rel = Path(filename).resolve().relative_to(self.root)
        except ValueError:
            rel = None
        if rel is not None and rel.suffix == ".py" and rel.parts[0] in self.floors:
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            room = parts[0]
            if len(rel.parts) > 2 and (self.root / rel.parts[0] / rel.parts[1] / "__init__.py").is_file():
                room = f"{rel.parts[0]}.{rel.parts[1]}"
            found = Place(rel.as_posix(), ".".join(parts), room)
        self._seen[filename] = found
        return found


# ---- does an argument hold the value --------------------------------------------------------
def _frame_columns(obj: Any, value: str) -> str | None:
    """The first string (or list-of-strings) column of a polars, pyarrow or pandas frame holding `value`."""
    kind = type(obj).__module__.split(".")[0]
    if kind == "polars":
        pl = sys.modules["polars"]
        if isinstance(obj, pl.Series):
            obj = obj.to_frame()
        if not isinstance(obj, pl.DataFrame):
            return None
        for name, dtype in obj.schema.items():
            if dtype == pl.String and (obj[name] == value).any():
                return name
            if dtype == pl.List(pl.String) and obj[name].list.contains(value).any():
                return name
        return None
    if kind == "pyarrow":
        pa, pc = sys.modules["pyarrow"], importlib.import_module("pyarrow.compute")
        if isinstance(obj, pa.Array | pa.ChunkedArray):
            obj = pa.table({"values": obj})
        if not isinstance(obj, pa.Table | pa.RecordBatch):
            return None
        for name, column in zip(obj.schema.names, obj.columns, strict=True):
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                if pc.any(pc.equal(column, value)).as_py():
                    return name
        return None
    if kind == "pandas":
        pd = sys.modules["pandas"]
        if isinstance(obj, pd.Series):
            obj = obj.to_frame()
        if not isinstance(obj, pd.DataFrame):
            return None
        for name in obj.columns:
            column = obj[name]
            if column.dtype == object or str(column.dtype).startswith("string"):
                try:
                    if any(v == value for v in column if isinstance(v, str)):
                        return str(name)
                except TypeError:
                    continue
        return None
    return None


def holds(obj: Any, value: str, depth: int = DEPTH) -> str | None:
    """How `obj` holds `value` ("equal", "item", "key", "column <name>", "field <name>"), or None."""
    if isinstance(obj, str):
        return "equal" if obj == value else None
    if obj is None or isinstance(obj, int | float | bool | bytes | Path) or depth <= 0:
        return None
    if isinstance(obj, list | tuple | set | frozenset):
        if len(obj) > MAX_ITEMS:
            return None
        for item in obj:
            if (how := holds(item, value, depth - 1)) is not None:
                return "item" if how == "equal" else f"item: {how}"
        return None
    if isinstance(obj, dict):
        if len(obj) > MAX_ITEMS:
            return None
        if value in obj:
            return "key"
        for item in obj.values():
            if (how := holds(item, value, depth - 1)) is not None:
                return "item" if how == "equal" else f"item: {how}"
        return None
    if type(obj).__module__.split(".")[0] in ("polars", "pyarrow", "pandas"):
        try:
            name = _frame_columns(obj, value)
        except Exception:  # noqa: BLE001 - a frame that cannot be searched cheaply is passed over
            return None
        return None if name is None else f"column {name}"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            if (how := holds(getattr(obj, f.name, None), value, depth - 1)) is not None:
                return f"field {f.name}" if how == "equal" else f"field {f.name}: {how}"
    return None


# ---- the tracer -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One project function that received the value: where, and through which arguments."""

    file: str
    function: str
    room: str
    arguments: tuple[str, ...]  # "name (how)"
    thread: str
    value: str  # which of the followed values (its label)


@dataclass
class ValueTracer:
    """Records, in call order, the project functions that receive one of `values` (label -> value:
    the value followed and the forms it is known by further on) as an argument.

        with ValueTracer({"kernel id": kernel_id}, Project(repo)) as tracer:
            run_the_flow()
        tracer.calls    # [Call(file, function, room, arguments, thread, value), ...]
    """

    values: dict[str, str]
    project: Project
    calls: list[Call] = field(default_factory=list)
    functions_seen: int = 0  # project function calls looked at, holding the value or not
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _codes: dict = field(default_factory=dict, repr=False)

    def __enter__(self) -> ValueTracer:
        self._before = (sys.gettrace(), threading.gettrace())
        threading.settrace(self._on_call)
        sys.settrace(self._on_call)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(self._before[0])
        threading.settrace(self._before[1])

    def _on_call(self, frame, event, arg):  # the global trace function: 'call' events only
        if event != "call":
            return None
        code = frame.f_code
        known = self._codes.get(code, False)
        if known is False:
            place = self.project.place(code.co_filename)
            n = code.co_argcount + code.co_kwonlyargcount
            n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
            known = None if place is None else (place, code.co_varnames[:n], getattr(code, "co_qualname", code.co_name))
            self._codes[code] = known
        if known is None:
            return None
        place, names, qualname = known
        self.functions_seen += 1
        local = frame.f_locals
        for label, value in list(self.values.items()):  # a flow may add one meanwhile
            found = []
            for name in names:
                if name in ("self", "cls") or name not in local:
                    continue
                how = holds(local[name], value)
                if how is not None:
                    found.append(f"{name} ({how})")
            if found:
                with self._lock:
                    self.calls.append(Call(place.file, qualname, place.room, tuple(found),
                                           threading.current_thread().name, label))
        return None


# ---- the walk, summed up ----------------------------------------------------------------------
def summary(calls: list[Call]) -> dict[str, Any]:
    """Files and rooms entered (first-entry order, calls each), distinct functions, room changes."""
    files = Counter(c.file for c in calls)
    rooms = Counter(c.room for c in calls)
    sequence = [c.room for i, c in enumerate(calls) if i == 0 or calls[i - 1].room != c.room]
    by_value = {}
    for label in dict.fromkeys(c.value for c in calls):
        mine = [c for c in calls if c.value == label]
        by_value[label] = {"calls": len(mine), "functions": len({(c.file, c.function) for c in mine}),
                           "files": len({c.file for c in mine}), "rooms": list(dict.fromkeys(c.room for c in mine))}
    return {"calls": len(calls), "functions": len({(c.file, c.function) for c in calls}),
            "files": dict(files), "rooms": dict(rooms), "room_sequence": sequence, "by_value": by_value}


def print_walk(walk: dict[str, Any]) -> None:
    s = walk["summary"]
    print(f"{walk['name']} walk of {walk['value']!r} on {walk['commit']}: {s['calls']} calls of "
          f"{s['functions']} functions in {len(s['files'])} files, {len(s['rooms'])} rooms "
          f"({walk['seconds']:.1f} s, {walk['functions_seen']} project calls looked at)")
    for label, value in walk["values"].items():
        n = s["by_value"].get(label, {"calls": 0, "functions": 0, "files": 0, "rooms": []})
        print(f"  {label} {value}: {n['calls']} calls, {n['functions']} functions, {n['files']} files, "
              f"rooms {' -> '.join(n['rooms']) or 'none'}")
    for note in walk["notes"]:
        print(f"  note: {note}")
    print("  rooms, in the order first entered (calls):")
    for room, n in s["rooms"].items():
        print(f"    {room:<28} {n}")
    print("  files, in the order first entered (calls):")
    for file, n in s["files"].items():
        print(f"    {file:<52} {n}")
    print("  the walk (room changes): " + " -> ".join(s["room_sequence"]))
    print("  calls:")
    for i, c in enumerate(walk["calls"]):
        print(f"    {i:>4} {c['value']:<12} {c['room']:<24} {c['file']}:{c['function']}  "
              f"[{', '.join(c['arguments'])}]")


# ---- the flows: entry points per checkout ------------------------------------------------------
def _entry(candidates: list[tuple[str, str]], notes: list[str]) -> Callable:
    """The first of (module, name) that the checkout defines; which one is noted when not the first."""
    for i, (module, name) in enumerate(candidates):
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if i:
            notes.append(f"{name} from {module} (this checkout has no {candidates[0][0]}.{candidates[0][1]})")
        return found
    raise SystemExit(f"none of {', '.join(f'{m}.{n}' for m, n in candidates)} in this checkout")


def _small_files(folder: Path) -> tuple[Path, Path]:
    """The committed H200 kernels and results files cut to one task: every measured kernel of it
    and its reference."""
    import polars as pl

    kernels = pl.read_parquet(DATA / KERNELS_FILE).filter(pl.col("task") == WALK_TASK)
    results = pl.read_parquet(DATA / RESULTS_FILE).filter(pl.col("task") == WALK_TASK)
    measured = set(results["kernel_id"])
    kernels = kernels.filter(pl.col("kernel_id").is_in(measured) | (pl.col("generator") == "reference"))
    # a kernel's parent stays only when it is kept
    kernels = kernels.with_columns(pl.when(pl.col("parent_kernel_id").is_in(set(kernels["kernel_id"])))
                                   .then(pl.col("parent_kernel_id")).alias("parent_kernel_id"))
    folder.mkdir(parents=True, exist_ok=True)
    k, r = folder / KERNELS_FILE, folder / RESULTS_FILE
    kernels.write_parquet(k)
    results.write_parquet(r)
    return k, r


def kernel_flow(folder: Path, value: str, notes: list[str]) -> Callable[[], dict[str, Any]]:
    """Ingest -> curate -> the reference forecasts of the eval pairs, and one forecast of the first
    eval pair with candidate `value` through `load_forecaster`, into `forecasts`, in a warehouse
    under `folder`."""
    import polars as pl

    from orchestration.settings import CurationSettings
    from pipelines.curation.stored import curate_and_store
    from pipelines.forecasting import load_forecaster
    from warehouse.datasets import current_dataset_version, read_pairs
    from warehouse.db import connect
    from warehouse.forecasts import write_forecasts
    from warehouse.ingest import ingest_paths
    from warehouse.kernels import read_kernels

    reference_forecasts = _entry([("pipelines.forecasting.references", "reference_forecasts"),
                                  ("pipelines.evaluation.suite", "reference_forecasts")], notes)
    files = _small_files(folder / "in")
    db = folder / "warehouse.duckdb"

    def run(follow: Callable[[str, str], None]) -> dict[str, Any]:
        with connect(db) as con:
            ingest_paths(con, list(files))
        stored = curate_and_store(db, CurationSettings(eval_per_bin=2, cross_pairs_per_task=20))
        with connect(db) as con:
            version = current_dataset_version(con)
            evals = pl.concat([read_pairs(con, version, "eval"), read_pairs(con, version, "discovery")],
                              how="diagonal_relaxed")
            frame = reference_forecasts(evals, read_pairs(con, version, "train"))
            keep = [c for c in frame.columns if c in _forecast_columns(con)]
            written = write_forecasts(con, frame.select(keep))
            # one forecast of the followed kernel's pair through the forecasting interface
            mine = evals.filter(pl.col("candidate_kernel_id") == value).head(1)
            ids = [*mine["anchor_kernel_id"], *mine["candidate_kernel_id"]]
            kernels = {r["kernel_id"]: r for r in read_kernels(con, kernel_ids=ids).iter_rows(named=True)}
            one = load_forecaster("baseline:bin_prior", training_pairs=read_pairs(con, version, "train"))
            written += write_forecasts(con, one.forecast_rows(mine, kernels)) if mine.height else 0
        return {"pairs": stored.rows.height, "eval_pairs": evals.height, "forecasts": written,
                "its_pairs": mine.height, "evals": evals}

    return run


def _forecast_columns(con) -> set[str]:
    return {r[0] for r in con.execute("select column_name from information_schema.columns "
                                      "where table_name = 'forecasts'").fetchall()} | {"p"}


def kernel_values(value: str | None) -> dict[str, str]:
    """The kernel id to follow (default: the first candidate, sorted, of an eval reference pair)
    and the id of the pair the flow forecasts it in, found by running the flow once untraced."""
    import polars as pl

    with tempfile.TemporaryDirectory() as tmp:
        evals = kernel_flow(Path(tmp), "", [])(lambda label, value: None)["evals"]
    if value is None:
        value = sorted(evals.filter(pl.col("pair_type") == "reference")["candidate_kernel_id"])[0]
    mine = evals.filter(pl.col("candidate_kernel_id") == value).head(1)
    return {"kernel id": value, **({"its pair id": mine["pair_id"][0]} if mine.height else {})}


def _toy_pairs(repo: Path):
    """tests/forecasting/test_forecasting_models.py's toy_pairs of the checkout."""
    path = repo / "tests" / "forecasting" / "test_forecasting_models.py"
    sys.path[1:1] = [str(repo / "tests"), str(path.parent)]  # its own imports (supervised_toy, ...)
    spec = importlib.util.spec_from_file_location("walk_toy_pairs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.toy_pairs


def model_flow(repo: Path, folder: Path, notes: list[str]) -> Callable[[], dict[str, Any]]:
    """Register a tiny cost model in a fresh home, alias it, and run `kernelcast forecast --model`."""
    import mlflow
    from typer.testing import CliRunner

    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    os.environ["KERNELCAST_HOME"] = str(home)
    uri = f"sqlite:///{(home / 'mlflow.db').resolve()}"
    anchor, candidate = folder / "anchor.py", folder / "candidate.py"
    anchor.write_text("import torch\n\n\ndef custom_kernel(data):\n    (x,) = data\n"
                      "    return torch.softmax(x.float(), dim=-1).to(torch.bfloat16)\n")
    candidate.write_text("import torch\n\n\ndef custom_kernel(data):\n    (x,) = data\n"
                         "    e = torch.exp(x.float() - x.float().amax(dim=-1, keepdim=True))\n"
                         "    return (e / e.sum(dim=-1, keepdim=True)).to(torch.bfloat16)\n")

    from models.classical import CostModel
    from models.classical.registry import log_classical
    from orchestration.cli import app

    toy_pairs = _toy_pairs(repo)  # fitted before the walk: the reference is not in it
    fit, y, l2 = toy_pairs(200, 0)
    cal, y_cal, _ = toy_pairs(60, 1)
    model = CostModel(max_iter=30)
    model.fit(fit, y, l2)
    model.calibrate(cal, y_cal)

    def run(follow: Callable[[str, str], None]) -> dict[str, Any]:
        extra = {}
        if "model_logger" in inspect.signature(log_classical).parameters:
            extra["model_logger"] = _entry([("pipelines.forecasting.pyfunc", "log_classical_sources_model")], notes)
        else:
            notes.append("log_classical logs the scikit-learn model itself (no model_logger in this checkout)")
        _, version = log_classical(model, uri, fit.head(4), MODEL_NAME, "ds-walk", "in_distribution", **extra)
        follow("its version", f"models:/{MODEL_NAME}/{version}")  # what the alias resolves to
        mlflow.MlflowClient(uri, registry_uri=uri).set_registered_model_alias(MODEL_NAME, "champion", str(version))
        result = CliRunner().invoke(app, ["forecast", "--task", WALK_TASK, "--anchor", str(anchor),
                                          "--candidate", str(candidate), "--model", MODEL_REF, "--json"])
        if result.exit_code != 0:
            raise SystemExit(f"kernelcast forecast exited {result.exit_code}: "
                             f"{(result.output or repr(result.exception)).strip().splitlines()[-1:]}")
        rows = json.loads(result.output[result.output.index("["):])
        return {"version": version, "forecast": [{k: r.get(k) for k in ("predicted_bin", "kind", "model_ref")}
                                                 for r in rows]}

    return run


def _commit(repo: Path) -> str:
    """The last commit of `repo` that changed the product (its floors), not the scripts or docs."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%h", "--", *FLOORS],
                              capture_output=True, text=True, check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@contextmanager
def _checkout(repo: Path) -> Iterator[None]:
    """Import the product from `repo` (this process and the children it starts)."""
    sys.path.insert(0, str(repo))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ.setdefault("TRITON_INTERPRET", "1")
    yield


def walk(name: str, repo: Path, value: str | None = None) -> dict[str, Any]:
    """Run the `name` flow ("kernel" or "model") on the checkout `repo` under the tracer."""
    notes: list[str] = []
    with _checkout(repo), tempfile.TemporaryDirectory() as tmp:
        if name == "kernel":
            values = kernel_values(value)
            run = kernel_flow(Path(tmp), values["kernel id"], notes)
        else:
            values = {"reference": value or MODEL_REF}
            run = model_flow(repo, Path(tmp), notes)
        t0 = time.perf_counter()
        with ValueTracer(dict(values), Project(repo)) as tracer:
            out = run(tracer.values.__setitem__)
        seconds = time.perf_counter() - t0
        values = tracer.values
    out.pop("evals", None)
    notes.append("flow result: " + json.dumps(out, default=str))
    calls = [dataclasses.asdict(c) for c in tracer.calls]
    return {"name": name, "value": next(iter(values.values())), "values": values, "commit": _commit(repo), "repo": str(repo), "seconds": seconds,
            "functions_seen": tracer.functions_seen, "notes": notes, "calls": calls,
            "summary": summary(tracer.calls)}


# ---- the figure -------------------------------------------------------------------------------
def room_order(rooms: set[str]) -> list[str]:
    """Rooms top to bottom as docs/architecture.md stacks them: orchestration, assets, the rooms of
    pipelines/ (highest first), models, warehouse."""
    sys.path.insert(0, str(HERE))
    from tests.test_import_structure import ROOMS

    def key(room: str) -> tuple[int, int, str]:
        floor = room.split(".")[0]
        inner = len(ROOMS) - ROOMS.index(room) if room in ROOMS else len(ROOMS) + 1
        return FLOORS.index(floor) if floor in FLOORS else len(FLOORS), inner, room

    return sorted(rooms, key=key)


def draw(walks: list[dict[str, Any]], out: Path, title: str) -> None:
    """One panel per walk: the calls in order (x) through the rooms (y), a line between consecutive
    calls, a colour per followed value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rooms = room_order({c["room"] for w in walks for c in w["calls"]})
    y = {r: i for i, r in enumerate(rooms)}
    fig, axes = plt.subplots(len(walks), 1, figsize=(12, 1.2 + 0.42 * len(rooms) * len(walks)), squeeze=False)
    for ax, w in zip(axes[:, 0], walks, strict=True):
        ys = [y[c["room"]] for c in w["calls"]]
        ax.plot(range(len(ys)), ys, color="#99a", lw=0.7)
        for label, colour in zip(w["values"], COLOURS, strict=False):
            xs = [i for i, c in enumerate(w["calls"]) if c["value"] == label]
            ax.plot(xs, [ys[i] for i in xs], ls="none", marker="o", ms=3.5, color=colour, label=label)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        ax.set_yticks(range(len(rooms)), rooms, fontsize=8)
        ax.set_ylim(len(rooms) - 0.5, -0.5)
        ax.set_xlim(-1, max(len(ys), 1))
        ax.grid(axis="y", color="#ddd", lw=0.5)
        s = w["summary"]
        ax.set_title(f"{w['commit']}: {s['calls']} calls, {s['functions']} functions, {len(s['files'])} files, "
                     f"{len(s['rooms'])} rooms", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("calls that receive the value, in order", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


# ---- command line -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("walk", choices=("kernel", "model", "draw"))
    ap.add_argument("--repo", default=str(HERE), help="the checkout whose product runs (default: this one)")
    ap.add_argument("--value", help="kernel: the kernel id to follow (default: picked from an untraced run)")
    ap.add_argument("--json", help="write the walk here")
    ap.add_argument("--before", help="draw: the older walk's JSON")
    ap.add_argument("--after", help="draw: the newer walk's JSON")
    ap.add_argument("--out", help="draw: the figure's path")
    args = ap.parse_args(argv)
    if args.walk == "draw":
        if not (args.before and args.after and args.out):
            ap.error("draw needs --before, --after and --out")
        try:
            walks = [json.loads(Path(p).read_text()) for p in (args.before, args.after)]
        except (OSError, json.JSONDecodeError) as exc:
            ap.error(f"cannot read a walk: {exc}")
        draw(walks, Path(args.out), f"the walk of {walks[1]['value']}")
        print(f"{args.out}: {' / '.join(w['commit'] for w in walks)}")
        return 0
    repo = Path(args.repo).resolve()
    if not (repo / "pipelines").is_dir():
        ap.error(f"{repo} is not a checkout of the product (no pipelines/)")
    result = walk(args.walk, repo, args.value)
    print_walk(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
