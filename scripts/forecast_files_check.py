"""Does `kernelcast forecast` on kernel files score what the evaluation scored on the same pairs?

    python3 scripts/forecast_files_check.py --home .kernelcast --model models:/kernelcast-surrogate/1 \
        [--pairs 100] [--out DIR]

Takes `--pairs` eval pairs of the home's current dataset version whose anchor is the task's
reference (a few tasks, so each task is one `kernelcast forecast` call with one anchor and many
candidates), writes both kernels of each pair as files under --out, runs `kernelcast forecast
--json --no-check` on them as a user would, and prints, beside each other, the Brier score of
those answers and of the evaluation's forecasts of the same model on the same pairs in the
`source_only` split (a file carries no generator metadata), and the largest difference of one
bin's probability. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]


def brier(p: np.ndarray, true_bin: np.ndarray) -> float:
    onehot = np.eye(8)[true_bin - 1]
    return float(((p - onehot) ** 2).sum(axis=1).mean() / 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a KERNELCAST_HOME that `kernelcast run` filled")
    parser.add_argument("--model", required=True, help="a registered classical version, e.g. models:/kernelcast-surrogate/1")
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="where the kernel files go (default: a temporary folder)")
    args = parser.parse_args(argv)

    from warehouse.db import connect

    db = args.home / "warehouse.duckdb"
    if not db.is_file():
        print(f"error: {db} does not exist: run `kernelcast run` with KERNELCAST_HOME={args.home} first", file=sys.stderr)
        return 2
    with connect(db, read_only=True) as con:
        version = con.sql("SELECT dataset_version FROM dataset_versions ORDER BY created_at DESC LIMIT 1").fetchall()[0][0]
        pairs = con.sql(
            """SELECT p.pair_id, p.task, p.hardware_id, p.anchor_kernel_id, p.candidate_kernel_id, p.true_bin,
                      a.source AS anchor_source, c.source AS candidate_source
               FROM pairs p JOIN kernels a ON a.kernel_id = p.anchor_kernel_id
                            JOIN kernels c ON c.kernel_id = p.candidate_kernel_id
               WHERE p.dataset_version = ? AND p.split = 'eval' AND a.generator = 'reference'
               ORDER BY p.pair_id""", params=[version]).pl()
        with_features = {r[0] for r in con.sql(
            "SELECT kernel_id FROM kernel_source_features WHERE status IN ('ok', 'partial')").fetchall()}
        evaluated = con.sql("SELECT pair_id, [p1, p2, p3, p4, p5, p6, p7, p8] AS p FROM forecasts WHERE model_ref = ? AND repeat = 0",
                            params=[f"{args.model}|source_only"]).pl()
    pairs = pairs.filter(pl.col("pair_id").is_in(evaluated["pair_id"].implode())).head(args.pairs)
    if pairs.is_empty():
        print(f"error: no eval pair of {version} has a source_only forecast of {args.model}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="forecast-files-"))
    answered: dict[str, list[float]] = {}
    env = {**os.environ, "KERNELCAST_HOME": str(args.home)}
    for (task, hardware, anchor_id), group in pairs.group_by(["task", "hardware_id", "anchor_kernel_id"], maintain_order=True):
        folder = out / task / anchor_id[:12]
        folder.mkdir(parents=True, exist_ok=True)
        anchor = folder / "anchor.py"
        anchor.write_text(group["anchor_source"][0])
        files = {}
        for pid, source in group.select("pair_id", "candidate_source").iter_rows():
            files[str(folder / f"{pid}.py")] = pid
            (folder / f"{pid}.py").write_text(source)
        cmd = [sys.executable, "-m", "orchestration.cli", "forecast", "--task", task, "--anchor", str(anchor),
               "--hardware", hardware, "--model", args.model, "--no-check", "--json", "--candidate", *files]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
        if res.returncode not in (0, 1):
            print(f"error: kernelcast forecast on {task} exited {res.returncode}: {res.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        for row in json.loads(res.stdout):
            if row["p"] is not None:
                answered[files[row["file"]]] = row["p"]
        print(f"{task}: {len(files)} files, {sum(files[f] in answered for f in files)} answered")
    ids = [pid for pid in pairs["pair_id"].to_list() if pid in answered]
    truth = pairs.filter(pl.col("pair_id").is_in(ids)).sort("pair_id")
    ids = truth["pair_id"].to_list()
    from_files = np.array([answered[i] for i in ids])
    ev = dict(evaluated.select("pair_id", "p").iter_rows())
    from_eval = np.array([ev[i] for i in ids])
    y = truth["true_bin"].to_numpy()
    print(f"dataset {version}, model {args.model}, {len(ids)} of {pairs.height} pairs answered from files")
    # A kernel whose source features the warehouse lacks is forecast there from its compile
    # features alone; its file gets both, so the two answers can differ for that reason alone.
    both = np.array([a in with_features and c in with_features for a, c in
                     truth.select("anchor_kernel_id", "candidate_kernel_id").iter_rows()])
    for name, mask in (("all pairs", np.ones(len(ids), bool)),
                       ("both kernels with source features in the warehouse", both),
                       ("a kernel without them", ~both)):
        if not mask.any():
            print(f"{name}: none")
            continue
        diff = np.abs(from_files[mask] - from_eval[mask]).max()
        print(f"{name} ({int(mask.sum())}): Brier from files {brier(from_files[mask], y[mask]):.4f}, "
              f"of the evaluation (source_only) {brier(from_eval[mask], y[mask]):.4f}, "
              f"largest difference of one bin's p {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
