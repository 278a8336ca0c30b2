"""`pathswarm node unit` (node/app/systemd_unit.py): a systemd user unit for an unattended node, checked by
`systemd-analyze verify` where this machine has it."""

import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pathswarm.node.app.cli import main
from pathswarm.node.app.systemd_unit import absolute_args, unit_text


def test_the_unit_runs_the_node_with_absolute_paths_and_restarts_it_on_failure_only(tmp_path, monkeypatch):
    (tmp_path / "swarm.toml").write_text("x")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "units" / "pathswarm-node.service"
    res = CliRunner().invoke(main, ["node", "unit", "-o", str(out), "--", "--swarm", "swarm.toml", "--path", "0.0",
                                    "--checkpoint-dir=ckpt with space"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart={sys.executable} -m pathswarm node run --swarm {tmp_path / 'swarm.toml'}")
    assert "--path 0.0" in exec_start and "'--checkpoint-dir=ckpt with space'" in exec_start  # quoted as one word
    for line in ("Restart=on-failure", "RestartPreventExitStatus=2", "WantedBy=default.target"):
        assert line in text.splitlines()
    assert "systemctl --user daemon-reload" in res.output
    # an existing unit is not overwritten without --force; the node's arguments are checked as `node run` does
    again = CliRunner().invoke(main, ["node", "unit", "-o", str(out), "--", "--swarm", "swarm.toml"])
    assert again.exit_code == 2 and "--force" in again.output
    bad = CliRunner().invoke(main, ["node", "unit", "--", "--swarm", "public", "--no-such-option"])
    assert bad.exit_code == 2 and "no-such-option" in bad.output
    none = CliRunner().invoke(main, ["node", "unit"])
    assert none.exit_code == 2 and "after --" in none.output


def test_relative_paths_that_do_not_exist_and_other_values_stay_as_they_are(tmp_path):
    (tmp_path / "member.cert").write_text("x")
    got = absolute_args(["--membership", "member.cert", "--swarm", "public", "--path", "0.1", "--x=member.cert"],
                        cwd=tmp_path)
    assert got == ["--membership", str(tmp_path / "member.cert"), "--swarm", "public", "--path", "0.1",
                   f"--x={tmp_path / 'member.cert'}"]
    assert "%%" in unit_text(["--swarm", "50%.toml"], python="/usr/bin/python3")  # systemd's %-specifiers escaped


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    unit = tmp_path / "pathswarm-node.service"
    unit.write_text(unit_text(["--swarm", "public"]))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and unit.name not in done.stderr, done.stderr
    # the check can fail: a unit whose interpreter does not exist is refused
    broken = tmp_path / "broken.service"
    broken.write_text(unit_text(["--swarm", "public"], python=str(tmp_path / "no-python")))
    done = subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "no-python" in done.stderr
