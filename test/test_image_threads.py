"""The cameras' images through the vision tower on threads of their own (omni_ros/policy/image_threads.py): the
same numbers as one call, each part on its own thread with one torch thread, and only where it pays."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from omni_ros import cpu_threads
from omni_ros.cpu_idle import IdlePoll
from omni_ros.policy.image_threads import ImageThreads, use_image_threads
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.precision import PrecisionChoice
from omni_ros.policy.torch_runner import TorchRunner


class PerItem(nn.Module):
    """A module whose batch items are independent; it records where and how each call ran."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 8)
        self.calls: list[tuple[int, int, int, bool]] = []
        self.grad: list[bool] = []

    def forward(self, x: torch.Tensor, shift: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        self.calls.append(
            (threading.get_ident(), x.shape[0], torch.get_num_threads(), torch.is_inference_mode_enabled())
        )
        self.grad.append(torch.is_grad_enabled())
        out = torch.tanh(self.linear(x)) * scale
        return out if shift is None else out + shift


@pytest.fixture
def two_torch_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_the_parts_run_on_threads_of_their_own_with_the_same_numbers(two_torch_threads):
    module = PerItem()
    x, shift = torch.randn(5, 16), torch.randn(5, 8)
    with torch.inference_mode():
        expected = module(x, shift, 0.5)
        module.calls.clear()
        split = ImageThreads(module.forward, 2)
        out = split(x, shift, 0.5)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # each item's numbers are its own
    assert sorted(rows for _, rows, _, _ in module.calls) == [2, 3]  # tensor_split: 3 + 2 of 5
    assert len({thread for thread, _, _, _ in module.calls}) == 2
    assert all(threads == 1 and inference for _, _, threads, inference in module.calls)
    assert torch.get_num_threads() == 2  # the caller's count is back
    # Under no_grad (guided RTC's prefix), not inference mode: the workers build no graph either.
    module.calls.clear()
    module.grad.clear()
    with torch.no_grad():
        torch.testing.assert_close(split(x, shift, 0.5), expected, rtol=0, atol=0)
    assert module.grad == [False, False] and not any(inference for *_, inference in module.calls)
    split.close()


def test_one_image_under_autograd_or_alone_is_one_plain_call(two_torch_threads):
    module = PerItem()
    split = ImageThreads(module.forward, 2)
    with torch.inference_mode():
        split(torch.randn(1, 16))
    x = torch.randn(4, 16, requires_grad=True)
    split(x).sum().backward()  # grad mode: the caller's thread, its threads
    assert x.grad is not None
    assert [(rows, threads) for _, rows, threads, _ in module.calls] == [(1, 2), (4, 2)]
    split.close()


def test_an_error_in_a_part_reaches_the_caller_and_the_next_call_works(two_torch_threads):
    class FailsOnSecondPart(PerItem):
        def forward(self, x, shift=None, scale=1.0):
            if threading.current_thread().name.startswith("omni-images"):
                raise RuntimeError("a part failed")
            return super().forward(x, shift, scale)

    module = FailsOnSecondPart()
    split = ImageThreads(module.forward, 2)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="a part failed"):
        split(torch.randn(4, 16))
    assert torch.get_num_threads() == 2
    split.close()
    with pytest.raises(ValueError, match="at least 2"):
        ImageThreads(module.forward, 1)


def test_the_runner_splits_the_cameras_only_under_passive_waiting_on_the_cpu(monkeypatch, two_torch_threads):
    cfg = preset("tiny")
    fp32 = PrecisionChoice("fp32", "test")

    def runner(wait_policy: str) -> TorchRunner:
        settings = cpu_threads.ThreadSettings(wait_policy, 2, True, IdlePoll(False, "policy.cpu_idle_poll off"))
        monkeypatch.setattr(cpu_threads, "current", lambda: settings)
        return TorchRunner(Pi0Model(cfg), precision=fp32)

    assert len(runner("passive").image_threads) == 1
    assert runner("brief").image_threads == [] and runner("runtime").image_threads == []
    torch.set_num_threads(1)
    assert runner("passive").image_threads == []


def test_a_two_camera_pi0_computes_the_same_prefix_with_its_images_split(two_torch_threads):
    cfg = preset("tiny")
    assert len(cfg.camera_names) >= 2
    torch.manual_seed(0)
    model = Pi0Model(cfg).eval()
    images = torch.rand(2, len(cfg.camera_names), 3, cfg.vision.image_size, cfg.vision.image_size) * 2 - 1
    keys = list(model.state_dict())
    with torch.inference_mode():
        expected = model.encode_images(images)
        (split,) = use_image_threads(model, 2)
        calls = []
        forward = split.forward
        split.forward = lambda *args: calls.append(args[0].shape[0]) or forward(*args)
        out = model.encode_images(images)
    assert sorted(calls) == [len(cfg.camera_names)] * 2  # two parts of the 2 x cameras images
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)  # float32 products of 1 vs 2 images' rows
    assert list(model.state_dict()) == keys  # the module tree is the model's own
    split.close()
