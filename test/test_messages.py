"""Custom messages cross real DDS between two OS processes, intact."""

from __future__ import annotations

import json
import subprocess

from helpers.msg_peer import action_chunk_dict, audio_chunk_dict, make_action_chunk, make_audio_chunk


def test_action_and_audio_chunks_cross_processes(python, root):
    count = 6
    sub = subprocess.Popen(
        [python, "test/helpers/msg_peer.py", "sub", "--count", str(count)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pub = subprocess.Popen(
        [python, "test/helpers/msg_peer.py", "pub", "--count", str(count)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = sub.communicate(timeout=60)
        _, pub_err = pub.communicate(timeout=60)
    finally:
        for p in (sub, pub):
            p.kill()
    assert sub.returncode == 0, f"subscriber failed: {err}"
    assert pub.returncode == 0, f"publisher failed: {pub_err}"

    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    by_type: dict[str, list[dict]] = {"ActionChunk": [], "AudioChunk": []}
    for row in rows:
        by_type[row.pop("type")].append(row)
    actions = sorted(by_type["ActionChunk"], key=lambda r: r["chunk_id"])
    audio = sorted(by_type["AudioChunk"], key=lambda r: r["seq"])
    assert [r["chunk_id"] for r in actions] == list(range(count))
    assert [r["seq"] for r in audio] == list(range(count))
    for i in range(count):
        assert actions[i] == action_chunk_dict(make_action_chunk(i))
        assert audio[i] == audio_chunk_dict(make_audio_chunk(i))


def test_policy_status_constants():
    from omni_ros.msg import PolicyStatus

    states = [
        PolicyStatus.IDLE,
        PolicyStatus.RUNNING,
        PolicyStatus.STALE_INPUT,
        PolicyStatus.PAUSED,
        PolicyStatus.ESTOPPED,
        PolicyStatus.ERROR,
    ]
    assert len(set(states)) == len(states)
