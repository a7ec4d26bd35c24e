"""The one home of the settings: every field carries its metadata, and the flags, help groups,
run record, recipe line and range checks all follow from it."""

import dataclasses

import pytest

from cifar10_estimator.config import checks, fields, flags, overlays, settings
from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir import settings_record


def _missing_metadata(cls) -> list[str]:
    """The fields of a settings dataclass that lack one of the ``REQUIRED`` metadata keys."""
    return [f.name for f in dataclasses.fields(cls)
            if any(key not in f.metadata for key in fields.REQUIRED)]


@pytest.mark.parametrize("group,cls", settings.SECTIONS, ids=[n for n, _ in settings.SECTIONS])
def test_every_setting_declares_its_help_group_and_whether_it_defines_the_run(group, cls):
    # A setting's help group is its section: every section is one of the help's groups.
    assert group in dict(fields.GROUPS)
    assert _missing_metadata(cls) == []
    for field in dataclasses.fields(cls):
        assert settings.SECTION_OF[field.name] == group
        assert field.metadata["help"] and "(default:" not in field.metadata["help"] or (
            field.default is None), f"{field.name} restates its default in its help"


def test_the_sections_are_the_help_groups_in_order_and_hold_every_setting_once():
    assert [name for name, _ in settings.SECTIONS] == [name for name, _ in fields.GROUPS]
    assert [f.name for f in settings.FIELDS] == [
        f.name for _, cls in settings.SECTIONS for f in dataclasses.fields(cls)]
    assert len(settings.SECTION_OF) == len(settings.FIELDS)
    given = settings.Settings.of(num_layers=8, sync=True, job_dir="j")
    assert (given.model.num_layers, given.cluster.sync, given.output.job_dir) == (8, True, "j")
    assert given.flat()["num_layers"] == given.value("num_layers") == 8
    assert given.replace(sync=False).cluster == settings.ClusterSection()
    with pytest.raises(TypeError, match="not settings: num_layer"):
        settings.Settings.of(num_layer=8)


def test_a_field_without_metadata_is_found():
    @dataclasses.dataclass(frozen=True)
    class Extended(settings.ScheduleSection):
        new_knob: int = 3

    assert _missing_metadata(Extended) == ["new_knob"]


def test_every_setting_is_one_flag_listed_in_its_help_group():
    parser = flags.build_parser()
    groups = {group.title: group for group in parser._action_groups}
    for name, section in settings.SECTIONS:
        group = groups[name]
        for field in dataclasses.fields(section):
            assert fields.flag(field.name) in {o for a in group._group_actions
                                               for o in a.option_strings}, field.name


def test_the_run_record_holds_exactly_the_fields_that_define_the_run():
    recorded = settings_record.run_settings(settings.Settings().flat(), "cifar10", 10)
    assert set(recorded) == {f.name for f in settings.FIELDS
                             if f.metadata["record"]} | set(settings_record.DATA_FIELDS)
    assert {"learning_rate", "precision", "num_layers"} <= set(settings.RUN_FIELDS)
    assert not {"job_dir", "train_steps", "num_gpus"} & set(settings.RUN_FIELDS)


def test_every_value_a_recipe_or_model_sets_is_a_setting_and_the_recipe_line_shows_it():
    names = {f.name for f in settings.FIELDS}
    for overlay in [*overlays.MODELS.values(), *overlays.RECIPES.values()]:
        assert set(overlay) <= names
    for recipe in overlays.RECIPES.values():
        assert set(recipe) <= set(settings.RECIPE_FIELDS)
    line = overlays.describe(overlays.build(recipe="fast", train_batch_size=8))
    assert "--lr-schedule one-cycle," in line and "--train-batch-size 8 (given)" in line


@pytest.mark.parametrize("flag,value,wording", [
    ("--train-batch-size", "0", "1 or more"),
    ("--weight-decay", "-1", "0 or more"),
    ("--learning-rate", "0", "positive"),
    ("--momentum", "1", "in [0, 1)"),
    ("--num-layers", "21", "6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...)"),
])
def test_a_value_out_of_its_range_is_one_line_naming_the_flag(flag, value, wording):
    config, _ = flags.parse(["--data-dir", "d", "--job-dir", "j", flag, value])
    with pytest.raises(UserError) as raised:
        checks.validate(config)
    assert str(raised.value) == f"{flag} must be {wording}, got {value}"


def test_a_flag_for_another_model_is_refused():
    with pytest.raises(UserError, match=r"^--num-layers applies to --model resnet, not to "
                                        r"--model tutorial-cnn; leave it out$"):
        flags.parse(["--model", "tutorial-cnn", "--num-layers", "20"])
    flags.parse(["--model", "tutorial-cnn", "--learning-rate", "0.05"])  # applies to both


def test_overlays_stack_field_model_recipe_and_given_values():
    tutorial = overlays.build(model="tutorial-cnn")
    assert (tutorial.schedule.momentum, tutorial.schedule.train_steps) == (0.0, 100_000)
    fast = overlays.build(recipe="fast", train_epochs=5.0).schedule
    assert fast.lr_schedule == "one-cycle" and fast.train_steps is None  # epochs replace steps
    assert overlays.build(recipe="fast", learning_rate=0.3).schedule.learning_rate == 0.3
    assert overlays.build().schedule.train_steps == overlays.MODELS[settings.RESNET][
        "train_steps"]


def test_the_fast_recipe_has_its_own_run_length_that_follows_the_training_file():
    points = overlays.RUN_LENGTHS["fast"]
    (small, short), (large, long_) = points[0], points[-1]
    assert overlays.recipe_epochs("fast", 96) == short
    assert overlays.recipe_epochs("fast", small) == short
    assert overlays.recipe_epochs("fast", large) == long_
    assert overlays.recipe_epochs("fast", 10 * large) == long_
    for (lo, at_lo), (hi, at_hi) in zip(points, points[1:]):
        assert overlays.recipe_epochs("fast", lo) == at_lo
        halfway = int((lo * hi) ** 0.5)  # halfway in log N
        assert overlays.recipe_epochs("fast", halfway) == round((at_lo + at_hi) / 2, 1)
    assert overlays.recipe_epochs("paper", 50_000) is None
    # The model's length gives way.
    assert overlays.build(recipe="fast").schedule.train_steps is None
    assert overlays.build(recipe="fast", train_steps=10).schedule.train_steps == 10


def test_the_help_says_the_fast_recipes_length_by_size_as_the_table_has_it(monkeypatch):
    # argparse wraps the lines, at hyphens too: compare without white space.
    help = "".join(flags.build_parser().format_help().split())
    text = overlays.recipe_help()
    assert "".join(text.split()) in help
    fast = text.split("fast: ", 1)[1]
    (small, short), *_, (large, long_) = overlays.RUN_LENGTHS["fast"]
    assert f"{short:g} epochs for {small:,} training records or fewer" in fast
    assert f"{long_:g} epochs for " in fast and "training records or more" in fast
    assert "paper: the defaults;" in text  # no length of its own
    # A flat table is said as one length; another table, as its points.
    monkeypatch.setitem(overlays.RUN_LENGTHS, "fast", ((10_000, 6.0), (40_000, 6.0)))
    assert "a length of its own: 6 epochs at every size" in overlays.recipe_help()
    monkeypatch.setitem(overlays.RUN_LENGTHS, "fast", ((10_000, 8.0), (20_000, 7.0),
                                                       (40_000, 6.0)))
    assert ("8 epochs for 10,000 training records or fewer, 7 epochs for 20,000 training "
            "records, 6 epochs for 40,000 training records or more, straight in log N "
            "between") in overlays.recipe_help()
    # A flat end is said from where it starts.
    monkeypatch.setitem(overlays.RUN_LENGTHS, "fast", ((10_000, 5.0), (20_000, 6.0),
                                                       (40_000, 6.0)))
    assert ("5 epochs for 10,000 training records or fewer, 6 epochs for 20,000 training "
            "records or more, straight") in overlays.recipe_help()


def test_nesterov_one_field_is_a_flag_in_the_run_record_and_reaches_the_optimizer():
    # The setting added as docs/architecture.md shows: one field, one use. Followed from the
    # command line through the plan to the optimizer's ops, as the trainer takes it.
    import tensorflow as tf

    from cifar10_estimator.config import plan
    from cifar10_estimator.config.role import Role
    from cifar10_estimator.data import schema
    from cifar10_estimator.training.estimator import model_fn

    for given in ([], ["--nesterov"]):
        config, _ = flags.parse(["--num-layers", "8", *given])
        assert config.schedule.nesterov == bool(given) and "nesterov" in settings.RUN_FIELDS
        resolved = plan.resolve(Role(), config.model, config.schedule, config.devices,
                                config.cluster, dataset="cifar10",
                                class_names=schema.CLASS_NAMES, train_records=96,
                                precision="fp32")
        with tf.Graph().as_default():
            spec = model_fn.make_model_fn(model_fn.ModelSettings.of(
                resolved, config.model, config.data.data_dir))(
                {"image": tf.zeros([2, 32, 32, 3])}, tf.zeros([2], tf.int32),
                tf.estimator.ModeKeys.TRAIN)
            applies = [op for op in tf.compat.v1.get_default_graph().get_operations()
                       if op.type == "ResourceApplyMomentum"]
            assert spec.train_op is not None and applies
            assert all(op.get_attr("use_nesterov") == bool(given) for op in applies)
