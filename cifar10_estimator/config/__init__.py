"""The one home of every setting: its declaration and metadata (``fields``, ``settings``),
the models' and recipes' overlays on the defaults (``overlays``), the checks (``checks``) and the
trainer's command line (``flags``). No TensorFlow here."""
