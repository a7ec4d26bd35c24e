"""CI's slice of the chaos campaign (issue 76, docs/faults.md "Chaos"): a local parameter-server
cluster with an evaluator, hit for a minute and a half by a seeded schedule of mixed faults
(kills, SIGTERM, stops, the launcher killed, a task's links cut, a full job dir, kills timed
inside a save, an evaluation and the export), every job run to its end the way a user would,
and the campaign's invariants checked after each one by ``benchmarks/chaos.py`` itself."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from trainer_fixtures import trainer_env, work_dir

CHAOS = pathlib.Path(__file__).parents[1] / "benchmarks" / "chaos.py"


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(900)
@pytest.mark.skipif(os.geteuid() != 0, reason="the campaign mounts a tmpfs and runs tc as root")
def test_a_seeded_slice_of_chaos_ends_every_job_with_its_invariants_held(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(CHAOS), "--engines", "ps", "--minutes", "1.5", "--seed", "7",
         "--gap", "4,10", "--hold", "4,8", "--train-steps", "400", "--checkpoint-steps", "50",
         "--no-reference", "--work-dir", str(tmp_path / "chaos")],
        capture_output=True, text=True, cwd=work_dir(), env=trainer_env(), timeout=850)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = re.search(r"^ps: [0-9.]+ min, (\d+) jobs, (\d+) faults \((.*)\), (\d+) held",
                        proc.stdout, re.M)
    assert summary, proc.stdout[-3000:]
    jobs, faults, kinds, held = summary.groups()
    assert int(jobs) >= 1 and held == jobs
    assert int(faults) >= 5 and len(kinds.split(", ")) >= 3, summary.group(0)
