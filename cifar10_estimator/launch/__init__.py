"""Launching a cluster's tasks, for as long as the job runs: where they are and listen
(``layout``: the network, the ports, each task's ``TF_CONFIG``), the loop that starts, watches,
restarts and stops them (``loop``), and where their processes run: this host, or Ray actors
on a Ray cluster's nodes (``ray_actors``, with ``ray_node``, what each actor runs there).

The ``cluster`` command drives it; each task it starts is a trainer process (``task`` is
what runs inside one). No TensorFlow here.
"""
