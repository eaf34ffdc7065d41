"""Launch a 2-rank torchrun job many times beside busy loops and count the ranks that died.

The gloo exit race (:mod:`bubblecast.runtime.shutdown`) shows only under CPU contention, a few
times in ten launches; this is the command behind README's "2 aborts in 13 runs before, 0 in
30 after" (run before and after the fix on ``tests/runtime/test_record.py``'s job):

    python tools/stress_launch.py [--runs 30] [--hogs 2] [--script tests/runtime/test_record.py]

Prints one line per launch (exit code, and the failure when there is one) and a total.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--hogs", type=int, default=2, help="busy-loop processes beside the job")
    ap.add_argument("--script", default=str(ROOT / "tests" / "runtime" / "test_record.py"))
    ap.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    from bubblecast.runtime.launch import failure_message, launch

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.hogs)]
    failed = 0
    try:
        for i in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory(prefix="stress-launch-") as tmp:
                code = launch(tmp, 2, script=args.script, timeout=args.timeout)
                why = failure_message(tmp) if code else ""
            failed += code != 0
            print(f"{i:3d} exit {code} {why}".rstrip(), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    print(f"{failed} of {args.runs} launches failed ({args.hogs} busy loops beside them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
