"""Supervised fine-tuning around RLVR: :mod:`.fine_tune` (TRL's ``SFTTrainer`` on conversations, assistant-only loss:
the tool job's cold start) and :mod:`.rejection_sampling` (rejection-sampling fine-tuning and expert iteration:
sample, keep what the verifier accepts, fine-tune on it; ``trl-rlvr rft``)."""
