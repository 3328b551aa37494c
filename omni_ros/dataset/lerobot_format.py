"""The LeRobotDataset v3.0 layout as LeRobot 0.6.1 writes and reads it (checked against folders it wrote).

    meta/info.json                                  codebase_version "v3.0", fps, features, totals, paths
    meta/stats.json                                 per feature: min max mean std count q01 q10 q50 q90 q99
    meta/tasks.parquet                              task (pandas index) -> task_index
    meta/episodes/chunk-000/file-000.parquet        one row per episode: length, frame range, video ranges, stats
    data/chunk-000/file-000.parquet                 one row per frame: state, action, timestamp, indices
    videos/<key>/chunk-000/file-000.mp4             one stream per camera, episodes one after the other

Only names and shapes live here; omni_ros/dataset/writer.py writes them, reader.py reads them.
"""

from __future__ import annotations

import json
from typing import Any

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_FILE_SIZE_MB = 100
VIDEO_FILE_SIZE_MB = 200
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"

STATE = "observation.state"
ACTION = "action"
IMAGE_PREFIX = "observation.images."
# The columns every LeRobot dataset has, in LeRobot's order (after the user's features).
DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def image_key(camera: str) -> str:
    """The feature a LeRobot policy reads camera `camera` from."""
    return IMAGE_PREFIX + camera


def next_file(chunk: int, file: int) -> tuple[int, int]:
    """The (chunk, file) after this one: CHUNKS_SIZE files per chunk folder."""
    return (chunk + 1, 0) if file == CHUNKS_SIZE - 1 else (chunk, file + 1)


def hf_features(features: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `datasets.Features` JSON LeRobot's parquet files carry (schema metadata b"huggingface")."""
    out: dict[str, Any] = {}
    for key, ft in features.items():
        if ft["dtype"] == "video":
            continue
        if list(ft["shape"]) == [1]:
            out[key] = {"dtype": ft["dtype"], "_type": "Value"}
        else:
            out[key] = {"feature": {"dtype": ft["dtype"], "_type": "Value"}, "length": ft["shape"][0], "_type": "List"}
    return {"info": {"features": out}}


def tasks_pandas_metadata(pyarrow_version: str) -> bytes:
    """pandas metadata that makes `pd.read_parquet(meta/tasks.parquet)` index by task, as LeRobot expects."""
    doc = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pyarrow_version},
        "pandas_version": "2.3.3",
    }
    return json.dumps(doc).encode()
