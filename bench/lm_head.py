"""A real pi0-FAST's tied output head per `policy.precision`: one decoded token's logits, float32 vs bf16 vs int8.

    .venv/bin/python bench/lm_head.py [--vocab 257152] [--width 2048] [--threads 1] [--runs 10] [--tokens 32]
        [--out bench/results/lm_head.json]

pi0-FAST's logits are the final hidden state times its token embedding (PaliGemma's 257,152 x 2048 table, tied).
bench/pi0_fast.py's edge model has the fixtures' 1,024-token vocabulary, where the head is a sliver of a step; at
a real checkpoint's size it reads 2.1 GB a token in float32. This times that product alone, as the policy runs it
(`omni_ros.policy.precision.tied_head`: `Bf16Linear` / `Int8Linear` of the same table; one row, so int8 takes
the int8 weight x bfloat16 path), on a seeded random table (N(0, 1) rows, as an embedding before Gemma's
sqrt(width) scaling) and seeded random hidden states, one process, the three kernels alternated in rounds (the
median of each). Also: each precision's relative L2 distance from the float32 logits and how often its argmax
(the greedy token) is float32's, over `--tokens` hidden states; a random table makes near-ties, so this is a
plumbing check, not a trained model's agreement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from common import cpu_facts, emit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=257152, help="rows of the table (PaliGemma's by default)")
    parser.add_argument("--width", type=int, default=2048, help="the decoder's width (Gemma 2B's by default)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=10, help="rounds; each times every kernel once")
    parser.add_argument("--tokens", type=int, default=32, help="hidden states for the accuracy columns")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F
    from torch import nn

    from omni_ros.policy.precision import apply_precision, choose

    torch.set_num_threads(args.threads)

    class Head(nn.Module):
        tied_head = "embed"
        head_kernel = staticmethod(F.linear)

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.width)
            self.proj = nn.Linear(8, 8)  # apply_precision swaps a model with linears

    print(f"[bench] building a {args.vocab} x {args.width} table ...", file=sys.stderr, flush=True)
    heads: dict[str, Any] = {}
    load_s: dict[str, float] = {}
    for precision in ("fp32", "bf16", "int8"):
        torch.manual_seed(0)  # the same table for every precision
        head = Head().eval()
        start = time.perf_counter()
        applied = apply_precision(head, choose(precision))
        load_s[precision] = round(time.perf_counter() - start, 2)
        heads[precision] = head
    int8_kernel = applied.choice.describe()

    def logits(precision: str, hidden: torch.Tensor) -> torch.Tensor:
        head = heads[precision]
        return head.head_kernel(hidden, head.embed.weight)

    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(args.tokens, 1, args.width, generator=gen)
    samples: dict[str, list[float]] = {p: [] for p in heads}
    with torch.inference_mode():
        for precision in heads:
            logits(precision, hidden[0])  # warm-up
        for run in range(args.runs):
            for precision in heads:
                start = time.perf_counter()
                logits(precision, hidden[run % args.tokens])
                samples[precision].append((time.perf_counter() - start) * 1e3)
        exact = [logits("fp32", h) for h in hidden]
        rows: dict[str, Any] = {}
        for precision in heads:
            ms = statistics.median(samples[precision])
            row: dict[str, Any] = {"ms_per_token": round(ms, 2), "prepare_s": load_s[precision]}
            if precision != "fp32":
                got = [logits(precision, h) for h in hidden]
                rel = [float((g - e).norm() / e.norm()) for g, e in zip(got, exact, strict=True)]
                same = sum(int(g.argmax() == e.argmax()) for g, e in zip(got, exact, strict=True))
                row.update(
                    rel_l2_vs_fp32=round(statistics.median(rel), 5),
                    same_argmax_as_fp32=f"{same}/{args.tokens}",
                    over_fp32=round(ms / statistics.median(samples["fp32"]), 3),
                )
            rows[precision] = row
    rows["int8"]["kernel"] = int8_kernel
    report = {
        "benchmark": "lm_head",
        "table": [args.vocab, args.width],
        "table_mb_fp32": round(args.vocab * args.width * 4 / 1e6),
        "threads": args.threads,
        "runs": args.runs,
        "rows": rows,
        "machine": cpu_facts(),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
