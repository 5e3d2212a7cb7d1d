"""The source arguments of `attach`, `live`, `targets` and `dashboard` (RUN_DIR or TARGET ..., --run,
--prometheus, --replay, --speed) are declared once (zeromon.commands.source_flags): the four accept the
same words as the same run and refuse the same mistakes with the same sentence, through the real CLI
(``main(argv)``, in this process). A source a command cannot use is refused in one sentence naming
what it takes; property-based over any words as positional arguments."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeromon.cli import build_parser, main
from zeromon.commands.source_flags import NEWEST, PROMETHEUS, REPLAY, RUN, TARGETS, Sources, read_sources
from zeromon.errors import ZeromonError

COMMANDS = ("attach", "live", "targets", "dashboard")
# What each command reads (targets lists a run's agents: it takes a run folder or the newest run)
TAKES = {"attach": {RUN, TARGETS, PROMETHEUS, REPLAY, NEWEST}, "live": {RUN, TARGETS, PROMETHEUS, REPLAY, NEWEST},
         "targets": {RUN, NEWEST}, "dashboard": {RUN, TARGETS, PROMETHEUS, REPLAY, NEWEST}}
# Which kinds each reads from several folders of one run: the dashboard reads a recording (RUN_DIR ...);
# attach, live and targets follow one folder's live agents.
SEVERAL = {"attach": {REPLAY}, "live": {REPLAY}, "targets": {REPLAY}, "dashboard": {RUN, REPLAY}}
_PARSER = build_parser()[0]


@pytest.fixture
def run_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with two run folders (a, b) and a file in a."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "rank-0.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _read(command: str, words: list[str]) -> Sources | str:
    """What the shared reader makes of ``words`` after ``zeromon COMMAND``: Sources, or the error line."""
    args, unknown = _PARSER.parse_known_args([command, *words])
    assert not unknown
    try:
        return read_sources(args, command, takes=TAKES[command], several=SEVERAL[command])
    except ZeromonError as exc:
        return exc.message.replace(f"zeromon {command}: ", "zeromon COMMAND: ")


MISTAKES = [
    (["nohost"], "'nohost': neither a run folder (none has that name) nor a host:port target"),
    (["host:x"], "TARGET 'host:x': the port 'x' is not a number from 1 to 65535"),
    (["[::1:9470"], "TARGET '[::1:9470': the port '(none)' is not a number from 1 to 65535"),
    (["./missing"], "RUN_DIR ./missing: no such run folder"),
    (["a/rank-0.jsonl"], "RUN_DIR a/rank-0.jsonl: a file, not a run folder; give the folder it is in"),
    (["a", "127.0.0.1:9470"], "RUN_DIR a: give one run folder or host:port targets, not both"),
    (["a", "--run", "b"], "zeromon COMMAND: give one source; RUN_DIR and --run were given"),
    (["127.0.0.1:9470", "--run", "a"], "zeromon COMMAND: give one source; TARGET and --run were given"),
    (["--run", "a", "--prometheus", "http://p:9090"], "zeromon COMMAND: give one source; --run and --prometheus"),
    (["--replay", "a", "--prometheus", "http://p:9090"], "give one source; --prometheus and --replay were given"),
    (["--run", "missing"], "--run missing: no such run folder"),
    (["--run", "a/rank-0.jsonl"], "--run a/rank-0.jsonl: a file, not a run folder"),
    (["--replay", "missing"], "--replay missing: no such run folder"),
    (["--replay", "a/rank-0.jsonl"], "--replay a/rank-0.jsonl: a file, not a run folder"),
    (["--speed", "2"], "zeromon COMMAND: --speed applies to --replay only"),
    (["--replay", "a", "--speed", "nan"], "--speed 'nan': is not finite: must be a speed factor from 0.001"),
    (["--prometheus", "http://[::1"], "--prometheus http://[::1: not a URL"),
    (["--prometheus", "ftp://p"], "--prometheus ftp://p: not an http(s) URL"),
]


@pytest.mark.parametrize(("words", "says"), MISTAKES, ids=[" ".join(w) for w, _ in MISTAKES])
def test_the_four_commands_refuse_the_same_mistake_with_the_same_sentence(run_dirs: Path, words: list[str],
                                                                          says: str,
                                                                          capsys: pytest.CaptureFixture[str]
                                                                          ) -> None:
    lines = set()
    for command in COMMANDS:
        assert main([command, *words]) == 2, command
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.splitlines()) <= 2, err
        lines.add(err.splitlines()[0].replace(f"zeromon {command}: ", "zeromon COMMAND: "))
    assert len(lines) == 1, lines  # the same sentence from all four
    assert says in lines.pop()


ACCEPTED = [
    (["a"], Sources(RUN, run_dirs=("a",))),
    (["--run", "a"], Sources(RUN, run_dirs=("a",))),  # the same run as RUN_DIR, in every command
    (["a/"], Sources(RUN, run_dirs=("a/",))),
    (["127.0.0.1:9470", "[::1]:9471"], Sources(TARGETS, targets=("127.0.0.1:9470", "[::1]:9471"))),
    (["--prometheus", "http://p:9090"], Sources(PROMETHEUS, prometheus="http://p:9090")),
    (["--replay", "a", "--speed", "4"], Sources(REPLAY, replay=("a",), speed=4.0)),
    (["--replay", "a", "b"], Sources(REPLAY, replay=("a", "b"))),  # one run, one folder per node
    (["--replay", "*"], Sources(REPLAY, replay=("a", "b"))),  # a glob the shell left alone
    ([], Sources(NEWEST)),
]


@pytest.mark.parametrize(("words", "sources"), ACCEPTED, ids=[" ".join(w) or "nothing" for w, _ in ACCEPTED])
def test_the_four_commands_read_the_same_words_as_the_same_source_or_say_they_do_not_take_it(
        run_dirs: Path, words: list[str], sources: Sources) -> None:
    for command in COMMANDS:
        got = _read(command, words)
        if sources.kind in TAKES[command]:
            assert got == sources, command
        else:
            assert got == (f"zeromon COMMAND: {_words(sources.kind)} is not a source it reads; it takes a RUN_DIR "
                           "or nothing (the newest local run)"), command


def _words(kind: str) -> str:
    return {TARGETS: "host:port TARGETs", PROMETHEUS: "--prometheus URL", REPLAY: "--replay RUN_DIR"}[kind]


def test_attach_takes_a_run_folder_as_live_does(run_dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 12: `zeromon live runs/demo` took a run folder where `zeromon attach runs/demo` refused it.
    Both now watch that run's agents (attach then stops at the terminal check, live at the registry)."""
    assert main(["attach", "a"]) == 2
    assert "draws in a terminal" in capsys.readouterr().err
    assert main(["live", "--once", "a"]) == 2
    assert f"RUN_DIR a: no agent endpoints registered in {os.path.join('a', 'endpoints')}" in capsys.readouterr().err


def test_several_run_folders_are_one_recording_for_the_dashboard_and_refused_by_those_that_follow_agents(
        run_dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run recorded in several folders (one per node): the dashboard reads it, from the folders or a
    quoted glob; attach, live and targets follow one folder's live agents and say what reads several."""
    for words in (["a", "b"], ["*"], ["./*"]):
        assert _read("dashboard", words) == Sources(RUN, run_dirs=tuple(
            os.path.join(os.path.dirname(words[0]), n) if len(words) == 1 else n for n in ("a", "b"))), words
        for command in ("attach", "live", "targets"):
            got = _read(command, words)
            assert isinstance(got, str) and got.startswith("RUN_DIR: give one run folder, not 2"), (command, got)
    assert main(["attach", "a", "b"]) == 2
    err = capsys.readouterr().err
    assert "RUN_DIR: give one run folder, not 2 (a b)" in err and "--replay RUN_DIR ..." in err
    assert _read("dashboard", ["nomatch*"]) == "RUN_DIR nomatch*: it matches nothing"
    assert _read("dashboard", ["a/*.jsonl"]) == "RUN_DIR a/*.jsonl: it matches 1 file, no folder"
    assert _read("attach", ["--replay", "nomatch*"]) == "--replay nomatch*: it matches nothing"


def test_help_declares_the_same_source_arguments_in_all_four() -> None:
    def sources_of(command: str) -> list[tuple[tuple[str, ...], str | None]]:
        sub = next(a for a in _PARSER._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[command]
        return [(tuple(a.option_strings), a.help) for a in parser._actions
                if a.dest in ("where", "run", "prometheus", "replay", "speed")]

    first = sources_of("attach")
    assert len(first) == 5 and all(sources_of(c) == first for c in COMMANDS)


_word = st.one_of(st.sampled_from(["a", "b", "a/", "./a", "a/rank-0.jsonl", "missing", "127.0.0.1:9470", "h:0",
                                   "[::1]:1", "http://h:80", "~", ".", "..", ":", "::", "[", "-", "h:99999"]),
                  st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
                          max_size=12))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(_word, max_size=3))
def test_any_positional_words_give_the_same_answer_in_all_four(run_dirs: Path, words: list[str]) -> None:
    words = [w for w in words if not w.startswith("-")]  # options are the parser's, tested above
    answers = set()
    for command in COMMANDS:
        got = _read(command, words)
        if isinstance(got, Sources) and len(got.run_dirs) > 1:  # the dashboard's: the test below
            continue
        if isinstance(got, str) and got.startswith("RUN_DIR: give one run folder, not"):
            continue
        if isinstance(got, str):
            assert "\n" not in got and len(got) < 400
            if "is not a source it reads" in got:  # targets: TARGETs (the test above checks the sentence)
                continue
        assert not isinstance(got, Sources) or got.kind in TAKES[command]
        answers.add(got)
    assert len(answers) <= 1, answers


def test_the_dashboard_reads_a_run_folder_as_a_recording_or_before_it_has_one_as_its_agents(
        run_dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """RUN_DIR is the run in that folder for the dashboard too (it was `--run` for live agents, RUN_DIR for a
    recording): its recording when it has one, its registered agents while its ranks have written none."""
    import socket

    from zeromon.commands.dashboard import build_feed
    from zeromon.model.registry import EndpointEntry, run_entry_path, write_entry
    from zeromon.views.run_data import LiveFeed

    empty = run_dirs / "b"
    # A folder with nothing in it (or nothing but what zeromon writes): a run whose ranks have not started, followed
    # live; one that holds other files is no run folder.
    feed, what = build_feed(_PARSER.parse_args(["dashboard", "b"]))
    assert isinstance(feed, LiveFeed) and what == "run b", what
    assert "waiting for the ranks of b to start" in capsys.readouterr().err
    (run_dirs / "src").mkdir()
    (run_dirs / "src" / "train.py").write_text("")
    assert main(["dashboard", "src"]) == 2
    assert ("RUN_DIR src: not a run folder: no rank-<r>.zmr (or .jsonl) recordings, no agent endpoints, and files "
            "zeromon does not write") in capsys.readouterr().err
    write_entry(run_entry_path(empty, 0), EndpointEntry(
        run_dir=str(empty.resolve()), run_id="b", job="t", host=socket.gethostname(), address="127.0.0.1", port=1,
        url="http://127.0.0.1:1", rank=0, local_rank=0, world_size=1, pid=os.getpid(), start_ns=1,
        token_required=False))
    for words in (["b"], ["--run", "b"]):
        feed, what = build_feed(_PARSER.parse_args(["dashboard", *words]))
        assert isinstance(feed, LiveFeed) and what == "run b", what
    assert main(["dashboard", "b", "--capacity", "80GiB"]) == 2
    assert "--capacity applies to a recording, and b holds none yet" in capsys.readouterr().err
    # Its rank has opened its recording, which holds no record yet (the agent writes at its first pass):
    # still its agents, live; once it holds one, the recording.
    from zeromon.model.events import Notice
    from zeromon.model.segments import CompactWriter
    from zeromon.views.run_data import RecordingFeed

    writer = CompactWriter(empty / "rank-0.zmr", 0, job="t", world_size=1)
    feed, what = build_feed(_PARSER.parse_args(["dashboard", "b"]))
    assert isinstance(feed, LiveFeed) and what == "run b", what
    writer.write(Notice(rank=0, t_ns=1, level="info", source="test", message="first"))
    writer.flush()
    feed, what = build_feed(_PARSER.parse_args(["dashboard", "b"]))
    assert isinstance(feed, RecordingFeed) and what == "recording b", what
    writer.close()
