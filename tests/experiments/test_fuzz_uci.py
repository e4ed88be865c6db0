"""Property-based fuzzing of the UCI split loader and the ``whvi`` argument parser: on generated
malformed folders and argument lists every outcome is a result or a one-line error, never a traceback,
a hang or a silently wrong load. Derandomized, without an example database, so runs are reproducible."""

from __future__ import annotations

import contextlib
import io
import math
import signal
import tempfile
from pathlib import Path
from unittest import mock

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyro_whvi.data import load_uci_split
from pyro_whvi.experiments.cli import _parser

from ..helpers import whvi_in_process, write_uci

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FILES = ("data.txt", "index_features.txt", "index_target.txt", "index_train_0.txt", "index_test_0.txt")
BAD_TOKENS = "inf -inf nan NaN ? NA 1,5 abc 0.5 -1 -0.5 1e3 99 0x1f --1 .".split()
GOOD_TOKENS = "0 1 2 3 5 +1 1.0 4.000000000000000000e+00 -2.5 7e-1".split()


@contextlib.contextmanager
def time_limit(seconds: float):
    """Fail an example that runs longer than ``seconds`` (a hang) instead of waiting for it."""

    def hang(signum, frame):
        raise AssertionError(f"no outcome within {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _text(content: str | bytes | None) -> str:
    return content.decode("utf-8", "replace") if isinstance(content, bytes) else content or ""


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _clean(files: dict[str, str | bytes | None]) -> bool:
    """The oracle: whether a folder is a valid split, written as plainly as possible."""
    if any(files[name] is None for name in FILES):
        return False
    text = {name: _text(files[name]).split("\n") for name in FILES}  # lines without their # comments
    tokens = {name: [line.split("#")[0].split() for line in lines] for name, lines in text.items()}
    data = [row for row in tokens["data.txt"] if row]
    values = [[_number(t) for t in row] for row in data]
    if len(data) < 2 or len({len(row) for row in data}) != 1 or any(v is None for row in values for v in row):
        return False

    def indices(name: str, bound: int) -> list[int] | None:
        numbers = [_number(t) for row in tokens[name] for t in row]
        if not numbers or any(v is None or not v.is_integer() or not 0 <= v < bound for v in numbers):
            return None
        return [int(v) for v in numbers if v is not None]

    features, target = indices("index_features.txt", len(data[0])), indices("index_target.txt", len(data[0]))
    train, test = indices("index_train_0.txt", len(data)), indices("index_test_0.txt", len(data))
    if features is None or target is None or train is None or test is None or len(target) != 1:
        return False
    return target[0] not in features and len(train) >= 2 and not set(train) & set(test)


EDITS = ["replace", "replace", "replace", "drop", "add", "drop line", "repeat line", "empty", "swap", "bytes", "delete"]


@st.composite
def folders(draw) -> dict[str, str | bytes | None]:
    """A valid small split, then a few edits: a token replaced, dropped or added, a line dropped or
    repeated, a file emptied, deleted, or swapped for another's content or for random bytes."""
    rows, columns = draw(st.integers(3, 8)), draw(st.integers(2, 4))
    cell = st.sampled_from(GOOD_TOKENS)
    data = [" ".join(draw(st.lists(cell, min_size=columns, max_size=columns))) for _ in range(rows)]
    target = draw(st.integers(0, columns - 1))
    order = draw(st.permutations(range(rows)))
    cut = draw(st.integers(2, rows - 1))
    lines = {
        "data.txt": data,
        "index_features.txt": [str(c) for c in range(columns) if c != target],
        "index_target.txt": [str(target)],
        "index_train_0.txt": [str(i) for i in order[:cut]],
        "index_test_0.txt": [str(i) for i in order[cut:]],
    }
    files: dict[str, str | bytes | None] = {}
    edits = draw(st.lists(st.tuples(st.sampled_from(FILES), st.sampled_from(EDITS), st.integers(0, 30)), max_size=3))
    for name, edit, where in edits:
        text = lines[name]
        if edit in ("replace", "drop", "add") and text:
            line = where % len(text)
            tokens = text[line].split()
            at = where % (len(tokens) + 1)
            new = [draw(st.sampled_from(BAD_TOKENS + GOOD_TOKENS))] if edit != "drop" else []
            tokens[at : at + (edit != "add")] = new
            text[line] = " ".join(tokens)
        elif edit == "drop line" and text:
            del text[where % len(text)]
        elif edit == "repeat line" and text:
            text.append(text[where % len(text)])
        elif edit == "empty":
            text.clear()
        elif edit == "swap":
            lines[name] = list(lines[FILES[where % len(FILES)]])
        elif edit == "bytes":
            files[name] = draw(st.binary(max_size=20))
        elif edit == "delete":
            files[name] = None
    for name in FILES:
        files.setdefault(name, "".join(line + "\n" for line in lines[name]))
    return files


def _write(folder: Path, files: dict[str, str | bytes | None]) -> None:
    folder.mkdir()
    for name, content in files.items():
        if content is not None:
            (folder / name).write_bytes(content.encode() if isinstance(content, str) else content)


def _one_line_error(error: BaseException, folder: Path) -> None:
    message = str(error)
    assert len(message.splitlines()) == 1 and str(folder) in message, message


@FUZZ
@given(files=folders())
def test_fuzzed_folders_load_exactly_when_valid(files):
    with tempfile.TemporaryDirectory() as root, time_limit(10):
        folder = Path(root) / "set"
        _write(folder, files)
        try:
            split = load_uci_split(folder, 0)
        except (ValueError, FileNotFoundError) as error:
            _one_line_error(error, folder)
            assert not _clean(files), f"a valid folder was refused: {error}"
        else:
            assert _clean(files), "a malformed folder loaded"
            tensors = (split.x_train, split.y_train, split.x_test, split.y_test)
            assert all(torch.isfinite(t).all() for t in tensors) and split.x_train.shape[1] == split.x_test.shape[1]


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="/\\"), max_size=12)
JUNK = "0123456789 \t\n.,-+eE?#naif;x\x00"


@FUZZ
@given(contents=st.lists(st.one_of(st.text(JUNK, max_size=60), st.binary(max_size=30)), min_size=5, max_size=5))
def test_random_text_folders_load_or_fail_in_one_line(contents):
    with tempfile.TemporaryDirectory() as root, time_limit(10):
        folder = Path(root) / "set"
        _write(folder, dict(zip(FILES, contents)))
        try:
            load_uci_split(folder, 0)
        except (ValueError, FileNotFoundError) as error:
            _one_line_error(error, folder)


UCI_OPTIONS = [
    "--data-dir",
    "--dataset",
    "--methods",
    "--splits",
    "--steps",
    "--fixed-noise-steps",
    "--batch-size",
    "--lr",
    "--hidden",
    "--layers",
    "--protocol",
    "--likelihood",
    "--samples",
    "--dropout",
    "--flows",
    "--reflections",
    "--seed",
    "--threads",
    "--out",
    "--help",
]
VALUES = [
    *["0", "1", "-1", "2", "0-2", "3-1", "0,2", "1e-3", "0.5", "inf", "nan", "-inf", "1e400", "4294967296"],
    *["99999999999999999999", "0-99999999999", "", " ", "mfg", "whvi,mcd", "mcd+iblm", "vsd+iblm", "bbb", "x"],
    *["diabetes", "digits", "breast_cancer", "good", "missing", "file", "file/out", "."],
    *["auto", "auto,wide", "table3,wide", "wide", "table9", "gaussian", "heteroscedastic", "whvi+iblm"],
]


def _run_main(argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` in-process with training stubbed out: its exit status and its stderr."""
    with mock.patch("pyro_whvi.experiments.uci.run_uci", return_value=([], "")):
        code, _, stderr = whvi_in_process(*argv)
    return code, stderr


def test_fuzzed_uci_arguments_get_a_result_or_one_line(tmp_path, monkeypatch):
    write_uci(tmp_path / "good", rows=20, splits=2)
    (tmp_path / "file").write_text("")
    monkeypatch.chdir(tmp_path)  # relative --out and --data-dir values land here
    threads = torch.get_num_threads()
    value = st.one_of(st.sampled_from(VALUES), TEXT)
    pairs = st.lists(st.tuples(st.sampled_from(UCI_OPTIONS), value).map(list), max_size=6)
    stray = st.lists(st.one_of(st.sampled_from(UCI_OPTIONS), value), max_size=2)  # a missing value, an extra one

    @FUZZ
    @given(argv=st.tuples(pairs, stray).map(lambda parts: [a for pair in parts[0] for a in pair] + parts[1]))
    def check(argv):
        with time_limit(10):
            code, stderr = _run_main(["uci", *argv])
        torch.set_num_threads(threads)
        assert code in (0, 2), (argv, code, stderr)
        assert code == 0 or len(stderr.splitlines()) == 1, (argv, stderr)

    check()


@FUZZ
@given(argv=st.lists(st.one_of(st.sampled_from(["demo", "gp", "bench", "uci", "--quick", "-h", *VALUES]), TEXT)))
def test_fuzzed_commands_parse_or_fail_in_one_line(argv):
    stderr = io.StringIO()
    with time_limit(10), contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            _parser().parse_args(argv)
        except SystemExit as exit:
            assert exit.code in (0, 2) and (exit.code == 0 or len(stderr.getvalue().splitlines()) == 1), stderr


EXTREMES = ["0", "-1", "-0", "0.0", "1e300", "-1e300", "1e-300", "nan", "inf", "-inf", "1e21", "1e400"]
EXTREMES += ["99999999999999999999999999", "4294967296", "-4294967297", "2.5", "1e3", ""]
FEW = settings(FUZZ, max_examples=40)  # each example runs a command's checks (stubbed where it would train)


def _fuzz_command(
    command: str, options: list[str], extra: list[str], stubs: dict, tmp_path, monkeypatch, first: tuple = ()
) -> None:
    """Fuzz ``whvi command`` with ``options`` given extreme numbers (the work itself stubbed by ``stubs``): every
    outcome is success or one line with exit status 2."""
    write_uci(tmp_path / "good", rows=20, splits=2)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    value = st.one_of(st.sampled_from(EXTREMES + extra), st.integers(-(2**70), 2**70).map(str))
    pairs = st.lists(st.tuples(st.sampled_from(options), value).map(list), max_size=4)

    @FEW
    @given(argv=pairs.map(lambda parts: [a for pair in parts for a in pair]))
    def check(argv):
        with time_limit(10), contextlib.ExitStack() as stack:
            for target, replacement in stubs.items():
                stack.enter_context(mock.patch(target, replacement))
            code, _, stderr = whvi_in_process(command, *first, *argv)
        torch.set_num_threads(threads)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert code in (0, 2) and "Traceback" not in stderr, (argv, code, stderr)
        assert code == 0 or len(lines) == 1, (argv, lines)

    check()


def test_fuzzed_synthetic_arguments_get_a_result_or_one_line(tmp_path, monkeypatch):
    options = ["--rows", "--noise", "--splits", "--seed", "--functions", "--out", "--noise-profile"]
    extra = ["10", "5", "robot", "borehole,robot,robot", "hartmann4,wingweight", "bogus", "out", "good/data.txt"]
    extra += ["constant", "ramp"]
    stubs = {"pyro_whvi.experiments.noisy_sets.write_noisy_set": lambda *args, **kwargs: 1.0}
    _fuzz_command("synthetic", options, extra, stubs, tmp_path, monkeypatch)


def test_fuzzed_uci_numbers_get_a_result_or_one_line(tmp_path, monkeypatch):
    options = ["--steps", "--fixed-noise-steps", "--batch-size", "--lr", "--hidden", "--layers", "--samples"]
    options += ["--noise-scale", "--kl-weight", "--val-fraction", "--cooldown", "--dropout", "--flows"]
    options += ["--reflections", "--seed", "--timeout", "--checkpoint-every", "--nproc"]
    stubs = {"pyro_whvi.experiments.uci.run_uci": lambda *args, **kwargs: ([], "")}
    _fuzz_command("uci", ["--data-dir", *options], ["good", "1,0.1", "0.5"], stubs, tmp_path, monkeypatch)


def test_fuzzed_demo_and_gp_numbers_get_a_result_or_one_line(tmp_path, monkeypatch):
    demo = ["--toy-steps", "--digits-steps", "--samples", "--seed", "--jobs"]
    _fuzz_command("demo", demo, [], {"pyro_whvi.experiments.cli.run_demo": lambda *a: {}}, tmp_path, monkeypatch)
    gp = ["--num-points", "--steps", "--fixed-noise-steps", "--lr-scale", "--batch-size", "--seed", "--blocks"]
    stubs = {"pyro_whvi.experiments.gp.run": lambda args: [], "pyro_whvi.experiments.gp.save": lambda *a: ""}
    methods = ("--methods", "rf,rf-whvi,svgp-gpytorch")  # not svgp-gpflow: importing TensorFlow takes long
    _fuzz_command("gp", gp, ["8", "4,8,8", "16"], stubs, tmp_path, monkeypatch, methods)
