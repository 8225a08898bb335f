"""The Kubernetes platform's own package: the only code that imports the ``kubernetes`` client.

Everything here wraps the client's errors at the edge (``PlatformError`` for the rest of the
supervisor), so the controller never meets an ``ApiException``; ``.importlinter`` holds the
rule. Today it holds the Lease-based leader elector (:mod:`supervisor.platforms.kube.lease`).
"""
