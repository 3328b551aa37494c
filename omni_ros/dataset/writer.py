"""Writing a LeRobotDataset v3.0 folder frame by frame, with LeRobot 0.6.1's file layout, schemas and stats.

    writer = DatasetWriter(root, fps=30, cameras=["base", "wrist"], joint_names=[...])
    writer.start_episode()
    writer.add_frame({"base": rgb, "wrist": rgb}, state, action, task="reach the red block")
    writer.end_episode()
    writer.finish()          # meta/*, the data parquet; videos were encoded while frames came in

Images go straight into each camera's encoder, so memory does not grow with the recording. Image stats need
frames picked evenly over the whole episode (known only at its end), so each frame's stats thumbnail is
appended to a scratch file and the picked ones are read back when the episode ends.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from omni_ros.dataset import lerobot_format as fmt
from omni_ros.dataset import stats as st
from omni_ros.dataset.video import VideoSettings, VideoWriter
from omni_ros.errors import OmniRosError


class DatasetError(OmniRosError):
    """A dataset cannot be written or read (the CLI prints one line and exits 2)."""


class _Camera:
    def __init__(self, name: str) -> None:
        self.name = name
        self.key = fmt.image_key(name)
        self.shape: tuple[int, int, int] | None = None
        self.writer: VideoWriter | None = None
        self.chunk, self.file = 0, 0
        self.file_frames = 0  # frames already in the open file, before this episode
        self.scratch: Any = None  # the episode's stats thumbnails
        self.thumb_shape: tuple[int, ...] | None = None


class DatasetWriter:
    def __init__(
        self,
        root: Path,
        fps: int,
        cameras: list[str],
        joint_names: list[str],
        settings: VideoSettings | None = None,
        robot_type: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.fps = int(fps)
        self.joint_names = list(joint_names)
        self.settings = settings or VideoSettings()
        self.robot_type = robot_type
        self.cameras = [_Camera(c) for c in cameras]
        self.tasks: dict[str, int] = {}
        self.columns: dict[str, list] = {k: [] for k in (fmt.STATE, fmt.ACTION, *fmt.DEFAULT_FEATURES)}
        self.episodes: list[dict[str, Any]] = []
        self.stats: dict[str, st.Stats] | None = None
        self.total_frames = 0
        self._episode: dict[str, Any] | None = None
        (self.root / "meta").mkdir(parents=True, exist_ok=True)

    # ----- episodes -------------------------------------------------------------------------------------------

    def start_episode(self) -> None:
        self._episode = {"states": [], "actions": [], "tasks": [], "frames": 0}
        for cam in self.cameras:
            cam.scratch = None

    def add_frame(self, images: dict[str, np.ndarray], state: np.ndarray, action: np.ndarray, task: str) -> None:
        ep = self._episode
        assert ep is not None, "start_episode() first"
        for cam in self.cameras:
            image = images[cam.name]
            shape = (int(image.shape[0]), int(image.shape[1]), int(image.shape[2]) if image.ndim == 3 else 1)
            if cam.shape is None:
                if shape[2] != 3:
                    raise DatasetError(f"camera '{cam.name}': frames of {shape[2]} channels; RGB expected")
                cam.shape = shape
            elif shape != cam.shape:
                raise DatasetError(
                    f"camera '{cam.name}' changed size from {cam.shape[1]}x{cam.shape[0]} to {shape[1]}x{shape[0]} "
                    f"(frame {ep['frames']} of the episode); one dataset feature has one shape"
                )
            if cam.writer is None:
                cam.writer = VideoWriter(self._video_path(cam), shape[1], shape[0], self.fps, self.settings)
            cam.writer.add(image)
            thumb = np.ascontiguousarray(st.downsample(image))
            if cam.scratch is None:
                cam.thumb_shape = thumb.shape
                cam.scratch = open(self.root / f".stats-{cam.name}.raw", "wb")  # noqa: SIM115  (closed at episode end)
            cam.scratch.write(thumb.tobytes())
        ep["states"].append(np.asarray(state, dtype=np.float32))
        ep["actions"].append(np.asarray(action, dtype=np.float32))
        ep["tasks"].append(task)
        ep["frames"] += 1

    def end_episode(self) -> int:
        """Close the episode; its length (an episode without frames leaves no trace)."""
        ep, self._episode = self._episode, None
        assert ep is not None, "start_episode() first"
        n = ep["frames"]
        if n == 0:
            return 0
        index = len(self.episodes)
        for task in ep["tasks"]:
            self.tasks.setdefault(task, len(self.tasks))
        frame_index = np.arange(n, dtype=np.int64)
        timestamps = np.array([i / self.fps for i in range(n)], dtype=np.float64)
        columns = {
            fmt.STATE: np.stack(ep["states"]),
            fmt.ACTION: np.stack(ep["actions"]),
            "timestamp": timestamps,
            "frame_index": frame_index,
            "episode_index": np.full((n,), index, dtype=np.int64),
            "index": np.arange(self.total_frames, self.total_frames + n, dtype=np.int64),
            "task_index": np.array([self.tasks[t] for t in ep["tasks"]], dtype=np.int64),
        }
        episode_stats: dict[str, st.Stats] = {}
        row: dict[str, Any] = {
            "episode_index": index,
            "tasks": list(dict.fromkeys(ep["tasks"])),
            "length": n,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": self.total_frames,
            "dataset_to_index": self.total_frames + n,
        }
        for cam in self.cameras:
            assert cam.writer is not None and cam.thumb_shape is not None
            cam.scratch.close()
            path = self.root / f".stats-{cam.name}.raw"
            thumbs = np.memmap(path, dtype=np.uint8, mode="r", shape=(n, *cam.thumb_shape))
            episode_stats[cam.key] = st.image_stats([thumbs[i] for i in st.image_sample_indices(n)])
            del thumbs
            path.unlink()
            start = cam.file_frames / self.fps
            row[f"videos/{cam.key}/chunk_index"] = cam.chunk
            row[f"videos/{cam.key}/file_index"] = cam.file
            row[f"videos/{cam.key}/from_timestamp"] = start
            row[f"videos/{cam.key}/to_timestamp"] = start + n / self.fps
            cam.file_frames += n
            if cam.writer.size_bytes >= fmt.VIDEO_FILE_SIZE_MB * 1024**2:  # the next episode opens a new file
                cam.writer.close()
                cam.writer = None
                cam.chunk, cam.file = fmt.next_file(cam.chunk, cam.file)
                cam.file_frames = 0
        episode_stats[fmt.STATE] = st.vector_stats(columns[fmt.STATE])
        episode_stats[fmt.ACTION] = st.vector_stats(columns[fmt.ACTION])
        for key in fmt.DEFAULT_FEATURES:
            episode_stats[key] = st.scalar_stats(columns[key])
        for key, values in columns.items():
            self.columns[key].append(values)
        for feature, feature_stats in episode_stats.items():
            for stat, value in feature_stats.items():
                row[f"stats/{feature}/{stat}"] = np.asarray(value).tolist()
        row["meta/episodes/chunk_index"] = 0
        row["meta/episodes/file_index"] = 0
        self.episodes.append(row)
        self.stats = st.merge_episode(self.stats, episode_stats)
        self.total_frames += n
        return n

    # ----- the end --------------------------------------------------------------------------------------------

    def features(self) -> dict[str, dict[str, Any]]:
        features: dict[str, dict[str, Any]] = {}
        for cam in self.cameras:
            assert cam.shape is not None
            h, w, c = cam.shape
            features[cam.key] = {
                "dtype": "video",
                "shape": [h, w, c],
                "names": ["height", "width", "channels"],
                "info": self.settings.info(w, h, self.fps),
            }
        dims = len(self.joint_names)
        features[fmt.STATE] = {"dtype": "float32", "shape": [dims], "names": list(self.joint_names)}
        features[fmt.ACTION] = {"dtype": "float32", "shape": [dims], "names": list(self.joint_names)}
        features.update(json.loads(json.dumps(fmt.DEFAULT_FEATURES)))
        return features

    def finish(self) -> None:
        """Write the metadata and the frame table; raises DatasetError when no frame was written."""
        for cam in self.cameras:
            if cam.writer is not None:
                cam.writer.close()
        if not self.episodes:
            raise DatasetError("no episode has any frame; nothing to write")
        features = self.features()
        self._write_data(features)
        self._write_episodes()
        self._write_tasks()
        stats_doc = st.to_json(self.stats or {})
        ordered = {k: stats_doc[k] for k in features if k in stats_doc}
        (self.root / fmt.STATS_PATH).write_text(json.dumps(ordered, indent=4), encoding="utf-8")
        info = {
            "codebase_version": fmt.CODEBASE_VERSION,
            "fps": self.fps,
            "features": features,
            "total_episodes": len(self.episodes),
            "total_frames": self.total_frames,
            "total_tasks": len(self.tasks),
            "chunks_size": fmt.CHUNKS_SIZE,
            "data_files_size_in_mb": fmt.DATA_FILE_SIZE_MB,
            "video_files_size_in_mb": fmt.VIDEO_FILE_SIZE_MB,
            "data_path": fmt.DATA_PATH,
            "video_path": fmt.VIDEO_PATH,
            "robot_type": self.robot_type,
            "splits": {"train": f"0:{len(self.episodes)}"},
        }
        (self.root / fmt.INFO_PATH).write_text(json.dumps(info, indent=4), encoding="utf-8")

    def abort(self) -> None:
        """Close what is open (the caller removes the folder)."""
        for cam in self.cameras:
            if cam.scratch is not None and not cam.scratch.closed:
                cam.scratch.close()
            if cam.writer is not None:
                with contextlib.suppress(Exception):  # an encoder that already failed: the folder goes anyway
                    cam.writer.discard()
                cam.writer = None

    def _video_path(self, cam: _Camera) -> Path:
        return self.root / fmt.VIDEO_PATH.format(video_key=cam.key, chunk_index=cam.chunk, file_index=cam.file)

    def _write_data(self, features: dict[str, dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        dims = len(self.joint_names)
        arrays, names = [], []
        for key in self.columns:
            values = np.concatenate(self.columns[key])
            if key in (fmt.STATE, fmt.ACTION):
                flat = pa.array(values.astype(np.float32).reshape(-1), type=pa.float32())
                arrays.append(pa.FixedSizeListArray.from_arrays(flat, dims))
            elif key == "timestamp":
                arrays.append(pa.array(values.astype(np.float32), type=pa.float32()))
            else:
                arrays.append(pa.array(values.astype(np.int64), type=pa.int64()))
            names.append(key)
        table = pa.Table.from_arrays(arrays, names=names)
        meta = {b"huggingface": json.dumps(fmt.hf_features(features)).encode()}
        table = table.replace_schema_metadata(meta)
        path = self.root / fmt.DATA_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="snappy")

    def _write_episodes(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = list(self.episodes[0])
        table = pa.Table.from_pydict({k: [row[k] for row in self.episodes] for k in keys})
        path = self.root / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)

    def _write_tasks(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        ordered = sorted(self.tasks.items(), key=lambda kv: kv[1])
        table = pa.Table.from_pydict(
            {"task_index": pa.array([i for _, i in ordered], pa.int64()), "task": pa.array([t for t, _ in ordered])}
        )
        table = table.replace_schema_metadata({b"pandas": fmt.tasks_pandas_metadata(pa.__version__)})
        pq.write_table(table, self.root / fmt.TASKS_PATH)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
