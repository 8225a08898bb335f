"""Where nodes run. Only this package starts, signals or inspects processes and schedulers."""

from supervisor.platforms.base import NodeState, NodeStatus, Platform, PlatformError

__all__ = ["NodeState", "NodeStatus", "Platform", "PlatformError"]
