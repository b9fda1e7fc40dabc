"""A teacher behind an endpoint: a real vLLM OpenAI server (`vllm serve`, on loopback) scores the policy's token ids
through `/v1/completions` with `prompt_logprobs`, and is checked before a run starts: its tokenizer against the
policy's (`/tokenize` on probes) and its context."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fullasync.models import build_pretrained_model, load_tokenizer
from fullasync.rollout.teacher import EndpointTeacher, TeacherError, TeacherScorer, check_endpoint_teacher
from fullasync.types import FinishReason, ModelCall, Trajectory

pytestmark = pytest.mark.slow  # ~50 s: a vLLM server of its own

CONTEXT = 512


@pytest.fixture(scope="module")
def served(tiny_model_path, tmp_path_factory):
    """vLLM's OpenAI server (what `vllm serve` runs) of the tiny model on a free loopback port: its /v1 URL (stopped
    after the module)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = Path(tmp_path_factory.mktemp("vllm")) / "serve.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_path, "--host",
               "127.0.0.1", "--port",
               str(port), "--served-model-name", "teacher", "--max-model-len", str(CONTEXT), "--dtype", "float32",
               "--kv-cache-memory-bytes", str(32 * 2**20), "--max-num-seqs", "8"]
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert server.poll() is None, f"vllm serve exited {server.returncode}: {log.read_text()[-3000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail(f"vllm serve did not come up in 300 s: {log.read_text()[-3000:]}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


async def test_an_endpoint_teacher_scores_the_policys_tokens_as_the_server_sampled_them(served, tokenizer):
    prompt = tokenizer.encode("12+30=")
    sampled = httpx.post(f"{served}/completions", timeout=60, json={
        "model": "teacher", "prompt": prompt, "max_tokens": 10, "temperature": 1.0, "seed": 5, "ignore_eos": True,
        "logprobs": 0, "return_tokens_as_token_ids": True}).json()["choices"][0]
    output = [int(token.removeprefix("token_id:")) for token in sampled["logprobs"]["tokens"]]
    call = ModelCall(tuple(prompt), tuple(output), tuple(sampled["logprobs"]["token_logprobs"]), (0,) * len(output),
                     FinishReason.LENGTH)
    endpoint = EndpointTeacher("teacher", served, "teacher")
    try:
        scorer = TeacherScorer("teacher", [endpoint])
        scored = await scorer.score_trajectory(Trajectory((call,), reward=1.0))
        assert scored.calls[0].teacher_logprobs == pytest.approx(call.output_logprobs, abs=2e-4)
        assert scorer.stats.sequences == 1 and scorer.stats.tokens == len(prompt) + len(output)
        await check_endpoint_teacher(endpoint, tokenizer, CONTEXT - 1)  # the policy's tokenizer, a context to spare
        with pytest.raises(ValueError, match=r"its context \(512\) is shorter than engine.max_model_len \+ 1 = 1025"):
            await check_endpoint_teacher(endpoint, tokenizer, 1024)
        other = load_tokenizer(build_pretrained_model("smollm2-135m-instruct"))
        with pytest.raises(ValueError, match="its tokenizer is not the policy's"):
            await check_endpoint_teacher(endpoint, other, CONTEXT - 1)
        wrong = EndpointTeacher("teacher", served, "no-such-model")
        with pytest.raises(TeacherError, match="refused a scoring request \\(404\\)"):
            await TeacherScorer("teacher", [wrong]).score(prompt)
        await wrong.close()
    finally:
        await endpoint.close()
