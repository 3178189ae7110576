"""The step recorder: an engine step hook that writes a JSONL trace (docs/trace-format.md).

Stable API (the TUI, the demos and the lessons build on these):

    record_run(prompts, params=None, out_path=None, *, model="default", title=None,
               focus_step=None, engine=None, **engine_options) -> (Path, list[RequestOutput])
        Runs the prompts to completion with a recorder attached; returns the trace path and the
        outputs in prompt order. `params` is one SamplingParams, a list (one per prompt) or None.
        Pass `engine=` to reuse a loaded LLMEngine (then `model` and engine_options are ignored).
        out_path None: traces/trace-YYYYmmdd-HHMMSS.jsonl under the current folder.

    TraceRecorder(engine, path, title=None, focus_step=None)
        Attaches itself to the engine as a step hook (do not also call engine.add_step_hook) and
        writes one line per step, flushed at once. Use it as a context manager, or call close():
        close() detaches it and makes sure the header is written even if no step ran; start()
        writes the header at once (the live app reads the file from its first line).
        Attributes: path, num_steps, violations (list[Violation] found live so far), failed (None, or
        why recording stopped, in one line).
        annotate(seq_id, **notes): extra fields for a request's entry, written when it first appears
        (a server's arrival_time and http_request_id, a scenario's requested `arrive` step).

    default_trace_path(folder="traces") -> Path

The header is written lazily, on the first step, listing every request live then. Requests that
first appear in a later step (added with add_request after the run started) are listed in that
step line's `new_requests`; the loader merges both into Trace.requests. Each step is checked whole
and written as a keyframe or a change (tracer/trace/keyframes.py: a line's size follows the
step's sequences and the blocks it changed, not every request seen).

The file is locked while it is written (fcntl.flock): a second recorder on it is refused
(RecorderRefused, one line), and so is a non-empty FILE.partial (a run's unfinished trace: never
truncated). A step that cannot be written (a full disk, anything else) never fails the engine's
step: recording stops, the file is cut back to its last whole line (removed if no header made it),
`failed` says why, and it is logged once; a `with` block then ends with an OSError saying so.

Per-step cost is kept low (figures: docs/benchmarks.md): token texts are decoded once per token id,
new ids together; a sequence's output text is decoded from a kept head (Detokenizer) only in steps
where it gained a token; finished sequences are carried as one cached dict; only a keyframe encodes
the pool's big arrays, and nothing derives the pool's layout (owners, filled: the reader's); a step
line is encoded by orjson.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import stat
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path

import orjson

import nanoengine
from nanoengine.engine import LLMEngine
from nanoengine.outputs import RequestOutput
from nanoengine.sampling_params import SamplingParams
from nanoengine.step_record import SeqStep, StepRecord
from tracer.trace.invariants import InvariantChecker, Violation
from tracer.trace.keyframes import DeltaWriter
from tracer.trace.sources import SourceBook
from tracer.trace.step_line import (
    EngineRow,
    SeqRow,
    StepLine,
    engine_row,
    idle_row,
    parent_of,
    seq_row,
    step_line,
)
from tracer.trace.trace_file import SCHEDULER_CONFIG, SCHEMA_VERSION

CONFIG_FIELDS = (*SCHEDULER_CONFIG, "use_chat_template")


HEAD_EVERY = 8  # Detokenizer.text decodes at most twice this many of a sequence's last tokens a step


JSON = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False
)  # one encoder: json.dumps builds one a call
ASCII_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # for text UTF-8 cannot hold (a lone surrogate)
LOG = logging.getLogger(__name__)


class RecorderRefused(ValueError):
    """The trace file cannot be recorded into; the message is one line."""


class Detokenizer:
    """The tokenizer's decode as the recorder uses it, made cheap enough to run every step.

    - Straight from a fast tokenizer's backend when that gives the same text (no space clean-up):
      transformers' wrapper re-checks every id on every call.
    - decode_each: each token's own text, many tokens in one call (a prefill brings thousands).
    - text: a sequence's growing completion without decoding all of it every step. The text of a head
      of the ids is kept, and grown by a piece once decode(piece) + decode(rest) == decode(piece +
      rest) was seen to hold (a whole character at the boundary; the rest always starts with the
      same token, so it keeps holding): a step decodes only the last few ids."""

    def __init__(self, tokenizer) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
            self.decode: Callable[[list[int]], str] = lambda ids: backend.decode(ids, skip_special_tokens=True)
            self.decode_each: Callable[[list[int]], list[str]] = lambda ids: backend.decode_batch(
                [[t] for t in ids], skip_special_tokens=False
            )
        else:
            self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
            self.decode_each = lambda ids: [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        self.heads: dict[int, tuple[int, str]] = {}  # seq_id -> (n, decode(ids[:n]))

    def text(self, seq_id: int, ids: list[int]) -> str:
        n, head = self.heads.get(seq_id, (0, ""))
        tail = self.decode(ids[n:])
        if len(ids) - n >= HEAD_EVERY:  # grow the head by what decodes on its own
            m = len(ids) - HEAD_EVERY // 2
            grown = self.decode(ids[n:m])
            if grown + self.decode(ids[m:]) == tail:
                self.heads[seq_id] = (m, head + grown)
        return head + tail


def default_trace_path(folder: str | Path = "traces") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(folder) / f"trace-{stamp}.jsonl"
    n = 1
    while path.exists():
        path, n = Path(folder) / f"trace-{stamp}-{n}.jsonl", n + 1
    return path


class TraceRecorder:
    def __init__(
        self,
        engine: LLMEngine,
        path: str | Path,
        title: str | None = None,
        focus_step: int | None = None,
        log_failure: bool = True,  # False: the caller reports `failed` itself (the trace command)
    ):
        self.engine = engine
        self.log_failure = log_failure
        self.path = Path(path)
        self.title = title
        self.focus_step = focus_step
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open_locked(self.path)
        self.written = 0  # bytes of whole lines in the file
        self.failed: str | None = None  # why recording stopped, in one line
        self.error: Exception | None = None  # the error that stopped it
        self.header: dict | None = None
        self.config = engine_config(engine)
        self.checker = InvariantChecker(self.config, eos_token_ids=engine.eos_token_ids)
        self.requests: dict[int, dict] = {}
        self.notes: dict[int, dict] = {}  # seq_id -> extra fields for its request entry
        self.rows: dict[int, SeqRow] = {}  # each sequence's latest row
        self.carried: dict[int, SeqRow] = {}  # finished sequences' row for later steps
        self.detokenizer = Detokenizer(engine.tokenizer)
        self.completions: dict[int, list[int]] = {}  # generated token ids so far
        self.texts: dict[int, str] = {}  # token id -> decoded text
        self.deltas = DeltaWriter()
        self.violations: list[Violation] = []
        self.sources: SourceBook | None = None  # the engine's functions, read when the header is written
        self.num_steps = 0
        self.last_step = -1
        engine.add_step_hook(self)

    # ---- the hook -----------------------------------------------------------------------
    def __call__(self, record: StepRecord) -> None:
        if self.failed is not None or self.file.closed or record.step <= self.last_step:
            return  # stopped, closed, or registered twice
        try:
            self.record_step(record)
        except Exception as e:  # the engine's step must not fail because its trace could not be written
            self.stop(e)

    def record_step(self, record: StepRecord) -> None:
        new_requests = [self.request_entry(s, record.step) for s in record.seqs if s.seq_id not in self.requests]
        if self.header is None:
            self.write_header(new_requests)
            new_requests = []
        line = self.line_of(record, new_requests)
        found = self.checker.check(line)
        line["violations"] = [v.to_dict() for v in found]
        self.violations.extend(found)
        self.write_line(self.deltas.line(line, {s.seq_id for s in record.seqs}))
        self.num_steps += 1
        self.last_step = record.step
        self.archive(self.deltas.just_archived)

    def archive(self, seq_ids: list[int]) -> None:
        """Finished sequences a keyframe has listed: a reader finds them there, so the whole lines
        built here (and the checker) leave them out from now on, and a step's cost follows the
        sequences still live, not every one the trace has seen (docs/benchmarks.md, twenty-fifth
        round). One the engine lists again comes back."""
        for seq_id in seq_ids:
            self.rows.pop(seq_id, None)
            self.carried.pop(seq_id, None)
        self.checker.forget(seq_ids)

    def write_line(self, obj: dict) -> None:
        """One whole line, or (on an error) none: a line cut short is cut off again."""
        data = encode_line(obj)
        try:
            view = memoryview(data)
            while view:
                if not (n := self.file.write(view)):
                    raise OSError(errno.ENOSPC, "the file took no more bytes")
                view = view[n:]
        except BaseException:
            self.cut_back()
            raise
        self.written += len(data)

    def cut_back(self) -> None:
        """Back to the last whole line."""
        try:
            os.ftruncate(self.file.fileno(), self.written)
            self.file.seek(self.written)
        except OSError:
            pass  # a reader drops a last line cut short

    def stop(self, e: Exception) -> None:
        """Recording failed: stop, keep the whole lines, say why once. A file without its header is
        no trace: it goes."""
        self.error = e
        self.failed = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if self.header is None or self.written == 0:
            self.failed += "; no trace was written"
            self.remove_file()
        else:
            self.failed += f"; the trace {self.path} holds the {self.num_steps} steps before it"
        if self.log_failure:
            LOG.error("nanoengine: recording stopped: %s", self.failed)

    def remove_file(self) -> None:
        """The file this recorder created, if path still names it (never a device or another's file)."""
        try:
            mine, there = os.fstat(self.file.fileno()), os.stat(self.path)
            if stat.S_ISREG(mine.st_mode) and (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                self.path.unlink()
        except OSError:
            pass

    def line_of(self, record: StepRecord, new_requests: list[dict]) -> StepLine:
        for s in record.seqs:
            self.rows[s.seq_id] = self.with_logprobs(self.with_texts(engine_row(s)))
            self.carried.pop(s.seq_id, None)  # it changed: carry its new row from now on
        live = {s.seq_id for s in record.seqs}
        seqs = [self.rows[sid] if sid in live else self.carry(sid) for sid in sorted(self.rows)]
        input_texts = self.token_texts(record.inputs.input_ids)
        line = step_line(record, seqs, new_requests, input_texts)
        if self.sources is not None:
            for event, e in zip(line["events"], record.events):
                event["where"] = self.sources.where(e.where)
        return line

    def with_texts(self, row: EngineRow) -> SeqRow:
        seq_id, new_ids = row["seq_id"], row["new_token_ids"]
        texts = self.token_texts(new_ids)
        completion = self.completion_before(row)
        made = row["num_tokens_after"] - row["num_prompt_tokens"]
        if new_ids or seq_id not in self.rows or len(completion) > made:
            completion.extend(new_ids)
            if len(completion) > made:  # a beam search restarted from its prompt (a preemption)
                del completion[max(made, 0) :]
                self.detokenizer.heads.pop(seq_id, None)
            return seq_row(row, texts, self.output_text(seq_id, completion))
        return seq_row(row, texts, self.rows[seq_id]["output_text"])

    def completion_before(self, row: EngineRow) -> list[int]:
        """The sequence's generated ids before this step; a beam forked in it starts with its parent's
        (the parent's row comes first: its seq_id is lower)."""
        seq_id = row["seq_id"]
        if seq_id not in self.completions:
            parent = self.completions.get(parent_of(row), [])
            self.completions[seq_id] = parent[: max(row["num_tokens"] - row["num_prompt_tokens"], 0)]
        return self.completions[seq_id]

    def with_logprobs(self, row: SeqRow) -> SeqRow:
        """The new tokens' logprobs (the chosen token's, the raw model's), where the request asked for logprobs:
        one float a token, read off the engine's sequence (its top k stay in the engine's output)."""
        seq = self.engine.sequences.get(row["seq_id"])
        if seq is None or seq.params.logprobs is None:
            return row
        new_ids = row["new_token_ids"]
        entries = seq.logprobs[len(seq.logprobs) - len(new_ids) :] if new_ids else []
        row["new_token_logprobs"] = [finite(entry[t].logprob) for t, entry in zip(new_ids, entries)]
        return row

    def carry(self, seq_id: int) -> SeqRow:
        """A sequence not in this step's record (finished earlier, or waiting untouched): listed, idle."""
        if seq_id not in self.carried:
            self.carried[seq_id] = idle_row(self.rows[seq_id])
        return self.carried[seq_id]

    # ---- text -----------------------------------------------------------------------------
    def token_texts(self, token_ids: Iterable[int]) -> list[str]:
        """Each token's own text (special tokens included), decoded once per token id: ids not seen
        before are decoded together (a prefill brings thousands)."""
        token_ids = list(token_ids)
        if new := list({t for t in token_ids if t not in self.texts}):
            tok = self.engine.tokenizer
            for token_id, text in zip(new, self.detokenizer.decode_each(new)):
                if not text and hasattr(tok, "convert_ids_to_tokens"):
                    text = tok.convert_ids_to_tokens([token_id])[0] or ""
                self.texts[token_id] = text
        return [self.texts[t] for t in token_ids]

    def output_text(self, seq_id: int, completion: list[int]) -> str:
        text = self.detokenizer.text(seq_id, completion) if completion else ""
        for stop in self.requests.get(seq_id, {}).get("params", {}).get("stop", ()):
            if stop in text:
                text = text[: text.index(stop)]
        return text

    # ---- header and requests --------------------------------------------------------------
    def annotate(self, seq_id: int, **notes: object) -> None:
        self.notes.setdefault(seq_id, {}).update(notes)

    def request_entry(self, s: SeqStep, step: int) -> dict:
        seq_id = s.seq_id
        seq = self.engine.sequences.get(seq_id)  # gone only if collected while live: prompt unknown
        ids = list(seq.token_ids[: seq.num_prompt_tokens]) if seq is not None else []
        prompt = (seq.prompt if seq is not None else "") or self.engine.tokenizer.decode(ids)
        params = params_entry(seq.params) if seq is not None else {}
        if seq is not None and seq.group is not None:  # a beam: its forks are no samples
            params["beam_width"] = seq.group.params.beam_width
        elif seq is not None and len(siblings := self.engine.requests.get(seq.request_id, ())) > 1:
            params["n"] = len(siblings)  # the request's n: each sample runs with n = 1 (and its own seed + i)
        entry = {
            "seq_id": seq_id,
            "prompt": prompt,
            "num_prompt_tokens": s.num_prompt_tokens,
            "prompt_token_ids": ids,
            "prompt_token_texts": self.token_texts(ids),
            "params": params,
            "first_step": step,
            **self.notes.pop(seq_id, {}),
        }
        self.requests[seq_id] = entry
        self.checker.add_requests([entry])
        return entry

    def write_header(self, requests: list[dict]) -> None:
        self.sources = SourceBook()
        self.header = {
            "type": "header",
            "schema_version": SCHEMA_VERSION,
            "nanoengine_version": nanoengine.__version__,
            "model": self.engine.model_name,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": self.config,
            "requests": requests,
            "title": self.title,
            "focus_step": self.focus_step,
            "eos_token_ids": sorted(self.engine.eos_token_ids),
            "tokenizer": tokenizer_identity(self.engine.tokenizer, self.engine.model_name),
            "sources": self.sources.entries,
        }
        self.write_line(self.header)

    # ---- lifetime -------------------------------------------------------------------------
    def start(self) -> TraceRecorder:
        """Write the header now, before any step (a live viewer reads it first); the requests then
        come in their first step's new_requests."""
        if self.header is None and not self.file.closed and self.failed is None:
            try:
                self.write_header([])
            except Exception as e:
                self.stop(e)
        return self

    def close(self) -> None:
        """Detach, write the header if no step did, release the file. Never raises for the file:
        failed says whether recording stopped early."""
        if self.file.closed:
            return
        while self in self.engine.step_hooks:  # registered twice by mistake: detached all the same
            self.engine.remove_step_hook(self)
        if self.header is None and self.failed is None:
            self.start()
        try:
            self.file.close()
        except OSError as e:
            if self.failed is None:
                self.stop(e)

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close()
        if self.failed is not None and kind is None:
            if isinstance(self.error, OSError):  # the disk's own error: the caller names the file
                raise self.error
            raise OSError(f"recording the trace stopped: {self.failed}")


def finite(logprob: float) -> float:
    """A logprob as JSON can hold it (no -Infinity: a token the model gave no chance), to 4 decimals."""
    return round(logprob, 4) if math.isfinite(logprob) else -1e30


def encode_line(obj: dict) -> bytes:
    """The line as UTF-8 JSON. A step line goes through orjson (a tenth of json's time: most of what
    writing a step cost, docs/benchmarks.md); the header and a line bringing new requests (the
    user's parameters and notes) through json, which refuses NaN and Infinity. orjson would write
    those as null: a step line's own floats, its two times, are checked here (a logprob passed
    finite(); every other field is an int or a string). Text UTF-8 cannot hold (a lone surrogate,
    e.g. from a client's JSON escape) is written as a JSON escape, which reads back as the same string."""
    if obj.get("type") == "step" and not obj.get("new_requests"):
        if not (math.isfinite(obj.get("wall_time", 0.0)) and math.isfinite(obj.get("model_time", 0.0))):
            raise ValueError("Out of range float values are not JSON compliant (a step's time)")
        try:
            return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)
        except orjson.JSONEncodeError:
            pass  # a lone surrogate, an int past 64 bits: json writes it
    try:
        return (JSON.encode(obj) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (ASCII_JSON.encode(obj) + "\n").encode("ascii")


def open_locked(path: Path):
    """path, opened for writing and locked (flock: released when the file is closed, or its process
    ends). RecorderRefused, one line, when another recorder holds it, or when it is a non-empty
    FILE.partial: an earlier run's unfinished trace is never truncated."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(fd)
        os.close(fd)
        by = f" (pid {holder})" if holder else ""
        raise RecorderRefused(f"{path} is being written by another nanoengine{by}: give another file") from None
    size = os.fstat(fd).st_size
    if path.name.endswith(".partial") and size > 0:
        os.close(fd)
        raise RecorderRefused(
            f"{path} holds an earlier run's unfinished trace ({size:,} bytes): rename it to keep it "
            f"(`nanoengine replay` opens it) or remove it, then start again"
        )
    os.ftruncate(fd, 0)
    return os.fdopen(fd, "wb", buffering=0)


def lock_holder(fd: int) -> int | None:
    """The pid holding an flock on fd's file, from /proc/locks (Linux); None where unknown."""
    inode = os.fstat(fd).st_ino
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()  # 1: FLOCK ADVISORY WRITE 1234 08:02:131 0 EOF
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
            return int(parts[4]) if parts[4].isdigit() else None
    return None


DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its sha256, once per tokenizer


def tokenizer_identity(tokenizer, model_name: str) -> dict:
    """Which tokenizer made the token ids: the model's name, a sha256 of the tokenizer's content
    (the same wherever it was loaded from) and the vocab size. Never the folder it was loaded
    from: a shared trace (or its HTML export) would show the user's home folder."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", 0)
    try:
        digest = DIGESTS[tokenizer]
    except (KeyError, TypeError):  # TypeError: an object that takes no weak reference
        digest = tokenizer_digest(tokenizer, int(size))
        try:
            DIGESTS[tokenizer] = digest
        except TypeError:
            pass
    return {"name": model_name, "sha256": digest, "vocab_size": int(size)}


def tokenizer_digest(tokenizer, size: int) -> str:
    """sha256 of a fast tokenizer's serialized form (vocab, merges, added tokens, normalizer, ...);
    otherwise of every token's text, in id order."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        content = backend.to_str()
    else:
        content = json.dumps(
            [type(tokenizer).__name__, tokenizer.convert_ids_to_tokens(list(range(size)))], allow_nan=False
        )
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def engine_config(engine: LLMEngine) -> dict:
    """The scheduler's knobs, and kv_cache_dtype where it is not auto (a trace of the default
    engine's header is what it was before that option)."""
    config = {name: getattr(engine.config, name) for name in CONFIG_FIELDS}
    if engine.config.kv_cache_dtype != "auto":
        config["kv_cache_dtype"] = engine.config.kv_cache_dtype
    return config


# The logits processors' and the outputs' fields: written only when a request sets them, so a
# plain request's entry is what it was before they existed.
PROCESSOR_FIELDS = (
    "n",
    "logprobs",
    "prompt_logprobs",
    "stop_token_ids",
    "min_tokens",
    "logit_bias",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "min_p",
)
NEUTRAL = SamplingParams()


def params_entry(params: SamplingParams) -> dict:
    """A request's sampling params as its trace entry lists them."""
    entry = {f.name: copy.copy(getattr(params, f.name)) for f in fields(params)}
    del entry["logits_processors"]  # functions: the trace says how many, when there are any
    if params.logits_processors:
        entry["logits_processors"] = len(params.logits_processors)
    for name in PROCESSOR_FIELDS:
        if entry[name] == getattr(NEUTRAL, name):
            del entry[name]
    if "logit_bias" in entry:  # JSON keys are strings: say so rather than let json.dumps convert
        entry["logit_bias"] = {str(t): b for t, b in entry["logit_bias"].items()}
    return entry


def record_run(
    prompts: str | Iterable[str | list[int]],
    params: SamplingParams | list[SamplingParams] | None = None,
    out_path: str | Path | None = None,
    *,
    model: str = "default",
    title: str | None = None,
    focus_step: int | None = None,
    engine: LLMEngine | None = None,
    **engine_options,
) -> tuple[Path, list[RequestOutput]]:
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not isinstance(params, list):
        params = [params or SamplingParams()] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
    engine = engine or LLMEngine(model, **engine_options)
    path = Path(out_path) if out_path is not None else default_trace_path()
    with TraceRecorder(engine, path, title=title, focus_step=focus_step):
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        while engine.has_unfinished():
            engine.step()
    return path, [engine.collect(i) for i in ids]
