"""The length-bias toy: its tabular policy as a transformers model, its tokenizer, and a plain-PyTorch reference.

The toy (the tutorial *GRPO and Reinforcement Learning from Verifiable Rewards*, section "An experiment: the length bias"): 16 questions, a vocabulary of V = 4 answer tokens plus an
end token, answers of at most LMAX = 8 tokens (the end token counts in the length; an answer that reaches 8 tokens
without one stops there). The reward is 1 when the first token is the question's answer, so an empty answer (the end
token first) is wrong, and the length of an answer never matters. The policy is a table of logits per question,
position and previous token, where an end token does not change "previous" and position 0 sees a start symbol.

``TablePolicy`` holds exactly that table, in a form TRL's generation and its fused LM head can use: the backbone
finds each position's (question, position, previous token) cell and looks its logits up in an embedding of
Q * LMAX * (V + 2) rows; the LM head is a frozen identity with a bias of -1e4 on every token that is not an answer
token or the end token, so those tokens get probability exactly 0 in fp32 and no gradient. All logits start at 0, as
in the tutorial (accuracy 1/5 and a mean right length of 4.95 tokens at update 1).

``reference_run`` is the same toy written directly from the tutorial's description and its published loss code, in plain
PyTorch, with no TRL: the study runs it on the same seeds beside the trainer.

Imports nothing from TRL, so it is quick to load.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutputWithPast

Q, V, LMAX = 16, 4, 8
END = V  # index of the end token among the V + 1 output tokens
START = V + 1  # the "previous token" seen at position 0 (the table has V + 2 "previous" slots; END is never one)

# Token ids of the tiny tokenizer: answer tokens first, so that answer token k has id k and the end token id V.
ANSWER_TOKENS = [f"a{k}" for k in range(V)]
EOS_TOKEN, PAD_TOKEN = "</s>", "<pad>"
QUESTION_TOKENS = [f"q{i}" for i in range(Q)]
VOCAB = ANSWER_TOKENS + [EOS_TOKEN, PAD_TOKEN] + QUESTION_TOKENS
EOS_ID, PAD_ID, FIRST_QUESTION_ID = V, V + 1, V + 2

METHODS = ("GRPO", "GRPO, summed", "Dr. GRPO, per answer", "Dr. GRPO", "RLOO, per answer", "RLOO")
#: Learners whose baseline leaves each answer out (RLOO, Ahmadian et al. 2024): A_i = r_i - mean of the others.
LEAVE_ONE_OUT = ("RLOO, per answer", "RLOO")


def build_tokenizer():
    """A word-level tokenizer over VOCAB: the prompt "q3" is one token, completions are answer tokens and "</s>"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=PAD_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=PAD_TOKEN)


def question_answers(seed: int) -> list[int]:
    """The right first token of each question for a seed (shared by the trainer run and the reference)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(V, (Q,), generator=g).tolist()


class TableConfig(PretrainedConfig):
    model_type = "length_bias_table"

    def __init__(self, num_questions=Q, num_answer_tokens=V, max_answer_length=LMAX, **kwargs):
        self.num_questions = num_questions
        self.num_answer_tokens = num_answer_tokens
        self.max_answer_length = max_answer_length
        self.vocab_size = num_answer_tokens + 2 + num_questions
        self.hidden_size = self.vocab_size  # the backbone's output is already a row of logits
        kwargs.setdefault("eos_token_id", num_answer_tokens)
        kwargs.setdefault("pad_token_id", num_answer_tokens + 1)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


class CellSelector(nn.Module):
    """Backbone: position j of a sequence -> the logits row of its (question, position, previous token) cell.

    The question is the first attended token. The hidden state at position j predicts the next token, i.e. answer
    position t = j - (question index); "previous" is the last answer token (id < V) after the question, at or before
    j, or START. Positions outside the table (padding, t >= LMAX) are clamped into it; their outputs are never used.
    ``self.table`` (an embedding, one row per cell, one column per vocabulary entry) holds the toy's logits.
    """

    def __init__(self, config: TableConfig):
        super().__init__()
        self.q, self.v, self.lmax = config.num_questions, config.num_answer_tokens, config.max_answer_length
        self.table = nn.Embedding(self.q * self.lmax * (self.v + 2), config.vocab_size)

    def cells(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        b, n = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        qpos = attention_mask.long().argmax(dim=1)  # first attended token = the question (prompts are left-padded)
        question = input_ids.gather(1, qpos[:, None]) - (self.v + 2)
        idx = torch.arange(n, device=input_ids.device).expand(b, n)
        t = (idx - qpos[:, None]).clamp(0, self.lmax - 1)
        is_answer = (input_ids < self.v) & (idx > qpos[:, None]) & attention_mask.bool()
        last = torch.where(is_answer, idx, torch.full_like(idx, -1)).cummax(dim=1).values
        prev = torch.where(last >= 0, input_ids.gather(1, last.clamp(min=0)), torch.full_like(idx, self.v + 1))
        return (question.clamp(0, self.q - 1) * self.lmax + t) * (self.v + 2) + prev

    def forward(self, input_ids=None, attention_mask=None, **kwargs) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=self.table(self.cells(input_ids, attention_mask)))


class TablePolicy(PreTrainedModel, GenerationMixin):
    """The tutorial's tabular policy as a causal LM.

    The backbone looks up the logits of the (question, position, previous token) cell; the LM head is a frozen
    identity whose bias is 0 on the V answer tokens and the end token and -1e4 on every other token (question tokens,
    pad), which so get probability exactly 0 in fp32 and no gradient. The only trainable parameter is the table.
    """

    config_class = TableConfig
    base_model_prefix = "backbone"
    main_input_name = "input_ids"
    _no_split_modules = []

    def __init__(self, config: TableConfig):
        super().__init__(config)
        self.backbone = CellSelector(config)
        self.lm_head = nn.Linear(config.vocab_size, config.vocab_size, bias=True)
        self.post_init()
        with torch.no_grad():
            self.backbone.table.weight.zero_()  # the tutorial's table starts at 0: uniform over the V + 1 output tokens
            self.lm_head.weight.copy_(torch.eye(config.vocab_size))
            self.lm_head.bias.fill_(-1e4)
            self.lm_head.bias[: config.num_answer_tokens + 1] = 0.0
        self.lm_head.requires_grad_(False)  # a fixed mask, not a parameter of the toy

    def _init_weights(self, module):  # the table is initialized in __init__, nothing to do here
        pass

    def get_output_embeddings(self):
        return self.lm_head

    def get_input_embeddings(self):
        return None

    def table(self) -> torch.Tensor:
        """The logits table, shape (Q, LMAX, V + 2, V + 1), as in the tutorial's script."""
        c = self.config
        w = self.backbone.table.weight[:, : c.num_answer_tokens + 1]
        return w.reshape(c.num_questions, c.max_answer_length, c.num_answer_tokens + 2, c.num_answer_tokens + 1)

    def forward(self, input_ids=None, attention_mask=None, logits_to_keep: int = 0, **kwargs):
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=self.lm_head(hidden))

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:  # no KV cache: the table needs none
        return False

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        # No KV cache: every step re-reads the whole (at most 9-token) sequence.
        return {"input_ids": input_ids, "attention_mask": attention_mask, "logits_to_keep": 1}

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=1):
        mask = model_kwargs.get("attention_mask")
        if mask is not None:
            model_kwargs["attention_mask"] = torch.cat([mask, mask.new_ones((mask.shape[0], num_new_tokens))], dim=-1)
        model_kwargs.pop("past_key_values", None)
        return model_kwargs


def build_policy() -> TablePolicy:
    model = TablePolicy(TableConfig())
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    return model


# ---------------------------------------------------------------------------------------------------------------------
# The reference: the toy written directly from the tutorial, in plain PyTorch (no transformers, no TRL).


def batch_stats(reward: torch.Tensor, length: torch.Tensor) -> dict:
    """Accuracy and mean length of right / wrong answers of one batch (NaN when there are none)."""
    right, wrong = reward > 0.5, reward <= 0.5
    nan = float("nan")
    return {
        "accuracy": reward.float().mean().item(),
        "len_right": length[right].float().mean().item() if right.any() else nan,
        "len_wrong": length[wrong].float().mean().item() if wrong.any() else nan,
    }


def sample_answers(logits: torch.Tensor, q: torch.Tensor, gen: torch.Generator):
    """Sample one answer per row of ``q`` from the table: tokens (N, LMAX) and lengths (end token included)."""
    n = len(q)
    toks = torch.empty(n, LMAX, dtype=torch.long)
    prev = torch.full((n,), START)
    done = torch.zeros(n, dtype=torch.bool)
    length = torch.full((n,), LMAX)
    for t in range(LMAX):
        tok = torch.multinomial(logits[q, t, prev].softmax(-1), 1, generator=gen)[:, 0]
        toks[:, t] = tok
        length[(tok == END) & ~done] = t + 1
        done |= tok == END
        prev = torch.where(tok == END, prev, tok)  # an end token doesn't change "previous"
    return toks, length


def reference_loss(logits, toks, length, R, q, method: str, group_size: int) -> torch.Tensor:
    """The tutorial's loss for one batch, verbatim apart from names (rows laid out group after group); the RLOO
    learners subtract the mean of the other G-1 rewards instead of the group mean, and do not divide by a std."""
    N = len(q)
    Rg = R.view(-1, group_size)
    if method in LEAVE_ONE_OUT:
        adv = Rg - (Rg.sum(1, keepdim=True) - Rg) / (group_size - 1)
    else:
        adv = Rg - Rg.mean(1, keepdim=True)
    if method in ("GRPO", "GRPO, summed"):
        adv = adv / (Rg.std(1, keepdim=True, unbiased=False) + 1e-4)  # population std, as in the worked example
    adv = adv.reshape(-1)
    # log-probs of the sampled tokens, recomputed with gradients
    prev = torch.cat([torch.full((N, 1), START), toks[:, :-1]], 1)
    for t in range(1, LMAX):  # an end token doesn't change "previous"
        prev[:, t] = torch.where(toks[:, t - 1] == END, prev[:, t - 1], toks[:, t - 1])
    lp = logits[q[:, None], torch.arange(LMAX)[None], prev].log_softmax(-1).gather(-1, toks[..., None])[..., 0]
    mask = torch.arange(LMAX)[None] < length[:, None]
    tok_loss = -(adv[:, None] * lp) * mask
    if method in ("GRPO", "Dr. GRPO, per answer", "RLOO, per answer"):
        return (tok_loss.sum(1) / length).mean()
    return tok_loss.sum(1).mean() / LMAX


def new_reference_table(lr: float = 0.05):
    logits = torch.zeros(Q, LMAX, V + 2, V + 1, requires_grad=True)
    return logits, torch.optim.Adam([logits], lr=lr, betas=(0.9, 0.999), eps=1e-8)


def reference_run(method: str, group_size: int, seed: int, updates: int, lr: float = 0.05) -> list[dict]:
    """Train the tabular toy with one of the tutorial's four learners; return per-update batch stats (before the step)."""
    assert method in METHODS, method
    answer = torch.tensor(question_answers(seed))
    gen = torch.Generator().manual_seed(seed)
    logits, opt = new_reference_table(lr)
    q = torch.arange(Q).repeat_interleave(group_size)
    history = []
    for _ in range(updates):
        with torch.no_grad():  # sample a group of G answers for each question
            toks, length = sample_answers(logits, q, gen)
        R = (toks[:, 0] == answer[q]).float()
        history.append(batch_stats(R, length))
        loss = reference_loss(logits, toks, length, R, q, method, group_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return history
