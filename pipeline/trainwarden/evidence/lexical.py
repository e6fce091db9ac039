"""Lexical evidence: what the words of a tail say, learned from real failures.

Patterns name errors one wording at a time and do not carry over to the
endless ways a configuration error or a flaky network is told. This is a
logistic model over the words of the tail's lines that tell of a failure
(numbers, paths and ids masked, single words and word pairs of a line), trained on the tuning set of the
real-failure corpus (``bench/train_lexical.py``), that says how likely a
restart gets past the failure. The classifier weighs it only when it is
confident, and says which words weighed most.

Pure: tokens in, a probability out. Training is here too, also pure, so
that operators can retrain on their own labelled failures.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from typing import Iterable, Mapping, Sequence

from trainwarden.evidence.ranks import launcher_boilerplate, strip_prefix

__all__ = ["LexicalModel", "LexicalScore", "Example", "WeightsError", "catalogue_context", "salient", "tokens", "train",
           "weights_to_text", "parse_weights"]

_MASKS = (
    (re.compile(r"0x[0-9a-fA-F]+"), " "),
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@%+~-]+){2,}/?"), " <path> "),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}\b"), " "),
)
_WORD = re.compile(r"[a-z][a-z_]{2,}")
# Bounds a job's tail cannot push past: a line longer than this is cut, and
# a word is never longer than this.
MAX_LINE = 2000
MAX_WORD = 40


def _words(line: str) -> list[str]:
    text = strip_prefix(line[:MAX_LINE])
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return [w[:MAX_WORD] for w in _WORD.findall(text.lower().replace("<path>", "path_"))]


# Lines that tell of a failure. Progress lines ("epoch 3 step 200 loss
# 1.23") fill real tails by the hundred and would outweigh the one line that
# matters; only these lines are read, in training and in judging.
_SALIENT = re.compile(
    r"(?i)error|exception|fail|fatal|kill|abort|time[ds]? ?out|warn|refused|denied|cannot|can't|unable|not found"
    r"|invalid|signal|segfault|exit|oom|memory|panic|traceback|raise|terminat|lost|closed|reset|unavailable"
    r"|exceed|no such|missing|mismatch|unsupported|expected|died|crash")


def salient(lines: Iterable[str]) -> list[str]:
    """The lines that tell of a failure, less a launcher's boilerplate (a
    summary of which ranks failed says nothing of why)."""
    return [line for line in lines if _SALIENT.search(line[:MAX_LINE]) and not launcher_boilerplate(line[:MAX_LINE])]


def tokens(lines: Iterable[str]) -> frozenset[str]:
    """The words of every salient line and the pairs of neighbouring words in a line."""
    found: set[str] = set()
    for line in salient(lines):
        words = _words(line)
        found.update(words)
        found.update(f"{a} {b}" for a, b in zip(words, words[1:]))
    return frozenset(found)


@dataclasses.dataclass(frozen=True)
class LexicalScore:
    retryable: float  # probability that a restart gets past it
    weighed: tuple[tuple[str, float], ...]  # the words that weighed most, heaviest first (+: retryable)
    words: int = 0  # how many words and pairs the tail's lines that tell of a failure hold


@dataclasses.dataclass(frozen=True)
class LexicalModel:
    bias: float
    weights: Mapping[str, float]
    # Decides only when the probability is at least this far from even:
    # 0.15 means 0.65 or more, or 0.35 or less.
    confidence: float = 0.15
    trained_on: str = ""

    def score(self, lines: Sequence[str], explain: int = 5, context: Iterable[str] = ()) -> LexicalScore:
        """``context``: tokens that are not words of the tail (what the
        catalogue found, see ``catalogue_context``)."""
        total = self.bias
        hits = []
        read = tokens(lines)
        for token in read | frozenset(context):
            weight = self.weights.get(token)
            if weight is not None:
                total += weight
                hits.append((token, weight))
        hits.sort(key=lambda hit: (-abs(hit[1]), hit[0]))
        return LexicalScore(_sigmoid(total), tuple((t, round(w, 3)) for t, w in hits[:explain]), len(read))

    def confident(self, score: LexicalScore) -> bool:
        """Far enough from even, for a tail that tells of a failure in words:
        with none at all (no output, only progress lines), the bias and the
        context are all there is, and that is no evidence either way."""
        return abs(score.retryable - 0.5) >= self.confidence and score.words > 0


def _sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    z = math.exp(value)
    return z / (1.0 + z)


@dataclasses.dataclass(frozen=True)
class Example:
    lines: tuple[str, ...]
    retryable: bool
    context: tuple[str, ...] = ()  # tokens that are not words of the tail (catalogue_context)


def catalogue_context(kind: str) -> tuple[str, ...]:
    """What the catalogue's evidence was, as a token the model weighs: a
    failure no pattern recognises at all is not like one whose words a
    pattern named (the catalogue knows the usual transient failures well, so
    what it does not know leans the other way), and the model learns by how
    much. Empty for the kinds that name the error (a pattern, a fact, aftermath)."""
    return (f"catalogue_{kind}",) if kind in ("none", "exit", "structure") else ()


def train(examples: Sequence[Example], *, l2: float = 1.0, epochs: int = 40, min_documents: int = 2,
          keep: int = 6000, confidence: float = 0.15, seed: int = 0, trained_on: str = "") -> LexicalModel:
    """L2-regularised logistic regression by stochastic gradient descent with
    AdaGrad steps: deterministic for a given seed and example order.
    Words seen in fewer than ``min_documents`` examples are left out (a
    single thread's wording is not evidence), and only the ``keep``
    heaviest weights are kept."""
    if not examples:
        raise ValueError("no examples to train on")
    documents = [tokens(e.lines) | frozenset(e.context) for e in examples]
    context = {token for e in examples for token in e.context}
    counts: dict[str, int] = {}
    for doc in documents:
        for token in doc:
            counts[token] = counts.get(token, 0) + 1
    vocabulary = {t for t, n in counts.items() if n >= min_documents}
    rows = [(sorted(doc & vocabulary), 1.0 if e.retryable else 0.0) for doc, e in zip(documents, examples)]
    weights: dict[str, float] = {t: 0.0 for t in vocabulary}
    squares: dict[str, float] = {t: 1e-8 for t in vocabulary}
    bias, bias_square = 0.0, 1e-8
    rate = 0.5
    n = len(rows)
    order = list(range(n))
    shuffle = random.Random(seed)
    for _ in range(epochs):
        shuffle.shuffle(order)
        for index in order:
            features, label = rows[index]
            error = _sigmoid(bias + sum(weights[t] for t in features)) - label
            bias_square += error * error
            bias -= rate * error / math.sqrt(bias_square)
            for token in features:
                # The regulariser spread over the examples: L2 / n per step;
                # none for the few context tokens, which every example of
                # their kind has (like the bias, they are not one thread's wording).
                gradient = error + (0.0 if token in context else l2 * weights[token] / n)
                squares[token] += gradient * gradient
                weights[token] -= rate * gradient / math.sqrt(squares[token])
    heaviest = sorted(weights.items(), key=lambda kv: (kv[0] not in context, -abs(kv[1]), kv[0]))[:keep]
    return LexicalModel(bias=round(bias, 6), weights={t: round(w, 6) for t, w in sorted(heaviest) if w},
                        confidence=confidence, trained_on=trained_on)


_WEIGHT_LINE = re.compile(r"^(?P<token>[a-z_]+(?: [a-z_]+)?) (?P<weight>-?\d+(?:\.\d+)?(?:e-?\d+)?)$")


def weights_to_text(weights: Mapping[str, float]) -> str:
    """One ``word weight`` or ``word word weight`` per line, sorted: the form
    a rule file keeps them in, readable and diffable in git."""
    return "".join(f"{token} {weight:.6f}\n" for token, weight in sorted(weights.items()))


def parse_weights(text: str) -> dict[str, float]:
    """The inverse of ``weights_to_text``; a line that is not ``word weight``
    raises ``WeightsError`` with its number (1 = the first line)."""
    weights: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _WEIGHT_LINE.match(line.strip())
        if match is None or len(match.group("token")) > 2 * MAX_WORD + 1:
            raise WeightsError(number, f"{line.strip()[:60]!r} is not 'word weight' or 'word word weight'")
        weight = float(match.group("weight"))
        if not math.isfinite(weight) or abs(weight) > 1e6:
            raise WeightsError(number, f"weight {match.group('weight')} is out of range")
        if match.group("token") in weights:
            raise WeightsError(number, f"{match.group('token')!r} has a weight already")
        weights[match.group("token")] = weight
    return weights


class WeightsError(ValueError):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
