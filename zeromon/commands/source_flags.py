"""Where a run is read from: the source arguments of `attach`, `live`, `targets` and `dashboard`, declared
and checked here once, so that the same words mean the same run and fail with the same sentence in all
four (``RUN_DIR`` or ``TARGET ...``, ``--run``, ``--prometheus``, ``--replay``, ``--speed``).

- ``RUN_DIR`` (or ``--run RUN_DIR``, the same thing): the run in that folder, the ``--out`` of `zeromon
  run`; `attach`, `live` and `targets` follow its registered agents, `dashboard` reads its recording
  (again while the run writes it). `dashboard` also takes several folders of one run (``RUN_DIR ...``,
  or a quoted glob such as ``'runs/job/node*'``): each node's ``--out`` on a disk of its own;
- ``TARGET ...``: ``host:port`` of agents, one per rank;
- ``--prometheus URL``: every rank through a Prometheus server's HTTP API;
- ``--replay RUN_DIR ... [--speed X]``: a recording played back, from one folder or several of one run;
- none of them: the newest local run in the user-level index (ZEROMON_REGISTRY).

``add_source_arguments(parser)`` declares them; ``read_sources(args, command, takes, several)`` checks
them in one order and gives a ``Sources``, or ZeromonError; a source a command cannot use is refused in
one sentence naming what it takes. ``run_folder_words(words, name)`` is the one reading of run folders
and globs, which `report` and `summary` use too. Not a subcommand (it is not in COMMAND_MODULES).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from collections.abc import Collection, Iterable, Sequence

from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.model.numbers import REPLAY_SPEED, flag

# The kinds of source, as Sources.kind names them.
TARGETS, RUN, PROMETHEUS, REPLAY, NEWEST = "TARGET", "RUN_DIR", "--prometheus", "--replay", "newest"
ALL_KINDS = frozenset({TARGETS, RUN, PROMETHEUS, REPLAY, NEWEST})

RUN_DIR_HINT = "a run folder is the --out of `zeromon run` (it holds rank-<r>.zmr or .jsonl files and endpoints/)"
_WHERE_HINT = f"{RUN_DIR_HINT}; a target is host:port, e.g. 127.0.0.1:9470"
# What each kind is, in the words of a refusal ("it takes a RUN_DIR, host:port TARGETs or ...").
_KIND_WORDS = {TARGETS: "host:port TARGETs", RUN: "a RUN_DIR", PROMETHEUS: "--prometheus URL",
               REPLAY: "--replay RUN_DIR", NEWEST: "nothing (the newest local run)"}



@frozen
class Sources:
    """The one source the arguments name: ``kind`` and its value (the others empty)."""

    kind: str
    targets: tuple[str, ...] = ()
    run_dirs: tuple[str, ...] = ()  # RUN: the run's folder, or its folders (one per node)
    prometheus: str | None = None
    replay: tuple[str, ...] = ()  # REPLAY: likewise
    speed: float = 1.0  # --replay's

    @property
    def run_dir(self) -> str | None:
        """The run folder of a RUN source read from one folder (what following live agents takes)."""
        return self.run_dirs[0] if len(self.run_dirs) == 1 else None


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("where", nargs="*", metavar="RUN_DIR | TARGET",
                        help="a run folder (the --out of `zeromon run`), or host:port of agents (one per rank); "
                             "default: the newest local run (the user-level index, ZEROMON_REGISTRY); a "
                             "recording may be several folders of one run, one per node, or a quoted glob "
                             "('runs/job/node*')")
    parser.add_argument("--run", metavar="RUN_DIR", help="the run in this folder (the same as giving RUN_DIR)")
    parser.add_argument("--prometheus", metavar="URL", help="read every rank through a Prometheus server's HTTP API")
    parser.add_argument("--replay", metavar="RUN_DIR", nargs="+",
                        help="play a recorded run back (its rank files), from its folder or from several "
                             "folders of one run (one per node; a quoted glob too)")
    parser.add_argument("--speed", metavar="X", type=flag("--speed", REPLAY_SPEED),
                        help=f"replay speed, 1 = real time (default 1; {REPLAY_SPEED.accepts})")


def token_flag(text: str) -> str:
    """``--token``'s ``type=``: a secret an HTTP header can carry (zeromon.sources.http.check_token)."""
    from zeromon.sources.http import check_token

    return check_token(text, "--token")


def read_sources(args: argparse.Namespace, command: str, takes: Collection[str] = ALL_KINDS,
                 others: dict[str, object] | None = None, several: Collection[str] = (REPLAY,)) -> Sources:
    """The source the arguments name, checked in one order for every command; ZeromonError naming the
    argument. ``others``: a command's own further sources (the dashboard's ``--trace``), counted in the
    "give one source" check; when one of them is given the result is NEWEST and the command reads it.
    ``several``: the kinds (RUN, REPLAY) the command reads from several folders of one run; a RUN_DIR
    that follows live agents is one folder."""
    prog = f"zeromon {command}"
    positional_folders, targets = _split_where(args.where, several_folders=RUN in several)
    given = [name for name, value in ((TARGETS if targets else RUN, args.where), ("--run", args.run),
                                      ("--prometheus", args.prometheus), ("--replay", args.replay),
                                      *(others or {}).items()) if value]
    if len(given) > 1:
        raise ZeromonError(f"{prog}: give one source; {' and '.join(given)} were given",
                           hint=f"one of: {', '.join(_KIND_WORDS[k] for k in _ordered(takes))}")
    if args.speed is not None and args.replay is None:
        raise ZeromonError(f"{prog}: --speed applies to --replay only", hint="--replay RUN_DIR --speed X")
    if args.run is not None:
        positional_folders = [_run_folder(args.run, "--run")]
    if args.replay is not None:
        sources = Sources(REPLAY, replay=_replay_folders(args.replay, several=REPLAY in several),
                          speed=1.0 if args.speed is None else args.speed)
    elif args.prometheus is not None:
        _check_url(args.prometheus)
        sources = Sources(PROMETHEUS, prometheus=args.prometheus)
    elif positional_folders:
        sources = Sources(RUN, run_dirs=tuple(positional_folders))
    elif targets:
        sources = Sources(TARGETS, targets=tuple(targets))
    else:
        sources = Sources(NEWEST)
    if sources.kind not in takes:
        raise ZeromonError(f"{prog}: {_KIND_WORDS[sources.kind]} is not a source it reads; it takes "
                           f"{_or(_KIND_WORDS[k] for k in _ordered(takes))}", hint=f"see `{prog} --help`")
    return sources


def run_folder_words(words: Iterable[str], name: str) -> tuple[str, ...]:
    """The run folders the words name, in order: a glob the shell left alone (quoted: 'runs/job/node*')
    expanded here, sorted (ZeromonError naming ``name``, the argument, when it matches no folder);
    any other word as it is, for the reader to check."""
    folders: list[str] = []
    for word in words:
        folders.extend(_glob_folders(word, name) if _is_glob(word) else [word])
    return tuple(folders)


def say_missing_ranks(run: Sequence[str]) -> None:
    """Check that the run's folders hold one run's rank files (ZeromonError naming two files that are
    not) and warn, on stderr, of ranks that the headers' world size counts and no folder holds, with
    the ranks each folder does hold: a node's folder left out is the likely reason. Reads the first
    line of each rank file."""
    from zeromon.model.codec import missing_ranks_note, run_headers

    note = missing_ranks_note(run_headers(run))
    if note is not None:
        print(f"zeromon: warning: {note}", file=sys.stderr, flush=True)


def _is_glob(word: str) -> bool:
    """A pattern for folders: '*' or '?', or a '[...]' set in a path with a '/' (a TARGET such as
    '[::1]:9470' has brackets and no '/'); a word that names a file or folder as it is is no pattern."""
    if os.path.exists(word) or not word.isprintable():
        return False
    return "*" in word or "?" in word or ("/" in word and re.search(r"\[[^\]/]+\]", word) is not None)


def _glob_folders(pattern: str, name: str) -> list[str]:
    matched = sorted(glob.glob(os.path.expanduser(pattern)))
    folders = [path for path in matched if os.path.isdir(path)]
    if not folders:
        what = f"it matches {len(matched)} file{'s' if len(matched) != 1 else ''}, no folder" if matched \
            else "it matches nothing"
        raise ZeromonError(f"{name} {pattern}: {what}", hint=RUN_DIR_HINT)
    return folders


def _split_where(where: list[str], several_folders: bool = False) -> tuple[list[str], list[str]]:
    """Run folders, or host:port targets, from the positional arguments (a folder that exists is a
    run folder, and so is each folder a glob matches; anything with a '/' that does not exist is a
    missing one, since no host:port has one). Several folders where ``several_folders``, else one."""
    from zeromon.sources.discovery import parse_target

    folders, targets = [], []
    for w in where:
        if os.path.isdir(w):
            folders.append(w)
        elif _is_glob(w):
            folders.extend(_glob_folders(w, "RUN_DIR"))
        elif os.path.exists(w):
            raise ZeromonError(f"RUN_DIR {w}: a file, not a run folder; give the folder it is in "
                               f"({os.path.dirname(os.path.abspath(w))})")
        elif "://" not in w and ("/" in w.rstrip("/") or w.startswith((".", "~"))):
            raise ZeromonError(f"RUN_DIR {w}: no such run folder", hint=_WHERE_HINT)
        elif ":" not in w:
            raise ZeromonError(f"{w!r}: neither a run folder (none has that name) nor a host:port target",
                               hint=_WHERE_HINT)
        else:
            targets.append(w)
    if len(folders) > 1 and not several_folders:
        raise ZeromonError(f"RUN_DIR: give one run folder, not {len(folders)} ({' '.join(folders)})",
                           hint="one command per run; a run recorded in several folders (one per node) is read "
                                "by --replay RUN_DIR ..., `zeromon dashboard`, `zeromon report` and `zeromon summary`")
    if folders and targets:
        raise ZeromonError(f"RUN_DIR {folders[0]}: give one run folder or host:port targets, not both",
                           hint=_WHERE_HINT)
    for target in targets:
        parse_target(target, what="TARGET")
    return folders, targets


def _run_folder(path: str, name: str) -> str:
    if os.path.isfile(path):
        raise ZeromonError(f"{name} {path}: a file, not a run folder; give the folder it is in "
                           f"({os.path.dirname(os.path.abspath(path))})")
    if not os.path.isdir(path):
        raise ZeromonError(f"{name} {path}: no such run folder", hint=RUN_DIR_HINT)
    return path


def _replay_folders(paths: list[str], several: bool) -> tuple[str, ...]:
    for path in paths:
        if os.path.isfile(path):  # a recording is a folder of rank files, played together
            raise ZeromonError(f"--replay {path}: a file, not a run folder; a replay plays a run folder (its "
                               "rank files together)",
                               hint=f"give the folder that holds it: --replay {os.path.dirname(os.path.abspath(path))}")
    folders = tuple(_run_folder(folder, "--replay") for folder in run_folder_words(paths, "--replay"))
    if len(folders) > 1 and not several:
        raise ZeromonError(f"--replay: give one run folder, not {len(folders)} ({' '.join(folders)})")
    return folders


def _check_url(url: str) -> None:
    """The URL's form only (scheme, host, port): whether Prometheus answers is the command's to find out."""
    from zeromon.sources.promql import PromQL

    PromQL(url).close()


def _ordered(kinds: Collection[str]) -> list[str]:
    return [k for k in (RUN, TARGETS, PROMETHEUS, REPLAY, NEWEST) if k in kinds]


def _or(words: Iterable[str]) -> str:
    items = list(words)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"
