"""A learner that goes through the phases of a deep-learning job, for right-sizing (docs/jobs.md, "Right-sizing").

    python scripts/workloads/phased_learner.py --scale 1.0 --epochs 2 --mem-mib 300

Per epoch (memory as a share of --mem-mib): load data (1/4, little CPU), train (all of it, every worker busy),
evaluate (1/2 plus the data, one busy core), checkpoint (write the 1/2 to a file, mostly I/O wait). Durations
are `--scale` seconds times the phase's weight, so a test can run one in a couple of seconds. Uses only the
standard library: it runs anywhere the agent runs a command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

PAGE = 4096


def touch(buf: bytearray) -> None:
    for i in range(0, len(buf), PAGE):
        buf[i] = 1


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="seconds per unit of phase length (default 1)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--mem-mib", type=int, default=300, help="the training buffer (default 300 MiB)")
    p.add_argument("--workers", type=int, default=2, help="busy processes while training (default 2)")
    p.add_argument("--out", default="checkpoint.bin", help="checkpoint file (default ./checkpoint.bin)")
    a = p.parse_args()
    if not (0 < a.scale <= 600 and 1 <= a.epochs <= 100 and 1 <= a.mem_mib <= 65536 and 1 <= a.workers <= 64):
        p.error("--scale 0-600, --epochs 1-100, --mem-mib 1-65536, --workers 1-64")
    mib = 1024 * 1024
    size = a.mem_mib * mib
    for epoch in range(a.epochs):
        print(f"epoch {epoch}: load", flush=True)
        data = bytearray(size // 4)                 # load: a batch of data read in, little CPU
        touch(data)
        time.sleep(3 * a.scale)
        print(f"epoch {epoch}: train", flush=True)
        model = bytearray(size)                     # train: model, activations, optimizer state; busy workers
        touch(model)
        # Busy workers in fresh interpreters (small, and sharing no pages with this one: summed RSS stays true).
        code = f"import time\nend = time.monotonic() + {6 * a.scale}\nwhile time.monotonic() < end: sum(range(1000))"
        workers = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(a.workers)]
        for w in workers:
            w.wait()
        print(f"epoch {epoch}: evaluate", flush=True)
        del model                                   # evaluate: activations freed, a smaller model copy, one core
        model = bytearray(size // 2)
        touch(model)
        spin(2 * a.scale)
        print(f"epoch {epoch}: checkpoint", flush=True)
        with open(Path(a.out), "wb") as f:          # checkpoint: write the weights out, mostly waiting on I/O
            for i in range(0, len(model), 8 * mib):
                f.write(model[i:i + 8 * mib])
            f.flush()
            with contextlib.suppress(OSError):   # /dev/null and pipes cannot be synced
                os.fsync(f.fileno())
        del model, data
        time.sleep(1 * a.scale)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
