"""`python -m gpurm.am`: the per-job ApplicationMaster, started by an agent as the job's AM container.

It reads GPURM_RM (the RM, or an active/standby list HOST:PORT,HOST:PORT: the agent passes its own agent.yaml rm),
GPURM_JOB_ID, GPURM_AM_ATTEMPT and GPURM_AM_TOKEN from its environment, and, where the
cluster uses mTLS, GPURM_TLS_CA / GPURM_TLS_CERT / GPURM_TLS_KEY (the agent that starts it passes its node's).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from gpurm.am.runner import RM_RETRY_FOR_S, AMRunner
from gpurm.common.fields import ConfigError
from gpurm.common.rmlist import parse_rm_list
from gpurm.common.textsafe import setup_logging
from gpurm.common.tls import tls_from_env


def main() -> int:
    setup_logging(logging.INFO)
    missing = [v for v in ("GPURM_RM", "GPURM_JOB_ID", "GPURM_AM_ATTEMPT", "GPURM_AM_TOKEN") if not os.environ.get(v)]
    if missing:
        sys.stderr.write(f"gpurm.am: missing environment {', '.join(missing)}; the AM is started by a node agent "
                         "on the RM's behalf, not by hand\n")
        return 2
    try:
        tls_config = tls_from_env()
    except ConfigError as exc:
        sys.stderr.write(f"gpurm.am: {'; '.join(exc.problems)}\n")
        return 2
    try:
        rms = parse_rm_list(os.environ["GPURM_RM"])
    except ValueError as exc:
        sys.stderr.write(f"gpurm.am: GPURM_RM: {exc}\n")
        return 2
    try:
        retry_for = float(os.environ.get("GPURM_AM_RETRY_FOR") or RM_RETRY_FOR_S)
    except ValueError:
        sys.stderr.write(f"gpurm.am: GPURM_AM_RETRY_FOR: expected seconds, got {os.environ['GPURM_AM_RETRY_FOR']!r}\n")
        return 2
    runner = AMRunner(rms, os.environ["GPURM_JOB_ID"], int(os.environ["GPURM_AM_ATTEMPT"]),
                      os.environ["GPURM_AM_TOKEN"], tls_config, rm_retry_for=retry_for)

    async def run() -> int:
        task = asyncio.ensure_future(runner.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            logging.getLogger("gpurm.am").info("AM stopped by signal")
            return 143

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
