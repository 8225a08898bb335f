"""elastic-supervisor: keeps long distributed PyTorch training jobs alive.

The package is layered (see ``.importlinter``):

* ``supervisor.checkpoint``: the checkpoint library (continuation state, two-phase commit,
  verified discovery). Knows nothing of the controller, the worker SDK or any platform.
* ``supervisor.worker``: what a training script imports.
* ``supervisor.cli``: the ``supervisor`` command.
"""

__version__ = "0.1.0"
