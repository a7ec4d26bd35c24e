"""A job dir recorded before a setting existed: the setting is read as its default, which a
rerun may keep (it is then recorded) and may not change (refused like any recorded setting)."""

import json
import logging

import pytest

from cifar10_estimator.config.settings import Settings
from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir import settings_record


@pytest.fixture
def package_log():
    """The package's log lines, whatever handlers other tests left on its logger."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger("cifar10_estimator")
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def current(**changed) -> dict:
    return settings_record.run_settings(Settings.of(**changed).flat(), "cifar10", 10)


def record_without(job_dir, *names: str) -> None:
    """A record as an older version wrote it: this version's, less ``names``."""
    settings = current()
    for name in names:
        del settings[name]
    settings_record.write(str(job_dir), settings)


def written(job_dir) -> dict:
    return json.loads((job_dir / settings_record.RECORD_FILE).read_text())["settings"]


def test_a_setting_the_record_predates_is_its_default_and_is_recorded(tmp_path, package_log):
    record_without(tmp_path, "test_time_mirror", "lr_boundary_epochs")
    settings_record.check(str(tmp_path), current(), is_chief=True)
    assert package_log == [  # in the help's order: the model's section, then the schedule's
        "settings.json was written before --test-time-mirror existed: taking its default, "
        "false",
        "settings.json was written before --lr-boundary-epochs existed: taking its default, "
        "82,123,300"]
    assert written(tmp_path) == current()  # recorded now, at the default
    package_log.clear()
    settings_record.check(str(tmp_path), current(), is_chief=True)
    assert package_log == []  # said once: the record holds them now


def test_changing_a_setting_the_record_predates_is_refused_in_one_line(tmp_path):
    record_without(tmp_path, "test_time_mirror")
    before = written(tmp_path)
    for is_chief, how in [(True, "rerun with the recorded values, use a new --job-dir, or add "
                                 "--change-settings to change them on purpose"),
                          (False, "start this task with the same flags as the chief")]:
        with pytest.raises(UserError) as refused:
            settings_record.check(str(tmp_path), current(test_time_mirror=True),
                                  is_chief=is_chief)
        assert str(refused.value) == (
            f"--job-dir {tmp_path} was trained with other settings (settings.json): "
            f"--test-time-mirror false (now true); {how}")
    assert written(tmp_path) == before  # nothing recorded


def test_a_worker_reads_the_default_and_records_nothing(tmp_path, package_log):
    record_without(tmp_path, "test_time_mirror")
    before = written(tmp_path)
    settings_record.check(str(tmp_path), current(), is_chief=False)
    assert written(tmp_path) == before
    assert package_log == ["settings.json was written before --test-time-mirror existed: "
                           "taking its default, false"]


def test_change_settings_records_a_new_value_of_a_setting_the_record_predates(tmp_path):
    record_without(tmp_path, "test_time_mirror")
    settings_record.check(str(tmp_path), current(test_time_mirror=True), is_chief=True,
                          change=True)
    assert written(tmp_path)["test_time_mirror"] is True


def test_readers_see_the_default_of_a_setting_the_record_predates(tmp_path):
    # What the trainer's precision `auto` follows and what `evaluate` builds the network from.
    record_without(tmp_path, "precision", "test_time_mirror")
    recorded = settings_record.read(str(tmp_path))
    assert recorded["precision"] == "fp32" and recorded["test_time_mirror"] is False
    assert recorded == current()


def test_the_default_is_the_fields_own_not_a_recipe_or_model_overlay(tmp_path):
    # The fast recipe turns nesterov on, the tutorial CNN sets its own weight decay: neither
    # overlay existed before the setting did, so an older record trained with the field's own.
    record_without(tmp_path, "nesterov", "weight_decay")
    recorded = settings_record.read(str(tmp_path))
    assert recorded["nesterov"] is False and recorded["weight_decay"] == 0.0002


# A real job dir recorded before --test-time-mirror existed, through the trainer (refused with
# the flag, then its default recorded): tests/test_job_dir.py, on the job dir its settings test
# trains anyway.


def test_a_share_the_plan_resolves_is_never_read_back_unresolved(tmp_path):
    # A recipe's None for --low-res-fraction is a request the plan resolves before the record
    # is written; a record that holds it anyway (edited by hand) is refused in one line.
    settings_record.write(str(tmp_path), {**current(), "low_res_fraction": None})
    with pytest.raises(UserError, match="records 'low_res_fraction' as null, not a finite "
                                        "number; restore it"):
        settings_record.read(str(tmp_path))
