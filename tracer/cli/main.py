"""The `nanoengine` command. `generate` lives here; the other subcommands are loaded lazily
from tracer/ so the engine never imports the tracer or the TUI."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time

from tracer.cli.beams import add_beam_args, request_params
from tracer.cli.defaults import add_field_arg, add_lang_arg, default_of
from tracer.cli.help_format import ArgumentParser
from tracer.i18n import LANGUAGES, N_, _, error_line, set_language
from tracer.kernels import ATTENTION_BACKENDS, KV_CACHE_DTYPES
from tracer.trace.readable import printable

SUBCOMMANDS = {  # name -> (module, function taking argv)
    "trace": ("tracer.cli.trace", "trace_main"),
    "run": ("tracer.cli.run", "run_main"),
    "replay": ("tracer.cli.trace", "replay_main"),
    "check": ("tracer.cli.trace", "check_main"),
    "diff": ("tracer.cli.diff", "diff_main"),
    "export": ("tracer.cli.export", "export_main"),
    "demo": ("tracer.cli.demo", "demo_main"),
    "lesson": ("tracer.cli.lesson", "lesson_main"),
    "bench": ("tracer.cli.bench", "bench_main"),
    "serve": ("tracer.cli.serve", "serve_main"),
}


def add_engine_args(p: argparse.ArgumentParser, sampling: bool = True) -> None:
    """Engine and sampling flags shared by generate, trace and serve (serve: the engine's only); their
    defaults are EngineConfig's and SamplingParams' own."""
    from nanoengine.config import EngineConfig
    from nanoengine.sampling_params import SamplingParams

    add_field_arg(
        p, EngineConfig, "model", str, _("'default' (SmolLM2-135M-Instruct), 'tiny', a folder or .gguf {shown}")
    )
    if sampling:
        add_field_arg(p, SamplingParams, "max_tokens", int, _("new tokens per request at most {shown}"))
        add_field_arg(p, SamplingParams, "temperature", float, _("0 = greedy {shown}"))
        add_field_arg(p, SamplingParams, "top_p", float)
        add_field_arg(p, SamplingParams, "top_k", int, _("0 = off {shown}"))
        add_field_arg(p, SamplingParams, "seed", int, _("seed each request's draws (default: %(default)s, unseeded)"))
        for name in PROCESSORS:
            add_field_arg(p, SamplingParams, name, PROCESSORS[name], _("vLLM's {name} {shown}").replace("{name}", name))
        p.add_argument("--ignore-eos", action="store_true", help=_("keep generating past the end-of-sequence token"))
        p.add_argument("--raw", action="store_true", help=_("do not wrap prompts in the chat template"))
        add_beam_args(p)
    add_field_arg(p, EngineConfig, "block_size", int, _("tokens per KV block {shown}"))
    add_field_arg(
        p,
        EngineConfig,
        "num_kv_blocks",
        int,
        _("KV pool size in blocks {shown}; None: as many as kv_cache_memory_gb holds"),
    )
    add_field_arg(p, EngineConfig, "max_num_batched_tokens", int, _("per-step token budget {shown}"))
    add_field_arg(p, EngineConfig, "max_num_seqs", int, _("requests in one step at most {shown}"))
    add_field_arg(
        p,
        EngineConfig,
        "max_model_len",
        int,
        _("prompt + output tokens at most {shown}; None: the model's context, capped"),
    )
    p.add_argument("--no-prefix-caching", action="store_true", help=_("turn prefix caching off"))
    p.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default="auto",
        help=_("auto: the compiled paged-decode kernel on the CPU where it builds; torch: the engine's own path"),
    )
    p.add_argument(
        "--threads", type=int, default=None, help=_("torch CPU threads (1 is much faster on a busy machine)")
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16", "auto"),
        default=None,
        help=_(
            "default: float32 on the CPU (Hugging Face's exact tokens), bfloat16 on CUDA; bfloat16 decodes"
            " about 2x faster on CPUs with AMX; auto: bfloat16 where the CPU has bf16 instructions"
        ),
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=default_of(EngineConfig, "kv_cache_dtype"),
        help=_(
            "the KV cache's numbers (vLLM's option): auto keeps the model's dtype; bfloat16 under a float32 model"
            " holds twice the tokens in the same memory and reads half the bytes, each K/V rounded once"
        ),
    )
    add_lang_arg(p)


def read_prompts(prompts: list[str]) -> list[str]:
    """`-` as a prompt means: read it from standard input."""
    if "-" not in prompts:
        return prompts
    if prompts.count("-") > 1:
        raise ValueError(_("`-` (read the prompt from standard input) can be given once"))
    try:
        text = sys.stdin.read()
    except UnicodeDecodeError:
        raise ValueError(_("standard input is not UTF-8 text")) from None
    return [text if p == "-" else p for p in prompts]


def bad_argument(argv: list[str]) -> str | None:
    """The first argument that is not valid text (argv bytes that are not UTF-8), described."""
    for i, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            return _("argument {i} ({arg!r}) is not valid UTF-8 text: pass prompts as UTF-8").format(
                i=i, arg=printable(shown)
            )
    return None


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("nanoengine")
    except PackageNotFoundError:
        return _("unknown (not installed)")


def engine_options(args: argparse.Namespace) -> dict:
    return dict(
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        use_chat_template=not args.raw,
        num_threads=args.threads,
        attention_backend=args.attention_backend,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
    )


# The logits processors given as flags (logit_bias and stop_token_ids: through the API and the server)
PROCESSORS = {
    "n": int,
    "repetition_penalty": float,
    "frequency_penalty": float,
    "presence_penalty": float,
    "min_p": float,
    "min_tokens": int,
}


def sampling_params(args: argparse.Namespace):
    from nanoengine.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        **{name: getattr(args, name) for name in PROCESSORS},
    )


def generate_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="nanoengine generate", description=_("Generate text, streaming tokens."))
    p.add_argument("prompts", nargs="+", help=_("the prompts (`-`: read one from standard input)"))
    add_engine_args(p)
    p.add_argument("--stats", action="store_true", help=_("print TTFT and the decode rate (tok/s after the first)"))
    args = p.parse_args(argv)
    args.prompts = read_prompts(args.prompts)
    from nanoengine.beam_search import BeamSearchParams
    from tracer.kernels.choose import build_engine

    params = request_params(args)
    engine = build_engine(args.model, engine_options(args))
    ids = [engine.add_request(prompt, params) for prompt in args.prompts]
    if isinstance(params, BeamSearchParams):
        return print_beams(engine, ids, args.prompts, params)
    many = len(ids) > 1 or params.n > 1
    start, num_generated, printed, first = time.perf_counter(), 0, "", None
    while engine.has_unfinished():
        for seq in engine.step():
            num_generated += 1
            first = first or time.perf_counter()
            if not many:  # decode the whole completion so multi-byte characters print whole
                text = engine.tokenizer.decode(seq.completion_token_ids, skip_special_tokens=True)
                if not text.endswith("\ufffd"):
                    sys.stdout.write(text[len(printed) :])
                    sys.stdout.flush()
                    printed = text
    elapsed = time.perf_counter() - start
    failed = []
    for i, seq_id in enumerate(ids):
        out = engine.collect(seq_id)
        failed += failure_lines(i, out)
        if many:
            for c in out.outputs:  # n > 1: each sample under its own header
                sample = f" (sample {c.index})" if params.n > 1 else ""
                print(f"--- [{i}]{sample} {printable(args.prompts[i])}\n{c.text}")
        elif len(out.text) > len(printed):
            sys.stdout.write(out.text[len(printed) :])
    print(f"\n{rate_line(num_generated, elapsed)}", file=sys.stderr)
    if args.stats:
        from tracer.bench.single import stats_line

        print(stats_line(engine, start, first, start + elapsed, num_generated), file=sys.stderr)
    print(*failed, sep="\n", file=sys.stderr, end="\n" if failed else "")
    return 1 if failed else 0


def print_beams(engine, ids: list[int], prompts: list[str], params) -> int:
    """Run each prompt's beam search to the end, then print every beam, best first, under its own
    header with its score (a beam changes until its search ends: nothing is streamed)."""
    from tracer.teach.demos import beam_score_of

    start, num_generated = time.perf_counter(), 0
    while engine.has_unfinished():
        num_generated += len(engine.step())
    elapsed = time.perf_counter() - start
    failed = []
    for i, seq_id in enumerate(ids):
        out = engine.collect(seq_id)
        failed += failure_lines(i, out)
        for rank, c in enumerate(out.outputs):
            score = beam_score_of(out, c, engine.eos_token_ids, params.length_penalty)
            beam = _("(beam {rank}, score {score:.4f}, {reason})").format(
                rank=rank, score=score, reason=c.finish_reason
            )
            print(f"--- [{i}] {beam} {printable(prompts[i])}\n{c.text}")
    print(rate_line(num_generated, elapsed), file=sys.stderr)
    print(*failed, sep="\n", file=sys.stderr, end="\n" if failed else "")
    return 1 if failed else 0


def failure_lines(i: int, out) -> list[str]:
    """The line saying prompt i failed inside the engine, if it did."""
    if out.finish_reason != "error":
        return []
    return [error_line(_("prompt {i} failed inside the engine: {error}").format(i=i, error=printable(out.error)))]


def rate_line(num_generated: int, elapsed: float) -> str:
    return _("[{n} tokens in {seconds:.2f} s, {rate:.1f} tok/s]").format(
        n=num_generated, seconds=elapsed, rate=num_generated / elapsed
    )


COMMAND_HELP = {
    "generate": N_("generate text, streaming tokens"),
    "trace": N_("generate with the step recorder and open the replay TUI (--arrive: late joiners)"),
    "run": N_("record a scenario file (requests arriving at given steps) and replay it"),
    "replay": N_("open a saved trace in the TUI"),
    "check": N_("run the invariant checker on a trace"),
    "diff": N_("where two traces of the same workload differ (e.g. nanoengine vs vLLM v1)"),
    "export": N_("a trace as a Perfetto timeline or a one-file HTML replay"),
    "demo": N_("classroom demos"),
    "lesson": N_("lessons and exercises"),
    "bench": N_("benchmarks against Hugging Face transformers (--serving: through the HTTP API)"),
    "serve": N_("an OpenAI-compatible HTTP server (completions, chat, streaming)"),
}


def split_lang(argv: list[str]) -> tuple[str | None, list[str]]:
    """--lang zh / --lang=zh taken out of argv wherever it stands before `--` (every command has it,
    and the language must be chosen before any command builds its help)."""
    lang, rest = None, []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            rest += [arg, *args]
            break
        if arg == "--lang":
            lang = next(args, None)
            if lang is None:
                raise ValueError(_("--lang needs a language: --lang zh or --lang en"))
        elif arg.startswith("--lang="):
            lang = arg.removeprefix("--lang=")
        else:
            rest.append(arg)
    return lang, rest


def choose_language(argv: list[str]) -> list[str]:
    """Set the language from --lang (else the environment); argv without --lang."""
    lang, rest = split_lang(argv)
    if lang is not None and lang.strip().lower() not in LANGUAGES:
        raise ValueError(
            _("unknown language {lang!r} for --lang: use zh (Chinese) or en (English)").format(lang=printable(lang))
        )
    set_language(lang)
    return rest


def print_help(commands: list[str]) -> None:
    lines = [
        _("usage: nanoengine [--version] [--lang zh|en] {{{commands}}} ...").format(commands=",".join(commands)),
        "",
        *(f"  {name:<9} {_(COMMAND_HELP[name])}" for name in commands),
        "",
        _("`nanoengine COMMAND --help` for a command's options; `-` as a prompt reads it from standard input."),
        _("--lang zh|en (or NANOENGINE_LANG, else the locale) chooses the language, on every command."),
    ]
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = ["generate", *SUBCOMMANDS]
    problem = bad_argument(argv)
    if problem:
        print(error_line(problem), file=sys.stderr)
        return 2
    try:
        argv = choose_language(argv)
    except ValueError as e:
        print(error_line(str(e)), file=sys.stderr)
        return 2
    if argv and argv[0] in ("-V", "--version"):
        print(f"nanoengine {version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print_help(commands)
        return 0
    name, rest = argv[0], argv[1:]
    sigterm = signal.getsignal(signal.SIGTERM)  # trace, run and serve take SIGTERM as Ctrl-C
    try:
        if name == "generate":
            return generate_main(rest)
        if name not in SUBCOMMANDS:
            message = _("nanoengine: unknown command {name!r}; choose one of {commands}")
            print(message.format(name=name, commands=", ".join(commands)), file=sys.stderr)
            return 2
        module, func = SUBCOMMANDS[name]
        return getattr(importlib.import_module(module), func)(rest)
    except KeyboardInterrupt:
        print("\n" + _("interrupted"), file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:
        print(error_line(printable(str(e))), file=sys.stderr)
        return 2
    finally:
        restore_sigterm(sigterm)


def restore_sigterm(handler) -> None:
    """SIGTERM as it was before the command: main() called in a process that goes on (a test, a
    notebook) must not leave it raising KeyboardInterrupt there."""
    if handler is not None and signal.getsignal(signal.SIGTERM) is not handler:
        signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(main())
