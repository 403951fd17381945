"""A small head on a frozen language model's hidden states: the LLM surrogate that reads code.

The language model reads the prompt of a pair (both sources, as the logprob readout's prompt up
to the answer prefix, models.training.supervised.encode_rows) in one prefill. Of each chosen layer it
keeps the mean over the prompt's tokens and the hidden state of its last token (the position
where the surrogate's answer would start), and of the last layer also the eight label logits of
the zero-shot readout. A two-layer MLP on that vector (optionally with the pair's source-derived
feature vector beside it) gives the eight bins.

Why a head: supervised fine-tuning of the 135M model on the label tokens barely moved it off the
uniform forecast in one epoch, while the hidden states of one prefill already separate kernels
(which loads, which tiles, which ops); a head fitted on them trains in seconds, so many epochs,
a best epoch by calibration NLL and several heads fit in one short GPU run.

    emb = embed_prompts(model, tokenizer, encoded, label_ids, layers=(15, -1))
    emb = embed_prompts_shared(model, encoded, label_ids, layers=(15, -1))  # the same rows, shared runs read once
    head, record = train_head(x_fit, y_fit, x_cal, y_cal, HeadSettings())
    p = head_probs(head, x_eval)

Only torch and numpy: this runs on a GPU host without the rest of the stack.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.bins import NUM_BINS


@dataclass(frozen=True)
class HeadSettings:
    """How a head is fitted.

    Attributes:
        hidden: width of the MLP's hidden layer.
        dropout: dropout on the input and the hidden layer (the inputs are thousands of
            correlated numbers and the fit pairs a few thousand: it needs the regularisation).
        learning_rate / weight_decay: AdamW.
        epochs: most passes over the fit rows; patience: stop after this many epochs without a
            lower calibration NLL (the best epoch's weights are kept).
        batch_size: rows per step.
        label_smoothing: mass moved from the true bin to its neighbours (ordinal).
        seed: initialisation and batch order.
    """

    hidden: int = 256
    dropout: float = 0.2
    learning_rate: float = 1e-3
    weight_decay: float = 0.05
    epochs: int = 300
    patience: int = 30
    batch_size: int = 256
    label_smoothing: float = 0.05
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def truncate_middle(ids: Sequence[int], limit: int) -> list[int]:
    """The ids as they are when they fit `limit`, else their first and last halves (the task and
    anchor start a prompt, the candidate and the answer prefix end it).

    >>> truncate_middle([1, 2, 3, 4, 5], 4)
    [1, 2, 4, 5]
    >>> truncate_middle([1, 2], 4)
    [1, 2]
    """
    ids = list(ids)
    if len(ids) <= limit:
        return ids
    head = limit // 2
    return ids[:head] + ids[len(ids) - (limit - head):]


def resolve_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    """Indices into a model's hidden_states (0: embeddings, n_layers: the last block's output);
    negative ones count from the end.

    >>> resolve_layers((15, -1), 30)
    [15, 30]
    """
    out = []
    for layer in layers:
        i = n_layers + 1 + layer if layer < 0 else layer
        if not 0 <= i <= n_layers:
            raise ValueError(f"layer {layer} is outside 0..{n_layers} (or -1..-{n_layers + 1})")
        out.append(i)
    return out


@torch.no_grad()
def embed_prompts(model: Any, tokenizer: Any, encoded: Sequence[Sequence[int]], label_ids: Sequence[int],
                  layers: Sequence[int] = (-1,), tokens_per_batch: int = 65536, autocast: bool = False,
                  stop_at: float | None = None) -> np.ndarray | None:
    """(n, width) float32 embeddings of encoded prompts, in input order: per layer the mean
    over real tokens and the last token's hidden state, then the eight label logits at the last
    position. None when `stop_at` (time.time()) passes first.

    The prompts are left-padded (models.backends.transformers_backend.left_pad), so the last
    position is every prompt's own last token.
    """
    from models.backends.transformers_backend import left_pad
    from models.training.supervised import _backbone_and_head, length_batches

    model.eval()
    backbone, out_emb = _backbone_and_head(model)
    chosen = resolve_layers(layers, model.config.num_hidden_layers)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    labels = out_emb[torch.tensor(list(label_ids), device=device)].float()  # (8, hidden)
    width = 2 * len(chosen) * model.config.hidden_size + NUM_BINS
    out = np.zeros((len(encoded), width), dtype=np.float32)
    for batch in length_batches([len(e) for e in encoded], tokens_per_batch):
        if stop_at is not None and time.time() > stop_at:
            return None
        ids, mask, pos = left_pad([list(encoded[i]) for i in batch], pad, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            res = backbone(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                           output_hidden_states=True)
        m = mask.unsqueeze(-1).float()
        parts = []
        for i in chosen:
            h = res.hidden_states[i].float()
            parts += [(h * m).sum(1) / m.sum(1).clamp_min(1.0), h[:, -1, :]]
        parts.append(res.last_hidden_state[:, -1, :].float() @ labels.T)  # the zero-shot label logits
        out[batch] = torch.cat(parts, dim=1).cpu().numpy()
    return out


def prefix_tree(encoded: Sequence[Sequence[int]]) -> list[tuple[int, int, int, list[int], int]]:
    """The prompts as a tree of shared token runs, parents before children: rows of
    (parent row or -1, start, end, prompts ending there, a prompt holding the run); a row's run
    is tokens start..end of every prompt under it (the same ids in each), its parent's run ends
    at its start.

    Why: causal attention makes the hidden state at a position a function of the ids up to it
    alone, so a run shared by several prompts (the system prompt, the task, the anchor; the
    opening docstring of candidates of one family) needs one prefill for all of them.

    >>> prefix_tree([[1, 2, 3], [1, 2, 4, 5], [1, 2, 4]])
    [(-1, 0, 2, [], 0), (0, 2, 3, [0], 0), (0, 2, 3, [2], 2), (2, 3, 4, [1], 1)]
    """
    rows: list[tuple[int, int, int, list[int], int]] = []
    order = sorted(range(len(encoded)), key=lambda i: (list(encoded[i]), i))

    stack = [(order, -1, 0)] if encoded else []
    while stack:  # depth first, so a run's cache is freed soon after it is read
        members, parent, start = stack.pop()
        # in sorted order, what every member shares is what the first and the last share
        first, last = encoded[members[0]], encoded[members[-1]]
        end, n = start, min(len(first), len(last))
        while end < n and first[end] == last[end]:
            end += 1
        rows.append((parent, start, end, [i for i in members if len(encoded[i]) == end], members[0]))
        groups: dict[int, list[int]] = {}
        for i in members:
            if len(encoded[i]) > end:
                groups.setdefault(int(encoded[i][end]), []).append(i)
        stack += [(group, len(rows) - 1, end) for group in reversed(groups.values())]
    return rows


@torch.inference_mode()
def embed_prompts_shared(model: Any, encoded: Sequence[Sequence[int]], label_ids: Sequence[int],
                         layers: Sequence[int] = (-1,), tokens_per_batch: int = 8192,
                         tree: list[tuple[int, int, int, list[int], int]] | None = None) -> np.ndarray:
    """`embed_prompts`' rows (same layout, the same numbers up to float round-off), each token
    run that several prompts share prefilled once (`prefix_tree`): the run's keys and values
    are the prefix its continuations attend to, and its per-layer sums of hidden states count
    in the mean of every prompt under it. For a CPU reading prompts of one anchor: the anchor's
    half of every prompt is read once, not once a pair.

    The runs that go on from one run are read together, at most `tokens_per_batch` padded
    tokens a pass, padded on the right: under causal attention a token never sees the padding
    after it, so no mask is needed and no token of a run is read twice.

    `tree`: `prefix_tree(encoded)` where the caller has it already (it counts the tokens read).

    Raises:
        ValueError: an empty prompt (one line).
    """
    from models.training.prefix_attention import PrefixAttention
    from models.training.supervised import _backbone_and_head, length_batches

    if any(len(e) == 0 for e in encoded):
        raise ValueError("an empty prompt has no last token to read")
    model.eval()
    backbone, out_emb = _backbone_and_head(model)
    chosen = resolve_layers(layers, model.config.num_hidden_layers)
    device = next(model.parameters()).device
    labels = out_emb[torch.tensor(list(label_ids), device=device)].float()  # (8, hidden)
    width = 2 * len(chosen) * model.config.hidden_size + NUM_BINS
    out = np.zeros((len(encoded), width), dtype=np.float32)
    tree = prefix_tree(encoded) if tree is None else tree
    if not tree:
        return out
    kids: dict[int, list[int]] = {row: [] for row in range(-1, len(tree))}
    for row, (parent, *_rest) in enumerate(tree):
        kids[parent].append(row)
    # per row whose runs are still to be read: its keys and values per layer and the
    # hidden-state sums of the chosen layers up to its end
    states = {-1: ([], [torch.zeros(model.config.hidden_size, device=device) for _ in chosen])}
    todo = [-1]
    if tree[0][1] == tree[0][2]:  # nothing shared by all: the root's run is empty
        states[0], todo = states.pop(-1), [0]
    # the runs that go on from one run read in batches after its keys and values, the prefix
    # each pass attends to (models.training.prefix_attention)
    with PrefixAttention.use(backbone) as prefix:
        while todo:
            parent = todo.pop()
            kv, sums = states.pop(parent)
            runs = kids[parent]
            for batch in length_batches([tree[r][2] - tree[r][1] for r in runs], tokens_per_batch):
                rows = [runs[j] for j in batch]
                start, longest = tree[rows[0]][1], max(tree[r][2] - tree[r][1] for r in rows)
                ids = torch.zeros((len(rows), longest), dtype=torch.long)
                for b, r in enumerate(rows):
                    ids[b, : tree[r][2] - start] = torch.tensor(list(encoded[tree[r][4]][start:tree[r][2]]))
                prefix.kv = kv
                res = backbone(input_ids=ids.to(device), use_cache=True, output_hidden_states=True,
                               position_ids=torch.arange(start, start + longest, device=device).unsqueeze(0))
                for b, r in enumerate(rows):
                    n = tree[r][2] - start
                    hidden = [res.hidden_states[i][b, :n].float() for i in chosen]
                    row_sums = [s + h.sum(0) for s, h in zip(sums, hidden, strict=True)]
                    if tree[r][3]:
                        parts = []
                        for s, h in zip(row_sums, hidden, strict=True):
                            parts += [s / tree[r][2], h[-1]]
                        parts.append(res.last_hidden_state[b, n - 1].float() @ labels.T)  # the zero-shot label logits
                        out[tree[r][3]] = torch.cat(parts).cpu().numpy()
                    if kids[r]:  # its children's prefix: the parent's keys and values, then its own
                        own = [(layer.keys[b:b + 1, :, :n], layer.values[b:b + 1, :, :n]) for layer in res.past_key_values.layers]
                        states[r] = ([(torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(kv, own, strict=True)]
                                     if kv else [(k.clone(), v.clone()) for k, v in own], row_sums)
                        todo.append(r)
    return out


class BinHead(torch.nn.Module):
    """Standardise, then Linear -> GELU -> Linear onto the eight bins (logits)."""

    def __init__(self, width: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("scale", torch.ones(width))
        self.net = torch.nn.Sequential(torch.nn.Dropout(dropout), torch.nn.Linear(width, hidden), torch.nn.GELU(),
                                       torch.nn.Dropout(dropout), torch.nn.Linear(hidden, NUM_BINS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = ((x - self.mean) / self.scale).nan_to_num(0.0).clamp(-10.0, 10.0)
        return self.net(z)


def _scores(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    from models.training.supervised import calibration_scores

    return calibration_scores(torch.softmax(logits.float(), dim=-1).cpu(), y.cpu())


def train_head(x_fit: np.ndarray, y_fit: np.ndarray, x_cal: np.ndarray, y_cal: np.ndarray,
               settings: HeadSettings = HeadSettings(), device: str = "cpu",
               stop_at: float | None = None) -> tuple[BinHead, dict[str, Any]]:
    """Fit a head on (fit rows, bins 1..8); keep the epoch of lowest calibration NLL.

    Returns:
        (the head at its best epoch, in eval mode, on the CPU; its record: settings, per-epoch
        history, best_epoch, best calibration scores, seconds).
    Raises:
        ValueError: no fit or calibration rows, or widths that differ (one line).
    """
    from models.training.supervised import ordinal_targets

    if len(x_fit) == 0 or len(x_cal) == 0:
        raise ValueError(f"a head needs fit and calibration rows (got {len(x_fit)} and {len(x_cal)})")
    if x_fit.shape[1] != x_cal.shape[1]:
        raise ValueError(f"fit rows are {x_fit.shape[1]} wide, calibration rows {x_cal.shape[1]}")
    t0 = time.time()
    torch.manual_seed(settings.seed)
    head = BinHead(x_fit.shape[1], settings.hidden, settings.dropout)
    ok = np.isfinite(x_fit)
    count = ok.sum(axis=0)
    x0 = np.where(ok, x_fit, 0.0).astype(np.float64)
    mean = x0.sum(axis=0) / np.maximum(count, 1)  # a column never known stands at 0
    scale = np.sqrt((np.where(ok, x0 - mean, 0.0) ** 2).sum(axis=0) / np.maximum(count, 1))
    head.mean.copy_(torch.from_numpy(mean.astype(np.float32)))
    head.scale.copy_(torch.from_numpy(np.where(scale > 1e-6, scale, 1.0).astype(np.float32)))
    head.to(device)
    xf = torch.from_numpy(x_fit.astype(np.float32)).to(device)
    xc = torch.from_numpy(x_cal.astype(np.float32)).to(device)
    yf = torch.from_numpy(np.asarray(y_fit, dtype=np.int64))
    yc = torch.from_numpy(np.asarray(y_cal, dtype=np.int64))
    targets = ordinal_targets(yf, settings.label_smoothing).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay)
    gen = torch.Generator().manual_seed(settings.seed)
    history: list[dict[str, Any]] = []
    best: dict[str, Any] = {"nll": math.inf}
    best_state = None
    stale = 0
    for epoch in range(1, settings.epochs + 1):
        if stop_at is not None and time.time() > stop_at:
            break
        head.train()
        total = 0.0
        for idx in torch.randperm(len(xf), generator=gen).split(settings.batch_size):
            idx = idx.to(device)
            logits = head(xf[idx])
            loss = -(targets[idx] * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        head.eval()
        with torch.no_grad():
            cal = _scores(head(xc), yc)
        record = {"epoch": epoch, "train_loss": total / len(xf), **{f"calibration_{k}": v for k, v in cal.items()}}
        history.append(record)
        if cal["nll"] < best["nll"] - 1e-5:
            best, stale = {**cal, "epoch": epoch}, 0
            best_state = {k: v.detach().cpu().clone() for k, v in head.state_dict().items()}
        else:
            stale += 1
            if settings.patience and stale >= settings.patience:
                break
    if best_state is None:
        raise ValueError("the head finished no epoch before its time ran out")
    head = head.cpu()
    head.load_state_dict(best_state)
    head.eval()
    return head, {"settings": settings.to_dict(), "history": history, "best_epoch": best["epoch"],
                  "best_calibration": {k: v for k, v in best.items() if k != "epoch"},
                  "seconds": round(time.time() - t0, 2), "width": int(x_fit.shape[1])}


@torch.no_grad()
def head_probs(head: BinHead, x: np.ndarray) -> np.ndarray:
    """(n, 8) float64 probabilities of a head on rows x (rows sum to 1)."""
    if len(x) == 0:
        return np.zeros((0, NUM_BINS))
    head.eval()
    logits = head(torch.from_numpy(x.astype(np.float32)))
    return torch.softmax(logits.double(), dim=-1).numpy()


def head_state(head: BinHead, record: dict[str, Any]) -> dict[str, Any]:
    """What is saved of a head (weights in float16, its settings and width): a few MB."""
    return {"state": {k: v.to(torch.float16) if k not in ("mean", "scale") else v for k, v in head.state_dict().items()},
            "settings": record["settings"], "width": record["width"]}


def principal_axes(x: np.ndarray, fit_rows: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """The first `k` principal axes of the rows `fit_rows` of `x` (indices into x), each column
    standardised by the fit rows first: {"mean", "scale": (width,), "axes": (width, k)}, float32.
    Kept with a version so a new pair's hidden-state vector lands on the same coordinates
    (`project`) as the pairs its head was fitted on.

    Why: a prefill's hidden-state vector is thousands of numbers wide (2 x layers x hidden + 8),
    too wide to bring back from a GPU host for every pair and too wide for boosted trees on a few
    thousand pairs; a few dozen principal coordinates keep most of its variance, fitted on the
    training rows alone so no eval or external row shapes the axes."""
    xs = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    fit = xs[np.asarray(fit_rows)]
    if len(fit) < 2:
        raise ValueError(f"a projection needs at least 2 fit rows (got {len(fit)})")
    mean = fit.mean(axis=0)
    scale = fit.std(axis=0)
    scale = np.where(scale > 1e-6, scale, 1.0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    zf = torch.from_numpy((fit - mean) / scale).to(device)
    _, _, vh = torch.linalg.svd(zf, full_matrices=False)  # rows of vh: principal axes, by variance
    axes = vh[:min(k, vh.shape[0])].T.cpu().numpy()  # (width, k)
    return {"mean": mean.astype(np.float32), "scale": scale.astype(np.float32), "axes": axes.astype(np.float32)}


def project(x: np.ndarray, axes: dict[str, np.ndarray]) -> np.ndarray:
    """(n, k) float32 coordinates of the rows of `x` on `principal_axes` output."""
    xs = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    z = (xs - axes["mean"].astype(np.float64)) / axes["scale"].astype(np.float64)
    return (z @ axes["axes"].astype(np.float64)).astype(np.float32)
