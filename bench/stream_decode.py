"""What turning a streamed call's token deltas into text costs per token: the whole output decoded again at every
delta (before) against the incremental decode (`fullasync.client.streaming.IncrementalText`), in one run.

A response of L tokens (real text: prose, code, multi-byte characters) arrives in deltas of `--interval` tokens,
as `rollout.stream_interval` sends them; each delta goes through `TextDeltas.push` (decode, hold back a partial
character and the beginning of a stop string), on the tiny model's tokenizer and SmolLM2's. Printed per length:
µs per token each way (best of `--repeats`) and before ÷ after. Asserts nothing; writes its section of
docs/benchmarks/stream-decode.md unless --no-write.

    .venv/bin/python bench/stream_decode.py [--lengths 32,64,256,1024,4096,16384] [--interval 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from _report import report

from fullasync.client import streaming
from fullasync.models import build_pretrained_model, build_tiny_model, load_tokenizer

BEGIN, END = "<!-- stream-decode:begin -->", "<!-- stream-decode:end -->"
TEXT = ("The answer is 42. It isn't 41, is it? café naïve 日本語 数学 Привет 🙂 → ≤\n"
        "def double(x):\n    return x * 2  # the value, doubled\n\n")


class WholeText:
    """Before: every delta decodes all the ids so far."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []

    def push(self, ids: Sequence[int]) -> str:
        self.ids += ids
        return self.decode(self.ids)


def per_token_us(decode: Callable[[list[int]], str], ids: list[int], interval: int, text_kind: type,
                 repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        deltas = streaming.TextDeltas(decode, ("</tool_call>",))
        deltas.text = text_kind(decode)
        start = time.perf_counter()
        for at in range(0, len(ids), interval):
            deltas.push(ids[at : at + interval])
        best = min(best, time.perf_counter() - start)
    return best / len(ids) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32,64,256,1024,4096,16384")
    parser.add_argument("--interval", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    lengths = [int(length) for length in args.lengths.split(",")]
    rows = []
    for name, path in (("tiny", build_tiny_model()), ("SmolLM2-135M", build_pretrained_model("smollm2-135m-instruct"))):
        tokenizer = load_tokenizer(str(path))

        def decode(ids: list[int], tokenizer=tokenizer) -> str:
            return tokenizer.decode(ids, skip_special_tokens=True)

        corpus = tokenizer.encode(TEXT, add_special_tokens=False) * (max(lengths) // 20 + 1)
        for length in lengths:
            ids = corpus[:length]
            whole = per_token_us(decode, ids, args.interval, WholeText, args.repeats)
            incremental = per_token_us(decode, ids, args.interval, streaming.IncrementalText, args.repeats)
            rows.append(f"| {name} | {length:,} | {whole:.1f} | {incremental:.1f} | {whole / incremental:.1f}× |")
            print(rows[-1], flush=True)
    section = "\n".join([
        "## Streamed text: decoding each delta",
        "",
        f"`python bench/stream_decode.py --interval {args.interval}`: µs per token to turn a streamed call's deltas "
        f"of {args.interval} tokens into text (`TextDeltas.push`), best of {args.repeats}; before, the whole output "
        "was decoded again at every delta; now only the new ids with a few before them (`IncrementalText`).",
        "",
        "| tokenizer | response tokens | whole decode µs/token | incremental µs/token | before ÷ after |",
        "|---|---|---|---|---|",
        *rows,
    ])
    report(section, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    main()
