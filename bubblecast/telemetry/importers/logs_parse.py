"""Parse Megatron-LM and DeepSpeed timer lines from training logs (granularity ``step``).

Layouts (from ``megatron/core/timers.py``, ``megatron/training/training.py``,
``deepspeed/runtime/pipe/engine.py``, ``deepspeed/utils/timer.py``; see the project's
LOG-FORMATS notes):

- Megatron ``--timing-log-option minmax``: a header ``(min, max) time across ranks (ms):`` then
  ``    <timer> .....: (min, max)`` lines; ``max``: header ``max time across ranks (ms):`` then
  ``    <timer> .....: value``; ``all``: header ``times across ranks (ms):`` then per timer
  ``    <timer>:`` and ``     rank  N: value`` lines. Older releases: one line
  ``time (ms) | <timer>: value | ...``. The step is the last `` iteration N/ M |`` line before
  the block, whose ``elapsed time per iteration (ms)`` is the step time.
- ALCF Megatron-DeepSpeed (Python logging): ``[date][INFO][training:1609] - iteration=  N/ M |
  ... | elapsed_time_per_iteration_ms=T | ...`` lines, then the ``minmax`` blocks above. A
  logging-record header (``[YYYY-MM-DD ...][LEVEL][where] - ``) is dropped from any line before
  it is read, so the header line, and block lines with or without their own record header,
  read as in a plain Megatron log.
- DeepSpeed ``wall_clock_breakdown``: ``[Rank N] time (ms) | <timer>: value | ...`` or
  ``rank=N time (ms) | ...``; the step is the last ``step=N`` or ``steps: N`` before it
  (``iter time (s)`` on the ``steps:`` line is the step time).

Anything before a header (a launcher's ``[default0]:`` or ``0: ``) is a prefix that the block's
lines repeat. A block ends at the first line that is not indented after that prefix or holds a
``|`` (an iteration line); an indented line inside a block that does not parse, or a
``time (ms) |`` field that is not ``name: number``, is refused naming the file and the line.
Values may be negative (clock jitter): the importer clamps or refuses them. Gzipped logs are
read as they are.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.importers.kineto_io import is_gzip, read_prefix

NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
_NUM = re.compile(rf"^-?{NUMBER}$")  # a negative timer is jitter or an error: read_log decides
#: ``iteration 5/ 100 |`` (Megatron-LM) or ``iteration=    5/ 100 |`` (ALCF Megatron-DeepSpeed)
_ITER = re.compile(r"\biteration\s*=?\s*(\d+)\s*/\s*\d+\s*\|")
#: ``elapsed time per iteration (ms): 12.3`` or ``elapsed_time_per_iteration_ms=12.3``
_ELAPSED = re.compile(rf"elapsed[ _]time[ _]per[ _]iteration[ _]\(?ms\)?\s*[:=]\s*({NUMBER})")
#: A Python-logging record header at the start of a line, as the ALCF Megatron-DeepSpeed logs
#: write it (``[2024-05-01 10:00:00,123][INFO][training:1609] - ``): not a launcher prefix
#: (it changes from line to line and the lines of a multi-line record do not repeat it).
_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d[^\]]*\](?:\[[^\]]*\])*\s*-\s")
_HEADERS = {
    "minmax": re.compile(r"\(min, max\) time across ranks \(ms\):\s*$"),
    "max": re.compile(r"(?<!\(min, )max time across ranks \(ms\):\s*$"),
    "all": re.compile(r"(?<![\w)] )times across ranks \(ms\):\s*$"),
}
_TIME_LINE = re.compile(r"(?:\[Rank (\d+)\]\s*|rank=(\d+)\s+)?time \(ms\)\s*\|(.*)$")
_BLOCK_LINE = re.compile(r"^\s+([^\s:.][^:]*?)[\s.]*:\s*(.*?)\s*$")
_RANK_NAME = re.compile(r"^rank\s+(\d+)$")
_DS_STEP = re.compile(r"(?<![\w])step=(\d+)|(?<![\w])steps:\s*(\d+)")
_DS_ITER_TIME = re.compile(rf"iter time \(s\):\s*({NUMBER})")
_MEGATRON_SIZES = {
    "pp": re.compile(r"pipeline-model-parallel size:\s*(\d+)"),
    "dp": re.compile(r"data-parallel size:\s*(\d+)"),
    "tp": re.compile(r"tensor-model-parallel size:\s*(\d+)"),
}
_MICROBATCHES = re.compile(r"number of micro-batches to constant (\d+)")
_DS_COORD = re.compile(r"ProcessCoord\(pipe=(\d+), data=(\d+), model=(\d+)\):\s*(\d+)")


@dataclass
class TimerValue:
    """One timer value: ``rank`` None when the value is an aggregate across ranks."""

    step: int
    rank: int | None
    timer: str
    value_ms: float
    min_ms: float | None
    line: int


@dataclass
class ParsedLog:
    """Everything a log gives: timer values, step times and what the layout lines say."""

    values: list[TimerValue] = field(default_factory=list)
    step_time_s: dict[int, float] = field(default_factory=dict)
    kinds: set[str] = field(default_factory=set)  # minmax, max, all, single-line, per-rank
    steps_from: str = "order"
    sizes: dict[str, int] = field(default_factory=dict)  # pp, dp, tp when the log says them
    coords: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (stage, replica)
    microbatches: int | None = None


def _number(text: str, path: Path, lineno: int, what: str) -> float:
    if not _NUM.match(text):
        raise BubblecastError(f"{path}: line {lineno}: {what}: '{text}' is not a number of "
                              "milliseconds")
    return float(text)


def _fields(body: str, path: Path, lineno: int) -> list[tuple[str, float]]:
    """``name: value | name: value`` -> [(name, value)]; refuse any other field."""
    out = []
    for part in body.split("|"):
        if not part.strip():
            continue
        name, sep, value = part.partition(":")
        if not sep or not name.strip():
            raise BubblecastError(f"{path}: line {lineno}: timer field '{part.strip()}' is not "
                                  "'name: value'")
        out.append((name.strip(), _number(value.strip(), path, lineno, f"timer '{name.strip()}'")))
    if not out:
        raise BubblecastError(f"{path}: line {lineno}: 'time (ms) |' line without timers")
    return out


class _Parser:
    """Line-by-line state machine; ``flavour`` is ``megatron`` or ``deepspeed``."""

    def __init__(self, path: Path, flavour: str) -> None:
        self.path, self.flavour = path, flavour
        self.out = ParsedLog()
        self.step: int | None = None
        #: without step lines: per rank, (ordinal step, timers seen in it); a repeat starts
        #: the next ordinal step
        self.ordinal: dict[int | None, tuple[int, set[str]]] = {}
        self.seen: dict[tuple[int, int | None, str], int] = {}  # (step, rank, timer) -> line
        self.block: str | None = None
        self.prefix = ""
        self.timer: str | None = None  # current timer of an ``all`` block

    def step_of(self, rank: int | None, timer: str) -> int:
        """The step a value belongs to: the last step line, else the ordinal step."""
        if self.step is not None:
            return self.step
        ordinal, timers = self.ordinal.get(rank, (0, set()))
        if timer in timers:
            ordinal, timers = ordinal + 1, set()
        timers.add(timer)
        self.ordinal[rank] = (ordinal, timers)
        return ordinal

    def add(self, rank: int | None, timer: str, value: float, low: float | None,
            lineno: int) -> None:
        step = self.step_of(rank, timer)
        first = self.seen.setdefault((step, rank, timer), lineno)
        if first != lineno:
            who = "across ranks" if rank is None else f"rank {rank}"
            raise BubblecastError(f"{self.path}: line {lineno}: timer '{timer}' ({who}) again at "
                                  f"step {step} (first on line {first}) with no step line between")
        self.out.values.append(TimerValue(step, rank, timer, value, low, lineno))

    def block_line(self, body: str, lineno: int) -> None:
        match = _BLOCK_LINE.match(body)
        if match is None:
            raise BubblecastError(f"{self.path}: line {lineno}: not a '<timer> ...: value' line "
                                  f"in a '{self.block}' timer block")
        name, value = match.groups()
        if self.block == "minmax":
            pair = re.match(r"^\(\s*(\S+?)\s*,\s*(\S+?)\s*\)$", value)
            if pair is None:
                raise BubblecastError(f"{self.path}: line {lineno}: timer '{name}': expected "
                                      f"'(min, max)', got '{value}'")
            low = _number(pair.group(1), self.path, lineno, f"timer '{name}' min")
            self.add(None, name, _number(pair.group(2), self.path, lineno, f"timer '{name}' max"),
                     low, lineno)
        elif self.block == "max":
            self.add(None, name, _number(value, self.path, lineno, f"timer '{name}'"), None,
                     lineno)
        elif (rank := _RANK_NAME.match(name)) is not None:
            if self.timer is None:
                raise BubblecastError(f"{self.path}: line {lineno}: a rank value before any "
                                      "timer name in a 'times across ranks' block")
            self.add(int(rank.group(1)), self.timer,
                     _number(value, self.path, lineno, f"timer '{self.timer}'"), None, lineno)
        elif value:
            raise BubblecastError(f"{self.path}: line {lineno}: timer '{name}': expected "
                                  f"'{name}:' then '  rank N: value' lines, got '{value}'")
        else:
            self.timer = name

    def feed(self, line: str, lineno: int) -> None:
        line = _RECORD.sub("", line, count=1)
        if self.block is not None:
            body = line[len(self.prefix):] if line.startswith(self.prefix) else ""
            if body[:1].isspace() and body.strip() and "|" not in body:
                self.block_line(body, lineno)
                return
            self.block, self.timer = None, None
        self.context(line)
        for kind, header in _HEADERS.items():
            match = header.search(line)
            if match is not None:
                self.block, self.prefix, self.timer = kind, line[:match.start()], None
                self.out.kinds.add(kind)
                return
        match = _TIME_LINE.search(line)
        if match is not None:
            rank_text = match.group(1) or match.group(2)
            rank = int(rank_text) if rank_text is not None else None
            self.out.kinds.add("per-rank" if rank is not None else "single-line")
            for name, value in _fields(match.group(3), self.path, lineno):
                self.add(rank, name, value, None, lineno)

    def context(self, line: str) -> None:
        """Step markers, step times and layout lines."""
        if self.flavour == "megatron":
            if (match := _ITER.search(line)) is not None:
                self.step, self.out.steps_from = int(match.group(1)), "iteration lines"
                if (elapsed := _ELAPSED.search(line)) is not None:
                    self.out.step_time_s[self.step] = float(elapsed.group(1)) / 1e3
            for key, pattern in _MEGATRON_SIZES.items():
                if (match := pattern.search(line)) is not None:
                    self.out.sizes[key] = int(match.group(1))
            if (match := _MICROBATCHES.search(line)) is not None:
                self.out.microbatches = int(match.group(1))
            return
        if (match := _DS_STEP.search(line)) is not None and "time (ms)" not in line:
            self.step, self.out.steps_from = int(match.group(1) or match.group(2)), "step lines"
            if (it := _DS_ITER_TIME.search(line)) is not None:
                self.out.step_time_s[self.step] = float(it.group(1))
        for match in _DS_COORD.finditer(line):
            pipe, data, _model, rank = (int(g) for g in match.groups())
            self.out.coords[rank] = (pipe, data)


def parse_log(path: Path, flavour: str) -> ParsedLog:
    """Parse ``path`` as a ``megatron`` or ``deepspeed`` log; refuse malformed timer lines."""
    parser = _Parser(path, flavour)
    try:
        opener = gzip.open if is_gzip(path) else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                parser.feed(line.rstrip("\r\n"), lineno)
    except (OSError, EOFError, zlib.error) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise BubblecastError(f"{path}: cannot read the log ({reason})") from None
    if not parser.out.values:
        raise BubblecastError(f"{path}: no timer lines found ({flavour} log)")
    return parser.out


def detect_flavour(path: Path, limit: int = 4 << 20) -> str | None:
    """``megatron-log``, ``deepspeed-log`` or None, from the first ``limit`` bytes of text
    (decompressed, for a gzipped log)."""
    head = read_prefix(path, limit)
    if b"\x00" in head:
        return None
    text = head.decode("utf-8", errors="replace")
    if any(h.search(line) for line in text.splitlines() for h in _HEADERS.values()):
        return "megatron-log"
    bare = False
    for line in text.splitlines():
        match = _TIME_LINE.search(line)
        if match is None:
            continue
        if match.group(1) or match.group(2):
            return "deepspeed-log"
        names = [part.partition(":")[0].strip() for part in match.group(3).split("|")]
        if any("_" in n for n in names):
            return "deepspeed-log"
        bare = True
    return "megatron-log" if bare else None


__all__ = ["ParsedLog", "TimerValue", "detect_flavour", "parse_log"]
