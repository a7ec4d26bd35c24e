"""Who a task is in its job: ``Role``, TF_CONFIG's cluster and task as the trainer reads them
(``task.tf_config.parse`` makes one), and the facts that follow from the cluster alone:
whether the task trains, is the chief, evaluates at the end; how many trainers and parameter
servers there are; its shard of the training records; the addresses of the other tasks.

No TensorFlow here: the trainer checks its role before TensorFlow loads.
"""

import dataclasses
from typing import Mapping, Sequence

# Jobs whose tasks run training steps ("master" is the pre-"chief" name Estimator still accepts).
TRAINER_JOBS = ("chief", "master", "worker")


@dataclasses.dataclass(frozen=True)
class Role:
    """This task's place in the job, as ``TF_CONFIG`` gives it (``task.tf_config.parse``).

    A run without a cluster is Estimator's local task, ``worker`` 0 with no cluster. The
    cluster stays as listed for every task, an evaluator's included (Estimator's ``RunConfig``
    gives an evaluator an empty one, so it cannot count the workers whose global step it
    follows).
    """

    task_type: str = "worker"
    task_id: int = 0
    cluster_spec: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    # TF_CONFIG listed workers only (Ray Train, SageMaker): worker 0 became the chief.
    workers_only: bool = False

    # The facts that follow from the fields above, computed once when the role is made (a
    # frozen dataclass's own set-up, as ``config.plan.Plan``'s): a run without a cluster is
    # ``local``; ``name`` is ``local`` or the task as TF_CONFIG names it (``worker 1``),
    # ``kind`` ``local`` or the task's type (what a result reports); ``in_cluster``: a
    # training task of a cluster; ``is_chief``: the task that saves checkpoints and exports
    # (the chief, or a local run); ``chief_evaluates``: the chief of this cluster evaluates
    # at the end, a cluster of workers only that lists no evaluator (the engines that write
    # that shape run no evaluator task; elsewhere an evaluator task evaluates, listed in the
    # cluster or not); ``evaluates_at_end``: this task evaluates the final checkpoint after
    # training (a local run, or that chief); ``num_trainers``: the training tasks (chief and
    # workers), 1 for a local run; ``trainer_index``: this training task's place among them
    # (its shard of the training records: the chief 0, worker i i + 1; 0 for a local run);
    # ``ps_tasks``: ``ps:i`` -> address; ``peers``: the other training tasks, ``job:index`` ->
    # address.
    local: bool = dataclasses.field(init=False)
    name: str = dataclasses.field(init=False)
    kind: str = dataclasses.field(init=False)
    trains: bool = dataclasses.field(init=False)
    in_cluster: bool = dataclasses.field(init=False)
    is_chief: bool = dataclasses.field(init=False)
    chief_evaluates: bool = dataclasses.field(init=False)
    evaluates_at_end: bool = dataclasses.field(init=False)
    num_trainers: int = dataclasses.field(init=False)
    num_ps: int = dataclasses.field(init=False)
    trainer_index: int = dataclasses.field(init=False)
    ps_tasks: Mapping[str, str] = dataclasses.field(init=False)
    peers: Mapping[str, str] = dataclasses.field(init=False)

    def __post_init__(self):
        spec, kind, index = self.cluster_spec, self.task_type, self.task_id
        local = not spec
        trains = kind in TRAINER_JOBS
        chief_type = kind in ("chief", "master")
        chief_evaluates = self.workers_only and "evaluator" not in spec
        has_chief = any(job in spec for job in ("chief", "master"))
        derived = {
            "local": local,
            "name": "local" if local else f"{kind} {index}",
            "kind": "local" if local else kind,
            "trains": trains,
            "in_cluster": trains and not local,
            "is_chief": local or chief_type,
            "chief_evaluates": chief_evaluates,
            "evaluates_at_end": local or (chief_evaluates and kind == "chief"),
            "num_trainers": max(1, sum(len(spec.get(job, ())) for job in TRAINER_JOBS)),
            "num_ps": len(spec.get("ps", ())),
            "trainer_index": 0 if local or chief_type else index + (1 if has_chief else 0),
            "ps_tasks": {f"ps:{i}": address for i, address in enumerate(spec.get("ps", ()))},
            "peers": {f"{job}:{i}": address for job in TRAINER_JOBS
                      for i, address in enumerate(spec.get(job, ()))
                      if (job, i) != (kind, index)},
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
