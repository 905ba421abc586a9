"""Write the weightless model folder the live stack serves: a small byte-level BPE tokenizer and a `config.json`.

Dynamo's frontend and mocker need a model folder only for its tokenizer (`tokenizer.json`, `tokenizer_config.json`
with a chat template) and a `config.json` naming `architectures`; the mocker has no weights. The tokenizer is
trained here, with the `tokenizers` package, on generated text, and saved through `transformers`' fast-tokenizer
wrapper so that its files have the layout both expect. Nothing is downloaded.

Runs with the interpreter of the aiperf virtualenv (`make live-env`), which has `tokenizers` and `transformers`
(aiperf needs them itself); the project's own environment does not.

Usage: AIPERF_PY make_tiny_model.py OUT_DIR [--name tiny]
"""

# ruff: noqa: T201 - a command-line script: printing is its output

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 2048
# A fixed seed: the same folder every time (the tokenizer decides how many tokens a prompt has).
SEED = 16
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]


def _corpus(num_lines: int) -> list[str]:
    """Word-like lines: enough variety for a BPE of VOCAB_SIZE merges."""
    rng = random.Random(SEED)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) for _ in range(num_lines)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--name", default="tiny")
    args = parser.parse_args(argv)

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(4000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    args.out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(args.out_dir))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "max_position_embeddings": 131072,
        "bos_token_id": tokenizer.token_to_id("<|bos|>"),
        "eos_token_id": tokenizer.token_to_id("<|eos|>"),
        "torch_dtype": "bfloat16",
    }
    (args.out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (args.out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}) + "\n"
    )
    print(f"{args.out_dir}: tokenizer of {tokenizer.get_vocab_size()} tokens, model name {args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
