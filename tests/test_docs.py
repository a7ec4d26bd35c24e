"""The docs' generated regions against the code that owns their facts (tools/gen_docs.py).

When a test here fails, the code changed what the docs say: run ``python tools/gen_docs.py``
and commit the docs with the change.
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys

from cifar10_estimator.config import flags, settings
from cifar10_estimator.config.fields import GROUPS, flag
from cifar10_estimator.evaluation.report import REPORT_FILE
from cifar10_estimator.jobdir.lock import LOCK_FILE
from cifar10_estimator.jobdir.settings_record import RECORD_FILE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tools", "gen_docs.py")
FIX = "run python tools/gen_docs.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=60)


def test_the_docs_say_what_the_code_generates():
    stale = gen.differences(REPO)
    assert not stale, f"{'; '.join(stale)}: the docs differ from the code; {FIX}"


def test_the_flag_tables_list_every_flag_of_help_once():
    rows = [line for line in gen.render_flags().split("\n") if line.startswith("| `--")]
    shown = [row.split("`")[1] for row in rows]
    expected = [a.option_strings[0] for a in flags.build_parser()._actions
                if a.option_strings and a.help != argparse.SUPPRESS and a.dest not in
                ("help", "version")]
    assert sorted(shown) == sorted(expected)


def _listed(text: str) -> list[str]:
    """The flags of a rendered list's items that name a help group (``- model: `--x`, ...``)."""
    items = " ".join(text.split("\n")).split("- ")
    groups = tuple(f"{title}: " for title, _ in GROUPS)
    return [word.strip("`,;.") for item in items if item.startswith(groups)
            for word in item.split() if word.startswith("`--")]


def test_the_recorded_list_names_each_setting_on_its_side_once():
    recorded, free = gen.render_recorded_settings().split("Every other flag")
    assert sorted(_listed(recorded)) == sorted(flag(name) for name in settings.RUN_FIELDS)
    assert sorted(_listed(free)) == sorted(
        flag(f.name) for f in settings.FIELDS
        if f.name not in settings.RUN_FIELDS)


def test_the_job_dir_table_names_the_files_by_their_constants():
    table = gen.render_jobdir_files()
    for name in (RECORD_FILE, LOCK_FILE, REPORT_FILE, settings.EXPORT_SUBDIR):
        assert f"`{name}" in table
    assert gen.constant("cifar10_estimator.jobdir.lock", "LOCK_FILE") == LOCK_FILE


def test_check_names_the_doc_and_section_and_the_fix(tmp_path):
    os.makedirs(tmp_path / "docs")
    doc = tmp_path / "docs" / "training.md"
    shutil.copy(os.path.join(REPO, "docs", "training.md"), doc)
    text = doc.read_text()
    doc.write_text(text.replace("| `--seed` | unset |", "| `--seed` | 42 |"))

    check = _run("--check", "--root", str(tmp_path))
    assert check.returncode == 1 and check.stdout == ""
    assert check.stderr.count("\n") == 1, check.stderr
    assert 'docs/training.md, section "Flags" (generated: flags)' in check.stderr
    assert FIX in check.stderr

    assert _run("--root", str(tmp_path)).returncode == 0
    assert doc.read_text() == text
    assert _run("--check", "--root", str(tmp_path)).returncode == 0


def test_a_missing_region_is_one_line(tmp_path):
    os.makedirs(tmp_path / "docs")
    text = open(os.path.join(REPO, "docs", "training.md")).read()
    start = text.index("<!-- generated: flags")
    end = text.index("<!-- end generated -->", start) + len("<!-- end generated -->")
    (tmp_path / "docs" / "training.md").write_text(text[:start] + text[end:])
    check = _run("--check", "--root", str(tmp_path))
    assert check.returncode == 1 and check.stderr.count("\n") == 1
    assert "docs/training.md has no <!-- generated: flags --> region" in check.stderr
