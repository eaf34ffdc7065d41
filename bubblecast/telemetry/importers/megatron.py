"""Import Megatron-LM timer traces (the ``megatron-ops`` format of SPEC §3).

One row per timer op with columns ``dp_rank``, ``stage``, ``rank``, ``step``, ``optype``,
``start_ts``, ``duration``, ``seq_id``, ``mc``, ``gmc``, ``mb_id``. Parallel sizes come from a
``meta-*.yaml`` beside the trace when there is one, else from the data.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from bubblecast.errors import BubblecastError
from bubblecast.telemetry.events import Events
from bubblecast.telemetry.importers.fixes import InputFixes
from bubblecast.telemetry.schema import RunMeta
from bubblecast.telemetry.validate import validate_frame

COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "mb_id", "mc")

#: Megatron optype -> SPEC op. Anything else becomes OTHER (kept, never dropped).
OPTYPE_TO_OP: dict[str, str] = {
    "forward-compute": "F",
    "backward-compute": "B",
    "forward-send": "SEND_F",
    "forward-recv": "RECV_F",
    "backward-send": "SEND_B",
    "backward-recv": "RECV_B",
    "optimizer": "OPTIMIZER",
    "grads-reduce-scatter": "ALLREDUCE",
    "params-all-gather": "ALLREDUCE",
    "embedding-grads-all-reduce": "ALLREDUCE",
    "layernorm-grads-all-reduce": "ALLREDUCE",
    "grads-all-reduce": "ALLREDUCE",
}
_P2P = {"SEND_F", "RECV_F", "SEND_B", "RECV_B"}


def looks_like(columns: list[str]) -> bool:
    return {"optype", "start_ts", "duration", "dp_rank"} <= set(columns)


def read_sidecar_meta(path: Path, pattern: str = r"trace-(.*)\.parquet$") -> dict[str, object]:
    """Parse the ``meta-<trial>.yaml`` beside ``path`` (flat ``key: value`` lines).

    ``pattern`` extracts the trial name from the file name (``trace-<trial>.parquet`` here,
    ``timeline-<trial>.json.gz`` for timelines); no match or no sidecar gives ``{}``.
    """
    match = re.match(pattern, path.name)
    if not match:
        return {}
    meta_path = path.with_name(f"meta-{match.group(1)}.yaml")
    if not meta_path.exists():
        return {}
    out: dict[str, object] = {}
    for line in meta_path.read_text().splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            value = value.strip()
            out[key.strip()] = int(value) if value.lstrip("-").isdigit() else value
    return out


def read_megatron(path: str | Path) -> Events:
    """Read a Megatron-LM ops trace into validated :class:`Events`."""
    path = Path(path)
    try:
        # ParquetFile, not read_table: one file needs no pyarrow.dataset (an import per command)
        with pq.ParquetFile(path, page_checksum_verification=True) as file:
            raw = file.read().to_pandas()
    except Exception as exc:
        raise BubblecastError(f"{path}: not a readable Parquet file ({exc})") from None
    for col in COLUMNS:
        if col not in raw.columns:
            raise BubblecastError(f"{path}: column '{col}': missing (megatron-ops format)")
    meta = read_sidecar_meta(path)
    run_id = str(meta.get("trial_name", path.stem))
    optype = raw["optype"].astype(str)
    op = optype.map(OPTYPE_TO_OP).fillna("OTHER")
    is_compute = op.isin(["F", "B"]).to_numpy()
    is_p2p = op.isin(list(_P2P)).to_numpy()
    vpp = int(meta.get("vpp_size", int(raw["mc"].max()) + 1) or 1)
    mb = np.where(is_compute, raw["mb_id"].to_numpy(np.int64), -1)
    if vpp == 1 and "seq_id" in raw.columns:
        mb = np.where(is_p2p, raw["seq_id"].to_numpy(np.int64), mb)
    chunk = np.where(is_compute, raw["mc"].to_numpy(np.int64), 0).clip(min=0)
    fixes = InputFixes(str(path))
    duration = fixes.clamp(raw["duration"].to_numpy(np.float64),
                           lambda i: f"column 'duration', row {i}")
    frame = pd.DataFrame({
        "run_id": run_id,
        "step": raw["step"].astype("int64"),
        "rank": raw["rank"].astype("int32"),
        "stage": raw["stage"].astype("int32"),
        "replica": raw["dp_rank"].astype("int32"),
        "chunk": chunk.astype("int32"),
        "microbatch": mb.astype("int32"),
        "op": op.to_numpy(),
        "start_s": raw["start_ts"].astype("float64"),
        "duration_s": duration,
        "name": optype.to_numpy(),
    })
    frame = frame.sort_values(["step", "rank", "start_s"], kind="stable").reset_index(drop=True)
    microbatches = int(raw.loc[is_compute, "mb_id"].max()) + 1 if is_compute.any() else 1
    stages = int(meta.get("pp_size", int(frame["stage"].max()) + 1))
    runs = {run_id: RunMeta(
        schedule="interleaved" if vpp > 1 else "1f1b",
        stages=stages,
        microbatches=max(microbatches, int(frame["microbatch"].max()) + 1),
        chunks=vpp,
        replicas=int(meta.get("dp_size", int(frame["replica"].max()) + 1)),
        partition=None,
        source="megatron-ops",
        extra={**{k: v for k, v in meta.items() if k.endswith("_size")},
               "timing": "host", "granularity": "op"},
    )}
    fixes.record(runs[run_id].extra)
    return Events(validate_frame(frame, runs, str(path)), runs)
