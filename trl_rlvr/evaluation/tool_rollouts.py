"""Tool rollouts for the evaluation: TRL's multi-turn tool loop (``GRPOTrainer._tool_call_loop`` in TRL 1.16), with
each turn sampled like the plain evaluation, so a sample depends only on ``(seed, question, sample)``.

One rollout, as TRL runs it with ``environment_factory``:

1. an environment instance (constructed once per slot of a batch, ``reset(**row)`` before each rollout; a string it
   returns is appended to the last user message), its public methods but ``reset`` / ``get_reward`` are the tools;
2. the prompt rendered with those tools (``apply_chat_template(tools=...)``, through TRL's prefix-preserving training
   template when the tokenizer's own is not prefix-preserving); the model's turn parsed by TRL's
   ``parse_response`` (the tokenizer's response template, set by TRL's ``add_response_schema`` for the templates it
   knows);
3. each tool call run (an unknown tool, bad arguments or an exception: the reply is ``{'error': ...}`` and the call
   counts as failed), its reply rendered by the chat template and appended by token concatenation (no
   re-tokenization); a reply that would push the completion past ``max_new_tokens`` (TRL's
   ``max_completion_length``) or the model's context is dropped and the rollout ends there;
4. the next turn generated, truncated to what is left of the budget, and parsed; repeat while it calls a tool
   (at most ``max_tool_calling_iterations`` times).

Sampling: turn ``t`` of a sample draws from its own stream, ``random.Random(f"{seed}:{question}:{sample}")`` for the
first turn (the plain evaluation's stream) and ``...:{t}`` after the ``t``-th tool reply. ``generate`` draws for every
row of a batch at every step, finished or not, so one stream carried across turns would depend on the batch; one
stream per turn does not. With a vLLM engine (``llm``) every turn is a request of its own, seeded from the same
stream's name (:func:`trl_rlvr.evaluation.vllm_generation.stream_seed`), with what is left of its budget.

Per sample the metrics a tool run needs: tool calls, turns whose tool call did not parse (TRL falls back to plain
text for them: ``parse_response`` raised, or its calls failed TRL's validation), calls that failed in TRL's loop,
errors and timeouts the environment counts in its ``stats`` (``PythonEnvironment``: cells that raised, cells that
ran out of time), tool-reply tokens (the completion's ``tool_mask == 0`` tokens), model tokens, and whether a reply
was dropped for the budget or the call cap was reached.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trl_rlvr.evaluation.cached_turns import CachedTurns
from trl_rlvr.evaluation.generation import SamplingSettings, end_of_sequence_ids, generate_token_rows

#: the metrics of one rollout, summed over samples by the summary
TOOL_COUNTS = ("calls", "call_turns", "parse_failures", "call_failures", "env_errors", "timeouts", "tool_tokens", "model_tokens",
               "reply_dropped", "capped")


def environment_tools(environment) -> list[Callable]:
    """The tools TRL offers for an environment instance: its class's public functions but ``reset`` and
    ``get_reward``, bound to the instance, in name order."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def tool_chat_template(tokenizer, chat_template: str | None = None) -> str | None:
    """Ready ``tokenizer`` for tool rollouts as TRL's trainer does, and return the chat template to render with
    (``None``: the tokenizer's own).

    ``chat_template``: template text to render with instead of the tokenizer's (the tokenizer's own is left as it
    is). Raises ``ValueError`` when the template cannot render a tool-calling conversation (TRL's
    ``supports_tool_calling``) or no response template is known for it (TRL's ``add_response_schema``, which sets
    it on the tokenizer, as the trainer does). A template that is not prefix-preserving is swapped for TRL's
    training template (``get_training_chat_template``), as the trainer does.
    """
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    original = tokenizer.chat_template
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    try:
        if not supports_tool_calling(tokenizer):
            raise ValueError(
                "tool rollouts: the chat template does not render a tool-calling conversation (user -> assistant "
                "with tool_calls -> tool); give one that does (`chat_template`: a file or one of TRL's templates, "
                "docs/python_tool.md)"
            )
        if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
            try:
                add_response_schema(tokenizer)
            except ValueError as e:
                raise ValueError(f"tool rollouts: no response template to parse tool calls with: {e}") from None
        if is_chat_template_prefix_preserving(tokenizer):
            return chat_template
        return get_training_chat_template(tokenizer)
    finally:
        tokenizer.chat_template = original


class _RecordingParser:
    """The tokenizer as TRL's ``parse_response`` sees it, recording whether its own parser raised and what it
    returned, so that a turn TRL silently fell back to plain text for can be counted."""

    def __init__(self, tokenizer):
        self._tokenizer, self.raised, self.parsed = tokenizer, False, None

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def parse_response(self, *args, **kwargs):
        self.raised, self.parsed = False, None
        try:
            self.parsed = self._tokenizer.parse_response(*args, **kwargs)
        except Exception:
            self.raised = True
            raise
        return self.parsed


def parse_turn(tokenizer, ids: list[int], prefix: list[int], tools) -> tuple[dict, bool]:
    """A generated turn as TRL's loop reads it (``trl.chat_template_utils.parse_response``), and whether its parse
    failed (TRL then keeps the turn as plain text: the tokenizer's parser raised or returned nothing, or its tool
    calls were malformed)."""
    from trl.chat_template_utils import parse_response

    recorder = _RecordingParser(tokenizer)
    message = parse_response(recorder, ids, prefix=prefix, tools=tools)
    failed = recorder.raised or recorder.parsed is None or (
        bool(recorder.parsed.get("tool_calls")) and not message.get("tool_calls"))
    return message, failed


def call_tool(tool_call: dict, tools: dict[str, Callable]) -> tuple[str, object, bool]:
    """Run one parsed tool call as TRL's loop runs it: ``(name, result, failed)``; an unknown tool, a call of
    another type, wrong arguments or an exception give ``{"error": ...}``."""
    if tool_call.get("type") != "function":
        return tool_call.get("name", "unknown"), {"error": f"Unsupported tool call type: {tool_call.get('type')}"}, True
    function = tool_call["function"]
    name = function["name"]
    try:
        if name not in tools:
            raise ValueError(f"Tool {name} not found.")
        return name, tools[name](**function["arguments"]), False
    except Exception as e:  # noqa: BLE001 - as TRL: the model's call failing is the model's loss, not the run's
        return name, {"error": str(e)}, True


@dataclass
class Rollout:
    """One sample's multi-turn rollout (TRL's per-sample state in ``_tool_call_loop``)."""

    environment: object
    tools: list
    seed: str | None  # the first turn's stream; None: greedy
    prompt: list  # the conversation so far (prompt, then the turns), as TRL's ``prompts[i]``
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    completions: list[dict] = field(default_factory=list)
    finished: bool = False
    pending: list = field(default_factory=list)  # the tool calls of the last turn
    counts: dict = field(default_factory=lambda: dict.fromkeys(TOOL_COUNTS, 0))

    @property
    def tool_dict(self) -> dict[str, Callable]:
        return {tool.__name__: tool for tool in self.tools}


def tool_suffix_ids(tokenizer, tool_messages: list[dict], chat_template, chat_template_kwargs) -> list[int]:
    """The tokens that follow an assistant turn's EOS for ``tool_messages`` (the replies) up to the next assistant
    header: TRL's ``_get_tool_suffix_ids``, rendered on a minimal conversation and cut after the last EOS."""
    dummy = [
        {"role": "user", "content": "dummy"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]},
    ]
    prefix = tokenizer.apply_chat_template(dummy, add_generation_prompt=False, tokenize=True,
                                           chat_template=chat_template, return_dict=False, **chat_template_kwargs)
    full = tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, tokenize=True,
                                         chat_template=chat_template, return_dict=False, **chat_template_kwargs)
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[: eos[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("tool rollouts: the chat template's EOS-trimmed prefix is not a prefix of the conversation "
                         "with the tool reply (TRL's _get_tool_suffix_ids needs a prefix-preserving template)")
    return full[len(prefix):]


def _start(rollout: Rollout, row: dict, tokenizer, chat_template, chat_template_kwargs) -> None:
    """``reset(**row)`` (its observation appended to the last user message, as TRL does) and the prompt's tokens."""
    observation = rollout.environment.reset(**row)
    prompt = rollout.prompt
    if observation is not None:
        content = prompt[-1]["content"]
        if isinstance(observation, list) and isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if isinstance(observation, str) and isinstance(content, list):
            observation = [{"type": "text", "text": observation}]
        rollout.prompt = prompt[:-1] + [{**prompt[-1], "content": content + observation}]
    rollout.prompt_ids = list(tokenizer.apply_chat_template(
        conversation=[rollout.prompt], tools=rollout.tools or None, chat_template=chat_template,
        add_generation_prompt=True, tokenize=True, return_dict=True, **chat_template_kwargs,
    )["input_ids"][0])


def _run_calls(rollout: Rollout, tokenizer, chat_template, chat_template_kwargs, budget: int, max_model_len: int):
    """Run the last turn's tool calls; the prompt + completion + replies' tokens to continue from, or None when the
    replies would not fit (they are then rolled back, as TRL does)."""
    conversation_len, completions_len = len(rollout.prompt), len(rollout.completions)
    rollout.prompt.append(rollout.completions[-1])
    replies = []
    tools = rollout.tool_dict
    for tool_call in rollout.pending:
        rollout.counts["calls"] += 1
        name, result, failed = call_tool(tool_call, tools)
        rollout.counts["call_failures"] += failed
        replies.append({"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)})
    rollout.prompt.extend(replies)
    rollout.completions.extend(replies)
    suffix = tool_suffix_ids(tokenizer, replies, chat_template, chat_template_kwargs)
    ids = rollout.prompt_ids + rollout.completion_ids + suffix
    if len(ids) - len(rollout.prompt_ids) > budget or len(ids) >= max_model_len:
        del rollout.completions[completions_len:]
        del rollout.prompt[conversation_len:]
        rollout.counts["reply_dropped"] = 1
        return None
    return ids


def _turn(rollout: Rollout, new_ids: list[int], prefix: list[int], tokenizer) -> None:
    """Parse a generated turn and note its tool calls."""
    if not new_ids:
        rollout.pending = []
        return
    message, failed = parse_turn(tokenizer, new_ids, prefix, rollout.tools)
    rollout.counts["parse_failures"] += failed
    rollout.completions.append(message)
    rollout.pending = message.get("tool_calls") or []
    rollout.counts["call_turns"] += bool(rollout.pending)


def run_tool_rollouts(model, tokenizer, rows: Sequence[dict], rollouts: Sequence[Rollout], *, max_new_tokens: int,
                      temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, chat_template=None,
                      chat_template_kwargs: dict | None = None, max_tool_calling_iterations: int | None = None,
                      synced_gpus: bool = False, keep_going: Callable[[bool], bool] | None = None,
                      llm=None, reuse_cache: bool = True) -> None:
    """Run ``rollouts`` (one per row of ``rows``) to their end, batched turn by turn, in place.

    ``keep_going(this process has work)`` -> whether any process has (distributed generation with ZeRO-3 / FSDP:
    every process must make the same ``generate`` calls; a process with none left continues a dummy row).
    ``llm``: a ``vllm.LLM`` that generates the turns instead of ``model`` (which then only lends its generation
    config); each turn of a sample is a request of its own, seeded from the turn's stream
    (:func:`trl_rlvr.evaluation.vllm_generation.generate_token_rows_vllm`), and the context ceiling is the engine's
    ``max_model_len``, as in TRL's loop with vLLM. ``reuse_cache``: with HF ``generate``, a turn after a tool reply
    continues the batch's KV cache and encodes only the reply (:class:`trl_rlvr.evaluation.cached_turns.CachedTurns`);
    False: every turn re-encodes its whole context, as TRL's loop does."""
    chat_template_kwargs = chat_template_kwargs or {}
    max_iterations = max_tool_calling_iterations if max_tool_calling_iterations is not None else float("inf")
    generate, eos_ids, max_model_len = _turn_generator(
        model, tokenizer, llm, temperature=temperature, top_p=top_p, top_k=top_k, synced_gpus=synced_gpus,
        reuse_cache=reuse_cache,
    )
    for rollout, row in zip(rollouts, rows):
        _start(rollout, row, tokenizer, chat_template, chat_template_kwargs)

    # the first turn: TRL's `_generate_single_turn` on the prompts
    if rollouts:
        for rollout, (ids, _) in zip(rollouts, generate([r.prompt_ids for r in rollouts], [r.seed for r in rollouts],
                                                        [max_new_tokens] * len(rollouts))):
            rollout.completion_ids, rollout.tool_mask = ids, [1] * len(ids)
            _turn(rollout, ids, rollout.prompt_ids, tokenizer)
    active = [r for r in rollouts if r.pending]
    row_of = {id(r): i for i, r in enumerate(rollouts)}  # each rollout's row in the last generate call
    iteration = 0
    while True:
        if iteration >= max_iterations:
            for r in active:
                r.counts["capped"] = 1
            active = []
        contexts = []
        for rollout in active:
            ids = _run_calls(rollout, tokenizer, chat_template, chat_template_kwargs, max_new_tokens, max_model_len)
            if ids is not None:
                contexts.append((rollout, ids))
        go = bool(contexts) if keep_going is None else keep_going(bool(contexts))
        if not go:
            break
        iteration += 1
        if not contexts:  # keep in step with the processes that still generate
            generate([[tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0]], ["idle"], [1])
            active = []
            continue
        left = [max_new_tokens - (len(ids) - len(r.prompt_ids)) for r, ids in contexts]
        seeds = [None if r.seed is None else f"{r.seed}:{iteration}" for r, _ in contexts]
        outputs = generate([ids for _, ids in contexts], seeds, left, [row_of[id(r)] for r, _ in contexts])
        row_of = {id(r): i for i, (r, _) in enumerate(contexts)}
        _extend(contexts, outputs, left, tokenizer)
        active = [r for r, _ in contexts if r.pending]
    for rollout in rollouts:
        _close(rollout, eos_ids)


def _extend(contexts: list[tuple[Rollout, list[int]]], outputs, left: list[int], tokenizer) -> None:
    """Each ``(rollout, context ids)`` continued by its generated turn, truncated to the ``left`` completion
    budget as TRL truncates it: the tool reply tokens since the last turn masked 0, the model's turn 1."""
    for (rollout, ids), (new, _), room in zip(contexts, outputs, left):
        new = new[:room]
        tool_length = len(ids) - len(rollout.prompt_ids) - len(rollout.completion_ids)
        rollout.tool_mask += [0] * tool_length + [1] * len(new)
        rollout.completion_ids = ids[len(rollout.prompt_ids):] + new
        _turn(rollout, new, ids, tokenizer)


def _turn_generator(model, tokenizer, llm, *, temperature: float, top_p: float, top_k: int, synced_gpus: bool,
                    reuse_cache: bool):
    """``(generate, eos_ids, max_model_len)`` for :func:`run_tool_rollouts`: ``generate(id_lists, seeds,
    new_tokens, rows=None)`` -> one ``(ids, ...)`` per context, with HF ``generate`` on ``model`` (through the
    batch's KV cache with ``reuse_cache``) or, given ``llm``, with vLLM; the token ids that end a sequence; the
    context ceiling (the model's ``max_position_embeddings``, or the engine's ``max_model_len``)."""
    eos_ids = end_of_sequence_ids(getattr(model, "generation_config", None), tokenizer)
    if llm is None:
        max_model_len = getattr(model.config, "max_position_embeddings", None) or float("inf")
        sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k, eos_ids=eos_ids, synced_gpus=synced_gpus)
        turns = CachedTurns(model, tokenizer.pad_token_id, **sampling) if reuse_cache else None

        def generate(id_lists, seeds, new_tokens, rows=None):
            greedy = any(s is None for s in seeds)
            seeds = None if greedy else seeds
            if turns is not None:
                return turns.generate(id_lists, seeds, max_new_tokens=max(new_tokens), rows=rows)
            return generate_token_rows(model, tokenizer.pad_token_id, id_lists, seeds,
                                       max_new_tokens=max(new_tokens), **sampling)

        return generate, eos_ids, max_model_len
    from trl_rlvr.evaluation.vllm_generation import (
        engine_end_of_sequence_ids,
        engine_max_model_len,
        generate_token_rows_vllm,
    )

    eos_ids = eos_ids | engine_end_of_sequence_ids(llm)

    def generate_vllm(id_lists, seeds, new_tokens, rows=None):
        greedy = any(s is None for s in seeds)
        return generate_token_rows_vllm(llm, id_lists, None if greedy else seeds, max_new_tokens=new_tokens,
                                        eos_ids=eos_ids, temperature=temperature, top_p=top_p, top_k=top_k)

    return generate_vllm, eos_ids, engine_max_model_len(llm)


def _close(rollout: Rollout, eos_ids) -> None:
    """A finished rollout's counts: whether it ended on an end-of-sequence token, its tool and model tokens, and the
    environment's own metrics (PythonEnvironment's ``stats``: cells that raised, timeouts)."""
    rollout.finished = bool(rollout.completion_ids) and rollout.completion_ids[-1] in eos_ids
    rollout.counts["tool_tokens"] = rollout.tool_mask.count(0)
    rollout.counts["model_tokens"] = rollout.tool_mask.count(1)
    stats = getattr(rollout.environment, "stats", None)
    if isinstance(stats, dict):
        rollout.counts["env_errors"] = int(stats.get("errors", 0) or 0)
        rollout.counts["timeouts"] = int(stats.get("timeouts", 0) or 0)


def generate_tool_completions(
    model,
    tokenizer,
    prompts: Sequence,
    question_ids: Sequence[int],
    n: int = 1,
    *,
    rows: Sequence[dict],
    environment_factory: Callable[[], object],
    sampling: SamplingSettings | None = None,
    batch_size: int = 64,
    n_batches: int | None = None,
    synced_gpus: bool = False,
    on_batch: Callable[[int], None] | None = None,
    chat_template: str | None = None,
    chat_template_kwargs: dict | None = None,
    max_tool_calling_iterations: int | None = None,
    keep_going: Callable[[bool], bool] | None = None,
    llm=None,
    reuse_cache: bool = True,
    **sampling_keywords,
) -> list[list[tuple[str, list[int], bool, dict]]]:
    """:func:`trl_rlvr.evaluation.generation.generate_completions` for tool rollouts: ``n`` rollouts per prompt
    (conversational), each ``(transcript, completion ids, finished with EOS, info)`` where ``info`` holds the
    completion as TRL's rewards receive it (``messages``: assistant turns and tool replies), TRL's ``tool_mask``
    (0 on tool-reply tokens) and the rollout's metrics (:data:`TOOL_COUNTS`). ``sampling``: a
    :class:`~trl_rlvr.evaluation.generation.SamplingSettings`, or its fields as keywords. ``rows[i]``: prompt ``i``'s dataset row, the environment's ``reset`` arguments.

    A batch takes ``max(1, batch_size // n)`` questions; its environments are constructed once (one per rollout of
    a batch, as TRL's pool) and reset before each rollout. ``chat_template``: the template text to render with
    (default: as TRL's trainer decides, :func:`tool_chat_template`, which must have run on ``tokenizer``).
    ``llm``: a ``vllm.LLM`` to generate the turns with (:func:`run_tool_rollouts`); ``batch_size`` then still sets
    how many rollouts (and environments) are in flight at once. ``reuse_cache``: :func:`run_tool_rollouts`'s.
    """
    settings = SamplingSettings.resolve(sampling, **sampling_keywords)
    settings.check("generate_tool_completions", prompts, question_ids, n)
    _check_tool_prompts(prompts, rows)
    per_call = max(1, batch_size // n)
    n_batches = n_batches if n_batches is not None else -(-len(prompts) // per_call)
    pool: list = []
    out = []
    try:
        for b in range(n_batches):
            lo = b * per_call
            idx = list(range(lo, min(lo + per_call, len(prompts)))) or [len(prompts) - 1]  # keep ranks in step
            rollouts = _batch_rollouts(idx, n, pool, environment_factory, prompts, question_ids, settings)
            run_tool_rollouts(model, tokenizer, [rows[i] for i in idx for _ in range(n)], rollouts,
                              max_new_tokens=settings.max_new_tokens, **settings.sampler(),
                              chat_template=chat_template, chat_template_kwargs=chat_template_kwargs,
                              max_tool_calling_iterations=max_tool_calling_iterations, synced_gpus=synced_gpus,
                              keep_going=keep_going, llm=llm, reuse_cache=reuse_cache)
            if lo >= len(prompts):
                continue
            out += [[_completion(r, tokenizer) for r in rollouts[q * n:(q + 1) * n]] for q in range(len(idx))]
            if on_batch is not None:
                on_batch(len(idx))
    finally:
        _close_environments(pool)
    return out


def _batch_rollouts(idx: list[int], n: int, pool: list, environment_factory: Callable[[], object], prompts: Sequence,
                    question_ids: Sequence[int], settings: SamplingSettings) -> list[Rollout]:
    """``n`` fresh rollouts for each prompt of ``idx``, prompt by prompt, each on its own environment of ``pool``
    (grown with ``environment_factory`` to the batch's size, kept for the next batch) and seeded from its stream."""
    while len(pool) < len(idx) * n:
        pool.append(environment_factory())
    return [Rollout(environment=pool[k * n + j], tools=environment_tools(pool[k * n + j]),
                    seed=settings.stream(question_ids[i], j), prompt=copy.deepcopy(list(prompts[i])))
            for k, i in enumerate(idx) for j in range(n)]


def _check_tool_prompts(prompts: Sequence, rows: Sequence[dict]) -> None:
    """One dataset row per prompt, and every prompt conversational (the tools are rendered by the chat template)."""
    if len(rows) != len(prompts):
        raise ValueError("generate_tool_completions: rows and prompts differ in length")
    for p in prompts:
        if isinstance(p, str):
            raise ValueError("tool rollouts need conversational prompts (a list of messages): the tools are "
                             "rendered by the chat template")


def _completion(rollout: Rollout, tokenizer) -> tuple[str, list[int], bool, dict]:
    """One rollout as :func:`generate_tool_completions` returns it: ``(transcript, completion ids, finished with
    EOS, info)``."""
    transcript = tokenizer.decode(rollout.completion_ids, skip_special_tokens=False)
    return (transcript, rollout.completion_ids, rollout.finished,
            {"messages": rollout.completions, "tool_mask": rollout.tool_mask, **rollout.counts})


def _close_environments(pool: list) -> None:
    """Close each environment that is a context manager (PythonEnvironment)."""
    for env in pool:
        close = getattr(env, "__exit__", None)
        if callable(close):
            close(None, None, None)


def _ratio(a, b):
    return a / b if b else None


def summarize_tool_rollouts(per_question: list[dict], max_new_tokens: int | None = None) -> dict | None:
    """The tool metrics of an evaluation from its per-question records (``rec["tool"]``); None without tools.

    - ``tool_call_rate``: share of samples that ran at least one tool call; ``calls_per_answer``: tool calls run per
      sample (TRL's ``tools/call_frequency``);
    - ``tool_call_parse_rate``: of the turns that wrote a tool call, the share TRL's parser read (a turn that fails
      to parse is kept as plain text: ``parse_failures`` counts them, ``parse_failure_frac`` is the share of samples
      with one);
    - ``tool_error_rate``: calls that failed in TRL's loop (unknown tool, bad arguments, an exception; TRL's
      ``tools/failure_frequency``) or that the environment counts as errors (a cell that raised), per call;
      ``tool_timeout_rate``: calls the environment counts as timed out, per call;
    - ``tool_token_frac``: share of the completions' tokens that are tool replies; ``tool_budget_frac``: tool-reply
      tokens per sample over ``max_new_tokens`` (the share of the budget the replies took);
    - ``reply_dropped_frac``: samples that ended because a tool reply would not fit the budget (TRL drops it);
      ``capped_frac``: samples stopped by ``max_tool_calling_iterations`` with a call pending.
    """
    if not per_question or any("tool" not in q for q in per_question):
        return None
    totals = {key: sum(sum(q["tool"][key]) for q in per_question) for key in TOOL_COUNTS}
    samples = sum(len(q["tool"]["calls"]) for q in per_question)

    def share(key):
        return sum(x > 0 for q in per_question for x in q["tool"][key]) / samples

    tool_tokens = [x for q in per_question for x in q["tool"]["tool_tokens"]]
    return {
        "samples": samples,
        **totals,
        "tool_call_rate": share("calls"),
        "calls_per_answer": totals["calls"] / samples,
        "tool_call_parse_rate": _ratio(totals["call_turns"], totals["call_turns"] + totals["parse_failures"]),
        "parse_failure_frac": share("parse_failures"),
        "tool_error_rate": _ratio(totals["call_failures"] + totals["env_errors"], totals["calls"]),
        "tool_timeout_rate": _ratio(totals["timeouts"], totals["calls"]),
        "tool_token_frac": _ratio(totals["tool_tokens"], totals["tool_tokens"] + totals["model_tokens"]),
        "tool_budget_frac": sum(tool_tokens) / (samples * max_new_tokens) if max_new_tokens else None,
        "reply_dropped_frac": share("reply_dropped"),
        "capped_frac": share("capped"),
    }
