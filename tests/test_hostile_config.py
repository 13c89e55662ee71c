"""Hostile and huge configs (issue 13, cases 2 and 5): refused fast, in one line, quoting nothing
they should not, before any run directory exists; and config loading under fuzzing."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from helpers import REPO, aiperf_cmd, cli_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiperf.cli import main
from aiperf.config import MAX_CONFIG_BYTES, Config, load_config
from aiperf.errors import AiperfError

SECRET = "s3cr3t-Hunter2-do-not-print"
LAUGHS = "\n".join(
    [f'a: &a ["{SECRET}", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]" for p, k in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["run: {name: *i}"]
)


def _run_cli(args: list[str], results: Path, timeout: float = 60, separate: bool = False) -> Any:
    """``aiperf run`` through the CLI's entry point (in this process: no 1 s interpreter start each).

    ``separate`` runs it as a user types it, in its own process, where a hang is caught by the
    timeout (a hang guard, not a speed assertion).
    """
    argv = ["run", *args, "--set", f"run.results_dir={results}"]
    if separate:
        return subprocess.run(
            aiperf_cmd(*argv), capture_output=True, text=True, env=cli_env(), timeout=timeout, cwd=REPO
        )
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def _refused(proc: Any, results: Path, fragment: str) -> str:
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-1000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    assert fragment in lines[0], lines[0]
    assert len(lines[0]) < 400, "an error message quotes at most a short excerpt"
    assert SECRET not in proc.stderr + proc.stdout
    assert not results.exists() or not any(results.iterdir()), "a refused run must not create a run directory"
    return lines[0]


def _files(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (path, expected fragment of the error)."""
    out = {}

    def put(name: str, data: bytes | str, fragment: str) -> None:
        path = tmp_path / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        out[name] = (str(path), fragment)

    put("laughs.yaml", LAUGHS, "anchors and aliases")
    put("one_alias.yaml", f"run: &r {{name: {SECRET}}}\nmodel: *r\n", "anchors and aliases")
    put("secrets.yaml", f"{SECRET}: hunter2\npassword: {SECRET}\n", "not an aiperf config")
    put("shadow_like", f"root:$6$salt${SECRET}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n", "")
    put("binary.bin", bytes(range(256)) * 64, "not a text (UTF-8) file")
    put("huge.yaml", "run:\n  name: x\n" + "#" * (MAX_CONFIG_BYTES + 10) + "\n", "too large for a config")
    put("deep.yaml", "run: {name: " + "[" * 5000 + "]" * 5000 + "}\n", "nested more than")
    put("bad_date.yaml", "run:\n  name: 2024-13-45\n", "cannot be represented")
    put("huge_int.yaml", "run:\n  seed: " + "9" * 6000 + "\n", "cannot be represented")
    put("inf.yaml", "run:\n  time_budget_s: .inf\n", "run.time_budget_s: Input should be a finite number")
    put("nan.yaml", "train:\n  learning_rate: .nan\n", "train.learning_rate")
    put("long_value.yaml", f"run:\n  name: [{', '.join([SECRET] * 200)}]\n", "run.name")
    put("long_key.yaml", "run:\n  " + "k" * 1000 + ": 1\n", "...: unknown key")
    return out


@pytest.mark.parametrize(
    "name",
    [
        "laughs.yaml",
        "one_alias.yaml",
        "secrets.yaml",
        "shadow_like",
        "binary.bin",
        "huge.yaml",
        "deep.yaml",
        "bad_date.yaml",
        "huge_int.yaml",
        "inf.yaml",
        "nan.yaml",
        "long_value.yaml",
        "long_key.yaml",
    ],
)
def test_a_hostile_config_file_is_one_line_without_its_content(tmp_path, name):
    path, fragment = _files(tmp_path)[name]
    proc = _run_cli(["--config", path], tmp_path / "results", separate=name == "laughs.yaml")
    _refused(proc, tmp_path / "results", fragment)


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("/etc/shadow", "not an aiperf config"),
        ("/etc/passwd", "mapping of sections"),
        ("/bin/ls", "too large"),
        ("/dev/zero", "not a regular file"),
        ("/proc/self/environ", ""),
    ],
)
def test_system_files_are_refused_without_printing_a_line_of_them(tmp_path, target, fragment):
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    proc = _run_cli(["--config", target], tmp_path / "results", separate=True)
    line = _refused(proc, tmp_path / "results", fragment)
    if os.access(target, os.R_OK) and Path(target).is_file():
        head = Path(target).read_bytes()[:200].split(b"\n")[0].decode(errors="replace")
        assert not head or head[:12] not in line, "the error printed part of the file"


def test_a_directory_and_a_fifo_are_refused_without_blocking(tmp_path):
    _refused(_run_cli(["--config", str(tmp_path)], tmp_path / "r1"), tmp_path / "r1", "is a folder")
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)  # nobody will ever write to it: reading it would block for ever
    proc = _run_cli(["--config", str(fifo)], tmp_path / "r2", timeout=60, separate=True)
    _refused(proc, tmp_path / "r2", "not a regular file")


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("run.time_budget_s=.inf", "run.time_budget_s: Input should be a finite number"),
        ("run.time_budget_s=-.inf", "run.time_budget_s"),
        ("run.time_budget_s=.nan", "run.time_budget_s"),
        ("run.telemetry_interval_s=1e300", "run.telemetry_interval_s"),
        ("run.seed=99999999999999", "run.seed"),
        ("search.max_flops_per_image=.inf", "search.max_flops_per_image"),
        ("hpo.learning_rate=[0.001, .inf]", "hpo.learning_rate"),
        (f"run.name=&a [{SECRET}, *a]", "anchors and aliases"),
        (f"run.name={{a: &x [{SECRET}], b: *x}}", "anchors and aliases"),
        ("run.name=" + "[" * 3000 + "]" * 3000, "nested more than"),
        ("run.name=" + "x" * 20000, "value too long"),
        (f"run.name=[{', '.join([SECRET] * 100)}]", "run.name"),
        ("run." + "k" * 500 + "=1", "...: unknown key"),
        ("run.na\nme=1", "unknown key"),
    ],
)
def test_hostile_overrides_are_one_line_before_any_run_directory(tmp_path, override, fragment):
    line = _refused(_run_cli(["--config", "smoke", "--set", override], tmp_path / "results"), tmp_path / "results", "")
    assert fragment in line


def test_billion_laughs_through_load_config_is_refused_before_expansion(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    with pytest.raises(AiperfError, match="line 1: anchors and aliases"):
        load_config(path)


# --- fuzzing ----------------------------------------------------------------------------------

SECTIONS = list(Config.model_fields)
KEYS = {name: list(Config.model_fields[name].annotation.model_fields) for name in SECTIONS}
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from([".inf", "-.inf", ".nan", "NaN", "1e999", "0x10", "~", "auto", "2024-13-45", "&a x", "*a"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def config_documents(draw) -> str:
    """YAML text: mostly real sections and keys with hostile values, sometimes raw garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    doc: dict = {}
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.sampled_from([*SECTIONS, "bogus"]))
        keys = KEYS.get(section, ["x"])
        doc.setdefault(section, {})[draw(st.sampled_from([*keys, "bogus"]))] = draw(VALUES)
    return yaml.safe_dump(doc, allow_unicode=True)


def _assert_one_line_error(exc: AiperfError) -> None:
    message = str(exc)
    assert message.startswith("config error:") and "\n" not in message and len(message) < 600, message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=config_documents())
def test_fuzzed_config_files_load_or_fail_in_one_line(tmp_path, text):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    try:
        cfg = load_config(path)
    except AiperfError as exc:
        _assert_one_line_error(exc)
    else:
        assert cfg.run.time_budget_s > 0


@settings(max_examples=150, deadline=None)
@given(
    key=st.one_of(st.sampled_from([f"{s}.{k}" for s in SECTIONS for k in KEYS[s]]), st.text(min_size=1, max_size=40)),
    value=st.one_of(st.text(max_size=60), VALUES.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip())),
)
def test_fuzzed_overrides_load_or_fail_in_one_line(key, value):
    try:
        load_config("smoke", [f"{key}={value}"])
    except AiperfError as exc:
        _assert_one_line_error(exc)
