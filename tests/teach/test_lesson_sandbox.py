"""Lesson checks run in a child process: an exercise that leaves a thread running, ends the
process, or allocates without bound gets a verdict that names what happened, and never hangs
or passes `lesson check`. Also: a lessons folder that is a file gets one line."""

from __future__ import annotations

from tracer.cli.main import main


def test_lessons_dir_that_is_a_file_gets_one_line_that_says_what_to_do(tmp_path, monkeypatch, capsys):
    taken = tmp_path / "notes"
    taken.write_text("not a folder\n")
    monkeypatch.setenv("NANOENGINE_LESSONS_DIR", str(taken))
    assert main(["lesson", "start"]) == 2
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert "is a file, not a folder" in said and "NANOENGINE_LESSONS_DIR" in said, said
    assert "Errno" not in said and "Traceback" not in said
    assert taken.read_text() == "not a folder\n"
    monkeypatch.setenv("NANOENGINE_LESSONS_DIR", str(taken / "inside"))
    assert main(["lesson", "start"]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert "cannot make the lessons folder" in said and "Errno" not in said, said
