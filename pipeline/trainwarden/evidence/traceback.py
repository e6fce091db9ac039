"""The last Python traceback of a tail: its exception and where it was raised.

"Where" is the innermost frame's file, sorted into the places a failure can
come from: the user's own code, PyTorch, the network stack, the filesystem,
an object store or model hub client, another library, or the standard
library. A ``KeyError`` raised in ``train.py`` and one raised inside
``botocore`` are different failures.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Optional, Sequence

from trainwarden.evidence.ranks import strip_prefix

TRACEBACK_START = "Traceback (most recent call last)"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?')
# "pkg.mod.SomeError: message", "SomeError", "raise SomeError(...)" is not one.
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault|Timeout|Failure|Exhausted"
    r"|Warning|timeout|error|Aborted|Unavailable|Denied|NotFound|Exceeded)|KeyboardInterrupt|StopIteration"
    r"|SystemExit|GeneratorExit)(?::\s?(?P<message>.*))?$")
_CHAIN_MARKERS = ("The above exception was the direct cause of the following exception",
                  "During handling of the above exception, another exception occurred")


class Origin(str, enum.Enum):
    """Where the frame that raised lives."""

    USER = "user"  # the job's own code
    TORCH = "torch"  # torch, torch.distributed, torchelastic
    NETWORK = "network"  # socket, ssl, http, urllib3, requests, grpc, aiohttp
    FILESYSTEM = "filesystem"  # os, shutil, pathlib, io, h5py, file readers
    OBJECT_STORE = "object_store"  # boto3/botocore, s3fs, gcsfs, google.cloud.storage, azure
    HUB = "hub"  # huggingface_hub, model/dataset downloads
    LIBRARY = "library"  # any other installed package
    STDLIB = "stdlib"  # the rest of the standard library


_SITE = re.compile(r"(?:site|dist)-packages/(?P<top>[\w.-]+)")
_STDLIB = re.compile(r"/(?:lib|Lib)/python\d+(?:\.\d+)?/(?P<top>[\w.-]+)")
_TOP_LEVEL = {
    Origin.TORCH: ("torch", "torchvision", "torchaudio", "torch_xla", "functorch"),
    Origin.NETWORK: ("urllib3", "requests", "grpc", "aiohttp", "httpx", "httpcore", "websockets", "paramiko"),
    Origin.OBJECT_STORE: ("boto3", "botocore", "s3fs", "gcsfs", "s3transfer", "aiobotocore", "azure", "google",
                          "oss2", "minio", "fsspec", "tos", "megfile", "petrel_client", "aistore"),
    Origin.HUB: ("huggingface_hub", "modelscope", "hf_transfer", "datasets/utils/file_utils"),
    Origin.FILESYSTEM: ("h5py", "safetensors", "zarr", "lmdb", "pyarrow"),
}
_STDLIB_NETWORK = ("socket", "ssl", "http", "urllib", "asyncio", "socketserver", "ftplib", "smtplib")
_STDLIB_FILESYSTEM = ("os", "shutil", "pathlib", "io", "tempfile", "genericpath", "posixpath", "zipfile",
                      "tarfile", "pickle", "gzip", "glob", "fileinput")


@dataclasses.dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def origin(self) -> Origin:
        return origin_of(self.file)


@dataclasses.dataclass(frozen=True)
class TracebackInfo:
    exception: str  # the exception type as printed, e.g. "torch.OutOfMemoryError"
    message: str
    frames: tuple[Frame, ...]  # outermost first
    # Exception types of the tracebacks chained before this one, oldest first.
    causes: tuple[str, ...] = ()
    cause_origins: tuple[Origin, ...] = ()

    @property
    def short_type(self) -> str:
        return self.exception.rsplit(".", 1)[-1]

    @property
    def raised_in(self) -> Optional[Origin]:
        return self.frames[-1].origin if self.frames else None

    @property
    def user_frames(self) -> int:
        return sum(1 for frame in self.frames if frame.origin is Origin.USER)


def origin_of(path: str) -> Origin:
    normal = path.replace("\\", "/")
    site = _SITE.search(normal)
    if site is not None:
        rest = normal[site.start("top"):]
        top = site.group("top").split(".")[0]
        for origin, names in _TOP_LEVEL.items():
            if top in names or any("/" in n and rest.startswith(n) for n in names):
                return origin
        return Origin.LIBRARY
    stdlib = _STDLIB.search(normal)
    if stdlib is not None:
        top = stdlib.group("top").split(".")[0]
        if top in _STDLIB_NETWORK:
            return Origin.NETWORK
        if top in _STDLIB_FILESYSTEM:
            return Origin.FILESYSTEM
        return Origin.STDLIB
    if normal.startswith("<frozen ") or normal.startswith("<string>"):
        return Origin.STDLIB
    # Source checkouts of the frameworks (an editable install, a container's /opt/pytorch).
    if re.search(r"(?:^|/)torch/(?:distributed|nn|utils|cuda|_|autograd|serialization)", normal):
        return Origin.TORCH
    return Origin.USER


def _frame(line: str) -> Optional[Frame]:
    match = _FRAME.match(strip_prefix(line))
    if match is None:
        return None
    return Frame(match.group("file"), int(match.group("line")), (match.group("func") or "").strip())


def parse_exception(line: str) -> Optional[tuple[str, str]]:
    match = _EXCEPTION.match(strip_prefix(line))
    if match is None:
        return None
    return match.group("type"), (match.group("message") or "").strip()


def last_traceback(tail: Sequence[str]) -> Optional[TracebackInfo]:
    """The last complete Python traceback in the tail, with the types of
    the exceptions chained before it; None when there is none."""
    starts = [i for i, line in enumerate(tail) if TRACEBACK_START in line]
    if not starts:
        return _headless(tail)
    parsed = [_parse_one(tail, start) for start in starts]
    last = None
    for index in range(len(parsed) - 1, -1, -1):
        if parsed[index] is not None and parsed[index].exception:
            last = index
            break
    if last is None:
        return None
    info = parsed[last]
    causes, origins = [], []
    # Walk back through tracebacks joined by a chain marker.
    index = last
    while index > 0 and _chained(tail, starts[index - 1], starts[index]) and parsed[index - 1] is not None:
        causes.insert(0, parsed[index - 1].exception)
        origin = parsed[index - 1].raised_in
        origins.insert(0, origin if origin is not None else Origin.STDLIB)
        index -= 1
    return dataclasses.replace(info, causes=tuple(causes), cause_origins=tuple(origins))


def _headless(tail: Sequence[str]) -> Optional[TracebackInfo]:
    """Frames and an exception with no "Traceback" line above them (a log
    cut at its start, a framework that prints frames itself): the frames
    within the last lines before the last exception line."""
    for end in range(len(tail) - 1, max(-1, len(tail) - 80), -1):
        found = parse_exception(tail[end])
        if found is None:
            continue
        frames = []
        for line in tail[max(0, end - 60):end]:
            frame = _frame(line)
            if frame is not None:
                frames.append(frame)
        if frames:
            return TracebackInfo(exception=found[0], message=found[1], frames=tuple(frames))
        return None
    return None


def _chained(tail: Sequence[str], previous: int, current: int) -> bool:
    window = tail[max(previous, current - 4):current]
    return any(marker in line for line in window for marker in _CHAIN_MARKERS)


def _parse_one(tail: Sequence[str], start: int) -> Optional[TracebackInfo]:
    frames: list[Frame] = []
    end = min(len(tail), start + 400)
    index = start + 1
    while index < end:
        line = strip_prefix(tail[index])
        frame = _frame(line)
        if frame is not None:
            frames.append(frame)
            index += 1
            continue
        found = parse_exception(line)
        if found is not None and frames:
            return TracebackInfo(exception=found[0], message=found[1], frames=tuple(frames))
        if TRACEBACK_START in line:
            break
        index += 1
    if frames:
        return TracebackInfo(exception="", message="", frames=tuple(frames))
    return None
