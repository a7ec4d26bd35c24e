"""The accuracy gate of converted files: each file evaluated by its own runtime beside the
SavedModel it was converted from, on the same pictures, and kept only if it loses at most the
allowed number of points.

One ordered pass over a split of a records folder (the eval split, for the convert command)
feeds every batch to the SavedModel and to every candidate, so all see the same pictures in the
same batches; the pipeline's padding rows weigh 0, as in ``offline.evaluate``. Per candidate:
accuracy, its difference from the SavedModel's in points (percentage points, negative for a
loss), and the share of pictures whose top class agrees with the SavedModel's.
"""

import dataclasses
from typing import Callable, Mapping

import numpy as np

from cifar10_estimator.data import metadata
from cifar10_estimator.data.pipeline import Cifar10DataSet


@dataclasses.dataclass(frozen=True)
class Reading:
    """One candidate's figures beside the reference's."""

    accuracy: float  # 0..1
    delta_points: float  # (accuracy - reference accuracy) * 100
    agreement: float  # 0..1: top class equal to the reference's

    def kept(self, max_drop_points: float) -> bool:
        # Rounded to the hundredth of a point shown, so the table and the verdict agree.
        return round(-self.delta_points, 2) <= max_drop_points


def side_by_side(reference: Callable, candidates: Mapping[str, Callable], data_dir: str,
                 split: str, batch_size: int = 100) -> tuple[float, int, dict[str, Reading]]:
    """The reference's accuracy, the pictures counted, and each candidate's ``Reading``.

    ``reference`` and each candidate map float32 [B, 32, 32, 3] pictures (0..255) to [B, C]
    probabilities (a tensor or an array).
    """
    data = Cifar10DataSet(data_dir, split, use_distortion=False)
    metadata.verify_split(data_dir, split)
    correct = dict.fromkeys(candidates, 0.0)
    agreeing = dict.fromkeys(candidates, 0.0)
    reference_correct = counted = 0.0
    for features, labels in data.one_pass(batch_size):
        images = features["image"].numpy()
        weight, labels = features["weight"].numpy(), labels.numpy()
        expected = np.asarray(reference(images)).argmax(axis=1)
        reference_correct += float(np.sum((expected == labels) * weight))
        counted += float(weight.sum())
        for name, candidate in candidates.items():
            found = np.asarray(candidate(images)).argmax(axis=1)
            correct[name] += float(np.sum((found == labels) * weight))
            agreeing[name] += float(np.sum((found == expected) * weight))
    total = max(counted, 1.0)
    accuracy = reference_correct / total
    readings = {name: Reading(correct[name] / total,
                              (correct[name] / total - accuracy) * 100.0,
                              agreeing[name] / total)
                for name in candidates}
    return accuracy, int(counted), readings
