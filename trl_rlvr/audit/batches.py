"""How the audit's calls look like training's: GRPO-shaped batches, the run's token ids, a run's settings.

TRL's GRPOTrainer calls a reward once per generation batch: ``num_generations`` completions of each prompt side by
side (a group, sharing the prompt and the dataset row), several groups per call, every call of a run the same size,
``completion_ids`` from the run's tokenizer, and ``trainer_state`` its ``transformers.TrainerState``, one object for
the whole run, updated in place step after step. The audit calls the same way:

* :func:`plan`: each case is a group with its metamorphic variants (:mod:`trl_rlvr.audit.variants`), padded to the
  group size with repeats of its members (a GRPO group often holds the same completion twice); the groups of
  several cases, hostile and plain ones drawn in a seeded random order, share a call; every call has
  ``groups_per_call`` groups (the last one is filled with groups sent before: a run's batches are all full).
* :class:`Tokenizer`: the ids come from the run's own tokenizer when the audit is given it (a ``tokenizer.json``,
  a model directory, a hub id in the local cache, the offline SmolLM2 of ``trl_rlvr.scripts.models``); without
  one, from a byte-level BPE trained for this audit run on its own texts, with a vocabulary size and id layout
  drawn from the seed (no two audits share ids, and none is a tokenizer a reward could recompute), every id below
  its size a token and the ids decoding to the completion (the trainer of the reward's process has it as its
  ``processing_class``), and the report says so.
* :class:`TrainingRun`: the settings of a run drawn from the seed (``max_steps``, ``logging_steps``, the batch size
  and gradient accumulation that give the call's size, the learning rate,
  ``max_completion_length``, the trainer class), which the reward's process trains a trainer with: the trainer
  state, its log, token count and FLOPs are that trainer's own (:mod:`trl_rlvr.audit._child`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

from trl_rlvr.audit.cases import Case

DEFAULT_GROUP_SIZE = 4
DEFAULT_GROUPS_PER_CALL = 2


@dataclass(frozen=True)
class Item:
    """One completion of a call: the case it scores (a corpus case or one of its variants) and the prompt sent
    with it (the case's, else an instruction drawn for its group: no run has empty prompts)."""

    case: Case
    ids: tuple[int, ...]
    prompt_tokens: int = 0
    prompt: str | None = None

    @property
    def prompt_text(self) -> str:
        return self.prompt if self.prompt is not None else self.case.prompt or ""


#: Instructions for a case that has no prompt of its own, per kind (no numbers or expressions: a reward that reads
#: the question, as boxed_math does, finds none in them). A group's prompt is an opening, one of these and a closing
#: line (:func:`instructions`), drawn without replacement, so that the train dataset's rows do not repeat.
INSTRUCTIONS = {
    "math_answer": ("Solve the following problem. Put your final answer within \\boxed{}.",
                    "Please reason step by step, and put your final answer within \\boxed{}.",
                    "Answer the question below. Write the final answer in a box.",
                    "Work out the answer to the problem, then state it inside \\boxed{}.",
                    "Find the exact value asked for. Give the result in a box."),
    "code": ("Write a Python function that solves the task. Return the code in a single fenced block.",
             "Solve the programming problem below in Python.",
             "Complete the following Python code so that the tests pass.",
             "Implement the function described below in Python.",
             "Write a correct and efficient Python solution for the task."),
    "format": ("Think about the question first, then answer it.",
               "Reason inside <think> tags, then give your answer.",
               "Answer the user's question.",
               "Reflect on the request step by step before replying.",
               "First reason privately, then write a short answer."),
}
_OPENINGS = ("", "You are a helpful assistant.", "You are a careful problem solver.", "Read the task carefully.",
             "Take your time.", "This is a practice exercise.", "A student asks for help.", "Here is your next task.",
             "You are an expert tutor.", "Be concise.", "Check your work.", "Show your reasoning.")
_CLOSINGS = ("", "Explain briefly.", "Keep the answer short.", "Do not skip steps.", "Be precise.",
             "Double-check the result.", "Write clearly.", "Avoid unnecessary detail.", "State any assumptions.",
             "Use plain language.", "Be rigorous.", "Stay on topic.")


def instructions(kind: str | None, rng: random.Random):
    """The prompts for groups without a prompt of their own: every composition of an opening, an instruction of
    ``kind`` and a closing, in a drawn order (cycled once they are spent)."""
    tasks = INSTRUCTIONS.get(kind or "", ("Answer the question below.",))
    prompts = [" ".join(p for p in (o, t, c) if p) for o in _OPENINGS for t in tasks for c in _CLOSINGS]
    while True:
        yield from rng.sample(prompts, len(prompts))


@dataclass(frozen=True)
class Call:
    """One reward call (one optimizer step of the run): its completions in order (groups side by side)."""

    items: tuple[Item, ...]


# ------------------------------------------------------------------------------------------------ token ids
#: Vocabulary sizes of released tokenizers (Llama 2, Mistral, GPT-2, SmolLM2, Gemma 2, Llama 3, Qwen 2/3): the
#: drawn BPE's ids spread over one of them.
VOCAB_SIZES = (32000, 32768, 49152, 50257, 100352, 128256, 151936, 256000)


class Tokenizer:
    """The ids of the completions.

    ``source``: a ``tokenizer.json``, a model directory holding one, a hub id whose ``tokenizer.json`` is in the
    local Hugging Face cache (or can be fetched, as the run would) (``trl-rlvr rewards audit --tokenizer smollm2``
    resolves the project's offline default model to its directory first); ``None``: no tokenizer given, a byte-level BPE trained on ``texts`` with a
    layout drawn from ``rng`` (:meth:`drawn`). ``given`` tells the two apart (the report says which)."""

    def __init__(self, source: str | Path | None = None, texts: list[str] | None = None,
                 rng: random.Random | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        self.given = source is not None
        self.path: Path | None = None
        if source is None:
            rng = rng or random.Random()
            self._tok, self.name, self.eos_id, self.eos_token = self.drawn(texts or [], rng)
            return
        path = self.path = self._resolve(str(source))
        self._tok, self.name = HFTokenizer.from_file(str(path)), f"{source} ({path})" if str(path) != str(source) else str(path)
        self.eos_id = self._eos(path)
        self.eos_token = self._tok.id_to_token(self.eos_id) if self.eos_id is not None else None

    def spec(self) -> dict:
        """What the reward's process builds the run's tokenizer (the trainer's ``processing_class``) from: the
        given file's path, else the drawn tokenizer's JSON; and its end-of-sequence token."""
        if self.path is not None:
            return {"path": str(self.path), "eos_token": self.eos_token}
        return {"json": self._tok.to_str(), "eos_token": self.eos_token}

    #: End-of-turn tokens of released tokenizers, for a ``tokenizer.json`` given without its ``tokenizer_config.json``.
    EOS_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<eos>", "<end_of_turn>",
                 "<|end|>")

    def _eos(self, path: Path) -> int | None:
        """The id of the run's end-of-sequence token (a completion that ends ends with it: TRL keeps it in
        ``completion_ids``): ``eos_token`` of the ``tokenizer_config.json`` beside the file, else a known name."""
        import json

        names = list(self.EOS_NAMES)
        config = path.parent / "tokenizer_config.json"
        if config.is_file():
            try:
                eos = json.loads(config.read_text()).get("eos_token")
                eos = eos.get("content") if isinstance(eos, dict) else eos
                if isinstance(eos, str):
                    names.insert(0, eos)
            except (OSError, ValueError):
                pass
        for name in names:
            i = self._tok.token_to_id(name)
            if i is not None:
                return i
        return None

    @staticmethod
    def _resolve(source: str) -> Path:
        p = Path(source).expanduser()
        if p.is_dir():
            p = p / "tokenizer.json"
        if p.is_file():
            return p
        if Path(source).exists() or source.endswith(".json") or source.startswith((".", "/", "~")):
            raise ValueError(f"audit tokenizer: no tokenizer file at {p} (give a tokenizer.json, a model directory "
                             "or a hub id)")
        try:
            from huggingface_hub import hf_hub_download

            return Path(hf_hub_download(source, "tokenizer.json"))
        except Exception as e:  # noqa: BLE001 - any failure: not in the cache and not reachable, or not a repo
            raise ValueError(f"audit tokenizer: {source!r} is neither a tokenizer file, a model directory, nor a hub "
                             f"model whose tokenizer.json is in the cache or can be fetched ({type(e).__name__})") from e

    @staticmethod
    def drawn(texts: list[str], rng: random.Random):
        """A byte-level BPE trained on (the starts of) ``texts`` with a merge budget drawn from ``rng``; its ids
        laid out as a released tokenizer's are (a block of special tokens, the 256 bytes, then the merges in
        order of rank) over a vocabulary size drawn from :data:`VOCAB_SIZES`, with gaps drawn between them, filled
        with tokens no merge makes (every id below the size is a token, as in a released tokenizer, and
        ``decode(ids)`` is the text). -> (tokenizer, name, end-of-sequence id, end-of-sequence token)."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        sample = [t[:4000] for t in texts]
        budget = rng.randrange(1500, 6000)
        tok.train_from_iterator(sample or [""], trainers.BpeTrainer(
            vocab_size=256 + budget, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        size = rng.choice(VOCAB_SIZES)
        n = tok.get_vocab_size()
        specials = rng.choice([0, 1, 3, 17])  # where the bytes start: after a block of special tokens, or at 0
        # the merges' ids in order of rank over the rest of the vocabulary (a real BPE's ids are its merge ranks:
        # the ones a text uses most are among the first), spaced with drawn gaps
        room = size - specials - 256 - 64
        ranks = sorted(rng.sample(range(room), max(0, n - 256)))
        by_rank = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
        vocab = {}
        for k, (token, _) in enumerate(by_rank):
            vocab[token] = specials + k if k < 256 else specials + 256 + ranks[k - 256]
        eos = rng.randrange(specials) if specials else size - 1  # in the special block, else the last id (GPT-2's)
        eos_token = rng.choice(Tokenizer.EOS_NAMES)
        return (Tokenizer._with_ids(tok, vocab, size, {eos: eos_token}, rng), f"none given: a byte-level BPE drawn "
                f"for this audit (vocabulary {size})", eos, eos_token)

    @staticmethod
    def _with_ids(tok, vocab: dict[str, int], size: int, special: dict[int, str], rng: random.Random):
        """``tok`` with its tokens at the ids of ``vocab``, the ``special`` tokens at theirs, and every other id
        below ``size`` a filler token of two to five byte-level characters that no merge makes."""
        import json

        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import pre_tokenizers

        spec = json.loads(tok.to_str())
        alphabet = "".join(pre_tokenizers.ByteLevel.alphabet())
        taken = set(vocab.values()) | set(special)
        full = dict(vocab)
        for i in range(size):
            if i in taken:
                continue
            while True:  # a fresh string (a collision with a merge's token is all but impossible, but checked)
                filler = "".join(rng.choices(alphabet, k=rng.randrange(2, 6)))
                if filler not in full:
                    break
            full[filler] = i
        full.update({token: i for i, token in special.items()})
        spec["model"]["vocab"] = full
        spec["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                                 "normalized": False, "special": True} for i, t in sorted(special.items())]
        return HFTokenizer.from_str(json.dumps(spec))

    def ids(self, text: str) -> tuple[int, ...]:
        return tuple(self._tok.encode(text, add_special_tokens=False).ids)


# ------------------------------------------------------------------------------------------------ the run
class TrainingRun:
    """The settings of one drawn run, and its completions' ids as TRL hands them.

    A run: ``call_size`` completions per reward call (``per_device_train_batch_size * steps_per_generation``, one
    call per optimizer step), drawn gradient accumulation, ``logging_steps``, ``save_steps``, ``max_steps``,
    learning rate, ``max_completion_length``, GRPOTrainer or RLVRTrainer. The reward's
    process trains a trainer built with them (:meth:`trainer_settings`), whose state and log are its own."""

    def __init__(self, rng: random.Random, calls: int, call_size: int, group_size: int, reward_name: str,
                 eos_id: int | None = None):
        self.eos_id = eos_id
        self.reward_name = reward_name or "reward"
        self.group_size = group_size
        accumulation = rng.choice([d for d in (1, 1, 2, 4, 8) if call_size % d == 0])
        self.train_batch_size = call_size // accumulation
        self.accumulation = accumulation
        self.logging_steps = rng.choice([1, 1, 5, 10, 10, 25])
        self.save_steps = rng.choice([50, 100, 200, 500, 500])
        self.max_steps = calls + 1 + rng.randrange(100, 3000)  # room for the warm-ups of fresh processes too
        self.lr = rng.choice([1e-6, 1e-6, 3e-6, 5e-7, 1e-5])
        self.max_completion_length = rng.choice([512, 1024, 2048, 4096, 8192])
        self.rlvr = rng.random() < 0.5

    def describe(self) -> dict:
        """The run's drawn settings, for the report."""
        return {"max_steps": self.max_steps, "logging_steps": self.logging_steps, "save_steps": self.save_steps,
                "train_batch_size": self.train_batch_size,
                "max_completion_length": self.max_completion_length, "trainer": "RLVRTrainer" if self.rlvr else
                "GRPOTrainer"}

    def trainer_settings(self) -> dict:
        """The settings the reward's process builds the run's trainer with (its ``args``): the batch, group and
        step settings that give the calls their size and the state its fields, as the run's configuration has
        them. ``trainer``: ``RLVRTrainer`` or ``GRPOTrainer``."""
        return {"trainer": "RLVRTrainer" if self.rlvr else "GRPOTrainer",
                "per_device_train_batch_size": self.train_batch_size, "gradient_accumulation_steps": self.accumulation,
                "num_generations": self.group_size, "max_completion_length": self.max_completion_length,
                "max_steps": self.max_steps, "logging_steps": self.logging_steps, "save_steps": self.save_steps,
                "learning_rate": self.lr}

    def completion_ids(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        """A completion's ids as the policy generates them: ending with the end-of-sequence token when the
        completion ends before ``max_completion_length``, cut there when it would run past it (TRL keeps both)."""
        if self.eos_id is None or len(ids) >= self.max_completion_length:
            return ids[:self.max_completion_length]
        return (*ids, self.eos_id)

    def prepare(self, call: Call) -> Call:
        """``call`` with its completions' ids as the policy generates them."""
        return replace(call, items=tuple(replace(it, ids=self.completion_ids(it.ids)) for it in call.items))


def plan(cases: list[list[Case]], tokenizer: Tokenizer, rng: random.Random, group_size: int = DEFAULT_GROUP_SIZE,
         groups_per_call: int = DEFAULT_GROUPS_PER_CALL, kind: str | None = None) -> list[Call]:
    """The calls for ``cases`` (each a corpus case followed by its variants), in a seeded random order.

    Only cases with the same columns share a call, and the calls of one set of columns come in a row (one dataset
    has one set of columns: the reward's process trains a run per set, :func:`call_columns`); each case's group is
    its members, shuffled, padded with repeats to ``group_size`` (a case with more members than that is several
    groups), all with the case's prompt (a case without one: an instruction drawn for the group,
    :func:`instructions`: the groups' rows are distinct); every call holds ``groups_per_call``
    groups (the last call of a set of columns is filled with groups of that set drawn again)."""
    groups: dict[tuple, list[list[Case]]] = {}
    for members in cases:
        shuffled = rng.sample(members, len(members))
        for k in range(0, len(shuffled), group_size):  # more members than a group holds: several groups
            group = shuffled[k:k + group_size]
            while len(group) < group_size:
                group.append(rng.choice(members))
            rng.shuffle(group)
            groups.setdefault(tuple(sorted(members[0].columns)), []).append(group)
    chunks = []
    for same_columns in rng.sample(list(groups.values()), len(groups)):  # a set's calls in a row: one run each
        rng.shuffle(same_columns)
        for i in range(0, len(same_columns), groups_per_call):
            chunk = same_columns[i:i + groups_per_call]
            while len(chunk) < groups_per_call:
                chunk.append(rng.choice(same_columns))
            chunks.append(chunk)
    ids: dict[str, tuple[int, ...]] = {}
    prompt_tokens: dict[str, int] = {}
    drawn = instructions(kind, rng)

    def item(c: Case, prompt: str) -> Item:
        if c.completion not in ids:
            ids[c.completion] = tokenizer.ids(c.completion)
        if prompt not in prompt_tokens:
            prompt_tokens[prompt] = len(tokenizer.ids(prompt))
        return Item(c, ids[c.completion], prompt_tokens[prompt], None if c.prompt else prompt)

    def group_items(group: list[Case]) -> tuple[Item, ...]:  # one prompt per group: a row of the dataset
        prompt = group[0].prompt or next(drawn)
        return tuple(item(c, prompt) for c in group)

    return [Call(tuple(it for group in chunk for it in group_items(group))) for chunk in chunks]


def call_columns(call: Call) -> tuple[str, ...]:
    """The dataset columns of ``call``'s rows (every case of a call has the same, :func:`plan`)."""
    return tuple(sorted(call.items[0].case.columns)) if call.items else ()


def row_columns(row: dict) -> tuple[str, ...]:
    """The columns of a dataset row of :func:`step_rows` (its keys but the prompt), as :func:`call_columns`."""
    return tuple(sorted(k for k in row if k != "prompt"))


def step_rows(call: Call, group_size: int) -> list[dict]:
    """The train dataset's rows a step of ``call`` draws: one per group (its prompt and the case's columns), in
    the call's order (TRL's sampler repeats each row ``num_generations`` times, side by side)."""
    return [{"prompt": it.prompt_text, **it.case.columns} for it in call.items[::group_size]]
