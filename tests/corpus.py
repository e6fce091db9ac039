"""The real-failure corpus (tests/data/failure_corpus/README.md): loading,
the split by source repository, and scoring the shipped catalogue on it.

Used by tests/test_failure_corpus.py (the acceptance figures) and by
bench/classify_corpus.py (which prints them for the README).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from pathlib import Path
from typing import Iterable, Optional

from trainwarden.attribution import Failure, judge
from trainwarden.rules.model import RulePack

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "data" / "failure_corpus"

RETRYABLE_CATEGORIES = ("collective_timeout", "collective_error", "connection_lost", "rendezvous", "gpu_hardware",
                        "host_oom", "platform_signal", "storage_transient", "infra_transient")
NOT_RETRYABLE_CATEGORIES = ("cuda_oom", "user_code_error", "user_shape_error", "user_missing_module",
                            "user_missing_file", "config_error", "collective_misuse", "gpu_application_fault",
                            "crash", "storage_full", "numerical")
LABELS = ("retryable", "not_retryable", "unknown")
# Repositories renamed on GitHub: one name each, so that a repository cannot
# sit in both sets under two spellings.
ALIASES = {
    "hiyouga/llama-factory": "hiyouga/llamafactory",
    "microsoft/deepspeed": "deepspeedai/deepspeed",
    "microsoft/deepspeedexamples": "deepspeedai/deepspeedexamples",
    "microsoft/megatron-deepspeed": "deepspeedai/megatron-deepspeed",
    "bigscience-workshop/megatron-deepspeed": "deepspeedai/megatron-deepspeed",
    "openaccess-ai-collective/axolotl": "axolotl-ai-cloud/axolotl",
    "lightning-ai/lightning": "lightning-ai/pytorch-lightning",
    "pytorchlightning/pytorch-lightning": "lightning-ai/pytorch-lightning",
    "volcengine/verl": "verl-project/verl",
    "kubeflow/training-operator": "kubeflow/trainer",
    "thudm/chatglm-6b": "zai-org/chatglm-6b",
    "thudm/chatglm2-6b": "zai-org/chatglm2-6b",
    "thudm/cogvideo": "zai-org/cogvideo",
    "thudm/codegeex": "zai-org/codegeex",
    "nvidia/nemo": "nvidia-nemo/nemo",
}
_HEADER = re.compile(r"^# (source|repo|exit_code|expect|category|phase|reason|note):\s?(.*)$")
# The phase the lines show the failure in (evidence/phase.py has the rule that annotated them).
PHASES = ("initialisation", "training", "evaluation", "checkpoint", "unknown")


class CorpusError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Excerpt:
    path: Path
    source: str
    repo: str  # canonical, lower case
    exit_code: int
    expect: str  # retryable, not_retryable, unknown
    category: str
    reason: str
    lines: tuple[str, ...]
    phase: str = "unknown"

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"


def canonical_repo(repo: str) -> str:
    repo = repo.strip().lower()
    return ALIASES.get(repo, repo)


def load_excerpt(path: Path) -> Excerpt:
    lines = path.read_text(encoding="utf-8").splitlines()
    header: dict[str, str] = {}
    body = len(lines)
    for index, line in enumerate(lines):
        match = _HEADER.match(line)
        if match is None:
            body = index
            break
        header.setdefault(match.group(1), match.group(2).strip())
    missing = {"source", "repo", "exit_code", "expect", "category", "reason"} - header.keys()
    if missing:
        raise CorpusError(f"{path}: header lacks {', '.join(sorted(missing))}")
    code = re.match(r"^(-?\d+)", header["exit_code"])
    if code is None:
        raise CorpusError(f"{path}: exit_code {header['exit_code']!r} is not an integer")
    expect = header["expect"].split()[0]
    category = header["category"].split()[0]
    if expect not in LABELS:
        raise CorpusError(f"{path}: expect {expect!r} is not one of {', '.join(LABELS)}")
    allowed = {"retryable": RETRYABLE_CATEGORIES, "not_retryable": NOT_RETRYABLE_CATEGORIES,
               "unknown": ("unknown",)}[expect]
    if category not in allowed:
        raise CorpusError(f"{path}: category {category!r} does not go with {expect}")
    phase = header.get("phase", "unknown").split()[0] if header.get("phase") else "unknown"
    if phase not in PHASES:
        raise CorpusError(f"{path}: phase {phase!r} is not one of {', '.join(PHASES)}")
    tail = tuple(lines[body:])
    if not any(line.strip() for line in tail):
        raise CorpusError(f"{path}: no log lines after the header")
    return Excerpt(path=path, source=header["source"].split()[0], repo=canonical_repo(header["repo"]),
                   exit_code=int(code.group(1)), expect=expect, category=category, reason=header["reason"],
                   lines=tail, phase=phase)


def load_corpus(directory: Path = CORPUS) -> list[Excerpt]:
    """Every excerpt, one per source address (the first by file name when
    several collectors quoted the same thread)."""
    seen: set[str] = set()
    excerpts = []
    for path in sorted(directory.glob("*/*.log")):
        excerpt = load_excerpt(path)
        if excerpt.source in seen:
            continue
        seen.add(excerpt.source)
        excerpts.append(excerpt)
    return excerpts


# The sources of the 60 excerpts the catalogue was tuned on before the
# corpus existed (their files carry the collector letter "o"): these
# repositories stay in the tuning set whatever their hash says.
TUNED_BEFORE_SPLIT = frozenset({
    "ai2cm/ace", "akash-network/support", "bubbliiiing/yolov7-pytorch", "castorini/hedwig",
    "deepspeedai/deepspeedexamples", "dice-group/dice-embeddings", "facebookincubator/submitit",
    "facebookresearch/av_hubert", "ganjinzero/rrhf", "guoyww/animatediff", "hiyouga/llamafactory",
    "hpcaitech/colossalai", "hpcaitech/open-sora", "huggingface/accelerate", "huggingface/diffusers",
    "huggingface/finetrainers", "ifzhang/fairmot", "jade-hpc-gpu/jade-hpc-gpu.github.io", "jittor/jittorllms",
    "junyuchen-cjy/dttnet-pytorch", "kohya-ss/sd-scripts", "leptonai/gpud", "lightning-ai/pytorch-lightning",
    "lmzpai/robomamba", "lzhxmu/cppo", "mk-minchul/adaface", "mngeyuu/memrift-flagscale", "nvidia-cosmos/cosmos-rl",
    "nvidia/gpu-operator", "nvidia/nccl", "nvidia/nvsentinel", "nvidia/semantic-segmentation", "ofa-sys/ofa",
    "princeton-vl/cornernet-lite", "project-monai/model-zoo", "pytorch/pytorch", "rwth-i6/returnn", "saforem2/mmm",
    "seannaren/deepspeech.pytorch", "shengcailiao/qaconv", "tatsu-lab/stanford_alpaca", "tdrussell/diffusion-pipe",
    "tongkunguan/ccd", "ultralytics/ultralytics", "vision-cair/minigpt-4", "vllm-project/vllm",
    "ymoslem/opennmt-tutorial",
})


def tuned_repositories() -> frozenset[str]:
    return TUNED_BEFORE_SPLIT


def in_test_set(repo: str, tuned: frozenset[str]) -> bool:
    repo = canonical_repo(repo)
    if repo in tuned:
        return False
    return hashlib.sha256(repo.encode()).digest()[0] % 5 < 2


def split(excerpts: Iterable[Excerpt]) -> tuple[list[Excerpt], list[Excerpt]]:
    tuned = tuned_repositories()
    tune, test = [], []
    for excerpt in excerpts:
        (test if in_test_set(excerpt.repo, tuned) else tune).append(excerpt)
    return tune, test


@dataclasses.dataclass(frozen=True)
class Outcome:
    excerpt: Excerpt
    verdict: str
    category: str
    rule: str

    @property
    def right(self) -> bool:
        return self.verdict == self.excerpt.expect


def judge_excerpt(pack: RulePack, excerpt: Excerpt) -> Outcome:
    judgement = judge(pack, [Failure("worker-0", excerpt.exit_code, excerpt.lines)])
    verdict = judgement.verdict
    return Outcome(excerpt, verdict.verdict.value, verdict.category, verdict.rule)


@dataclasses.dataclass(frozen=True)
class Scores:
    outcomes: tuple[Outcome, ...]

    @property
    def accuracy(self) -> float:
        return sum(o.right for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    def by_label(self) -> dict[str, tuple[int, int]]:
        counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for o in self.outcomes:
            counts[o.excerpt.expect][0] += o.right
            counts[o.excerpt.expect][1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(counts.items())}

    def by_category(self) -> dict[str, tuple[int, int]]:
        """Verdict right / excerpts, per expected category."""
        counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for o in self.outcomes:
            counts[o.excerpt.category][0] += o.right
            counts[o.excerpt.category][1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(counts.items(), key=lambda kv: -kv[1][1])}

    def category_precision_recall(self) -> dict[str, tuple[Optional[float], float, int]]:
        """Per expected category: (precision, recall, support) of the category itself."""
        result = {}
        for category, (_, support) in self.by_category().items():
            predicted = [o for o in self.outcomes if o.category == category]
            hits = sum(1 for o in predicted if o.excerpt.category == category)
            recall_hits = sum(1 for o in self.outcomes if o.excerpt.category == category and o.category == category)
            precision = hits / len(predicted) if predicted else None
            result[category] = (precision, recall_hits / support, support)
        return result

    def wrong(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.right]


def score(pack: RulePack, excerpts: Iterable[Excerpt]) -> Scores:
    return Scores(tuple(judge_excerpt(pack, e) for e in excerpts))
