"""Inside one task of a cluster: what a trainer process does because other tasks exist.
``TF_CONFIG`` checked and parsed into its role (``tf_config``), the other tasks' waits, device
filters and parameter servers (``peers``), the all-reduce strategies and what keeps a
multi-worker job whole (``allreduce``), and the evaluator task's loop (``evaluator``).

Everything here lives and dies with one trainer process; starting the tasks is ``launch``'s.
"""
