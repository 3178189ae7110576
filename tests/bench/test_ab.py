"""`nanoengine bench --ab OLD NEW`: two builds of the kernels taking turns in one engine (tracer/bench/ab.py).
Timings are not asserted (a busy machine moves them); what is: both builds run, in turns, on the
steps counted; a build that computes differently shows in the tokens; the loaders are put back;
and a build this checkout's Python cannot call is refused in one line before anything runs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tracer.bench import ab
from tracer.cli.main import main as cli_main
from tracer.kernels import decode_layers, packed_linear

NORM = "l->post_attention_eps, bf16, s->threads);"


def copy_of_kernels(into: Path, old: str = "", new: str = "") -> Path:
    """tracer/kernels' C sources, with one change to decode_layers.c where old is given."""
    folder = into / "kernels"
    folder.mkdir()
    for source in ab.KERNELS.glob("*.[ch]"):
        shutil.copy(source, folder)
    if old:
        path = folder / "decode_layers.c"
        text = path.read_text()
        assert text.count(old) == 1
        path.write_text(text.replace(old, new))
    return folder


def run_ab(capsys, *argv: str) -> dict:
    assert ab.main([*argv, "--model", "tiny", "--workload", "few", "--repeat", "1", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_build_against_a_copy_of_itself_runs_both_in_turns_and_agrees(tmp_path, capsys):
    loaders = decode_layers.decode_layers_library, packed_linear.packed_gemv_library
    report = run_ab(capsys, str(ab.KERNELS), str(copy_of_kernels(tmp_path)))
    assert [g["rows"] for g in report["groups"]] == ["1", "2-3", "4-15"]  # the few workload: 4, 3, 2, 1 rows
    for group in report["groups"]:
        assert group["steps_old"] > 0 and group["steps_new"] > 0
        assert abs(group["steps_old"] - group["steps_new"]) <= 3  # in turns: one more at most per row count
        assert group["new_over_old"] > 0 and group["old_ms"] > 0
    assert report["same_tokens"] and report["first_request_differing"] is None
    assert (decode_layers.decode_layers_library, packed_linear.packed_gemv_library) == loaders


def test_the_kv_cache_asked_in_bfloat16_is_the_pool_both_builds_read(tmp_path, capsys):
    copy = str(copy_of_kernels(tmp_path))
    assert run_ab(capsys, str(ab.KERNELS), copy)["kv_cache_dtype"] == "float32"
    report = run_ab(capsys, str(ab.KERNELS), copy, "--kv-cache-dtype", "bfloat16")
    assert report["kv_cache_dtype"] == "bfloat16" and report["dtype"] == "float32"
    assert report["same_tokens"] and all(g["steps_old"] > 0 and g["steps_new"] > 0 for g in report["groups"])
    ab.print_report(report)
    assert "float32, KV cache in bfloat16," in " ".join(capsys.readouterr().out.split())  # the title, wrapped


def test_a_build_from_before_the_benchs_own_kernel_functions_still_runs(tmp_path, capsys):
    """paged_decode.c's read_pages is the bench's probe (kv_reads.py), not the step's: a build that
    predates it is compared like any other."""
    older = copy_of_kernels(tmp_path)
    source = older / "paged_decode.c"
    text = source.read_text()
    source.write_text(text[: text.index("/* One KV head's rows of a sequence")])
    report = run_ab(capsys, str(older), str(ab.KERNELS))
    assert report["same_tokens"] and all(g["steps_old"] > 0 for g in report["groups"])


def test_a_build_that_computes_differently_shows_in_the_tokens(tmp_path, capsys):
    planted = copy_of_kernels(tmp_path, NORM, NORM.replace("eps,", "eps + 1.0f,"))
    report = run_ab(capsys, str(ab.KERNELS), str(planted))
    assert not report["same_tokens"] and report["first_request_differing"] is not None
    assert report["new"]["folder"] == str(planted)


def test_a_git_revision_is_written_out_whole(tmp_path):
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(ab.REPOSITORY), *args], capture_output=True, text=True)

    if shutil.which("git") is None or git("rev-parse", "HEAD").returncode:
        pytest.skip("no git, or not a git checkout")
    build = ab.resolve("HEAD", tmp_path)
    listed = git("ls-tree", "--name-only", "HEAD", "tracer/kernels/").stdout.split()
    assert sorted(p.name for p in build.folder.iterdir()) == sorted(Path(name).name for name in listed)
    assert (build.folder / "decode_layers.c").read_text() == git("show", "HEAD:tracer/kernels/decode_layers.c").stdout


@pytest.mark.parametrize(
    "sources, says",
    [
        ("no such revision", "neither a folder nor a git revision"),
        ("empty folder", "no decode_layers.c there nor in its tracer/kernels"),
        ("other struct", "its kernels take other arguments than this checkout's Python passes (step_t differs)"),
    ],
)
def test_a_build_that_cannot_be_compared_gets_one_line(tmp_path, capsys, sources, says):
    if sources == "no such revision":
        label = "no-such-revision-anywhere"
    elif sources == "empty folder":
        label = str(tmp_path)
    else:
        shares = "typedef struct { /* what every layer shares in this step */"
        label = str(copy_of_kernels(tmp_path, shares, shares + " int64_t extra;"))
    assert cli_main(["bench", "--ab", str(ab.KERNELS), label, "--model", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["HEAD"], "the following arguments are required: NEW"),
        (["HEAD", "HEAD", "--repeat", "0"], "--repeat must be at least 1, got 0"),
    ],
)
def test_a_bad_argument_gets_one_line(capsys, argv, says):
    with pytest.raises(SystemExit) as exited:
        cli_main(["bench", "--ab", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_the_build_named_first_loads_first_and_each_turn_answers_with_its_own(monkeypatch, tmp_path):
    loaded: list[Path] = []
    for module, name, _ in ab.LOADERS:  # loaders that only note which build asked, and in what order
        monkeypatch.setattr(module, name, lambda source, loaded=loaded: loaded.append(source.parent) or object())
    recording = decode_layers.decode_layers_library
    builds = [ab.Build("old", tmp_path / "old"), ab.Build("new", tmp_path / "new")]
    with ab.switching(builds, first=1) as switch:
        assert loaded == [tmp_path / "new"] * len(ab.LOADERS) + [tmp_path / "old"] * len(ab.LOADERS)
        for turn in (0, 1, 0):
            switch.use(turn)
            assert (
                decode_layers.decode_layers_library() is switch.libraries[turn][decode_layers, "decode_layers_library"]
            )
    assert decode_layers.decode_layers_library is recording
