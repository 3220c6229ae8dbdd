"""Build tiny causal LMs (Qwen3 or Llama architecture) with a real tokenizer and chat template.

Why: no model hub is reachable here, yet the `hf` policy, token-exact rollouts and training must
run through the real transformers loading path. A tiny model trained on nothing (random weights)
is enough to prove the plumbing; a tokenizer trained on tbhpc's own manuals, tasks and tool
schemas keeps prompts short. Everything is saved with `save_pretrained`, so it loads exactly like
a user's checkpoint.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
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

# The demo model's template: the same turns, but tools listed as one-line signatures (names,
# argument names, allowed values; `?` = optional) instead of JSON schemas. The schemas are ~2k of
# the ~2.4k system tokens, and a model of a million parameters learns the domains' procedures
# from its warm start, not from reading schemas: the short prompt is what makes training fit a
# CPU. The tool-call format the interpreter parses is unchanged.
COMPACT_TEMPLATE = CHAT_TEMPLATE.replace("""
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.""", """
{%- for tool in tools %}{% set f = tool.function %}{% set req = f.parameters.required or [] %}{{ '\n' ~ f.name }}({% for k, v in f.parameters.properties.items() %}{{ k }}{% if k not in req %}?{% endif %}
{%- if v.enum %}={{ v.enum | join('|') }}{% endif %}{% if not loop.last %}, {% endif %}{% endfor %})
{%- endfor %}""")
assert COMPACT_TEMPLATE != CHAT_TEMPLATE

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>", "<DONE>"]


def corpus(with_calls: bool = False, pack: str = "full") -> list[str]:
    """Text the tokenizer learns from: manuals, instructions, tool schemas, pack files (and, for
    the demo model, one tool call per tool, so call markup is a few tokens). `pack="demo"`: whole
    oracle episodes of the demo pack's train templates, rendered with the compact template (what
    the demo-pack model reads and writes, and nothing else)."""
    if pack == "demo":
        return demo_episode_texts()
    from tbhpc.domains import all_domains
    from tbhpc.tasks.loader import default_pack_dir
    texts = []
    for d in all_domains().values():
        texts.append(d.scenario.instructions)
        texts += [doc.text for doc in d.scenario.manual]
        texts += [json.dumps(t.openai_schema) for t in d.tools.values()]
        if with_calls:
            texts += [f'<tool_call>\n{{"name": "{t.name}", "arguments": {{}}}}\n</tool_call>' for t in d.tools.values()]
    texts += [p.read_text(encoding="utf-8") for p in sorted(default_pack_dir().glob("*.yaml"))]
    return texts


def demo_episode_texts(per_template: int = 40) -> list[str]:
    """Oracle episodes of `per_template` train instances of each demo template, as chat text."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from tbhpc.domains import get_domain
    from tbhpc.domains.demo.pack import demo_instances
    from tbhpc.env.episode import run_episode
    from tbhpc.env.users import ScriptedUser
    from tbhpc.policy.hf import template_messages
    from tbhpc.policy.scripted import OraclePolicy
    texts = []
    for inst in demo_instances(train=per_template, eval=0):
        t = inst.task
        r = run_episode(t, get_domain(t.domain), OraclePolicy(), ScriptedUser())
        rendered = render_jinja_template([template_messages(r.messages)], tools=r.tools, chat_template=COMPACT_TEMPLATE)
        texts.append(rendered[0][0])
    return texts


@dataclass(frozen=True)
class TinySpec:
    """Shape of a project-built model. `tiny`: plumbing tests (0.3M parameters, fast to serve).
    `demo`: the model `make demo PACK=full` trains (~1M parameters; digits are single tokens so ids
    and amounts are copied digit by digit, the compact template keeps prompts short).
    `demo-pack`: the same shape with a tokenizer learnt from the demo pack's episodes (`make demo`);
    spaces are not isolated there (272 instead of 351 tokens per median episode, measured)."""
    hidden: int = 64
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    intermediate: int = 128
    vocab: int = 4000
    split_digits: bool = False
    compact: bool = False
    isolate_spaces: bool = True     # with split_digits: a space is a token of its own
    corpus: str = "full"            # what the tokenizer learns from: full (manuals, packs) | demo (demo-pack episodes)


SPECS = {"tiny": TinySpec(),
         "demo": TinySpec(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, vocab=1500,
                          split_digits=True, compact=True),
         "demo-pack": TinySpec(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, vocab=1000,
                               split_digits=True, compact=True, isolate_spaces=False, corpus="demo")}


def build_tokenizer(vocab_size: int = 4000, split_digits: bool = False, compact: bool = False,
                    isolate_spaces: bool = True, corpus_name: str = "full"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # split_digits (the demo model): digits are single tokens and a space is a token of its own, so
    # a value is the same tokens wherever it appears ("hugo" after a space in the user's message
    # and after a quote in a tool call), and copying it is copying tokens.
    spaces = [pre_tokenizers.Split(" ", "isolated")] if isolate_spaces else []
    tok.pre_tokenizer = (pre_tokenizers.Sequence(spaces + [pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(with_calls=split_digits, pack=corpus_name), trainer)
    tok.add_tokens(MARKUP)  # markup: single tokens, but not "special" (decode keeps them)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = COMPACT_TEMPLATE if compact else CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: Path | str, arch: str = "qwen3", seed: int = 0, vocab_size: int | None = None,
                     size: str = "tiny") -> Path:
    """Write a tokenizer + randomly initialised model of shape SPECS[size] to `out_dir`; returns the path."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    if size not in SPECS:
        raise ValueError(f"model size must be one of {sorted(SPECS)}, got {size!r}")
    spec = SPECS[size]
    out = Path(out_dir)
    tok = build_tokenizer(vocab_size or spec.vocab, spec.split_digits, spec.compact, spec.isolate_spaces, spec.corpus)
    # head_dim 32: the smallest head size vLLM's CPU attention kernels accept.
    common = dict(vocab_size=len(tok), hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                  num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                  num_key_value_heads=spec.kv_heads, max_position_embeddings=32768, tie_word_embeddings=True,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    config = Qwen3Config(head_dim=32, **common) if arch == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
