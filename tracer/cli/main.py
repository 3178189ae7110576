"""The `nanoengine` command. `generate` lives here; the other subcommands are loaded lazily
from tracer/ so the engine never imports the tracer or the TUI."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from tracer.cli.defaults import SHOWN, add_field_arg
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
        p, EngineConfig, "model", str, f"'default' (SmolLM2-135M-Instruct), 'tiny', a folder or .gguf {SHOWN}"
    )
    if sampling:
        add_field_arg(p, SamplingParams, "max_tokens", int, f"new tokens per request at most {SHOWN}")
        add_field_arg(p, SamplingParams, "temperature", float, f"0 = greedy {SHOWN}")
        add_field_arg(p, SamplingParams, "top_p", float)
        add_field_arg(p, SamplingParams, "top_k", int, f"0 = off {SHOWN}")
        add_field_arg(p, SamplingParams, "seed", int, "seed each request's draws (default: %(default)s, unseeded)")
        for name in PROCESSORS:
            add_field_arg(p, SamplingParams, name, PROCESSORS[name], f"vLLM's {name} {SHOWN}")
        p.add_argument("--ignore-eos", action="store_true")
        p.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template")
    add_field_arg(p, EngineConfig, "block_size", int, f"tokens per KV block {SHOWN}")
    add_field_arg(
        p,
        EngineConfig,
        "num_kv_blocks",
        int,
        f"KV pool size in blocks {SHOWN}; None: as many as kv_cache_memory_gb holds",
    )
    add_field_arg(p, EngineConfig, "max_num_batched_tokens", int, f"per-step token budget {SHOWN}")
    add_field_arg(p, EngineConfig, "max_num_seqs", int, f"requests in one step at most {SHOWN}")
    add_field_arg(
        p,
        EngineConfig,
        "max_model_len",
        int,
        f"prompt + output tokens at most {SHOWN}; None: the model's context, capped",
    )
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is much faster on a busy machine)")


def read_prompts(prompts: list[str]) -> list[str]:
    """`-` as a prompt means: read it from standard input."""
    if "-" not in prompts:
        return prompts
    if prompts.count("-") > 1:
        raise ValueError("`-` (read the prompt from standard input) can be given once")
    try:
        text = sys.stdin.read()
    except UnicodeDecodeError:
        raise ValueError("standard input is not UTF-8 text") from None
    return [text if p == "-" else p for p in prompts]


def bad_argument(argv: list[str]) -> str | None:
    """The first argument that is not valid text (argv bytes that are not UTF-8), described."""
    for i, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            return f"argument {i} ({printable(shown)!r}) is not valid UTF-8 text: pass prompts as UTF-8"
    return None


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("nanoengine")
    except PackageNotFoundError:
        return "unknown (not installed)"


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
    )


# The logits processors given as flags (logit_bias and stop_token_ids: through the API and the server)
PROCESSORS = {
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
    p = argparse.ArgumentParser(prog="nanoengine generate", description="Generate text, streaming tokens.")
    p.add_argument("prompts", nargs="+")
    add_engine_args(p)
    args = p.parse_args(argv)
    args.prompts = read_prompts(args.prompts)
    from nanoengine.engine import LLMEngine

    params = sampling_params(args)
    engine = LLMEngine(args.model, **engine_options(args))
    ids = [engine.add_request(prompt, params) for prompt in args.prompts]
    many = len(ids) > 1
    start, num_generated, printed = time.perf_counter(), 0, ""
    while engine.has_unfinished():
        for seq in engine.step():
            num_generated += 1
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
        if out.finish_reason == "error":
            failed.append(f"nanoengine: error: prompt {i} failed inside the engine: {printable(out.error)}")
        if many:
            print(f"--- [{i}] {printable(args.prompts[i])}\n{out.text}")
        elif len(out.text) > len(printed):
            sys.stdout.write(out.text[len(printed) :])
    print(f"\n[{num_generated} tokens in {elapsed:.2f} s, {num_generated / elapsed:.1f} tok/s]", file=sys.stderr)
    print(*failed, sep="\n", file=sys.stderr, end="\n" if failed else "")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = ["generate", *SUBCOMMANDS]
    problem = bad_argument(argv)
    if problem:
        print(f"nanoengine: error: {problem}", file=sys.stderr)
        return 2
    if argv and argv[0] in ("-V", "--version"):
        print(f"nanoengine {version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(
            f"usage: nanoengine [--version] {{{','.join(commands)}}} ...\n\n"
            "  generate  generate text, streaming tokens\n"
            "  trace     generate with the step recorder and open the replay TUI (--arrive: late joiners)\n"
            "  run       record a scenario file (requests arriving at given steps) and replay it\n"
            "  replay    open a saved trace in the TUI\n"
            "  check     run the invariant checker on a trace\n"
            "  diff      where two traces of the same workload differ (e.g. nanoengine vs vLLM v1)\n"
            "  export    a trace as a Perfetto timeline or a one-file HTML replay\n"
            "  demo      classroom demos\n"
            "  lesson    lessons and exercises\n"
            "  bench     benchmarks against Hugging Face transformers (--serving: through the HTTP API)\n"
            "  serve     an OpenAI-compatible HTTP server (completions, chat, streaming)\n\n"
            "`nanoengine COMMAND --help` for a command's options; `-` as a prompt reads it from standard input."
        )
        return 0
    name, rest = argv[0], argv[1:]
    try:
        if name == "generate":
            return generate_main(rest)
        if name not in SUBCOMMANDS:
            print(f"nanoengine: unknown command {name!r}; choose one of {', '.join(commands)}", file=sys.stderr)
            return 2
        module, func = SUBCOMMANDS[name]
        return getattr(importlib.import_module(module), func)(rest)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:
        print(f"nanoengine: error: {printable(str(e))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
