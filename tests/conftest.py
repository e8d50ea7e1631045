"""Shared fixtures. Tests never read ../shared and never touch the Hugging Face hub."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
