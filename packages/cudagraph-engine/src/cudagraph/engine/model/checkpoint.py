"""Hugging Face checkpoints <-> ``CausalLM``: the tensor-name map onto the fused layout, ``load_model`` and
``save_model``.

One table (``checkpoint_slots``) says where every Hugging Face tensor lives in the model (which parameter, which
rows); loading and saving both read it, so they cannot disagree. Loading checks every tensor's presence and shape
before copying; it never leaves a half-filled model to the caller.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from .architecture import CONFIG_FILE, FAMILIES, ModelConfig
from .causal_lm import CausalLM
from .errors import ModelFileNotFoundError, ModelLoadError, TensorParallelError
from .parallel import SINGLE_RANK, RowRange, ShardPlan

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Tensors some checkpoints carry that the model recomputes."""


@dataclass(frozen=True)
class TensorSlot:
    """Where one Hugging Face tensor lives: rows ``[row_start, row_stop)`` of ``parameter`` (a dotted name in
    ``CausalLM``), and the shape the checkpoint must hold. ``broadcast``: the checkpoint's vector fills every row
    (Qwen3's q/k norm weight, repeated per head). ``source``: on a tensor-parallel rank, the part of the
    checkpoint tensor this rank holds (rows or, with ``source_dim=1``, columns); ``None``: all of it. ``expert``: the
    parameter stacks experts (``[E, rows, columns]``) and the rows are those of this (rank-local) expert."""

    hf_name: str
    parameter: str
    row_start: int
    row_stop: int
    shape: tuple[int, ...]
    broadcast: bool = False
    source: RowRange | None = None
    source_dim: int = 0
    expert: int | None = None

    def target(self, model: CausalLM) -> torch.Tensor:
        """The slice of the model's parameter this tensor fills."""
        parameter: torch.Tensor = model.get_parameter(self.parameter)
        if self.expert is not None:
            parameter = parameter[self.expert]
        return parameter[self.row_start : self.row_stop]

    def select(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of the whole checkpoint ``tensor`` (a view)."""
        if self.source is None:
            return tensor
        return tensor.narrow(self.source_dim, self.source.start, self.source.size)

    def index(self) -> tuple[slice, ...]:
        """The index of this rank's part, for a lazily read safetensors slice."""
        if self.source is None:
            return (slice(None),)
        part = slice(self.source.start, self.source.stop)
        return (part,) if self.source_dim == 0 else (slice(None), part)


def checkpoint_slots(config: ModelConfig, shard: ShardPlan = SINGLE_RANK) -> list[TensorSlot]:
    """Every tensor a checkpoint of ``config`` must hold, in Hugging Face naming, mapped onto ``CausalLM`` (onto
    rank ``shard.rank``'s part of it when ``shard`` spans several ranks, each slot naming what it reads)."""
    hidden, head_dim = config.hidden_size, config.head_dim
    local = shard.local_config(config)
    q_size, kv_size, inter = local.q_size, local.kv_size, local.intermediate_size
    parallel = shard.is_parallel

    def part(heads: RowRange, width: int = 1) -> RowRange | None:
        return RowRange(heads.start * width, heads.stop * width) if parallel else None

    q_rows = part(shard.q_heads(config), head_dim)
    kv_rows = part(shard.kv_heads(config), head_dim)
    inter_rows = part(shard.intermediate(config))
    vocab_rows = part(shard.vocab(config))
    vocab_here = shard.vocab(config).size
    vocab_shape = (config.vocab_size, hidden)
    slots = [TensorSlot("model.embed_tokens.weight", "embed_tokens", 0, vocab_here, vocab_shape, source=vocab_rows)]
    for layer in range(config.num_layers):
        hf, ours = f"model.layers.{layer}.", f"layers.{layer}."
        attn = ours + "self_attn."
        # q, k and v are stacked row-wise in one projection, as are gate and up.
        qkv_rows = (
            ("q_proj", 0, q_size, config.q_size, q_rows),
            ("k_proj", q_size, q_size + kv_size, config.kv_size, kv_rows),
            ("v_proj", q_size + kv_size, q_size + 2 * kv_size, config.kv_size, kv_rows),
        )
        for projection, start, stop, full, source in qkv_rows:
            slots.append(
                TensorSlot(
                    f"{hf}self_attn.{projection}.weight",
                    attn + "qkv_weight",
                    start,
                    stop,
                    (full, hidden),
                    source=source,
                )
            )
            if config.qkv_bias:
                slots.append(
                    TensorSlot(
                        f"{hf}self_attn.{projection}.bias", attn + "qkv_bias", start, stop, (full,), source=source
                    )
                )
        o_shape = (hidden, config.q_size)
        slots.append(
            TensorSlot(
                f"{hf}self_attn.o_proj.weight", attn + "o_weight", 0, hidden, o_shape, source=q_rows, source_dim=1
            )
        )
        if config.o_bias:
            slots.append(TensorSlot(f"{hf}self_attn.o_proj.bias", attn + "o_bias", 0, hidden, (hidden,)))
        if config.qk_norm:
            heads, all_heads = local.num_heads, local.num_heads + local.num_kv_heads
            norm = attn + "qk_norm.weight"
            slots.append(TensorSlot(f"{hf}self_attn.q_norm.weight", norm, 0, heads, (head_dim,), broadcast=True))
            slots.append(
                TensorSlot(f"{hf}self_attn.k_norm.weight", norm, heads, all_heads, (head_dim,), broadcast=True)
            )
        for norm_name in ("input_layernorm", "post_attention_layernorm"):
            slots.append(TensorSlot(f"{hf}{norm_name}.weight", f"{ours}{norm_name}.weight", 0, hidden, (hidden,)))
        if config.uses_experts(layer):
            slots.extend(_expert_slots(config, shard, hf, ours))
            continue
        mlp_shape = (config.intermediate_size, hidden)
        gate_up = ours + "mlp.gate_up_weight"
        slots.append(TensorSlot(f"{hf}mlp.gate_proj.weight", gate_up, 0, inter, mlp_shape, source=inter_rows))
        slots.append(TensorSlot(f"{hf}mlp.up_proj.weight", gate_up, inter, 2 * inter, mlp_shape, source=inter_rows))
        down_shape = (hidden, config.intermediate_size)
        slots.append(
            TensorSlot(
                f"{hf}mlp.down_proj.weight",
                ours + "mlp.down_weight",
                0,
                hidden,
                down_shape,
                source=inter_rows,
                source_dim=1,
            )
        )
    slots.append(TensorSlot("model.norm.weight", "norm.weight", 0, hidden, (hidden,)))
    if not config.tie_word_embeddings:
        slots.append(TensorSlot("lm_head.weight", "lm_head", 0, vocab_here, vocab_shape, source=vocab_rows))
    return slots


def _expert_slots(config: ModelConfig, shard: ShardPlan, hf: str, ours: str) -> list[TensorSlot]:
    """A sparse layer's router (whole on every rank) and the experts this rank holds, each expert's gate and up
    projections stacked into its rows of ``gate_up_weight`` and its down projection into ``down_weight`` (named as
    the family spells them: Qwen3-MoE's ``mlp.experts.{e}.gate_proj``, Mixtral's
    ``block_sparse_moe.experts.{e}.w1``)."""
    spelling = FAMILIES[config.model_type].experts
    assert spelling is not None, "only a family with experts has sparse layers"
    hidden, width, moe = config.hidden_size, config.moe_intermediate_size, ours + "mlp."
    block = f"{hf}{spelling.block}."
    router_shape = (config.num_experts, hidden)
    slots = [TensorSlot(f"{block}gate.weight", moe + "router_weight", 0, config.num_experts, router_shape)]
    experts = shard.experts(config)
    for expert in range(experts.start, experts.stop):
        name, local = f"{block}experts.{expert}.", expert - experts.start
        projections = (
            (spelling.gate, "gate_up_weight", 0, width, (width, hidden)),
            (spelling.up, "gate_up_weight", width, 2 * width, (width, hidden)),
            (spelling.down, "down_weight", 0, hidden, (hidden, width)),
        )
        for projection, parameter, start, stop, shape in projections:
            slots.append(TensorSlot(f"{name}{projection}.weight", moe + parameter, start, stop, shape, expert=local))
    return slots


def load_model(
    path: str | Path,
    dtype: torch.dtype | str = "auto",
    device: torch.device | str = "cpu",
    *,
    progress: bool | None = None,
    shard: ShardPlan = SINGLE_RANK,
) -> CausalLM:
    """Load a Hugging Face model directory (``config.json`` + ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``) onto ``device``.

    ``dtype="auto"`` keeps the checkpoint's dtype (``config.json``'s ``dtype``/``torch_dtype``); otherwise
    ``float32``, ``bfloat16`` or ``float16`` (name or ``torch.dtype``). ``progress``: show a bar per shard
    (default: only when there are several shards). ``shard``: load one tensor-parallel rank's part, reading only
    that part of each tensor from the files (safetensors slices), never the whole tensor.
    """
    directory = Path(path)
    config = ModelConfig.from_pretrained(directory)
    files_by_name = _checkpoint_files(directory)
    shard.check(config)
    slots = checkpoint_slots(config, shard)
    _check_names(directory, config, slots, files_by_name)
    model = CausalLM(config, dtype, device, shard)
    slots_by_file: dict[Path, list[TensorSlot]] = defaultdict(list)
    for slot in slots:
        slots_by_file[files_by_name[slot.hf_name]].append(slot)
    show_progress = len(slots_by_file) > 1 if progress is None else progress
    with torch.no_grad():
        for file, file_slots in tqdm(
            slots_by_file.items(), desc="loading shards", unit="shard", disable=not show_progress
        ):
            with _open_safetensors(file) as handle:
                for slot in file_slots:
                    tensor = _read_slot(file, handle, slot)
                    slot.target(model).copy_(
                        tensor.expand(slot.row_stop - slot.row_start, -1) if slot.broadcast else tensor
                    )
    return model


def save_model(model: CausalLM, path: str | Path, *, max_shard_bytes: int | None = None) -> None:
    """Write ``model`` as a Hugging Face directory (``config.json`` + safetensors in Hugging Face naming) that
    ``load_model`` and ``transformers`` both load. ``max_shard_bytes`` splits the weights into shards with a
    ``model.safetensors.index.json``; by default one ``model.safetensors``."""
    if model.shard.is_parallel:
        raise TensorParallelError(
            f"save_model writes whole models; this one is rank {model.shard.rank} of {model.shard.size} of a "
            "tensor-parallel group: save the single-rank model instead"
        )
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    dtype_name = str(model.dtype).removeprefix("torch.")
    (directory / CONFIG_FILE).write_text(json.dumps(model.config.to_hf_dict(torch_dtype=dtype_name), indent=2) + "\n")
    tensors = {slot.hf_name: _saved_tensor(model, slot) for slot in checkpoint_slots(model.config)}
    shards = list(_shard(tensors, max_shard_bytes))
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(directory / SINGLE_FILE), metadata=metadata)
        return
    weight_map: dict[str, str] = {}
    for index, shard in enumerate(shards, start=1):
        file_name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file_name), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, file_name))
    total_size = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    index_json = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index_json, indent=2) + "\n")


def _checkpoint_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    index_path, single_path = directory / INDEX_FILE, directory / SINGLE_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ModelLoadError(
                f"{index_path} is not a safetensors index (needs a 'weight_map' object): {error}"
            ) from None
        files = {name: directory / file_name for name, file_name in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise ModelFileNotFoundError(f"{index_path} names shard {file.name}, which is missing from {directory}")
        return files
    if single_path.is_file():
        with _open_safetensors(single_path) as checkpoint:
            return dict.fromkeys(checkpoint.keys(), single_path)
    raise ModelFileNotFoundError(
        f"no weights in {directory}: expected {SINGLE_FILE} or {INDEX_FILE} (safetensors only; .bin is not supported)"
    )


_UNREADABLE = (SafetensorError, OSError, RuntimeError)
"""What safetensors raises for a truncated or corrupt file (a header past the end, a short tensor)."""


@contextlib.contextmanager
def _open_safetensors(file: Path) -> Iterator[Any]:
    """``safe_open`` of ``file``; a file it cannot read is one ``ModelLoadError`` naming it."""
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except _UNREADABLE as error:
        raise ModelLoadError(f"{file} is not a readable safetensors file (truncated or corrupt?): {error}") from None
    with handle as opened:
        yield opened


def _read_slot(file: Path, handle: Any, slot: TensorSlot) -> torch.Tensor:
    """The part of ``slot``'s tensor this rank holds, read lazily: the shape is checked from the header first, and
    only the rows (or columns) in ``slot.source`` are read from the file."""
    try:
        lazy = handle.get_slice(slot.hf_name)
        _check_shape(file, slot, tuple(lazy.get_shape()))
        tensor = lazy[slot.index()]
    except _UNREADABLE as error:
        raise ModelLoadError(
            f"{file}: tensor {slot.hf_name!r} cannot be read (truncated or corrupt file?): {error}"
        ) from None
    if not tensor.is_floating_point():
        raise ModelLoadError(
            f"tensor {slot.hf_name!r} in {file.name} has dtype {tensor.dtype}: weights must be floating point"
        )
    return tensor


def _check_names(directory: Path, config: ModelConfig, slots: list[TensorSlot], files: dict[str, Path]) -> None:
    # Every rank's names: another rank's experts are not this rank's to read, but not foreign to the checkpoint.
    expected = {slot.hf_name for slot in (*slots, *checkpoint_slots(config))}
    missing = [slot for slot in slots if slot.hf_name not in files]
    if missing:
        first = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(
            f"checkpoint {directory} is missing tensor {first.hf_name!r}{more}: a {config.model_type} model with "
            f"this config.json needs it with shape {first.shape}"
        )
    unexpected = [
        name
        for name in files
        if name not in expected
        and not name.endswith(_IGNORED_SUFFIXES)
        and not (config.tie_word_embeddings and name == "lm_head.weight")
    ]
    if unexpected:
        logger.warning("ignoring %d tensors the model does not use, e.g. %s", len(unexpected), unexpected[:3])


def _check_shape(file: Path, slot: TensorSlot, shape: tuple[int, ...]) -> None:
    if shape != slot.shape:
        raise ModelLoadError(
            f"tensor {slot.hf_name!r} in {file.name} has shape {shape}, but config.json implies {slot.shape}"
        )


def _saved_tensor(model: CausalLM, slot: TensorSlot) -> torch.Tensor:
    rows = slot.target(model).detach()
    tensor = rows[0] if slot.broadcast else rows
    return tensor.to("cpu").contiguous().clone()


def _shard(tensors: dict[str, torch.Tensor], max_shard_bytes: int | None) -> Iterator[dict[str, torch.Tensor]]:
    """Greedy in-order packing; a tensor larger than the limit gets a shard of its own."""
    if max_shard_bytes is None:
        yield tensors
        return
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + size > max_shard_bytes:
            yield shard
            shard, shard_bytes = {}, 0
        shard[name] = tensor
        shard_bytes += size
    if shard:
        yield shard
