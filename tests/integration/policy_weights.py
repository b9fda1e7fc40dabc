"""The weights the shared engine holds, kept beside it in torch so tests can compute reference log-probs."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from fullasync.client import RolloutService
from fullasync.contracts.engine import PauseMode
from fullasync.weights.sync import WeightSync


class PolicyWeights:
    """The weights the shared engine holds, so tests can compute reference log-probs in torch."""

    def __init__(self, model_path: str, weight_sync: WeightSync) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.weight_sync = weight_sync
        self.current = {k: v.clone() for k, v in self.model.state_dict().items()}

    def perturbed(self, seed: int, scale: float = 0.05,
                  around: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """New weights: the current ones (or `around`) plus seeded noise; lm_head left out (tied to the embeddings)."""
        generator = torch.Generator().manual_seed(seed)
        return {
            name: tensor + scale * torch.randn(tensor.shape, generator=generator)
            for name, tensor in (self.current if around is None else around).items()
            if name != "lm_head.weight"
        }

    async def push(self, state: dict[str, torch.Tensor], mode: PauseMode = PauseMode.ABORT):
        self.weight_sync.mode = mode
        timing = await self.weight_sync.push(state)
        self._take(state)
        return timing

    def _take(self, state: dict[str, torch.Tensor]) -> None:
        self.current = {**self.current, **state}
        if self.model.config.tie_word_embeddings:
            self.current["lm_head.weight"] = self.current["model.embed_tokens.weight"]

    def installed(self, state: dict[str, torch.Tensor], version: int) -> None:
        """A test installed `state` as `version` on the engine by the push's own steps (not through `push`)."""
        self.weight_sync.version = version
        self._take(state)

    async def assert_engine_serves_current(self, engine, tokenizer, prompt: str, version: int,
                                           tolerance: float = 1e-4) -> None:
        """A generation on `engine` has this object's current weights' log-probs and carries `version`."""
        client = RolloutService([engine], tokenizer).client()
        await client.completions.create(model="policy", prompt=prompt, max_tokens=32, seed=1)
        (call,) = client.episode.calls
        reference = self.token_logprobs(self.current, call.prompt_ids, call.output_ids)
        assert max(abs(a - b) for a, b in zip(call.output_logprobs, reference, strict=True)) < tolerance
        assert set(call.output_versions) == {version}

    def token_logprobs(self, state: dict[str, torch.Tensor], prompt_ids, output_ids) -> list[float]:
        """log p(output_i | prompt, output_<i) under `state`, by a plain torch forward."""
        self.model.load_state_dict(state, strict=False)
        if self.model.config.tie_word_embeddings:
            self.model.tie_weights()
        ids = torch.tensor([list(prompt_ids) + list(output_ids)])
        with torch.no_grad():
            logits = self.model(ids).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        start = len(prompt_ids)
        positions = torch.arange(start - 1, start - 1 + len(output_ids))
        return logprobs[positions, torch.tensor(list(output_ids))].tolist()
