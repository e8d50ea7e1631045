"""The audit's reward process: builds the reward and a trainer of the run, and trains it on the audit's calls.

Started by :mod:`trl_rlvr.audit.runner` as a script (a copy of this file, ``train.py`` in the audit's scratch
directory, run from there by a shell script, ``sh train.sh``, its parent process), so that no module of the audit is
imported in the reward's process, and ``sys.argv``, ``__main__`` and the frames' files name no audit. It is the one
module of ``trl_rlvr.audit`` that imports the trainer and its config (tests/test_layout.py exempts it): no module of
the package imports it. Requests and replies are JSON lines on private copies of stdin/stdout; fd 0 is then
/dev/null and fd 1 the child's stderr, so a reward (or code it runs) that reads stdin or prints does not touch the
channel.

The reward is called by a training run: the first request carries the run's settings and the audit's rows, and the
process builds a real ``RLVRTrainer`` (or ``GRPOTrainer``, as the run drawn) on a tiny model built from a config,
with the run's tokenizer as its ``processing_class``, and calls its ``train()``. Each optimizer step of that run is
one request. The run's train dataset is a ``datasets.Dataset`` of the audit's rows (a row per group: its prompt and
columns, each row once), the rows of the steps planned at the indices the trainer's own sampler draws first, so
that TRL's ``RepeatSampler`` and transformers' dataloader hand each step its request's rows; where the policy
generates, its ``generate`` returns the request's completion ids after the prompts. Everything else is TRL's and
transformers' own code: the prompts tokenized, the completions decoded from the ids (cut after the first
end-of-sequence token, as TRL cuts them), the generation's metrics, ``_calculate_rewards`` called from
``_generate_and_score_completions`` under ``training_step`` and ``_inner_training_loop``, the advantages, the loss's
forward and backward on the tiny model, the optimizer step, the logging, the trainer state. The scores replied are
the rewards TRL put in its completions table for that step.

What of TRL and transformers this relies on beyond their documented API, named here and nowhere else
(:data:`PRIVATE_NAMES`): TRL's completions table ``GRPOTrainer._logs["rewards"][name]`` (the object ``__init__``
sets, read at the next step: the rewards of the generation, in the rows' order); TRL's generation without vLLM or
continuous batching calling the policy's ``generate(input_ids=..., attention_mask=..., generation_config=...)`` and
taking the completion as what follows the left-padded prompts (``GRPOTrainer._generate_single_turn``); the order in
which the trainer's sampler draws a dataset's rows (``GRPOTrainer._get_train_sampler``: a fresh one, seeded by
``args.seed``, draws the first epoch as a fresh ``train()`` does); TRL's fused LM head (``add_fused_lm_head``: the
model's ``forward(..., labels=..., fused_lm_head=True)`` returning a ``FusedCausalLMOutput``), which the tiny model
computes over the batch's own tokens (:func:`_tokens_head`).
"""

from __future__ import annotations

import base64
import json
import math
import numbers
import os
import pickle
import sys
import traceback


def _channel():
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return requests, replies


def _error(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {str(e)[:300]}{where}"


def _build(setup: dict):
    if setup.get("pickled"):
        return pickle.loads(base64.b64decode(setup["pickled"]))
    from trl_rlvr.rewards import resolve_reward_spec

    reward = resolve_reward_spec(setup["reward"], setup.get("options") or None)
    if isinstance(reward, str):  # a reward model's hub id or path: TRL's to load, not a function to audit
        raise TypeError(f"{reward!r} names a reward model (a hub id or a path), not a reward function: the audit "
                         "runs reward functions (a registered name or module:function)")
    return reward


# -------------------------------------------------------------------------------------------- the run's trainer
def _tokenizer(spec: dict):
    """The run's tokenizer as the trainer's ``processing_class``: the given file (with the configuration beside
    it, as the run loads it), else the tokenizer drawn for the audit."""
    from pathlib import Path

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if spec.get("path"):
        path = Path(spec["path"])
        try:
            tok = AutoTokenizer.from_pretrained(str(path.parent), local_files_only=True)
        except Exception:  # noqa: BLE001 - a bare tokenizer.json: no configuration to load it with
            tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    else:
        from tokenizers import Tokenizer

        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(spec["json"]))
    if tok.eos_token is None and spec.get("eos_token"):
        tok.eos_token = spec["eos_token"]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _model(tokenizer):
    """A tiny causal LM of the tokenizer's vocabulary, built from a config (nothing is downloaded)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return AutoModelForCausalLM.from_config(config)


def _dataset(rows: list[dict]):
    """A train dataset of ``rows`` (prompt and columns; a column a row lacks is None). Columns whose values Arrow
    cannot hold in one column are stored as JSON text."""
    from datasets import Dataset

    rows = rows or [{"prompt": ""}]
    names = list(dict.fromkeys(k for r in rows for k in r))
    table = {k: [r.get(k) for r in rows] for k in names}
    try:
        return Dataset.from_dict(table)
    except Exception:  # noqa: BLE001 - mixed types in a column (Arrow's errors vary)
        return Dataset.from_dict({k: v if k == "prompt" else [json.dumps(x) for x in v] for k, v in table.items()})


def _key(row: dict) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def _run_dataset(trainer, steps: list[list[dict]], rows: list[dict], messages: bool):
    """The run's train dataset: the rows of the steps planned (``steps``, a row per group), at the indices the
    trainer's own sampler draws first, in that order, then the audit's other rows (``rows``), each once: TRL's
    ``RepeatSampler`` and transformers' dataloader hand each step its call's rows (:data:`PRIVATE_NAMES`)."""
    planned = [row for step in steps for row in step]
    keys = {_key(r) for r in planned}
    rest = [r for r in rows if _key(r) not in keys]
    n = len(planned) + len(rest)
    drawn = list(dict.fromkeys(trainer._get_train_sampler(range(n))))  # the first epoch's order, groups once
    if len(drawn) < len(planned):
        raise RuntimeError(f"the sampler draws {len(drawn)} of {n} rows, the steps planned need {len(planned)}")
    table: list[dict | None] = [None] * n
    for index, row in zip(drawn, planned):
        table[index] = row
    free = iter(rest)
    table = [row if row is not None else next(free) for row in table]
    if messages:  # a conversational dataset's prompts, rendered by the tokenizer's chat template
        table = [{**r, "prompt": [{"role": "user", "content": r.get("prompt") or ""}]} for r in table]
    return _dataset(table)


def _rows_a_run_accepts(reward, rows: list[dict]) -> list[dict]:
    """The rows a run could train on: RLVRTrainer refuses a dataset with a row the reward's ``check_rows`` rejects
    before the model loads, so such a row never reaches the reward in training; the audit still scores its case."""
    check = getattr(reward, "check_rows", None)
    if not callable(check):
        return rows
    kept = []
    for row in rows:
        try:
            check(_dataset([row]))
        except ValueError:
            continue
        kept.append(row)
    return kept


#: TRL and transformers names this process relies on beyond their documented API (the module docstring says how).
PRIVATE_NAMES = ("trl.GRPOTrainer._logs", "trl.GRPOTrainer._generate_single_turn (calls model.generate)",
                 "trl.GRPOTrainer._get_train_sampler (a fresh sampler draws the first epoch as train() does)",
                 "trl.trainer.utils.add_fused_lm_head (model(..., fused_lm_head=True) -> FusedCausalLMOutput)")


def _trainer(reward, run: dict, rows: list[dict], messages: bool):
    """The run's trainer, built as a training script builds it."""
    import torch

    settings = dict(run["settings"])
    name = settings.pop("trainer")
    if not torch.cuda.is_available():  # bf16 is the configs' default on a GPU only
        settings["bf16"] = False
    if name == "RLVRTrainer":
        from trl_rlvr.config import RLVRConfig as config_class
        from trl_rlvr.trainer import RLVRTrainer as trainer_class
    else:
        from trl import GRPOConfig as config_class
        from trl import GRPOTrainer as trainer_class
    tokenizer = _tokenizer(run["tokenizer"])
    if messages:  # a conversational dataset's prompts, rendered by the tokenizer's chat template
        rows = [{**r, "prompt": [{"role": "user", "content": r.get("prompt") or ""}]} for r in rows]
        if tokenizer.chat_template is None:
            tokenizer.chat_template = _CHAT_TEMPLATE
    return trainer_class(model=_model(tokenizer), reward_funcs=[reward], args=config_class(**settings),
                         train_dataset=_dataset(_rows_a_run_accepts(reward, rows)), processing_class=tokenizer)


#: ChatML, for a tokenizer without a chat template in an audit of conversational prompts.
_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tokens_head(trainer) -> None:
    """The tiny policy's log-probabilities, as TRL's fused LM head gives them (``model(..., labels=...,
    fused_lm_head=True)``), over the batch's own token ids (and the first 64) rather than the whole vocabulary.

    TRL's head scores every position against every token of the vocabulary, which on a CPU costs seconds per call
    for a released tokenizer's 32,000 to 256,000 tokens, and minutes for a call of completions cut at
    ``max_completion_length``; this one costs what the batch's tokens cost. It is the audit's model's own forward
    (the model is the audit's, :data:`PRIVATE_NAMES`): the loss, its backward, the gradient norm and the optimizer
    step are TRL's and torch's, on these log-probabilities."""
    import types

    import torch
    from trl.trainer.utils import FusedCausalLMOutput

    model, fused, temperature = trainer.model, trainer.model.forward, trainer.args.temperature

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head or shift_labels is not None:
            return fused(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                         num_items_in_batch=num_items_in_batch, **kwargs)
        hidden = self.base_model(*args, **{**kwargs, "use_cache": False}).last_hidden_state[:, :-1]
        labels = labels[:, 1:]
        mask = labels != -100
        weight = self.get_output_embeddings().weight
        ids = torch.unique(torch.cat([labels[mask], torch.arange(min(64, weight.size(0)), device=labels.device)]))
        logp = torch.log_softmax((hidden @ weight[ids].T).float() / temperature, dim=-1)
        where = torch.searchsorted(ids, labels.clamp(min=0)).clamp(max=ids.numel() - 1)
        log_probs = logp.gather(-1, where.unsqueeze(-1)).squeeze(-1).masked_fill(~mask, 0)
        entropy = -(logp.exp() * logp).sum(-1).masked_fill(~mask, 0)
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        return FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, label_mask=mask)

    model.forward = types.MethodType(forward, model)


class _End(BaseException):
    """The audit closed its requests: the run stops here."""


class Session:
    """The channel and the run's trainer: each optimizer step of ``trainer.train()`` draws the next request's rows
    from the train dataset and generates its completions (:meth:`generated`) and, at the next step, replies with
    their scores."""

    def __init__(self, reward, messages: bool, requests, replies):
        self.reward, self.messages = reward, messages
        self.requests, self.replies = requests, replies
        self.trainer = None
        self.table: dict = {}  # the trainer's completions table, TRL's ``_logs`` as its __init__ sets it
        self.rows: list[dict] = []  # the audit's rows (every group's), for the runs' train datasets
        self.waiting: dict | None = None  # a request read, no step taken for it yet
        self.pending: tuple[int, int] | None = None  # (request id, completions) of the step in progress
        self.steps: list[str] = []  # the rows of the steps planned for this run (JSON), the next one first
        self._ids: list[list[int]] = []

    def read(self) -> dict:
        line = self.requests.readline()
        if not line:
            raise _End
        return json.loads(line)

    def reply(self, message: dict) -> None:
        self.replies.write(json.dumps(message) + "\n")

    def scored(self) -> None:
        """Reply with the scores of the step just taken: the rewards TRL wrote in its completions table (the
        trainer's own, :attr:`table`: it is read from within the next step's generation, where RLVRTrainer holds
        the round's entries in a table of the round's)."""
        if self.pending is None:
            return
        (i, n), self.pending = self.pending, None
        table = self.table["rewards"][self.trainer.reward_func_names[0]]
        try:
            self.reply({"i": i, "scores": [_one_score(v) for v in list(table)[-len(self._ids):][:n]]})
        except (TypeError, ValueError) as e:
            self.reply({"i": i, "error": _error(e)})

    def failed(self, e: BaseException) -> None:
        """Reply with ``e`` to the request it ended (the step in progress, else the one read for the next)."""
        if self.pending is not None:
            (i, _), self.pending = self.pending, None
        elif self.waiting is not None:
            i, self.waiting = self.waiting["i"], None
        else:
            raise e
        self.reply({"i": i, "error": _error(e)})

    def start(self):
        """The train dataset of the run that starts: the next request carries the rows of its steps."""
        if self.waiting is None:
            self.waiting = self.read()
        steps = self.waiting.get("steps")
        if not steps:
            raise RuntimeError("the request that starts a run carries no steps")
        self.steps = [json.dumps(step, sort_keys=True, default=str) for step in steps]
        return _run_dataset(self.trainer, steps, self.rows, self.messages)

    def generated(self, prompt_ids):
        """What the policy's ``generate`` returns for the step's prompts (left-padded, as given): the prompts
        followed by the next request's completion ids, right-padded (after replying to the previous step)."""
        import torch

        self.scored()
        request = self.waiting if self.waiting is not None else self.read()
        self.waiting = None
        items = request["items"]
        self.pending = (request["i"], len(items))
        limit = self.trainer.args.max_completion_length  # where generation stops
        self._ids = [list(it["ids"])[:limit] for it in items]
        group = self.trainer.num_generations
        rows = [{"prompt": it.get("prompt") or "", **it.get("columns", {})} for it in items[::group]]
        if not self.steps or self.steps.pop(0) != json.dumps(rows, sort_keys=True, default=str):
            raise RuntimeError("the request is not the step the run's dataset planned")
        if len(items) != prompt_ids.size(0):
            raise RuntimeError(f"the step generates {prompt_ids.size(0)} completions, the request has {len(items)}")
        pad = self.trainer.processing_class.pad_token_id
        width = max(1, *(len(x) for x in self._ids))
        out = torch.full((len(self._ids), width), pad, dtype=prompt_ids.dtype)
        for r, ids in enumerate(self._ids):
            out[r, :len(ids)] = torch.tensor(ids, dtype=prompt_ids.dtype)
        return torch.cat([prompt_ids, out.to(prompt_ids.device)], dim=1)


def _seams(session: Session) -> None:
    """Where the audit's request enters the run (:data:`PRIVATE_NAMES`): the policy's ``generate`` returns its
    completions (the step's rows are the dataset's, drawn by the trainer's sampler). Anything else calling it (a
    reward that generates with a model of its own) gets the library's."""
    model_class = type(session.trainer.model)
    generate = model_class.generate

    def generate_completions(self, *args, **kwargs):
        if self is not session.trainer.model:
            return generate(self, *args, **kwargs)
        return session.generated(kwargs["input_ids"] if "input_ids" in kwargs else args[0])

    generate_completions.__name__ = generate_completions.__qualname__ = "generate"
    generate_completions.__doc__ = generate.__doc__
    model_class.generate = generate_completions


def _one_score(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"the reward returned a score of type {type(value).__name__}, not a number or None")
    value = float(value)
    if math.isnan(value):
        return None
    if math.isinf(value):
        raise ValueError(f"the reward returned an infinite score ({value})")
    return value


def serve(session: Session, build) -> None:
    """Build the run's trainer at the first request, then train: every step is a request; an exception (the
    reward's, within a step) is that request's reply, and the run starts again (its dataset the steps planned
    from the next request on)."""
    session.waiting = session.read()
    session.rows = session.waiting.get("rows") or []
    try:
        session.trainer = build(session.waiting)
    except BaseException as e:  # noqa: BLE001 - every request gets it
        while True:
            session.failed(e)
            session.waiting = session.read()
    session.table = session.trainer._logs
    _seams(session)
    _tokens_head(session.trainer)
    while True:
        try:
            session.trainer.train_dataset = session.start()
            session.trainer.train()
            raise RuntimeError("the run reached max_steps before the audit's last call")
        except _End:
            return
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: the reward raised it
            session.failed(e)


def main() -> None:
    requests, replies = _channel()
    setup = json.loads(requests.readline())
    sys.path[1:1] = [p for p in setup.get("path", []) if p not in sys.path]  # where the audit imports from
    try:
        import transformers  # noqa: F401 - first, as in a training process
        reward = _build(setup)
        if not callable(reward):
            raise TypeError(f"{setup.get('reward')!r} is not callable")
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which explains it
        replies.write(json.dumps({"fatal": str(e) if isinstance(e, (ValueError, TypeError, ImportError)) else _error(e)}) + "\n")
        return
    kind = getattr(reward, "reward_kind", None)
    replies.write(json.dumps({"ready": True, "name": getattr(reward, "__name__", repr(reward)),
                              "kind": kind if isinstance(kind, str) else None}) + "\n")
    messages = setup.get("messages", False)
    session = Session(reward, messages, requests, replies)
    try:
        serve(session, lambda request: _trainer(reward, request["run"], request.get("rows") or [], messages))
    except _End:
        return


if __name__ == "__main__":
    main()
