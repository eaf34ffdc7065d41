"""Run the real service (uvicorn) on a fake model directory: ``python -m tests.serve.serve_fake
--dir D --port P [--token T] [--watch S]``. Used by the tests that need a separate process."""

from __future__ import annotations

import argparse

import uvicorn

from bubblecast.serve.app import ServeConfig, create_app
from bubblecast.serve.predictor import Predictor
from tests.serve.fakes import load_fake


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token", default=None)
    ap.add_argument("--watch", type=float, default=None)
    args = ap.parse_args()
    predictor = Predictor.from_source(args.dir, loader=load_fake)
    config = ServeConfig(token=args.token, watch_interval_s=args.watch)
    uvicorn.run(create_app(predictor, config=config), host="127.0.0.1", port=args.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
