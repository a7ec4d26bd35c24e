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

    @property
    def local(self) -> bool:
        return not self.cluster_spec

    @property
    def name(self) -> str:
        """``local``, or the task as TF_CONFIG names it (``worker 1``)."""
        return "local" if self.local else f"{self.task_type} {self.task_id}"

    @property
    def kind(self) -> str:
        """``local`` or the task's type: what a result reports."""
        return "local" if self.local else self.task_type

    @property
    def trains(self) -> bool:
        return self.task_type in TRAINER_JOBS

    @property
    def in_cluster(self) -> bool:
        """A training task of a cluster."""
        return self.trains and not self.local

    @property
    def is_chief(self) -> bool:
        """The task that saves checkpoints and exports: the chief, or a local run."""
        return self.local or self.task_type in ("chief", "master")

    @property
    def evaluates_at_end(self) -> bool:
        """The task that evaluates the final checkpoint after training: a local run, or the
        chief of a cluster of workers only that lists no evaluator (the engines that write
        that shape run no evaluator task; elsewhere an evaluator task evaluates, listed in the
        cluster or not)."""
        return self.local or (self.chief_evaluates and self.task_type == "chief")

    @property
    def chief_evaluates(self) -> bool:
        """Whether the chief of this task's cluster evaluates at the end (above)."""
        return self.workers_only and "evaluator" not in self.cluster_spec

    @property
    def num_trainers(self) -> int:
        """Training tasks of the job (chief and workers); 1 for a local run."""
        return max(1, sum(len(self.cluster_spec.get(job, ())) for job in TRAINER_JOBS))

    @property
    def num_ps(self) -> int:
        return len(self.cluster_spec.get("ps", ()))

    @property
    def trainer_index(self) -> int:
        """This training task's place among the trainers (its shard of the training records):
        the chief 0, worker i i + 1; 0 for a local run."""
        if self.local or self.task_type in ("chief", "master"):
            return 0
        return self.task_id + (1 if any(j in self.cluster_spec for j in ("chief", "master")) else 0)

    @property
    def ps_tasks(self) -> dict[str, str]:
        """``ps:i`` -> address."""
        return {f"ps:{i}": address for i, address in enumerate(self.cluster_spec.get("ps", ()))}

    @property
    def peers(self) -> dict[str, str]:
        """The other training tasks: ``job:index`` -> address."""
        return {f"{job}:{i}": address for job in TRAINER_JOBS
                for i, address in enumerate(self.cluster_spec.get(job, ()))
                if (job, i) != (self.task_type, self.task_id)}
