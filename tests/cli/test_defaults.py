"""The command line's engine and sampling flags default to EngineConfig's and SamplingParams' own
values, and --help shows them."""

from __future__ import annotations

import argparse

import pytest

from nanoengine.config import EngineConfig
from nanoengine.sampling_params import SamplingParams
from tracer.cli.defaults import default_of
from tracer.cli.main import add_engine_args, engine_options, sampling_params


def engine_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoengine generate")
    add_engine_args(p)
    return p


def test_no_flags_give_the_engines_own_config_and_sampling_params():
    args = engine_parser().parse_args([])
    assert EngineConfig(model=args.model, **engine_options(args)) == EngineConfig()
    assert sampling_params(args) == SamplingParams()


def test_help_shows_the_engines_defaults():
    shown = " ".join(engine_parser().format_help().split())  # argparse folds long help lines
    for field in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
        assert f"(default: {getattr(EngineConfig(), field)})" in shown
    assert f"(default: {SamplingParams().max_tokens})" in shown


def test_trace_help_shows_its_own_pool_size(capsys):
    from tracer.cli.trace import TRACE_NUM_KV_BLOCKS, trace_main

    with pytest.raises(SystemExit):
        trace_main(["--help"])
    assert f"(default: {TRACE_NUM_KV_BLOCKS})" in " ".join(capsys.readouterr().out.split())


def test_default_of_reads_a_default_factory_and_refuses_a_field_without_one():
    assert default_of(SamplingParams, "stop") == []
    with pytest.raises(ValueError, match="no field 'colour'"):
        default_of(SamplingParams, "colour")
