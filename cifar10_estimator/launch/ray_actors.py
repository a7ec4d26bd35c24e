"""A training cluster on a Ray cluster's nodes: ``cifar10-cluster --ray ADDRESS``.

The same roles, ``TF_CONFIG`` values (``layout``), output and rules as a cluster on this host
(the launch loop, ``loop``), with Ray placing the tasks (``RayActors``, the loop's placement):

- One Ray actor per task (chief, workers, parameter servers, evaluator), spread over the nodes,
  with the CPUs and GPUs asked for (``--cpus-per-task``, ``--gpus-per-task``; a parameter
  server asks for none: it holds variables and computes little). Each actor binds a free port
  on its node, below the kernel's ephemeral range, and holds it until it starts its trainer
  (``ray_node.TaskRunner``); ``TF_CONFIG`` lists the nodes' addresses with those ports.
- Each actor starts ``python -m cifar10_estimator`` on its node with the trainer's flags, the
  node's environment and the launcher's own storage, TensorFlow, CUDA and NCCL variables
  (``FORWARDED_PREFIXES``: the bucket's endpoint and keys travel with the job). Their output
  comes back with the task's prefix, ``[chief] ...``.
- The ending and restart rules are the launch loop's (``loop.LaunchLoop``), which is handed
  ``RayActors`` as its placement: a trainer that a signal stopped, or that was killed, is
  started again in its actor, on the same node and port, and resumes from the latest
  checkpoint; a task that failed stops the job; the job ends when the chief, the workers and
  the evaluator have exited 0.
- A task whose actor was lost (its node died, or Ray stopped it) cannot be started again on
  its own: the others' TF_CONFIG names its address. The whole job is placed again instead, as
  Ray Train does with its worker group: the other trainers are stopped (SIGTERM: they save),
  every actor ended, new actors placed on the nodes that are alive (new ports, a new
  TF_CONFIG, the same tasks), and the job resumes from the latest checkpoint in its shared job
  dir; at most ``--max-failures`` times (the loop's rule; ``RayActors`` says which task's node
  was lost, and places the job again). A trainer dies with its actor (``ray_node``), so no
  task of the old placement trains on.
- Every path of the job must be one the nodes share: a bucket (``s3://``, ``gs://``), or a
  folder every node mounts at the same path. ``check_shared`` writes a token into a local
  ``--job-dir`` and asks every actor to read it, and asks every actor for ``--data-dir``'s
  metadata file; a node that does not see them is refused in one line, before anything trains.

Ray is an optional dependency (the ``ray`` extra); nothing here imports it before it runs.
"""

import dataclasses
import json
import os
import secrets
import subprocess
import time
from typing import Callable, Mapping, Optional, Sequence

from cifar10_estimator import storage
from cifar10_estimator.data.metadata import METADATA_FILENAME
from cifar10_estimator.launch import layout
from cifar10_estimator.errors import UserError

# The launcher's variables every task gets, whatever its node's environment: storage (S3's
# endpoint and keys, Google's credentials), TensorFlow's own, CUDA's and NCCL's.
FORWARDED_PREFIXES = ("AWS_", "S3_", "GOOGLE_", "GCS_", "TF_", "CUDA_", "NCCL_")
_NOT_FORWARDED = ("TF_CONFIG",)  # each task gets its own
# How long the actors may take to be placed and bind their ports; a cluster without room for
# them never places them.
PLACEMENT_TIMEOUT_SECS = 120
_READ_SECS = 0.2  # how often the launcher asks an actor for its trainer's new output
# An actor answers the launcher's calls at once (they read a queue or poll a process); one that
# has not in this long is taken for lost with its node.
_ACTOR_ANSWER_SECS = 30
# --max-failures' default: how many lost nodes a job survives. Ray Train's own default is 0
# (FailureConfig); on preemptible nodes a loss is the common case, and a few restarts keep a
# long job going while still ending one whose tasks take their nodes down with them.
MAX_FAILURES = 3


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'cifar10_estimator[ray]'") from None
    return ray


def connect(address: str) -> None:
    """Joins the Ray cluster at ``address`` (``auto``: the one this host runs)."""
    ray = _ray()
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                 configure_logging=False, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        if _asks_for_token(e, ray.exceptions.AuthenticationError):
            # Ray 2.60's `ray start` turns token authentication on when ~/.ray/auth_token
            # exists; a client joins only with RAY_AUTH_MODE=token and that token.
            raise UserError(f"--ray {address}: the Ray cluster asks for its authentication "
                            f"token; set RAY_AUTH_MODE=token and put the cluster's token in "
                            f"~/.ray/auth_token (or RAY_AUTH_TOKEN) on this host") from None
        raise UserError(f"--ray {address}: cannot join the Ray cluster "
                        f"({' '.join(str(e).split())[:300]}); start one with `ray start "
                        f"--head` and give the address it prints") from None


def _asks_for_token(error: BaseException, kind: type) -> bool:
    """Whether ``error``, or one it was raised from, is Ray's ``kind`` of refused token (Ray
    2.60 keeps the first try's error as text in the message of the one it raises)."""
    while error is not None:
        if isinstance(error, kind) or "InvalidAuthToken" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def with_gpus(trainer_args: Sequence[str], gpus_per_task: float, num_gpus: int) -> list[str]:
    """The trainer's flags for tasks that ask Ray for ``gpus_per_task`` GPUs each: Ray makes
    those GPUs the task's visible ones, and the trainer trains on them (``--num-gpus``, added
    when the flags leave it at ``num_gpus`` 0). The same code path as on the CPU."""
    if gpus_per_task != int(gpus_per_task):
        raise UserError(f"--gpus-per-task {gpus_per_task:g}: a trainer uses whole GPUs; give a "
                        f"whole number")
    if num_gpus and num_gpus != gpus_per_task:
        raise UserError(f"the trainer's --num-gpus {num_gpus} differs from --gpus-per-task "
                        f"{gpus_per_task:g}: each task sees only the GPUs Ray gives it; leave "
                        f"--num-gpus out")
    if gpus_per_task and not num_gpus:
        return [*trainer_args, "--num-gpus", str(int(gpus_per_task))]
    return list(trainer_args)


def forwarded(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` every task gets (``FORWARDED_PREFIXES``)."""
    return {k: v for k, v in environ.items()
            if k.startswith(FORWARDED_PREFIXES) and k not in _NOT_FORWARDED}


@dataclasses.dataclass
class Placed:
    """A task's actor and where Ray placed it."""

    actor: object
    address: str  # node:port
    node_id: str


class RayProcess:
    """A trainer process on a Ray node, seen as the launch loop sees a ``Popen``."""

    def __init__(self, actor, pid: int):
        self._ray = _ray()
        self._actor = actor
        self.pid = pid
        self._code: Optional[int] = None
        self.lost_because: Optional[str] = None  # why its actor was lost, once it was
        self._unreachable_since: Optional[float] = None

    @property
    def lost(self) -> bool:
        return self.lost_because is not None

    @property
    def unsure(self) -> bool:
        """Lost, or unreachable for now (its node may be dying)."""
        return self.lost or self._unreachable_since is not None

    def _call(self, method: str, *args):
        """The actor's answer; None while it cannot give one (``lost`` says whether for good)."""
        errors = self._ray.exceptions
        try:
            answer = self._ray.get(getattr(self._actor, method).remote(*args),
                                   timeout=_ACTOR_ANSWER_SECS)
        except errors.GetTimeoutError:
            self.lost_because = f"its actor did not answer within {_ACTOR_ANSWER_SECS} s"
        except errors.ActorUnavailableError:
            # Unreachable for now (a node that missed a heartbeat may come back); lost once Ray
            # declares it dead, or after the same bound as an unanswered call.
            now = time.monotonic()
            self._unreachable_since = self._unreachable_since or now
            if now - self._unreachable_since > _ACTOR_ANSWER_SECS:
                self.lost_because = f"its actor was unreachable for {_ACTOR_ANSWER_SECS} s"
            time.sleep(_READ_SECS)
        except errors.RayActorError as e:
            # Ray's words: "The actor died because its node has died", "... unexpectedly".
            said = sorted((line.strip() for line in str(e).splitlines() if "died" in line),
                          key=lambda line: "node" not in line)  # the node's death first
            self.lost_because = (said[0].split(" Node Id:")[0] if said
                                 else type(e).__name__)[:200]
        else:
            self._unreachable_since = None
            return answer
        return None

    @property
    def stdout(self):
        """The trainer's output lines, until it has ended."""
        while True:
            got = self._call("read")
            if got is None and self.lost:
                self._code = 1
                yield "[its Ray actor was lost: its node died or Ray stopped it]\n"
                return
            if got is None:
                continue  # unreachable for now
            lines, code = got
            yield from lines
            if code is not None:
                self._code = code
                return
            time.sleep(_READ_SECS)

    def poll(self) -> Optional[int]:
        if self._code is None:
            code = self._call("poll")
            if self.lost:
                self._code = 1  # the others' TF_CONFIG names it: the job is placed again
            elif code is not None:
                self._code = code
        return self._code

    def _send(self, signum: int) -> None:
        self._call("send", signum)

    def terminate(self) -> None:
        self._send(15)

    def kill(self) -> None:
        self._send(9)

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("ray task", timeout)
            time.sleep(_READ_SECS)
        return self._code


def place(runner_class, num_workers: int, num_ps: int, evaluator: bool, cpus: float,
          gpus: float, timeout_secs: float = PLACEMENT_TIMEOUT_SECS
          ) -> tuple[list[layout.LaunchedTask], dict[str, Placed]]:
    """Starts one actor per task, spread over the nodes, each holding a port: the tasks with
    their TF_CONFIG, and each task's actor by name. Waits up to ``timeout_secs`` for the
    cluster to have room for all of them, then says what it lacks."""
    ray = _ray()
    layout.check_sizes(num_workers, num_ps)
    remote = ray.remote(runner_class)

    def actor(task_cpus: float, task_gpus: float):
        return remote.options(num_cpus=task_cpus, num_gpus=task_gpus,
                              scheduling_strategy="SPREAD").remote()

    roles = ([("chief", 0)] + [("worker", i) for i in range(num_workers - 1)]
             + [("ps", i) for i in range(num_ps)] + ([("evaluator", 0)] if evaluator else []))
    deadline = time.monotonic() + timeout_secs
    reserved = None
    while reserved is None:
        actors = [actor(0 if kind == "ps" else cpus, 0 if kind == "ps" else gpus)
                  for kind, _ in roles]
        try:
            reserved = ray.get([a.reserve.remote() for a in actors],
                               timeout=max(0.0, deadline - time.monotonic()))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            for a in actors:
                ray.kill(a)
            if isinstance(e, ray.exceptions.GetTimeoutError) or time.monotonic() > deadline:
                raise UserError(_lacking(ray, len(actors), num_ps, cpus, gpus, timeout_secs)
                                ) from None
            # Placed on a node that died meanwhile (Ray had not declared it dead yet): again,
            # on the nodes alive now.
            time.sleep(1)
    placed = {layout.task_name(kind, i): Placed(a, f"{ip}:{port}", node)
              for (kind, i), a, (ip, port, node) in zip(roles, actors, reserved)}
    trainers = [placed[layout.task_name(k, i)].address for k, i in roles if k != "ps"
                and k != "evaluator"]
    ps = [placed[layout.task_name("ps", i)].address for i in range(num_ps)]
    cluster = layout.cluster_of(num_workers, num_ps, trainers + ps)
    return layout.tasks_of(cluster, evaluator), placed


def _lacking(ray, tasks: int, num_ps: int, cpus: float, gpus: float,
             timeout_secs: float) -> str:
    """What a cluster that could not place the job lacks, in one line."""
    total = ray.cluster_resources()  # the nodes alive now
    trainers = tasks - num_ps
    return (f"the Ray cluster placed not all {tasks} tasks within {timeout_secs:g} s: its live "
            f"nodes have {total.get('CPU', 0):g} CPUs and {total.get('GPU', 0):g} GPUs in all, "
            f"the job needs {trainers * cpus:g} CPUs and {trainers * gpus:g} GPUs ({trainers} "
            f"tasks x --cpus-per-task {cpus:g} and --gpus-per-task {gpus:g}; parameter servers "
            f"none); add nodes, or lower --cpus-per-task")


def check_shared(paths: Mapping[str, Optional[str]], placed: Mapping[str, Placed]) -> None:
    """Refuses, in one line, a local path of the job that a node does not see (see the
    module's docstring); a bucket's path is the trainers' to check."""
    ray = _ray()
    actors = list(placed.values())
    job_dir = paths.get("--job-dir")
    if job_dir and not storage.is_url(job_dir):
        os.makedirs(job_dir, exist_ok=True)
        token = secrets.token_hex(16).encode()
        probe = os.path.join(os.path.abspath(job_dir), f".shared-check-{token.decode()[:8]}")
        with open(probe, "wb") as f:
            f.write(token)
        try:
            seen = ray.get([p.actor.sees.remote(probe, token) for p in actors])
        finally:
            os.remove(probe)
        _refuse_unseen("--job-dir", job_dir, placed, seen)
    data_dir = paths.get("--data-dir")
    if data_dir and not storage.is_url(data_dir):
        metadata = os.path.join(os.path.abspath(data_dir), METADATA_FILENAME)
        if os.path.isfile(metadata):
            size = os.path.getsize(metadata)
            seen = ray.get([p.actor.sees.remote(metadata, None, size) for p in actors])
            _refuse_unseen("--data-dir", data_dir, placed, seen)


def _refuse_unseen(flag: str, path: str, placed: Mapping[str, Placed], seen: Sequence[bool]
                   ) -> None:
    blind = [name for (name, _), ok in zip(placed.items(), seen) if not ok]
    if blind:
        where = placed[blind[0]].address.rpartition(":")[0]
        raise UserError(f"{flag} {path} is not shared by the Ray cluster's nodes ({blind[0]}'s "
                        f"node, {where}, does not see it): use a bucket (s3://, gs://) or a "
                        f"folder every node mounts at the same path")


class RayActors:
    """The placement (``loop.Placement``) of tasks whose trainers run in Ray actors on a Ray
    cluster's nodes: ``placed``, each task's actor by name (``place``); a job that lost a node
    is placed again by ``place_again`` (``place`` with the job's sizes)."""

    def __init__(self, placed: Mapping[str, Placed],
                 place_again: Callable[[], tuple[list[layout.LaunchedTask], dict[str, Placed]]]):
        self.placed = dict(placed)
        self._place_again = place_again

    def line(self, addresses: Sequence[str]) -> str:
        return (f"network: the Ray cluster's nodes: the tasks listen on every interface of "
                f"their node ({', '.join(sorted(addresses))}), and TensorFlow's gRPC server "
                f"has no authentication; the cluster's network must be private "
                f"(docs/distributed.md, 'Ray')")

    def spawn(self, task: layout.LaunchedTask, trainer_args: Sequence[str],
              env: Mapping[str, str]) -> RayProcess:
        actor = self.placed[task.name].actor
        pid = _ray().get(actor.start.remote(list(trainer_args), dict(env)))
        return RayProcess(actor, pid)

    def where(self, task: layout.LaunchedTask) -> str:
        return f" on {self.placed[task.name].address.rpartition(':')[0]}"

    def in_doubt(self, task: layout.LaunchedTask) -> bool:
        return isinstance(task.process, RayProcess) and task.process.unsure

    def lost(self, task: layout.LaunchedTask) -> Optional[str]:
        if not (isinstance(task.process, RayProcess) and task.process.lost):
            return None
        placed = self.placed[task.name]
        where = f"{placed.address.rpartition(':')[0]} (node {placed.node_id[:8]})"
        return f"{task.name}'s node {where} was lost ({task.process.lost_because})"

    def place_again(self) -> list[layout.LaunchedTask]:
        tasks, self.placed = self._place_again()
        return tasks

    def summary(self) -> str:
        return summary(self.placed)

    def close(self) -> None:
        for p in self.placed.values():
            kill_actor(p)


def kill_actor(placed: Placed) -> None:
    """Ends a task's actor (and with it its trainer, ``ray_node``), lost or not."""
    _ray().kill(placed.actor)


def summary(placed: Mapping[str, Placed]) -> str:
    nodes = {p.node_id for p in placed.values()}
    return (f"placed {len(placed)} tasks on {len(nodes)} Ray node(s): "
            + json.dumps({name: p.address for name, p in placed.items()}))

