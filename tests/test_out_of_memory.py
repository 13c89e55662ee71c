"""Where memory runs out anyway, the one-line error names the command and the input it was given."""

from __future__ import annotations

from unittest import mock

import aiperf.cli as cli


def test_out_of_memory_names_the_command_and_its_input(capsys, tmp_path):
    run = tmp_path / "some-run"
    with mock.patch.dict(cli.COMMANDS, {"verify": mock.Mock(side_effect=MemoryError)}):
        assert cli.main(["verify", str(run)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("aiperf: error: out of memory while `aiperf verify`") and str(run) in line
    assert "docs/limits.md" in line
