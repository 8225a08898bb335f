"""Run ``examples/train.py`` with the supervisor's addresses swapped for a recording proxy's.

The rank's environment names the controller (``SUPERVISOR_HEARTBEAT_ADDR``, ``SUPERVISOR_API``);
``WIRE_PROXY_UDP`` and ``WIRE_PROXY_HTTP`` replace them before the worker SDK reads them, so
every datagram and HTTP request between this rank and its controller crosses the proxy (what an
attacker on the network path sees, and can send from). Nothing else changes: the training
script, the SDK and the controller are the real ones.
"""

import os
import runpy
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"

os.environ["SUPERVISOR_HEARTBEAT_ADDR"] = os.environ["WIRE_PROXY_UDP"]
os.environ["SUPERVISOR_API"] = os.environ["WIRE_PROXY_HTTP"]
sys.argv = [str(TRAIN), *sys.argv[1:]]
runpy.run_path(str(TRAIN), run_name="__main__")
