"""A source-text forecaster: token n-grams of both kernels, multinomial logistic regression.

It needs nothing but the two sources, so it reads any kernel, LLM-written ones without knobs
included: comments and docstrings are dropped (they describe, they do not run), the code is
cut into identifier, number and operator tokens, and TF-IDF weights of word 1- to 3-grams of
the candidate and of the anchor (two vocabularies, so "BLOCK_N = 256" in the candidate is not
confused with the same text in the anchor) feed an L2-regularised multinomial logistic
regression over the eight bins. Numbers stay tokens: tile sizes, warp counts and stages are
what most variants differ in. Calibration is the shared temperature fit
(models.calibration) on the calibration split.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
from scipy.sparse import hstack
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from models.classical.base import BinClassifier, full_proba
from models.classical.features import code_text

TOKEN_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?|[^\sA-Za-z0-9_]{1,2}"
VECTORIZERS = ("candidate_vec_", "anchor_vec_")
# Joins a vocabulary's terms in the stored state: no token holds it (TOKEN_PATTERN's operators are
# printable), and n-grams join tokens with a space.
TERM_SEP = "\x00"


def _texts(frame: pd.DataFrame, side: str) -> list[str]:
    return [code_text(str(s or "")) for s in frame[f"{side}_source"]]


def _transform_distinct(vectorizer: TfidfVectorizer, texts: list[str]):
    """`vectorizer.transform(texts)`, each distinct text tokenised once.

    Why: a fitted TF-IDF vectorizer turns each document into its row alone (counts, the fitted
    idf, the row's norm), so equal texts give equal rows, and the pairs of a split share their
    anchors (one task reference for hundreds of pairs): tokenising each distinct text once and
    repeating its row gives the same matrix for a fraction of the work.
    """
    index: dict[str, int] = {}
    rows = np.fromiter((index.setdefault(t, len(index)) for t in texts), dtype=np.int64, count=len(texts))
    return vectorizer.transform(list(index))[rows]


class TextModel(BinClassifier):
    """TF-IDF n-grams of candidate and anchor code -> multinomial logistic regression.

    Args:
        ngram_max: longest n-gram (tokens).
        max_features: vocabulary cap per side.
        C: inverse L2 strength of the logistic regression.
    """

    kind = "text_model"

    def __init__(self, ngram_max: int = 3, max_features: int = 60000, C: float = 4.0):
        self.ngram_max = ngram_max
        self.max_features = max_features
        self.C = C

    def __getstate__(self) -> dict:
        """The state with each vocabulary as one string of its terms in index order: MLflow
        stores the model with skops, which writes a dict entry by entry (8 s and 18 MB for the
        two vocabularies of the default model, against well under a second this way)."""
        state = dict(super().__getstate__())
        for name in VECTORIZERS:
            vec = state.get(name)
            if vec is not None and hasattr(vec, "vocabulary_"):
                packed = copy.copy(vec)
                del packed.vocabulary_
                state[name] = packed
                state[name + "terms"] = TERM_SEP.join(sorted(vec.vocabulary_, key=vec.vocabulary_.get))
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        for name in VECTORIZERS:
            terms = state.pop(name + "terms", None)
            if terms is not None:  # a state written by __getstate__ (an older one holds the dict)
                state[name] = copy.copy(state[name])
                state[name].vocabulary_ = {t: i for i, t in enumerate(terms.split(TERM_SEP))} if terms else {}
        super().__setstate__(state)

    def _vectorizer(self) -> TfidfVectorizer:
        return TfidfVectorizer(token_pattern=TOKEN_PATTERN, lowercase=False, ngram_range=(1, self.ngram_max),
                               max_features=self.max_features, sublinear_tf=True, min_df=2, dtype=np.float32)

    def _matrix(self, frame: pd.DataFrame):
        return hstack([_transform_distinct(self.candidate_vec_, _texts(frame, "c")),
                       _transform_distinct(self.anchor_vec_, _texts(frame, "a"))]).tocsr()

    def _fit(self, frame: pd.DataFrame, y: np.ndarray, log2_speedup: np.ndarray | None) -> None:
        self.candidate_vec_ = self._vectorizer().fit(_texts(frame, "c"))
        self.anchor_vec_ = self._vectorizer().fit(_texts(frame, "a"))
        self.logistic_ = LogisticRegression(C=self.C, max_iter=2000).fit(self._matrix(frame), y)

    def _raw_proba(self, frame: pd.DataFrame) -> np.ndarray:
        return full_proba(self.logistic_.predict_proba(self._matrix(frame)), self.logistic_.classes_)
