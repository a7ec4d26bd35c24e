"""Sweeps, for as long as a sweep runs: its trials and their records (``records``: the grid,
the names and job dirs, ``sweep.json`` and ``JOB/trial.json``, what a rerun skips, the best
trial), the trials run by Ray Tune on the driver's side (``tuner``) and on the nodes'
(``trainable``: each trial a trainer process), and TensorBoard's HParams summaries
(``hparams``).

The ``sweep`` command drives it.
"""
