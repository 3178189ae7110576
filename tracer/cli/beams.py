"""`--beam-width K` on `nanoengine generate` and `nanoengine trace`: a beam search per prompt
(BeamSearchParams, vLLM's), each beam printed with its score under its own header.

    add_beam_args(p)                          --beam-width, --length-penalty
    request_params(args)                      SamplingParams, or BeamSearchParams with --beam-width
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING

from tracer.cli.defaults import default_of, with_default
from tracer.i18n import _

if TYPE_CHECKING:
    from nanoengine.beam_search import BeamSearchParams
    from nanoengine.sampling_params import SamplingParams


def add_beam_args(p: argparse.ArgumentParser) -> None:
    from nanoengine.beam_search import BeamSearchParams

    p.add_argument(
        "--beam-width",
        type=int,
        default=None,
        metavar="K",
        help=_(
            "beam search: keep the K likeliest continuations of each prompt and print each with its score; "
            "takes --max-tokens, --temperature, --ignore-eos and --length-penalty"
        ),
    )
    p.add_argument(
        "--length-penalty",
        type=float,
        default=default_of(BeamSearchParams, "length_penalty"),
        help=with_default(_("a beam scores cum_logprob / length ** length_penalty {shown}")),
    )


def sampling_only_flags(args: argparse.Namespace) -> list[str]:
    """The sampling flags given a value other than their default that a beam search has no use for
    (they shape a draw; the search ranks each beam's likeliest tokens)."""
    from nanoengine.beam_search import BeamSearchParams
    from nanoengine.sampling_params import SamplingParams

    beam_fields = {f.name for f in fields(BeamSearchParams)}
    given = []
    for f in fields(SamplingParams):
        if f.name in beam_fields or f.name == "n" or not hasattr(args, f.name) or f.default is MISSING:
            continue
        if getattr(args, f.name) != f.default:
            given.append("--" + f.name.replace("_", "-"))
    return given


def request_params(args: argparse.Namespace) -> SamplingParams | BeamSearchParams:
    """What each prompt runs with: a beam search with --beam-width, else the sampling flags'
    SamplingParams. Flags that make no sense together are one line (ValueError)."""
    from nanoengine.beam_search import BeamSearchParams
    from tracer.cli.main import sampling_params

    if args.beam_width is None:
        if args.length_penalty != default_of(BeamSearchParams, "length_penalty"):
            raise ValueError(_("--length-penalty scores the beams of a beam search: give --beam-width too"))
        return sampling_params(args)
    if args.n != 1:
        raise ValueError(
            _(
                "--beam-width {k} searches {k} beams of one request, --n {n} draws {n} samples of it: give one "
                "or the other"
            ).format(k=args.beam_width, n=args.n)
        )
    unused = sampling_only_flags(args)
    if unused:
        raise ValueError(
            _(
                "--beam-width ranks each beam's likeliest tokens: {flags} only shape a random draw, leave them "
                "out (a beam search takes --max-tokens, --temperature, --ignore-eos and --length-penalty)"
            ).format(flags=", ".join(unused))
        )
    return BeamSearchParams(
        beam_width=args.beam_width,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        length_penalty=args.length_penalty,
    )
