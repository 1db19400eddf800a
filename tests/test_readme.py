"""README keeps exactly two set-up commands, and .ci/run runs the test one verbatim."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_two_setup_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert len(commands) == 2
    main_job, tests = commands
    assert "rlk-triton drift" in main_job and "[hf]" in main_job and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()
