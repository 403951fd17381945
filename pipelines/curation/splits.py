"""Eval / training / discovery splits without leakage through near-copies (method.md 5).

- Eval candidates: per (task, hardware) and true bin, up to `per_bin` candidates (default
  12, so at most 96 per task and hardware), chosen by a seeded hash of the kernel id (the
  same data and seed give the same choice whatever the row order). Bins with fewer
  candidates give all they have; the shortfall is reported per (task, hardware, bin).
  eval_set = the reference pairs of the chosen (hardware, candidate) rows.
- Blocked kernels: everything within `lineage_k` mutations of an eval candidate, meaning
  every kernel that shares an ancestor-or-self with it at most k generations above both.
  For k = 1: the candidate, its parent, its children and its siblings. The task reference
  is never blocked (it anchors every reference pair) and does not link its children.
- Each hardware is split on its own (`make_splits` per `hardware_id`, with the lineage of the
  kernels measured there): a kernel is blocked in the training pool of the hardware whose eval
  or external candidates it neighbours. Every forecaster is fitted on the pairs of one hardware
  (pipelines.surrogates.roles), so a second card's measurements (rewrites of the first card's
  kernels, say) leave the first card's splits as they were, pair for pair; the cross-hardware
  settings (pipelines.surrogates.cross_hardware) keep what the reference card's forecasters
  learned from out of the other card's eval pairs.
- rl_training_pool: reference and cross pairs whose candidate and anchor are not blocked,
  that are not eval pairs, and whose task is not held out (the paper kept
  gdn_chunk_fwd_o out of training).
- discovery_pairs: every parent pair, with `leak_free` = neither kernel appears in the
  training pool (read a trained model's discovery numbers on those).
- Styles: kernels of the style generators (pipelines.generation.styles: PyTorch programs,
  library-style Triton) are learned from like the template kernels, but are never eval
  candidates: the eval set stays the template kernels' (its figures compare across versions),
  and each style is scored held out instead (pipelines.surrogates.roles: forecasters fitted
  without it, on every reference pair of it).
- external_set: the reference pairs of kernels no learned generator wrote (generator neither
  the template's, the reference, nor a style's: rewrites, hand-written, LLM-written, fetched ones).
  They are never eval candidates of the in-distribution set, and they and their whole lineage
  (`external_lineage`: every ancestor up to the task reference, every descendant, and the
  `lineage_k` neighbourhood) are kept out of the training pool, on every hardware. The pairs
  table knows three splits (train/eval/discovery), so the external pairs are stored under
  'eval'; `is_external_generator` on the candidate's generator tells the two eval parts apart
  (pipelines.surrogates.roles).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import polars as pl

from models.bins import NUM_BINS
from pipelines.generation.styles import STYLE_GENERATORS

log = logging.getLogger(__name__)

DEFAULT_PER_BIN = 12
DEFAULT_LINEAGE_K = 1
TEMPLATE_GENERATORS = ("kernelcast-space", "reference")
LEARNED_GENERATORS = (*TEMPLATE_GENERATORS, *STYLE_GENERATORS)


def is_external_generator(generator: str | None) -> bool:
    """Whether a kernel's generator is none that is learned from: not the template generator,
    the task reference, nor a style generator.

    A missing generator is not external: kernels recorded before the column existed are the
    generator's own.

    >>> [is_external_generator(g) for g in ("kernelcast-space", "reference", None, "pytorch-programs",
    ...                                     "rewrite:unroll", "llm:x")]
    [False, False, False, False, True, True]
    """
    return generator is not None and str(generator) not in LEARNED_GENERATORS


def external_kernel_ids(lineage: pl.DataFrame) -> set[str]:
    """Kernel ids of a lineage frame whose `generator` is external (none without the column)."""
    if "generator" not in lineage.columns or lineage.is_empty():
        return set()
    return {k for k, g in lineage.select("kernel_id", "generator").unique().rows() if is_external_generator(g)}


def style_kernel_ids(lineage: pl.DataFrame) -> dict[str, set[str]]:
    """Style generator -> the ids of its kernels in a lineage frame (styles without kernels left out)."""
    if "generator" not in lineage.columns or lineage.is_empty():
        return {}
    out: dict[str, set[str]] = {}
    for k, g in lineage.select("kernel_id", "generator").unique().rows():
        if g in STYLE_GENERATORS:
            out.setdefault(g, set()).add(k)
    return out


@dataclass(frozen=True)
class SplitConfig:
    """Split settings.

    Attributes:
        per_bin: eval candidates per (task, hardware, bin); 12 x 8 bins = 96 per task at most.
        lineage_k: mutations around an eval candidate kept out of training (1: parent,
            children, siblings).
        holdout_tasks: tasks kept entirely out of training (still evaluated).
        seed: seed of the eval choice.
    """

    per_bin: int = DEFAULT_PER_BIN
    lineage_k: int = DEFAULT_LINEAGE_K
    holdout_tasks: tuple[str, ...] = ()
    seed: int = 0


@dataclass(frozen=True)
class Splits:
    """The pair sets and what decided them."""

    eval_set: pl.DataFrame
    rl_training_pool: pl.DataFrame
    discovery_pairs: pl.DataFrame
    shortfall: pl.DataFrame  # task, hardware_id, bin, available, target, selected, shortfall
    blocked_kernel_ids: frozenset[str] = field(default_factory=frozenset)
    external_set: pl.DataFrame | None = None  # reference pairs of non-template kernels (split 'eval')

    def all_pairs(self) -> pl.DataFrame:
        """The sets stacked, each with its `split` column (eval/train/discovery)."""
        external = [self.external_set] if self.external_set is not None and self.external_set.height else []
        return pl.concat(
            [self.eval_set, *external, self.rl_training_pool, self.discovery_pairs.drop("leak_free")],
            how="diagonal_relaxed",
        )


def _hash_key(seed: int, kernel_id: str) -> str:
    return hashlib.sha256(f"{seed}|{kernel_id}".encode()).hexdigest()


def select_eval_candidates(
    reference_pairs: pl.DataFrame, per_bin: int = DEFAULT_PER_BIN, seed: int = 0
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Bin-balanced choice of eval pairs among reference pairs.

    Args:
        reference_pairs: pairs of type 'reference' (task, hardware_id, candidate_kernel_id,
            true_bin, ...).
        per_bin: target per (task, hardware, bin).
        seed: the choice is the `per_bin` smallest sha256(seed|kernel id) in each cell.
    Returns:
        (the chosen pairs, the shortfall frame with one row per task, hardware and bin 1..8).
    """
    ranked = reference_pairs.with_columns(
        pl.Series("_h", [_hash_key(seed, k) for k in reference_pairs["candidate_kernel_id"]], dtype=pl.Utf8)
    ).sort(["task", "hardware_id", "true_bin", "_h"])
    chosen = ranked.filter(pl.int_range(pl.len()).over(["task", "hardware_id", "true_bin"]) < per_bin).drop("_h")
    cells = reference_pairs.select("task", "hardware_id").unique().join(
        pl.DataFrame({"bin": list(range(1, NUM_BINS + 1))}, schema={"bin": pl.Int64}), how="cross"
    )
    avail = reference_pairs.group_by("task", "hardware_id", pl.col("true_bin").alias("bin")).agg(
        pl.len().cast(pl.Int64).alias("available")
    )
    shortfall = (
        cells.join(avail, on=["task", "hardware_id", "bin"], how="left")
        .with_columns(pl.col("available").fill_null(0), pl.lit(per_bin, dtype=pl.Int64).alias("target"))
        .with_columns(pl.min_horizontal("available", "target").alias("selected"))
        .with_columns((pl.col("target") - pl.col("selected")).alias("shortfall"))
        .sort("task", "hardware_id", "bin")
    )
    short = shortfall.filter(pl.col("shortfall") > 0)
    if short.height:
        log.info("eval selection short in %d (task, hardware, bin) cells, %d candidates in all",
                 short.height, int(short["shortfall"].sum()))
    return chosen, shortfall


def lineage_map(lineage: pl.DataFrame, reference_ids: Iterable[str] = ()) -> dict[str, str]:
    """child -> parent from a frame with kernel_id, parent_kernel_id; reference edges dropped."""
    refs = set(reference_ids)
    rows = lineage.select("kernel_id", "parent_kernel_id").unique().drop_nulls().rows()
    return {c: p for c, p in rows if p not in refs and c not in refs}


def lineage_neighbourhood(kernels: Iterable[str], parent_of: Mapping[str, str], k: int = DEFAULT_LINEAGE_K) -> set[str]:
    """Kernels sharing an ancestor-or-self with one of `kernels`, at most k generations above both.

    Args:
        kernels: the centres (eval candidates).
        parent_of: child -> parent.
        k: generations.
    Returns:
        The centres and their neighbourhoods.

    >>> parent_of = {"b": "a", "c": "a", "d": "b", "e": "d"}
    >>> sorted(lineage_neighbourhood(["b"], parent_of, 1))  # parent, sibling, child
    ['a', 'b', 'c', 'd']
    >>> sorted(lineage_neighbourhood(["b"], parent_of, 0))
    ['b']
    """
    children: dict[str, list[str]] = {}
    for c, p in parent_of.items():
        children.setdefault(p, []).append(c)
    out: set[str] = set()
    for centre in kernels:
        ancestors, node = [centre], centre
        for _ in range(k):
            node = parent_of.get(node)
            if node is None:
                break
            ancestors.append(node)
        for anc in ancestors:
            # From each ancestor (at most k generations up), go down at most k generations.
            frontier = [anc]
            out.add(anc)
            for _ in range(k):
                frontier = [ch for f in frontier for ch in children.get(f, [])]
                out.update(frontier)
    return out


def external_lineage(kernels: Iterable[str], parent_of: Mapping[str, str], k: int = DEFAULT_LINEAGE_K) -> set[str]:
    """Every kernel sharing a lineage with one of `kernels`: the kernels, their ancestors up to
    the task reference (`parent_of` holds no reference edge), every descendant of the kernels
    (any depth) and their `lineage_neighbourhood` of k (siblings, the parent's other children).

    A rewrite of a template kernel shares that kernel's code: its parent chain must not be
    learned from, nor anything derived from the rewrite.

    >>> parent_of = {"b": "a", "c": "a", "d": "b", "e": "d", "x": "w"}
    >>> sorted(external_lineage(["d"], parent_of, 1))
    ['a', 'b', 'd', 'e']
    >>> sorted(external_lineage(["d"], parent_of, 0))
    ['a', 'b', 'd', 'e']
    """
    children: dict[str, list[str]] = {}
    for c, p in parent_of.items():
        children.setdefault(p, []).append(c)
    centres = set(kernels)
    out = lineage_neighbourhood(centres, parent_of, k) | centres
    for centre in centres:
        node, seen = centre, {centre}
        while (node := parent_of.get(node)) is not None and node not in seen:  # a cycle is bad data: stop
            seen.add(node)
            out.add(node)
        frontier = [centre]
        while frontier:
            frontier = [ch for f in frontier for ch in children.get(f, []) if ch not in out]
            out.update(frontier)
    return out


def lineage_on(lineage: pl.DataFrame, hardware_id: str) -> pl.DataFrame:
    """The rows of a lineage frame for the kernels measured on one hardware, one per kernel (a
    frame without `hardware_id` is every hardware's lineage, returned as it is).

    >>> f = pl.DataFrame({"hardware_id": ["a", "b", "b"], "kernel_id": ["k", "k", "j"], "parent_kernel_id": [None] * 3})
    >>> lineage_on(f, "b")["kernel_id"].sort().to_list(), lineage_on(f.drop("hardware_id"), "a").height
    (['j', 'k'], 3)
    """
    if "hardware_id" not in lineage.columns:
        return lineage
    return lineage.filter(pl.col("hardware_id") == hardware_id).drop("hardware_id").unique("kernel_id", keep="first")


def make_splits(pairs: pl.DataFrame, lineage: pl.DataFrame, config: SplitConfig = SplitConfig()) -> Splits:
    """Eval set, RL training pool and discovery pairs from all pairs, each hardware on its own.

    Args:
        pairs: output of `pairs.build_pairs`.
        lineage: kernel_id, parent_kernel_id (and `generator`, which names the external kernels)
            of every known kernel (the labels frame will do); with `hardware_id`, the rows of the
            kernels measured on each hardware, which split that hardware's pairs.
        config: `SplitConfig`.
    Returns:
        `Splits`; each frame carries a `split` column (the external set's is 'eval').
    """
    cards = sorted(set(pairs["hardware_id"].to_list())) if pairs.height else []
    if len(cards) <= 1:
        return _hardware_splits(pairs, lineage_on(lineage, cards[0]) if cards else lineage, config)
    parts = [_hardware_splits(pairs.filter(pl.col("hardware_id") == hw), lineage_on(lineage, hw), config)
             for hw in cards]

    def stacked(frames: list[pl.DataFrame]) -> pl.DataFrame:
        return pl.concat(frames, how="diagonal_relaxed")

    return Splits(
        eval_set=stacked([p.eval_set for p in parts]),
        rl_training_pool=stacked([p.rl_training_pool for p in parts]),
        discovery_pairs=stacked([p.discovery_pairs for p in parts]),
        shortfall=stacked([p.shortfall for p in parts]),
        blocked_kernel_ids=frozenset().union(*(p.blocked_kernel_ids for p in parts)),
        external_set=stacked([p.external_set for p in parts if p.external_set is not None]),
    )


def _hardware_splits(pairs: pl.DataFrame, lineage: pl.DataFrame, config: SplitConfig) -> Splits:
    """`make_splits` of the pairs of one hardware, with the lineage of its kernels."""
    reference = pairs.filter(pl.col("pair_type") == "reference")
    ref_ids = set(reference["anchor_kernel_id"].to_list())
    external = external_kernel_ids(lineage) - ref_ids
    is_ext = pl.col("candidate_kernel_id").is_in(list(external))
    external_set = reference.filter(is_ext)
    styled = set().union(*style_kernel_ids(lineage).values())
    eval_set, shortfall = select_eval_candidates(
        reference.filter(~is_ext & ~pl.col("candidate_kernel_id").is_in(list(styled))), config.per_bin, config.seed)
    parent_of = lineage_map(lineage, ref_ids)
    blocked = lineage_neighbourhood(eval_set["candidate_kernel_id"].unique().to_list(), parent_of, config.lineage_k)
    blocked |= external_lineage(external, parent_of, config.lineage_k)
    blocked -= ref_ids
    eval_ids = set(eval_set["pair_id"].to_list()) | set(external_set["pair_id"].to_list())
    pool = pairs.filter(
        pl.col("pair_type").is_in(["reference", "cross"])
        & ~pl.col("pair_id").is_in(list(eval_ids))
        & ~pl.col("candidate_kernel_id").is_in(list(blocked))
        & ~pl.col("anchor_kernel_id").is_in(list(blocked))
        & ~pl.col("task").is_in(list(config.holdout_tasks))
    )
    train_kernels = set(pool["candidate_kernel_id"].to_list()) | set(pool["anchor_kernel_id"].to_list())
    discovery = pairs.filter(pl.col("pair_type") == "parent").with_columns(
        (
            ~pl.col("candidate_kernel_id").is_in(list(train_kernels))
            & ~pl.col("anchor_kernel_id").is_in(list(train_kernels))
        ).alias("leak_free")
    )
    log.info("splits: eval %d, external %d, train %d, discovery %d, blocked kernels %d",
             eval_set.height, external_set.height, pool.height, discovery.height, len(blocked))
    return Splits(
        eval_set=eval_set.with_columns(pl.lit("eval").alias("split")),
        external_set=external_set.with_columns(pl.lit("eval").alias("split")),
        rl_training_pool=pool.with_columns(pl.lit("train").alias("split")),
        discovery_pairs=discovery.with_columns(pl.lit("discovery").alias("split")),
        shortfall=shortfall,
        blocked_kernel_ids=frozenset(blocked),
    )


def find_leakage(
    eval_set: pl.DataFrame,
    training_pool: pl.DataFrame,
    lineage: pl.DataFrame,
    *,
    lineage_k: int = DEFAULT_LINEAGE_K,
    holdout_tasks: Iterable[str] = (),
) -> list[str]:
    """Training pair ids that leak eval information; must be empty.

    A training pair leaks if it is an eval pair, if its candidate or (non-reference) anchor
    is within `lineage_k` mutations of an eval candidate, if it shares a lineage with an
    external kernel (`external_lineage`; the `generator` column of `lineage` names them), or if
    its task is held out.

    Args:
        eval_set: eval pairs (reference pairs; the external ones among them too).
        training_pool: training pairs.
        lineage: kernel_id, parent_kernel_id, optionally generator.
        lineage_k: as in `SplitConfig`.
        holdout_tasks: tasks that must not appear in training.
    Returns:
        Sorted offending training pair ids. With pairs of several hardware (and a lineage frame
        with `hardware_id`), each hardware's training pairs are held against its own eval pairs,
        as `make_splits` draws them.
    """
    cards = sorted(set(eval_set["hardware_id"].to_list()) | set(training_pool["hardware_id"].to_list())) \
        if "hardware_id" in eval_set.columns and "hardware_id" in training_pool.columns else []
    if len(cards) > 1:
        return sorted({pid for hw in cards for pid in find_leakage(
            eval_set.filter(pl.col("hardware_id") == hw), training_pool.filter(pl.col("hardware_id") == hw),
            lineage_on(lineage, hw), lineage_k=lineage_k, holdout_tasks=holdout_tasks)})
    lineage = lineage_on(lineage, cards[0]) if cards else lineage
    ref_ids = set(eval_set["anchor_kernel_id"].to_list())
    parent_of = lineage_map(lineage, ref_ids)
    blocked = lineage_neighbourhood(eval_set["candidate_kernel_id"].to_list(), parent_of, lineage_k)
    blocked = (blocked | external_lineage(external_kernel_ids(lineage) - ref_ids, parent_of, lineage_k)) - ref_ids
    eval_ids = set(eval_set["pair_id"].to_list())
    held = set(holdout_tasks)
    bad = [
        pid
        for pid, a, c, t in training_pool.select("pair_id", "anchor_kernel_id", "candidate_kernel_id", "task").rows()
        if pid in eval_ids or c in blocked or a in blocked or t in held
    ]
    return sorted(set(bad))


DEFAULT_CALIBRATION_PER_BIN = 4
CALIBRATION_SEED_OFFSET = 7919  # a seed apart from the eval choice's, so the two draws differ


@dataclass(frozen=True)
class CalibrationSplit:
    """Training pairs cut in two for post-hoc calibration (method.md section 5b).

    fit: the pairs a model learns from; calibration: bin-balanced reference pairs on which
    its temperature / biases are fitted; blocked: kernels within `lineage_k` mutations of a
    calibration candidate, kept out of `fit` as eval neighbourhoods are kept out of training.
    """

    fit: pl.DataFrame
    calibration: pl.DataFrame
    blocked_kernel_ids: frozenset[str] = field(default_factory=frozenset)


def calibration_split(
    training_pool: pl.DataFrame,
    lineage: pl.DataFrame,
    per_bin: int = DEFAULT_CALIBRATION_PER_BIN,
    lineage_k: int = DEFAULT_LINEAGE_K,
    seed: int = 0,
) -> CalibrationSplit:
    """Carve a calibration split out of the training pool, the way the eval set is chosen.

    The calibration pairs are reference pairs of the pool, up to `per_bin` per (task,
    hardware, bin) by a seeded hash (as `select_eval_candidates`, another seed), so they are
    bin-balanced like the eval set; their lineage neighbourhoods leave the fit set. The input
    is the training pool only, so neither eval pairs nor eval lineages can enter either part.

    Args:
        training_pool: the dataset version's training pairs (split 'train').
        lineage: kernel_id, parent_kernel_id of the kernels.
        per_bin: calibration candidates per (task, hardware, bin).
        lineage_k: mutations around a calibration candidate kept out of the fit set.
        seed: the choice's seed (offset from the eval choice's).
    Returns:
        `CalibrationSplit`; fit and calibration are disjoint and share no blocked kernel.
    """
    reference = training_pool.filter(pl.col("pair_type") == "reference")
    if reference.is_empty():
        return CalibrationSplit(fit=training_pool, calibration=reference)
    chosen, _ = select_eval_candidates(reference, per_bin, seed + CALIBRATION_SEED_OFFSET)
    ref_ids = set(reference["anchor_kernel_id"].to_list())
    parent_of = lineage_map(lineage, ref_ids)
    blocked = lineage_neighbourhood(chosen["candidate_kernel_id"].unique().to_list(), parent_of, lineage_k) - ref_ids
    fit = training_pool.filter(
        ~pl.col("pair_id").is_in(chosen["pair_id"].to_list())
        & ~pl.col("candidate_kernel_id").is_in(list(blocked))
        & ~pl.col("anchor_kernel_id").is_in(list(blocked))
    )
    log.info("calibration split: %d calibration pairs, %d fit pairs, %d kernels blocked",
             chosen.height, fit.height, len(blocked))
    return CalibrationSplit(fit=fit, calibration=chosen, blocked_kernel_ids=frozenset(blocked))


def held_out_task_split(
    training_pool: pl.DataFrame, eval_set: pl.DataFrame, task: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(training pool without `task`, every reference pair of `task`) for held-out-task evaluation.

    A forecaster trained on the first never sees the task; it is scored on the task's eval and
    training reference pairs together (all of the task's correct kernels the version holds
    against its reference), the paper's held-out-task setting.

    >>> pool = pl.DataFrame({"task": ["a", "b", "b"], "pair_type": ["reference"] * 3, "pair_id": ["1", "2", "3"]})
    >>> ev = pl.DataFrame({"task": ["b"], "pair_type": ["reference"], "pair_id": ["4"]})
    >>> train, held = held_out_task_split(pool, ev, "b")
    >>> train["pair_id"].to_list(), sorted(held["pair_id"].to_list())
    (['1'], ['2', '3', '4'])
    """
    train = training_pool.filter(pl.col("task") != task)
    held = pl.concat(
        [eval_set.filter(pl.col("task") == task), training_pool.filter((pl.col("task") == task) & (pl.col("pair_type") == "reference"))],
        how="diagonal_relaxed",
    ).unique("pair_id", keep="first").sort("pair_id")
    return train, held
