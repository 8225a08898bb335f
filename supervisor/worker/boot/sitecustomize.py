"""Run at the start of every interpreter whose ``PYTHONPATH`` holds this directory: the node
agent puts it there for ranks it starts as new interpreters (forking off, or not possible), so
that a rank whose script never imports the worker SDK is still watched
(:func:`supervisor.worker.instrument.install`: only in the agent's own children, only when
wanted). Then the ``sitecustomize`` this file shadows, if the interpreter has one, runs as it
would have. Nothing here may fail the rank: an interpreter without the supervisor package is
left alone."""


def _chain() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _install() -> None:
    try:
        from supervisor.worker import instrument
    except ImportError:
        return
    instrument.install()


try:
    _install()
finally:
    _chain()
