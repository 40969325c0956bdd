"""``EagleHead``: an EAGLE-style draft head over a target ``CausalLM``: ``fc`` (``Linear(2H -> H)``, no bias) over
the concatenation of a token's embedding and a hidden state, one decoder layer of the target's architecture, and its
own final norm; the embedding and the LM head are the target's (shared, never copied).

The head at position ``p`` reads ``(embed(x_p), h_{p-1})``: ``h`` is the target's last hidden state (after its final
norm) of the token before, or while drafting the head's own output of the step before (EAGLE-1's alignment).

Three ways to get one:

- ``random_eagle_head(target, seed)``: seeded random weights (the ``random`` preset): low acceptance, for shapes.
- ``self_draft_head(target)``: for a one-layer target only, ``fc = [I | 0]`` and the target's layer and norm copied,
  so the head computes exactly the target's next token (acceptance ~100%): the ``self`` preset, for tests and the
  benchmark's tokens-a-step.
- ``load_eagle_head(directory, target)`` / ``save_eagle_head(head, directory)``: a directory holding

  ``config.json``
      the head's model config in Hugging Face form: the target's architecture with ``num_hidden_layers: 1``
      (``hidden_size`` and ``vocab_size`` must be the target's);
  ``model.safetensors``
      ``fc.weight`` ``[H, 2H]`` (columns ``:H`` multiply the embedding, ``H:`` the hidden state), the layer under
      Hugging Face names (``model.layers.0.self_attn.q_proj.weight`` ...) and ``model.norm.weight``; no embedding
      and no LM head (the target's are used; present ones are ignored).

Example:
    >>> from cudagraph.engine.model import dense_attend, model_config_from_preset, random_model
    >>> target = random_model(model_config_from_preset("tiny-qwen3-random"))
    >>> head = random_eagle_head(target, seed=1)
    >>> hidden = head(torch.tensor([1, 2]), torch.arange(2), torch.zeros(2, 64), dense_attend(head.config))
    >>> hidden.shape
    torch.Size([2, 64])
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..kernels.layer_set import TORCH_KERNELS, LayerKernels
from .architecture import CONFIG_FILE, ModelConfig
from .causal_lm import CausalLM
from .checkpoint import SINGLE_FILE, TensorSlot, checkpoint_slots
from .errors import ModelFileNotFoundError, ModelLoadError
from .layers import AttendFn, DecoderLayer, KernelModule, RMSNorm
from .random_init import INIT_RULES

__all__ = [
    "EAGLE_PRESETS",
    "FC_WEIGHT",
    "EagleHead",
    "eagle_head_from_source",
    "head_config",
    "load_eagle_head",
    "random_eagle_head",
    "save_eagle_head",
    "self_draft_head",
]

logger = logging.getLogger(__name__)

FC_WEIGHT = "fc.weight"
"""The checkpoint name of the head's input projection ``[H, 2H]``."""

_SHARED = ("model.embed_tokens.weight", "lm_head.weight")
"""Checkpoint tensors of a one-layer model that the head takes from the target instead."""


def head_config(target: ModelConfig) -> ModelConfig:
    """The config of a head over ``target``: its architecture, one layer."""
    return target.with_overrides(num_layers=1)


def head_slots(config: ModelConfig) -> list[TensorSlot]:
    """The checkpoint tensors of the head's layer and norm (Hugging Face names), mapped onto ``EagleHead``'s
    parameters (which are named as ``CausalLM``'s)."""
    return [slot for slot in checkpoint_slots(config) if slot.hf_name not in _SHARED]


class EagleHead(nn.Module):
    """The draft head (see the module docstring). ``forward(input_ids, positions, hidden_states, attend)`` gives the
    head's hidden states ``[T, H]`` (after its final norm); ``compute_logits`` is the target's head.

    The target is held by reference only (not a submodule): its embedding and LM head are read, never registered
    twice, so ``parameters()`` are the head's own."""

    def __init__(self, target: CausalLM) -> None:
        super().__init__()
        if target.shard.is_parallel:
            raise ModelLoadError("an EAGLE head drafts for a single-rank target; this target is one rank's shard")
        self.config = head_config(target.config)
        self.local_config = self.config
        self.dtype, self.device = target.dtype, target.device
        hidden = self.config.hidden_size
        self.fc = nn.Parameter(torch.zeros((hidden, 2 * hidden), dtype=self.dtype, device=self.device), False)
        self.layers = nn.ModuleList([DecoderLayer(self.config, 0, self.dtype, self.device)])
        self.norm = RMSNorm(hidden, self.config.rms_norm_eps, self.dtype, self.device)
        self._target = (target,)  # a tuple: not registered as a submodule
        self.kernels: LayerKernels = TORCH_KERNELS
        self.rotary_cos_sin: torch.Tensor
        self._build_rotary_table()

    @property
    def target(self) -> CausalLM:
        """The model whose embedding and LM head the head shares."""
        return self._target[0]

    def _build_rotary_table(self) -> None:
        table = self.kernels.rotary_table(self.config, self.dtype, self.device)
        self.register_buffer("rotary_cos_sin", table, persistent=False)

    def use_kernels(self, kernels: LayerKernels) -> None:
        """Compute through ``kernels`` from now on (the layer and the rotary table)."""
        self.kernels = kernels
        for module in self.modules():
            if isinstance(module, KernelModule):
                module.kernels = kernels
        self._build_rotary_table()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor, attend: AttendFn
    ) -> torch.Tensor:
        """Hidden states ``[T, H]`` of tokens ``input_ids`` ``[T]`` at ``positions`` ``[T]``, each reading the hidden
        state ``hidden_states[t]`` ``[T, H]`` of the token before it; attention through ``attend`` (layer 0)."""
        embedded = F.embedding(input_ids, self.target.embed_tokens)
        fused = F.linear(torch.cat((embedded, hidden_states.to(self.dtype)), dim=-1), self.fc)
        rotary = self.kernels.rotary_step(self.rotary_cos_sin, positions)
        hidden, residual = self.layers[0](fused, None, rotary, attend)
        return self.norm.add_and_norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[N, vocab]`` through the target's LM head."""
        return self.target.compute_logits(hidden)


def random_eagle_head(target: CausalLM, seed: int = 0) -> EagleHead:
    """A head over ``target`` with seeded random weights (``random_init``'s scales; ``fc`` ``1/sqrt(2H)``)."""
    head = EagleHead(target)
    generator = torch.Generator(device=head.device).manual_seed(seed)
    with torch.no_grad():
        for name, shape, slot in _drawn_tensors(head):
            rule = next(rule for rule in INIT_RULES if name.endswith(rule.suffix))
            draw = torch.empty(shape, dtype=torch.float32, device=head.device)
            draw.normal_(rule.mean, rule.std(shape), generator=generator)
            _write(head, name, slot, draw)
    return head


def self_draft_head(target: CausalLM) -> EagleHead:
    """A head that computes exactly ``target``'s hidden states: ``fc = [I | 0]`` (the embedding through, the hidden
    state ignored) and the target's one layer and final norm copied. ``ModelLoadError`` unless the target has one
    layer (the head has one)."""
    if target.config.num_layers != 1:
        raise ModelLoadError(
            f"the self-draft EAGLE head copies a one-layer target; this target has {target.config.num_layers} layers "
            "(use a one-layer target, e.g. tiny-qwen3-random with num_layers=1, or the 'random' head)"
        )
    head = EagleHead(target)
    hidden = head.config.hidden_size
    with torch.no_grad():
        head.fc.zero_()
        head.fc[:, :hidden].copy_(torch.eye(hidden, dtype=head.dtype, device=head.device))
        head.layers[0].load_state_dict(target.layers[0].state_dict())
        head.norm.load_state_dict(target.norm.state_dict())
    return head


EAGLE_PRESETS: Mapping[str, str] = MappingProxyType(
    {
        "random": "seeded random weights (acceptance near zero: for shapes and timings)",
        "self": "the one-layer target itself (fc = [I | 0], its layer copied: every draft accepted)",
    }
)
"""The heads ``eagle:PRESET`` names, with what each is."""


def eagle_head_from_source(source: str | Path, target: CausalLM, seed: int = 0) -> EagleHead:
    """The head ``source`` names: a preset of ``EAGLE_PRESETS`` or a directory (``load_eagle_head``)."""
    if source == "random":
        return random_eagle_head(target, seed)
    if source == "self":
        return self_draft_head(target)
    return load_eagle_head(source, target)


def save_eagle_head(head: EagleHead, path: str | Path) -> None:
    """Write ``head`` as a directory ``load_eagle_head`` reads (the module docstring's layout)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    dtype_name = str(head.dtype).removeprefix("torch.")
    hf = head.config.to_hf_dict(torch_dtype=dtype_name)
    (directory / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
    tensors = {FC_WEIGHT: head.fc.detach().to("cpu").contiguous().clone()}
    for slot in head_slots(head.config):
        rows = slot.target(head).detach()  # type: ignore[arg-type]  # the head's parameters are named as CausalLM's
        tensors[slot.hf_name] = (rows[0] if slot.broadcast else rows).to("cpu").contiguous().clone()
    save_file(tensors, str(directory / SINGLE_FILE), metadata={"format": "pt"})


def load_eagle_head(path: str | Path, target: CausalLM) -> EagleHead:
    """The head saved in ``path`` over ``target``; ``ModelLoadError`` naming what does not fit (a missing file or
    tensor, a shape, a config of another width or vocabulary than the target's)."""
    directory = Path(path)
    config_file, weights_file = directory / CONFIG_FILE, directory / SINGLE_FILE
    for needed in (config_file, weights_file):
        if not needed.is_file():
            raise ModelFileNotFoundError(
                f"EAGLE head directory {directory} has no {needed.name}: it needs {CONFIG_FILE} and {SINGLE_FILE}"
            )
    config = ModelConfig.from_pretrained(directory)
    for field_name in ("hidden_size", "vocab_size"):
        mine, theirs = getattr(config, field_name), getattr(target.config, field_name)
        if mine != theirs:
            raise ModelLoadError(
                f"EAGLE head {directory}: {field_name} is {mine}, the target's is {theirs}; a head drafts for a "
                "target of its own width and vocabulary"
            )
    if config.num_layers != 1:
        raise ModelLoadError(f"EAGLE head {directory}: num_hidden_layers is {config.num_layers}; a head has one layer")
    head = EagleHead(target)
    tensors = load_file(str(weights_file), device="cpu")
    with torch.no_grad():
        for name, shape, slot in _drawn_tensors(head):
            if name not in tensors:
                raise ModelLoadError(f"EAGLE head {weights_file} is missing tensor {name!r} (shape {shape})")
            tensor = tensors[name]
            if tuple(tensor.shape) != shape:
                raise ModelLoadError(
                    f"EAGLE head {weights_file}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}"
                )
            _write(head, name, slot, tensor)
    known = {name for name, _, _ in _drawn_tensors(head)} | set(_SHARED)
    unknown = sorted(set(tensors) - known)
    if unknown:
        logger.warning(
            "EAGLE head %s: ignoring %d tensors it does not use, e.g. %s", directory, len(unknown), unknown[:3]
        )
    return head


def _drawn_tensors(head: EagleHead) -> list[tuple[str, tuple[int, ...], TensorSlot | None]]:
    """Every checkpoint tensor of the head, in one order: ``fc.weight`` (no slot), then the layer's and the norm's."""
    hidden = head.config.hidden_size
    return [
        (FC_WEIGHT, (hidden, 2 * hidden), None),
        *((slot.hf_name, slot.shape, slot) for slot in head_slots(head.config)),
    ]


def _write(head: EagleHead, name: str, slot: TensorSlot | None, tensor: torch.Tensor) -> None:
    if slot is None:
        head.fc.copy_(tensor)
        return
    target = slot.target(head)  # type: ignore[arg-type]
    target.copy_(tensor.expand(slot.row_stop - slot.row_start, -1) if slot.broadcast else tensor)
