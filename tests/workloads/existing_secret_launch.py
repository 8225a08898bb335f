"""``supervisor launch`` on the local platform, with the job token provided by the platform.

What the Kubernetes platform does with ``token.existingSecret`` (a Secret kept across releases,
the GitOps way): every run of the job has the same token, read from ``WIRE_TOKEN_FILE``, and
the ranks read it from there too (as pods get it through ``secretKeyRef``). The controller, the
ranks and the wire are the real ones; only where the token comes from is the Kubernetes way.
"""

import os
import sys
from pathlib import Path

from supervisor.platforms.local import LocalPlatform
from supervisor.protocol import Env, token_problem


def job_token(self) -> bytes:
    token = Path(os.environ["WIRE_TOKEN_FILE"]).read_bytes().strip()
    if token_problem(token):
        raise SystemExit(f"WIRE_TOKEN_FILE: {token_problem(token)}")
    return token


def token_env(self, token_path: Path) -> dict[str, str]:
    return {Env.TOKEN_FILE: os.environ["WIRE_TOKEN_FILE"]}


LocalPlatform.job_token = job_token
LocalPlatform.token_env = token_env

from supervisor.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
