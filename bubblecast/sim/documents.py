"""Packed-document workloads: document lengths, the data loader's packing, and what a packed
micro-batch costs.

A training step takes a global batch of documents and packs them into micro-batches of at most
``token_budget`` tokens (the micro-batch tensor keeps one shape, ``(1, token_budget)``; the rest
is padding). Attention is causal within each document, so a micro-batch's compute grows with
its tokens and with the sum of its documents' squared lengths (``tokens_sq``): one layer costs

    ``per_token * tokens + per_token_sq * tokens_sq + per_document * documents + per_microbatch``

(:class:`WorkCost`). :meth:`WorkCost.attention` sets the first two from the attention share of
a micro-batch of mean-length documents, normalised so that a full micro-batch of mean-length
documents costs 1 (the simulator multiplies a stage's ``--f/--b/--w`` by this factor).

Document sources (:func:`load_documents`): the presets ``lognormal`` (documents at most a
quarter of the budget) and ``long-tail`` (single documents up to the whole budget), or a JSON
file of real lengths (a list of integers, or ``{"lengths": [...]}``) sampled with replacement.

:func:`next_fit` is the data loader's packing: documents in arrival order, each into the
current micro-batch if it fits, else into a new one (sequential first-fit). :func:`draw_batches`
cuts a seeded document stream into steps: a step's global batch is the documents that fill its
``microbatches * replicas`` micro-batches in that order; the document that does not fit the last
one opens the next step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bubblecast.errors import BubblecastError

#: Named document-length distributions (``--documents``).
PRESETS: tuple[str, ...] = ("lognormal", "long-tail")
#: Default token budget of a packed micro-batch (``--token-budget``).
DEFAULT_TOKEN_BUDGET = 4096
#: Default attention share of a mean-length micro-batch's cost (``--attention-share``).
DEFAULT_ATTENTION_SHARE = 0.5
#: Shortest document the presets draw.
MIN_LENGTH = 16


@dataclass(frozen=True)
class WorkCost:
    """Cost of one packed micro-batch per layer, linear in its statistics (see the module doc).

    The unit is the caller's (simulated multiples of a reference micro-batch, seconds of a
    learned model, plain token counts for the token heuristic: ``WorkCost(per_token=1)``).
    """

    per_token: float
    per_token_sq: float = 0.0
    per_document: float = 0.0
    per_microbatch: float = 0.0

    def __post_init__(self) -> None:
        values = asdict(self)
        for name, value in values.items():
            if not (isinstance(value, (int, float, np.floating, np.integer))
                    and np.isfinite(value) and value >= 0):
                raise BubblecastError(f"cost '{name}': must be a finite number >= 0, "
                                      f"got {value!r}")
        if not any(values.values()):
            raise BubblecastError("cost: every coefficient is 0")

    @classmethod
    def attention(cls, share: float, mean_length: float, token_budget: int) -> WorkCost:
        """Attention ``share`` of a full micro-batch of ``mean_length`` documents; that
        micro-batch costs 1."""
        if not 0.0 <= share < 1.0:
            raise BubblecastError(f"--attention-share: must be in [0, 1), got {share}")
        if not (mean_length > 0 and token_budget > 0):
            raise BubblecastError("cost: mean length and token budget must be positive")
        return cls(per_token=(1.0 - share) / token_budget,
                   per_token_sq=share / (token_budget * float(mean_length)))

    def microbatch(self, tokens: Any, tokens_sq: Any, documents: Any = 0) -> np.ndarray:
        """Cost of micro-batches with these statistics (empty ones cost 0)."""
        tokens = np.asarray(tokens, dtype=np.float64)
        cost = (self.per_token * tokens + self.per_token_sq * np.asarray(tokens_sq, np.float64)
                + self.per_document * np.asarray(documents, np.float64))
        return np.where(tokens > 0, cost + self.per_microbatch, 0.0)

    def documents_cost(self, lengths: Any) -> np.ndarray:
        """Each document's additive share of its micro-batch's cost (no per-micro-batch
        term)."""
        x = np.asarray(lengths, dtype=np.float64)
        return self.per_token * x + self.per_token_sq * x * x + self.per_document

    def to_json(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, obj: Any, source: str = "cost") -> WorkCost:
        if not isinstance(obj, dict) or "per_token" not in obj:
            raise BubblecastError(f"{source}: expected an object with 'per_token'")
        known = {k: obj[k] for k in ("per_token", "per_token_sq", "per_document",
                                     "per_microbatch") if k in obj}
        try:
            return cls(**{k: float(v) for k, v in known.items()})
        except (TypeError, ValueError):
            raise BubblecastError(f"{source}: cost coefficients must be numbers") from None


def check_lengths(lengths: Any, token_budget: int, where: str = "lengths",
                  min_documents: int = 1) -> np.ndarray:
    """``lengths`` as an int64 array, or BubblecastError naming ``where`` and the problem:
    not a 1-D list of integers, fewer than ``min_documents``, a length < 1, or one longer than
    the budget (split such documents into pieces of at most the budget first)."""
    try:
        raw = np.asarray(lengths)
    except (TypeError, ValueError):
        raise BubblecastError(f"{where}: expected a list of integer document lengths") from None
    if raw.ndim != 1:
        raise BubblecastError(f"{where}: expected a flat list of document lengths")
    if raw.size < max(1, min_documents):
        what = "is empty" if raw.size == 0 else \
            f"has {raw.size} documents, fewer than the {min_documents} micro-batches to fill"
        raise BubblecastError(f"{where}: the batch {what}")
    if raw.dtype.kind == "f":
        bad = ~np.isfinite(raw) | (raw != np.round(raw))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise BubblecastError(f"{where}[{i}]: length {raw[i].item()!r} is not an integer")
    elif raw.dtype.kind not in "iu":
        raise BubblecastError(f"{where}: expected integer document lengths, got {raw.dtype}")
    out = raw.astype(np.int64)
    if (out < 1).any():
        i = int(np.flatnonzero(out < 1)[0])
        raise BubblecastError(f"{where}[{i}]: length {int(out[i])} must be >= 1")
    if (out > token_budget).any():
        i = int(np.flatnonzero(out > token_budget)[0])
        raise BubblecastError(f"{where}[{i}]: document of {int(out[i])} tokens is longer than "
                              f"the token budget {token_budget}; split it into pieces of at "
                              f"most {token_budget} tokens, or raise the budget")
    return out


@dataclass(frozen=True)
class DocumentSource:
    """A seeded stream of document lengths: a preset (``lognormal``, ``long-tail``) or the
    ``lengths`` of a file sampled with replacement, for micro-batches of ``token_budget``."""

    kind: str = "lognormal"
    token_budget: int = DEFAULT_TOKEN_BUDGET
    lengths: tuple[int, ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        budget = self.token_budget
        if not isinstance(budget, (int, np.integer)) or budget < 4 * MIN_LENGTH:
            raise BubblecastError(f"--token-budget: must be an integer >= {4 * MIN_LENGTH}, "
                                  f"got {self.token_budget}")
        if self.kind == "file":
            check_lengths(self.lengths, self.token_budget, f"{self.name or 'documents'}: lengths")
        elif self.kind not in PRESETS:
            raise BubblecastError(f"--documents: unknown preset '{self.kind}' (known: "
                                  f"{', '.join(PRESETS)}, or a JSON file of lengths)")
        if not self.name:
            object.__setattr__(self, "name", self.kind)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` document lengths (int64, each in ``1..token_budget``)."""
        t = self.token_budget
        if self.kind == "file":
            return np.asarray(self.lengths, dtype=np.int64)[rng.integers(0, len(self.lengths), n)]
        if self.kind == "lognormal":
            raw = rng.lognormal(np.log(t / 16), 0.9, n)
            cap = t // 4
        else:  # long-tail: a short-document body with a heavy tail reaching the budget
            raw = rng.lognormal(np.log(t / 32), 1.5, n)
            cap = t
        return np.clip(np.rint(raw), MIN_LENGTH, cap).astype(np.int64)

    def mean_length(self) -> float:
        """Expected document length (a fixed large seeded sample for the presets)."""
        if self.kind == "file":
            return float(np.mean(self.lengths))
        return float(self.sample(np.random.default_rng(0), 200_000).mean())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "token_budget": int(self.token_budget),
                               "name": self.name}
        if self.kind == "file":
            out["lengths"] = list(map(int, self.lengths))
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DocumentSource:
        return cls(str(obj["kind"]), int(obj["token_budget"]),
                   tuple(int(x) for x in obj.get("lengths", ())), str(obj.get("name", "")))


def load_documents(spec: str, token_budget: int = DEFAULT_TOKEN_BUDGET) -> DocumentSource:
    """``--documents``: a preset name or a JSON file of lengths (see the module doc)."""
    if spec in PRESETS:
        return DocumentSource(spec, token_budget)
    path = Path(spec)
    if not path.is_file():
        raise BubblecastError(f"--documents: '{spec}' is neither a preset "
                              f"({', '.join(PRESETS)}) nor a file")
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BubblecastError(f"{path}: not valid JSON ({exc})") from None
    lengths = obj.get("lengths") if isinstance(obj, dict) else obj
    if not isinstance(lengths, list):
        raise BubblecastError(f"{path}: expected a list of lengths or {{\"lengths\": [...]}}")
    checked = check_lengths(lengths, token_budget, f"{path}: lengths")
    return DocumentSource("file", token_budget, tuple(checked.tolist()), path.stem)


def next_fit(lengths: Sequence[int] | np.ndarray, token_budget: int) -> np.ndarray:
    """The data loader's packing: each document's micro-batch index, in arrival order, each
    document into the current micro-batch if it fits, else into a new one."""
    out = np.empty(len(lengths), dtype=np.int64)
    used, current = 0, 0
    for i, n in enumerate(np.asarray(lengths, dtype=np.int64).tolist()):
        if used + n > token_budget and used > 0:
            current += 1
            used = 0
        used += n
        out[i] = current
    return out


def cut_steps(lengths: Sequence[int] | np.ndarray, token_budget: int, bins: int
              ) -> np.ndarray:
    """The loader's cut of a document stream into global batches of exactly ``bins``
    micro-batches: the index of each complete step's first document, then the end of the last
    complete one (``len = complete steps + 1``). One :func:`next_fit` over the stream: the
    document that does not fit a step's last micro-batch opens the next step's first, so a
    step is complete once a document has opened the next one."""
    owner = next_fit(lengths, token_budget)
    last = int(owner[-1]) if len(owner) else -1
    return np.searchsorted(owner, np.arange(0, last + 1, bins))


def draw_batches(source: DocumentSource, seed: int, steps: int, bins: int
                 ) -> list[np.ndarray]:
    """``steps`` global batches from the seeded stream: each the documents that :func:`next_fit`
    packs into exactly ``bins`` micro-batches (see the module doc). The stream is drawn in
    blocks of a fixed size, so its documents do not depend on how many steps are asked for."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2]))
    t = source.token_budget
    typical = max(1, int(source.mean_length() if source.kind == "file" else t // 16))
    block = max(256, 4 * bins * t // typical)
    docs_per_step = bins * t / typical
    chunks = [source.sample(rng, block)
              for _ in range(max(1, int(np.ceil(steps * docs_per_step / block))))]
    while True:
        stream = np.concatenate(chunks)
        bounds = cut_steps(stream, t, bins)
        if len(bounds) > steps:
            return [stream[bounds[k]:bounds[k + 1]].copy() for k in range(steps)]
        chunks.append(source.sample(rng, block))


def microbatch_stats(lengths: np.ndarray, owner: np.ndarray, bins: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens, tokens_sq, documents)`` of each of ``bins`` micro-batches, given each
    document's micro-batch index."""
    x = np.asarray(lengths, dtype=np.float64)
    owner = np.asarray(owner, dtype=np.int64)
    tokens = np.bincount(owner, weights=x, minlength=bins).astype(np.int64)
    tokens_sq = np.bincount(owner, weights=x * x, minlength=bins)
    documents = np.bincount(owner, minlength=bins).astype(np.int64)
    return tokens, tokens_sq, documents
