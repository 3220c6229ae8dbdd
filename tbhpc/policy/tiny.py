"""Build tiny causal LMs (Qwen3 or Llama architecture) with a real tokenizer and chat template.

Why: no model hub is reachable here, yet the `hf` policy, token-exact rollouts and training must
run through the real transformers loading path. A tiny model trained on nothing (random weights)
is enough to prove the plumbing; a tokenizer trained on tbhpc's own manuals, tasks and tool
schemas keeps prompts short. Everything is saved with `save_pretrained`, so it loads exactly like
a user's checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = """{%- if messages and messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}
{%- if tools %}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
{%- endif %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content or '' }}
{%- for tc in (m.tool_calls or []) %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>", "<DONE>"]


def corpus() -> list[str]:
    """Text the tokenizer learns from: manuals, instructions, tool schemas, pack files."""
    from tbhpc.domains import all_domains
    from tbhpc.tasks.loader import default_pack_dir
    texts = []
    for d in all_domains().values():
        texts.append(d.scenario.instructions)
        texts += [doc.text for doc in d.scenario.manual]
        texts += [json.dumps(t.openai_schema) for t in d.tools.values()]
    texts += [p.read_text(encoding="utf-8") for p in sorted(default_pack_dir().glob("*.yaml"))]
    return texts


def build_tokenizer(vocab_size: int = 4000):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_tokens(MARKUP)  # markup: single tokens, but not "special" (decode keeps them)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: Path | str, arch: str = "qwen3", seed: int = 0, vocab_size: int = 4000) -> Path:
    """Write a tokenizer + randomly initialised tiny model to `out_dir`; returns the path."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    out = Path(out_dir)
    tok = build_tokenizer(vocab_size)
    # head_dim 32: the smallest head size vLLM's CPU attention kernels accept.
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=32768, tie_word_embeddings=True,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    config = Qwen3Config(head_dim=32, **common) if arch == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
