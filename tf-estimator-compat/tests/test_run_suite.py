"""tools/run_suite.py on a folder of small test files of its own, programs as the estimator's
are: the counts and failures it records per file, the Python the 2.15 tests were written for
given back (tools/suite_sitecustomize.py), a file that hangs with a child of its own or dies
before its report, ``--update``, and the table that compares records."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

DISTRIBUTION = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(DISTRIBUTION, "tools", "run_suite.py")


def _absl_program(source: str) -> str:
    """A test file as the estimator's are: a program that ends in absl's test runner."""
    return textwrap.dedent(source) + '\nif __name__ == "__main__":\n    absltest.main()\n'


# A test file as the estimator's are: a program whose main block reads absl flags, and whose
# tests call names Python 3.11 and 3.12 removed, beside a test that fails and one that skips.
OLD_PYTHON_TEST = _absl_program("""\
    import inspect
    import unittest

    from absl import flags
    from absl.testing import absltest

    SHARDS = flags.DEFINE_integer("test_num_shards", 8, "read only once flags are parsed")

    class OldPythonTest(absltest.TestCase):
        def test_old_assertion_names(self):
            self.assertEquals(1, 1)
            self.assertRaisesRegexp(ValueError, "bad", int, "bad")

        def test_getargspec(self):
            def f(a, b=2, *rest, **named):
                pass
            spec = inspect.getargspec(f)
            self.assertEqual((spec.args, spec.varargs, spec.keywords, spec.defaults),
                             (["a", "b"], "rest", "named", (2,)))

        def test_fails(self):
            self.assertEqual(SHARDS.value, 2)

        @unittest.skip("not here")
        def test_skips(self):
            pass
    """)
OTHER_TEST = _absl_program("""\
    from absl.testing import absltest

    class OtherTest(absltest.TestCase):
        def test_passes(self):
            pass
    """)
# A file one of whose tests waits forever: run whole it times out, run one test per program
# the other test counts.
ONE_TEST_HANGS = _absl_program("""\
    import time
    from absl.testing import absltest

    class SomeHangTest(absltest.TestCase):
        def test_hangs(self):
            time.sleep(600)

        def test_passes(self):
            pass
    """)
# A file that hangs with a worker of its own, and one that dies before its runner reports.
HANGING_TEST = textwrap.dedent("""\
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open("child.pid", "w").write(str(child.pid))
    time.sleep(600)
    """)
DYING_TEST = "raise SystemExit('no TPU here')\n"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, RUNNER, *args], capture_output=True, text=True,
                          timeout=240)


@pytest.fixture
def tests_folder(tmp_path):
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "old_python_test.py").write_text(OLD_PYTHON_TEST)
    (folder / "other_test.py").write_text(OTHER_TEST)
    return folder


@pytest.mark.timeout(300)
def test_a_record_counts_each_file_and_names_its_failures(tests_folder, tmp_path):
    out = tmp_path / "record.json"
    done = _run("run", "--tests", str(tests_folder), "--files", "old_*", "--out", str(out))
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    assert list(record["files"]) == ["old_python_test.py"]
    counts = record["files"]["old_python_test.py"]
    assert {c: counts[c] for c in ("passed", "failed", "errors", "skipped")} == {
        "passed": 2, "failed": 1, "errors": 0, "skipped": 1}
    [failure] = counts["failures"]
    assert failure.startswith("OldPythonTest::test_fails: AssertionError: 8 != 2")
    assert not os.path.exists(str(out) + ".tmp")

    # --update adds the other file and keeps the first; a record of other versions is refused.
    done = _run("run", "--tests", str(tests_folder), "--files", "other_test.py", "--update",
                "--out", str(out))
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert list(record["files"]) == ["old_python_test.py", "other_test.py"]
    assert record["files"]["other_test.py"]["passed"] == 1
    assert record["files"]["old_python_test.py"] == counts
    record["tensorflow"] = "2.0.0"
    out.write_text(json.dumps(record))
    done = _run("run", "--tests", str(tests_folder), "--files", "other_test.py", "--update",
                "--out", str(out))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert "not of" in done.stderr and "2.0.0" in done.stderr
    assert json.loads(out.read_text()) == record  # untouched


@pytest.mark.timeout(300)
def test_the_table_marks_each_count_that_differs_and_says_which_tests_fail(tests_folder,
                                                                             tmp_path):
    reference = tmp_path / "reference.json"
    assert _run("run", "--tests", str(tests_folder), "--out", str(reference)).returncode == 0
    record = json.loads(reference.read_text())
    # Another release, as it would be recorded: one more test of the other file fails.
    record["tensorflow"] = "9.9.9"
    other = record["files"]["other_test.py"]
    other.update(passed=0, failed=1, failures=["OtherTest::test_passes: ImportError: gone"])
    # and a file the reference has not run yet: shown, compared with nothing.
    record["files"]["later_test.py"] = dict(other, passed=1, failed=0, failures=[])
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(record))

    done = _run("table", str(reference), str(newer))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "| `old_python_test.py` | 2 / 1 / 1 | 2 / 1 / 1 |" in lines
    assert "| `other_test.py` | 1 / 0 / 0 | **0 / 1 / 0** |" in lines
    assert "| `later_test.py` | - | 1 / 0 / 0 |" in lines
    assert "| all | 3 / 1 / 1 | 3 / 2 / 1 |" in lines
    [listed] = [line for line in lines if line.startswith("- ")]
    assert "TF 9.9.9" in listed
    assert listed.endswith("`other_test.py`: 1 (OtherTest::test_passes): ImportError: gone")

    (tmp_path / "broken.json").write_text("{")
    done = _run("table", str(reference), str(tmp_path / "broken.json"))
    assert done.returncode != 0 and "broken.json cannot be read as a record" in done.stderr


@pytest.mark.timeout(300)
def test_a_file_that_hangs_is_killed_with_its_children_and_one_that_dies_is_an_error(
        tests_folder, tmp_path):
    (tests_folder / "hanging_test.py").write_text(HANGING_TEST)
    (tests_folder / "dying_test.py").write_text(DYING_TEST)
    out = tmp_path / "record.json"
    done = _run("run", "--tests", str(tests_folder), "--files", "hanging_test.py",
                "dying_test.py", "--timeout", "20", "--out", str(out))
    assert done.returncode == 0, done.stderr
    files = json.loads(out.read_text())["files"]
    assert files["hanging_test.py"]["timed_out"] is True
    assert files["hanging_test.py"]["failures"] == ["hanging_test.py: timed out after 20 s"]
    assert files["dying_test.py"]["timed_out"] is False
    assert files["dying_test.py"]["errors"] == 1
    assert files["dying_test.py"]["failures"] == ["dying_test.py: no TPU here"]
    # The hanging file's child went with it: no process of that command is left.
    left = subprocess.run(["pgrep", "-f", "import time; time.sleep(600)"], capture_output=True,
                          text=True)
    assert left.stdout == ""


@pytest.mark.timeout(300)
def test_a_file_that_times_out_runs_again_one_test_per_program(tests_folder, tmp_path):
    (tests_folder / "one_hangs_test.py").write_text(ONE_TEST_HANGS)
    out = tmp_path / "record.json"
    done = _run("run", "--tests", str(tests_folder), "--files", "one_hangs_test.py",
                "--timeout", "20", "--test-timeout", "15", "--out", str(out))
    assert done.returncode == 0, done.stderr
    counts = json.loads(out.read_text())["files"]["one_hangs_test.py"]
    assert (counts["passed"], counts["errors"], counts["one_by_one"]) == (1, 1, True)
    assert counts["failures"] == ["SomeHangTest::test_hangs: timed out after 15 s"]
    table = _run("table", str(out)).stdout
    assert "| `one_hangs_test.py` | 1 / 1 / 0 (one test per program) |" in table
