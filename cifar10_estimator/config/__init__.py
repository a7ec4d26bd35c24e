"""The one home of every setting: its declaration and metadata (``fields``, ``settings``),
the models' and recipes' overlays on the defaults (``overlays``), the checks (``checks``), the
trainer's command line (``flags``), a task's role in its cluster (``role``) and the plan
resolved from all of them, once (``plan``). No TensorFlow here."""
