"""Logging options of every command (pathswarm/logs.py, the CLI's -v / -q / --log-level / --log-format) and byte
counts in log lines, by value."""

import json
import logging
import subprocess
import sys

from pathswarm.logs import JsonFormatter, human_bytes, level_of


def test_the_level_moves_with_v_and_q_and_log_level_wins():
    assert level_of() == logging.INFO and level_of(verbose=1) == logging.DEBUG and level_of(verbose=3) == logging.DEBUG
    assert level_of(quiet=1) == logging.WARNING and level_of(quiet=2) == logging.ERROR and level_of(quiet=5) == 40
    assert level_of(verbose=1, log_level="error") == logging.ERROR and level_of(log_level="Warning") == 30


def test_json_lines_carry_time_level_logger_and_message():
    record = logging.LogRecord("pathswarm.node", logging.WARNING, __file__, 1, "round %d: %s", (3, "ü"), None)
    line = json.loads(JsonFormatter().format(record))
    # the level's name as logging names it in this process (hivemind renames WARNING to WARN once imported)
    assert line["level"] == logging.getLevelName(logging.WARNING) and line["logger"] == "pathswarm.node"
    assert line["message"] == "round 3: ü"
    assert line["time"].endswith("Z") and line["time"][10] == "T"


def test_byte_counts_read_as_people_read_them():
    assert [human_bytes(n) for n in (0, 999, 1000, 209_642_367, 3.2e12)] == ["0 B", "999 B", "1.0 KB", "209.6 MB",
                                                                            "3.2 TB"]


def cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PATHSWARM_LOG_")}
    env.update(env_extra or {})
    # `swarm id` of a missing file logs nothing by itself: the probe logs one line per level, then exits
    code = ("import logging, sys\n"
            "from pathswarm.node.app.cli import main\n"
            "@main.command('probe')\n"
            "def probe():\n"
            "    log = logging.getLogger('hivemind.test')  # as hivemind's own loggers, once routed\n"
            "    for level in ('debug', 'info', 'warning', 'error'):\n"
            "        getattr(logging.getLogger('pathswarm.probe'), level)('p-' + level)\n"
            "    import pathswarm.protocol.net  # routes hivemind's loggers to ours\n"
            "    log.info('h-info')\n"
            "    log.warning('h-warning')\n"
            "main()\n")
    return subprocess.run([sys.executable, "-c", code, *args, "probe"], capture_output=True, text=True, timeout=60,
                          env=env)


def test_every_command_takes_the_level_and_format_and_hivemind_follows():
    """Three processes (each imports hivemind): the default, -q with JSON lines, and a level inherited from the
    command that started the process (-v and -qq: `level_of`, above)."""
    plain = cli()
    assert plain.returncode == 0, plain.stderr
    assert "p-info" in plain.stderr and "p-debug" not in plain.stderr and "h-info" in plain.stderr
    lines = [json.loads(line) for line in cli("-q", "--log-format", "json").stderr.splitlines()]
    assert [(x["logger"], x["message"]) for x in lines] == [  # hivemind's INFO lines quieted too
        ("pathswarm.probe", "p-warning"), ("pathswarm.probe", "p-error"), ("hivemind.test", "h-warning")]
    # the processes a command starts inherit its choice
    inherited = cli(env_extra={"PATHSWARM_LOG_LEVEL": "error", "PATHSWARM_LOG_FORMAT": "json"})
    assert [json.loads(line)["message"] for line in inherited.stderr.splitlines()] == ["p-error"]
