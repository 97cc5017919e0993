"""`hf-pretrain gguf`: an exported model folder as one GGUF file for llama.cpp and the tools built on it.

    hf-pretrain gguf exports/1b                       # exports/1b/1b-f16.gguf
    hf-pretrain gguf exports/1b --gguf_type q8_0      # 8-bit, about half the size of f16

Written with `gguf`, llama.cpp's own Python library. llama.cpp's converter cannot take our folders:
it recognises a BPE tokenizer by hashing the ids it gives for a test string, so every freshly
trained vocabulary is "not recognized" even though its pre-tokenizer is exactly GPT-2's. We know
that pre-tokenizer (we trained it), so we check it and write it as such (`tokenizer.ggml.pre = gpt-2`).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hf_pretrain.config import CommandParser
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_WRITE_FAILED
from hf_pretrain.formatting import human_bytes
from hf_pretrain.publish.formats import GGUF_TYPES
from hf_pretrain.publish.targets import unwritable_reason

if TYPE_CHECKING:  # torch is loaded with the weights, not for `--help`
    import torch

# The GPT-2 pre-tokenizer our BPE trains with: byte level, GPT-2's split regex, no prefix space.
GPT2_PRE_TOKENIZER = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}


class GGUFError(RuntimeError):
    """A model folder that cannot be written as GGUF, with the reason."""


class GGUFWriteError(GGUFError):
    """The disk refused the GGUF file (full, quota, I/O error); its partial file was removed."""


def _gguf():
    try:
        import gguf
    except ImportError as exc:  # the `gguf` extra
        from hf_pretrain.extras import install_line

        raise GGUFError(f"GGUF export needs the `gguf` package: {install_line('gguf')}") from exc
    return gguf


def check_gpt2_pre_tokenizer(tokenizer_json: dict) -> None:
    """Refuse a tokenizer whose text splitting is not GPT-2's: llama.cpp would split differently."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    differs = {
        k: pre.get(k) for k, v in GPT2_PRE_TOKENIZER.items() if pre.get(k, True if k == "use_regex" else None) != v
    }
    if differs or tokenizer_json.get("normalizer"):
        raise GGUFError(
            f"the tokenizer's pre-tokenizer is {json.dumps(pre)} with normalizer "
            f"{json.dumps(tokenizer_json.get('normalizer'))}; GGUF export writes `tokenizer.ggml.pre = gpt-2` and "
            f"only supports GPT-2's byte-level pre-tokenizer (no prefix space, no normalizer), which is what "
            f"`hf-pretrain prepare` trains"
        )
    if (tokenizer_json.get("model") or {}).get("type") != "BPE":
        raise GGUFError(f"the tokenizer model is {tokenizer_json.get('model', {}).get('type')}, not BPE")


def permute_rows_for_llama_cpp(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q/k projections with each head's rotary halves interleaved: transformers rotates the two
    halves of a head (`rotate_half`), llama.cpp rotates adjacent pairs, so the rows are reordered."""
    rows, cols = weight.shape
    head_dim = rows // n_heads
    return weight.reshape(n_heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def _vocabulary(tokenizer_json: dict, vocab_rows: int, gguf) -> tuple[list[str], list[int], list[str]]:
    """Tokens by id (padded with unused `[PADn]` up to the embedding rows), their types, merges."""
    model = tokenizer_json["model"]
    by_id = {index: token for token, index in model["vocab"].items()}
    special = set()
    for added in tokenizer_json.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    if len(by_id) > vocab_rows:
        raise GGUFError(f"the tokenizer has {len(by_id)} tokens but the model only {vocab_rows} embedding rows")
    tokens, types = [], []
    for index in range(vocab_rows):
        if index in by_id:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.CONTROL if index in special else gguf.TokenType.NORMAL)
        else:  # rows added to round the vocabulary up for tensor cores: never produced, never decoded
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def _tensor_data(name: str, tensor: torch.Tensor, gguf_type: str, gguf):
    """(data, raw_shape, raw_dtype) for the writer: 1-D tensors (norms) stay f32, as llama.cpp keeps them."""
    array = tensor.float().numpy()
    if array.ndim == 1 or gguf_type == "f32":
        return array.astype(np.float32), None, None
    if gguf_type == "f16":
        return array.astype(np.float16), None, None
    qtype = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[gguf_type]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if array.shape[-1] % block:
        return array.astype(np.float16), None, None  # rows that do not split into q8_0 blocks stay f16
    return gguf.quants.quantize(array, qtype), None, qtype  # bytes; the writer derives the shape from them


FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}


def write_gguf(
    folder: str | Path, out: str | Path | None = None, gguf_type: str = "f16", overwrite: bool = False
) -> Path:
    """Write the Llama model folder `folder` (an `hf-pretrain export`) as GGUF; returns the file. An
    existing `out` is replaced only with `overwrite`, and only when it is a GGUF file (never a user's other file)."""
    gguf = _gguf()
    folder = Path(folder)
    if gguf_type not in GGUF_TYPES:
        raise GGUFError(f"--gguf_type {gguf_type!r} is not one of {', '.join(GGUF_TYPES)}")
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise GGUFError(f"{folder} has no {name}: give a model folder written by `hf-pretrain export`")
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise GGUFError(f"{folder} holds a {config.get('model_type')!r} model; GGUF export writes Llama models")
    tokenizer_json = json.loads((folder / "tokenizer.json").read_text())
    check_gpt2_pre_tokenizer(tokenizer_json)
    tokenizer_config = (
        json.loads((folder / "tokenizer_config.json").read_text())
        if (folder / "tokenizer_config.json").is_file()
        else {}
    )
    out = Path(out) if out is not None else folder / f"{folder.name}-{gguf_type}.gguf"
    if out.is_dir():
        raise GGUFError(
            f"--out {out} is a folder; give the file to write, e.g. --out {out / f'{folder.name}-{gguf_type}.gguf'}"
        )
    refuse_replacing(out, overwrite)
    unwritable = unwritable_reason(out.absolute().parent)
    if unwritable:
        raise GGUFError(f"cannot write {out}: {unwritable}; choose an --out on a writable disk")
    out.parent.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import load_file

    weights = load_file(folder / "model.safetensors")

    # written as NAME.gguf.tmp, renamed when whole: a kill leaves only the .tmp (`export --overwrite` removes it)
    building = out.with_name(out.name + ".tmp")
    try:
        _write_file(gguf, building, folder.name, config, tokenizer_json, tokenizer_config, weights, gguf_type)
        building.replace(out)
    except OSError as exc:  # a full disk, a quota: said in a line, the partial file removed
        building.unlink(missing_ok=True)
        try:
            free = f"{human_bytes(shutil.disk_usage(out.parent).free)} free on {out.parent}"
        except OSError:
            free = f"{out.parent} cannot be read"
        raise GGUFWriteError(
            f"writing {building} failed: {exc.strerror or exc}; {free}. The partial file was removed: free space "
            f"or choose another --out"
        ) from None
    except BaseException:
        building.unlink(missing_ok=True)
        raise
    return out


def _write_file(
    gguf,
    building: Path,
    name: str,
    config: dict,
    tokenizer_json: dict,
    tokenizer_config: dict,
    weights: dict[str, torch.Tensor],
    gguf_type: str,
) -> None:
    """The GGUF file: llama.cpp's metadata keys, the vocabulary, the tensors."""
    vocab_rows = weights["model.embed_tokens.weight"].shape[0]
    writer = gguf.GGUFWriter(str(building), arch=gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    _add_model_keys(writer, gguf, name, config, vocab_rows, gguf_type)
    _add_vocabulary(writer, gguf, tokenizer_json, tokenizer_config, vocab_rows)
    _add_tensors(writer, gguf, config, weights, gguf_type)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    finally:  # a failed write leaves the file open: close it, so that removing it frees the disk
        for fout in writer.fout or []:
            try:
                fout.close()
            except OSError:
                pass


def _add_model_keys(writer, gguf, name: str, config: dict, vocab_rows: int, gguf_type: str) -> None:
    """llama.cpp's keys for the architecture: sizes, heads, rotary base, norm epsilon, the file's tensor type."""
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    rope_theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    writer.add_name(name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config.get("head_dim") or hidden // heads)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(vocab_rows)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[gguf_type]))


def _add_vocabulary(writer, gguf, tokenizer_json: dict, tokenizer_config: dict, vocab_rows: int) -> None:
    """The BPE vocabulary as GPT-2's, its merges, and the special tokens the tokenizer config names."""
    tokens, types, merges = _vocabulary(tokenizer_json, vocab_rows, gguf)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    ids = {token: index for index, token in enumerate(tokens)}
    for key, add in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
        ("unk_token", writer.add_unk_token_id),
    ):
        token = tokenizer_config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if token in ids:
            add(ids[token])
    writer.add_add_bos_token(False)  # a base model trained on documents separated by EOS, never prefixed by BOS


def _add_tensors(writer, gguf, config: dict, weights: dict[str, torch.Tensor], gguf_type: str) -> None:
    """Every weight under its llama.cpp name, q/k rows reordered for its rotary layout; a tied head left out."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    for name, tensor in weights.items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # tied: llama.cpp reuses token_embd when `output` is absent
        if name.endswith("self_attn.q_proj.weight"):
            tensor = permute_rows_for_llama_cpp(tensor, heads)
        elif name.endswith("self_attn.k_proj.weight"):
            tensor = permute_rows_for_llama_cpp(tensor, kv_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise GGUFError(f"no GGUF name for the tensor {name}")
        data, raw_shape, raw_dtype = _tensor_data(name, tensor, gguf_type, gguf)
        writer.add_tensor(gguf_name, data, raw_shape=raw_shape, raw_dtype=raw_dtype)


GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def refuse_replacing(out: Path, overwrite: bool) -> None:
    """Raise GGUFError when writing `out` would replace a file: any file without `overwrite`, a file that
    is not a GGUF file even with it."""
    if not out.exists() and not out.is_symlink():
        return
    try:
        with out.open("rb") as file:
            is_gguf = file.read(4) == GGUF_MAGIC
    except OSError:
        is_gguf = False
    if not is_gguf:
        raise GGUFError(f"--out {out} exists and is not a GGUF file; it is never replaced: choose another --out")
    if not overwrite:
        raise GGUFError(f"--out {out} already exists; pass --overwrite to replace it, or choose another --out")


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="hf-pretrain gguf", description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1]
    )
    parser.add_argument("folder", help="a model folder written by `hf-pretrain export`")
    parser.add_argument("--gguf_type", choices=GGUF_TYPES, default="f16", help="tensor type")
    parser.add_argument("--out", help="the .gguf file to write (unset: FOLDER/NAME-TYPE.gguf)")
    parser.add_argument("--overwrite", action="store_true", help="replace a GGUF file at --out (never another file)")
    args = parser.parse_args(argv)
    from hf_pretrain.store.urls import is_url

    if is_url(args.folder):  # a Path of it would read `s3:/bucket/...`: said, with the command that reads it
        print(
            f"hf-pretrain gguf: {args.folder} is a URL; gguf reads a model folder on this machine. "
            f"`hf-pretrain export --checkpoint {args.folder} --out model --gguf --gguf_type {args.gguf_type}` "
            f"reads the URL and writes both",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        path = write_gguf(args.folder, args.out, args.gguf_type, args.overwrite)
    except GGUFError as exc:
        print(f"hf-pretrain gguf: {exc}", file=sys.stderr)
        return EXIT_WRITE_FAILED if isinstance(exc, GGUFWriteError) else EXIT_CONFIG
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
