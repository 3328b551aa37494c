"""Reading a LeRobotDataset v3.0 folder (LeRobot's own, or our export) without LeRobot: parquet + PyAV video.

folder = DatasetFolder("path/to/dataset")     # DatasetError for another version or a broken folder
folder.cameras, folder.state_names, folder.action_names, folder.fps, folder.episodes
for frame in folder.frames(episode_index):    # DatasetFrame: timestamp, images, state, action, task
    ...
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omni_ros.dataset import lerobot_format as fmt
from omni_ros.dataset.video import VideoError, read_frames
from omni_ros.dataset.writer import DatasetError


@dataclass
class DatasetFrame:
    timestamp: float
    images: dict[str, np.ndarray]
    state: np.ndarray
    action: np.ndarray
    task: str


@dataclass
class DatasetEpisode:
    index: int
    length: int
    start: int  # global index of its first frame
    videos: dict[str, tuple[Path, float]]  # camera -> (file, from_timestamp)


class DatasetFolder:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        info_path = self.root / fmt.INFO_PATH
        if not info_path.is_file():
            raise DatasetError(f"dataset {self.root}: no {fmt.INFO_PATH}; not a LeRobotDataset folder")
        try:
            self.info: dict[str, Any] = json.loads(info_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise DatasetError(f"dataset {self.root}: unreadable {fmt.INFO_PATH}: {exc}") from exc
        version = str(self.info.get("codebase_version", "?"))
        if version != fmt.CODEBASE_VERSION:
            raise DatasetError(
                f"dataset {self.root} is LeRobotDataset {version}; omni_ros reads {fmt.CODEBASE_VERSION} "
                f"(convert older datasets with LeRobot's `lerobot.datasets.v30.convert_dataset_v21_to_v30`)"
            )
        self.fps = float(self.info["fps"])
        features: dict[str, dict[str, Any]] = self.info["features"]
        self.features = features
        for key in (fmt.STATE, fmt.ACTION):
            if key not in features:
                raise DatasetError(f"dataset {self.root}: no '{key}' feature (features: {', '.join(features)})")
        images = [k for k, v in features.items() if v["dtype"] in ("video", "image")]
        stored = [k for k in images if features[k]["dtype"] == "image"]
        if stored:
            raise DatasetError(f"dataset {self.root}: image features stored in parquet ({stored}) are not read yet")
        if not images:
            raise DatasetError(f"dataset {self.root}: no camera (observation.images.*) features")
        self.camera_keys = images
        self.cameras = [k.removeprefix(fmt.IMAGE_PREFIX) for k in images]
        self.state_names = self._names(fmt.STATE)
        self.action_names = self._names(fmt.ACTION)
        self.tasks = self._tasks()
        self.episodes = self._episodes()
        self._data: dict[str, np.ndarray] | None = None

    def _names(self, key: str) -> list[str]:
        ft = self.features[key]
        names = ft.get("names")
        dims = int(ft["shape"][0])
        if isinstance(names, dict):  # older LeRobot: {"motors": [...]}
            names = next(iter(names.values()), None)
        if isinstance(names, list) and len(names) == dims and all(isinstance(n, str) for n in names):
            return list(names)
        return []

    def _read_parquets(self, folder: Path) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        paths = sorted(folder.glob("*/*.parquet"))
        if not paths:
            raise DatasetError(f"dataset {self.root}: no parquet files under {folder.relative_to(self.root)}")
        try:
            tables = [pq.read_table(p) for p in paths]
        except Exception as exc:
            raise DatasetError(f"dataset {self.root}: unreadable parquet in {folder}: {exc}") from exc
        return pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]

    def _tasks(self) -> dict[int, str]:
        import pyarrow.parquet as pq

        path = self.root / fmt.TASKS_PATH
        if not path.is_file():
            raise DatasetError(f"dataset {self.root}: no {fmt.TASKS_PATH}")
        table = pq.read_table(path).to_pydict()
        return {int(i): str(t) for i, t in zip(table["task_index"], table["task"], strict=True)}

    def _episodes(self) -> list[DatasetEpisode]:
        table = self._read_parquets(self.root / "meta" / "episodes")
        columns = [c for c in table.column_names if not c.startswith("stats/")]
        rows = table.select(columns).to_pylist()
        episodes = []
        for row in sorted(rows, key=lambda r: r["episode_index"]):
            videos = {}
            for key, cam in zip(self.camera_keys, self.cameras, strict=True):
                path = self.root / str(self.info["video_path"]).format(
                    video_key=key,
                    chunk_index=row[f"videos/{key}/chunk_index"],
                    file_index=row[f"videos/{key}/file_index"],
                )
                videos[cam] = (path, float(row[f"videos/{key}/from_timestamp"]))
            episodes.append(
                DatasetEpisode(int(row["episode_index"]), int(row["length"]), int(row["dataset_from_index"]), videos)
            )
        return episodes

    def data(self) -> dict[str, np.ndarray]:
        """The frame table by global index: state, action, timestamp, task_index, episode_index."""
        if self._data is None:
            table = self._read_parquets(self.root / "data")
            cols = table.to_pydict()
            order = np.argsort(np.asarray(cols["index"]), kind="stable")
            self._data = {
                "index": np.asarray(cols["index"], dtype=np.int64)[order],
                "state": np.asarray(cols[fmt.STATE], dtype=np.float32)[order],
                "action": np.asarray(cols[fmt.ACTION], dtype=np.float32)[order],
                "timestamp": np.asarray(cols["timestamp"], dtype=np.float64)[order],
                "task_index": np.asarray(cols["task_index"], dtype=np.int64)[order],
            }
        return self._data

    def episode(self, index: int) -> DatasetEpisode:
        for ep in self.episodes:
            if ep.index == index:
                return ep
        raise DatasetError(f"dataset {self.root}: no episode {index} (it has {len(self.episodes)}: 0..)")

    def frames(self, index: int) -> Iterator[DatasetFrame]:
        """Episode `index` frame by frame, video decoded on the way (VideoError/DatasetError if incomplete)."""
        ep = self.episode(index)
        data = self.data()
        rows = np.searchsorted(data["index"], np.arange(ep.start, ep.start + ep.length))
        if len(rows) != ep.length or not np.array_equal(data["index"][np.minimum(rows, len(data["index"]) - 1)],
                                                        np.arange(ep.start, ep.start + ep.length)):  # fmt: skip
            raise DatasetError(f"dataset {self.root}: episode {index} lacks rows in data/")
        streams = {}
        for cam, (path, start) in ep.videos.items():
            if not path.is_file():
                raise DatasetError(f"dataset {self.root}: episode {index}: missing video {path.relative_to(self.root)}")
            streams[cam] = read_frames(path, start, ep.length, self.fps)
        try:
            for row in rows:
                images = {cam: next(stream) for cam, stream in streams.items()}
                yield DatasetFrame(
                    float(data["timestamp"][row]),
                    images,
                    data["state"][row],
                    data["action"][row],
                    self.tasks.get(int(data["task_index"][row]), ""),
                )
        except StopIteration as exc:
            raise DatasetError(f"dataset {self.root}: episode {index}: video shorter than its frames") from exc
        except VideoError as exc:
            raise DatasetError(f"dataset {self.root}: episode {index}: {exc}") from exc
