"""LoRA adapters merged into the weights a push carries: W + scaling · B·A for each adapted layer, HF-named.

Owns: the merge of a peft LoRA model's full state dict (`merge_lora`) and its gathering from the FSDP-wrapped
policy (`merged_lora_weights`, a collective). Runs inside trainer workers (`worker.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

PEFT_PREFIX = "base_model.model."  # peft's name of the wrapped model's parameters
LORA_ADAPTER = "default"  # the adapter verl's peft model trains


def merged_lora_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights with its LoRA adapters merged, HF-named (a collective: every rank gathers every tensor
    in the same order). verl's own merged export casts to bf16; this keeps the master weights' dtype."""
    from peft.tuners.lora import LoraLayer
    from torch.distributed.tensor import DTensor

    model = getattr(module, "_fsdp_wrapped_module", module)
    scalings = {name: layer.scaling[LORA_ADAPTER] for name, layer in model.named_modules()
                if isinstance(layer, LoraLayer)}
    full = {name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()
            for name, t in model.state_dict().items()}
    return merge_lora(full, scalings)


def merge_lora(state: Mapping[str, torch.Tensor], scalings: Mapping[str, float]) -> dict[str, torch.Tensor]:
    """HF-named weights from a peft LoRA model's full state dict: each adapted layer's weight W + scaling · B·A
    (computed in fp32, returned in W's dtype), every other tensor as it is, the adapters themselves dropped."""
    merged = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        if name.endswith(".base_layer.weight") and (layer := name.removesuffix(".base_layer.weight")) in scalings:
            a = state[f"{layer}.lora_A.{LORA_ADAPTER}.weight"].float()
            b = state[f"{layer}.lora_B.{LORA_ADAPTER}.weight"].float()
            tensor = (tensor.float() + scalings[layer] * (b @ a)).to(tensor.dtype)
        merged[name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")] = tensor
    return merged
