"""Small Hugging Face decoder-only (causal LM) folders: the ``text_generation`` family's small models.

Each folder is what ``save_pretrained`` writes (``config.json``, ``generation_config.json`` with the
end-of-sequence ids, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` with the
chat template where there is one) for a tiny model of an architecture the family serves
(``app.core.causal_lm_contract.ARCHITECTURES``): two layers of width 32, four query heads sharing two
key/value heads (grouped-query attention; GPT-2 has none; Mistral attends to a window of the last
``SLIDING_WINDOW`` tokens), seeded random weights. The tokenizers are
trained here with the ``tokenizers`` library on ``SENTENCES`` (accented letters, 日本, an emoji):

- byte-level BPE for GPT-2 (``GPT2TokenizerFast``: ``<|endoftext|>`` is its only special token, no
  padding token, no chat template) and Qwen2/Qwen3 (``Qwen2TokenizerFast``: ``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>``, the end of a turn ending a generation; ChatML template);
- SentencePiece-style BPE for Llama, Mistral and Phi-3 (``LlamaTokenizerFast``: ``▁`` for spaces,
  ``<unk>``, ``<s>`` put before each text, ``</s>``): only ASCII and ``é`` are pieces, every other
  character falls back to its UTF-8 bytes (``<0xE6>``...), so a character may take several tokens and
  a decoder that streams must not cut it. Llama has a Llama-2 chat template (``[INST]``).

``trained=True`` fits a wider Llama in a few seconds to ``SENTENCES`` (each between ``<s>`` and
``</s>``), so that greedy generation from a sentence's first words is the rest of that sentence.
``causal_model_folder`` writes the two-line ``model.toml`` beside the folder. Nothing here downloads.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from clients.text_generation import FAMILY_NAME
from scripts.model_prep.small_models.encoders import CORPUS, update_json_files, write_model_toml

FAMILY = FAMILY_NAME
BYTE_LEVEL, SENTENCEPIECE = "byte_level", "sentencepiece"
TOKENIZER_KINDS = {
    "gpt2": BYTE_LEVEL,
    "qwen2": BYTE_LEVEL,
    "qwen3": BYTE_LEVEL,
    "llama": SENTENCEPIECE,
    "mistral": SENTENCEPIECE,
    "phi3": SENTENCEPIECE,
}
SENTENCES = [
    *CORPUS,
    "Tokyo is the capital of 日本 and Kyoto was its capital before.",
    "Grüße aus München: the café serves crème brûlée 🍰 every day.",
]
MAX_POSITIONS = 128  # the small models' context: prompt and new tokens together
# Mistral's attention window, shorter than most texts of the tests (as Mistral 7B v0.1's 4096 tokens
# are shorter than its context): a token attends to the last 8 only, though the cache keeps them all.
SLIDING_WINDOW = 8
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Llama 2's, as its folders ship it: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s><s>[INST] ...
LLAMA2_CHAT = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# ChatML with tools, as Qwen3's folders ship it (its thinking left out): the tools in the system turn,
# a call as <tool_call>{"name", "arguments"}</tool_call>, the tools' answers in the user's turn
QWEN_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{\\"name\\": \\"\' + tool_call.name + \'\\", \\"arguments\\": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_TEMPLATES = {"chatml": CHATML, "llama2": LLAMA2_CHAT, "qwen_tools": QWEN_TOOLS}
# each architecture's chat template in the sets, as its instruct folders ship one (GPT-2's have none;
# Mistral's and Phi-3's left out: a folder without one refuses chat requests)
TEMPLATES = {"gpt2": None, "llama": "llama2", "qwen2": "qwen_tools", "qwen3": "chatml", "mistral": None, "phi3": None}
TRAIN_STEPS = 150  # full-batch Adam steps of the trained Llama (width 64): about 20 ms each on 2 cores
LEARNING_RATE = 1e-2


def corpus(repeat: int = 20) -> list[str]:
    return [line for _ in range(repeat) for line in SENTENCES]


def byte_level_tokenizer(architecture: str):
    """GPT-2's or Qwen2's fast tokenizer with a byte-level BPE (vocabulary and merges) trained on the
    sentences; its special tokens first (ids 0, 1, 2)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast, Qwen2TokenizerFast

    chat = architecture.startswith("qwen")
    specials = ["<|endoftext|>", *(["<|im_start|>", "<|im_end|>"] if chat else [])]
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(corpus(), vocab_size=420, min_frequency=1, special_tokens=specials, show_progress=False)
    model = json.loads(trainer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if not chat:
        return GPT2TokenizerFast(vocab=model["vocab"], merges=merges, model_max_length=MAX_POSITIONS)
    return Qwen2TokenizerFast(
        vocab=model["vocab"],
        merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=MAX_POSITIONS,
    )


def sentencepiece_tokenizer():
    """LlamaTokenizerFast with a SentencePiece-style BPE trained on the sentences: ``<unk>`` 0,
    ``<s>`` 1, ``</s>`` 2, the 256 bytes ``<0x00>``... next (the fallback of a character that is not a
    piece: only ASCII, ``▁`` and ``é`` are), then the merged pieces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    alphabet = [*string.ascii_letters, *string.digits, *string.punctuation, "▁", "é"]
    byte_pieces = [f"<0x{byte:02X}>" for byte in range(256)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        min_frequency=1,
        special_tokens=["<unk>", "<s>", "</s>", *byte_pieces],
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return LlamaTokenizerFast(
        vocab=model["vocab"], merges=merges, add_bos_token=True, add_eos_token=False, model_max_length=MAX_POSITIONS
    )


def tokenizer_of(architecture: str):
    if TOKENIZER_KINDS[architecture] == BYTE_LEVEL:
        return byte_level_tokenizer(architecture)
    return sentencepiece_tokenizer()


def model_config(architecture: str, tokenizer, hidden: int, layers: int, heads: int, kv_heads: int):
    """The architecture's config at this size, its special ids the tokenizer's."""
    from transformers import AutoConfig

    ends = tokenizer.eos_token_id
    if architecture == "gpt2":
        return AutoConfig.for_model(
            "gpt2",
            vocab_size=len(tokenizer),
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=MAX_POSITIONS,
            bos_token_id=ends,
            eos_token_id=ends,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    sizes: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": ends,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if architecture in ("qwen2", "qwen3"):
        sizes["tie_word_embeddings"] = True  # as the small Qwen checkpoints
    if architecture == "mistral":
        sizes["sliding_window"] = SLIDING_WINDOW
    if architecture == "phi3":
        del sizes["head_dim"]  # Phi-3 derives it
    return AutoConfig.for_model(architecture, **sizes)


def _train(model, tokenizer, seed: int) -> None:
    """Full-batch Adam on ``SENTENCES``, each encoded as a prompt is and ended by ``</s>`` (padding left out of the loss),
    in place, on one thread (the same weights on every machine); ends in eval mode."""
    import torch

    # each sentence as a prompt is encoded (a SentencePiece tokenizer puts <s> first), then its end
    rows = [ids + [tokenizer.eos_token_id] for ids in tokenizer(SENTENCES).input_ids]
    width = max(map(len, rows))  # padded on the right by hand: GPT-2's tokenizer has no padding token
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    batch = {"input_ids": ids, "attention_mask": mask}
    labels = ids.masked_fill(mask == 0, -100)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        model.train()
        for _ in range(TRAIN_STEPS):
            optimizer.zero_grad()
            model(**batch, labels=labels).loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()


def hf_causal_folder(
    folder: Path,
    architecture: str,
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    chat_template: str | None = None,
    trained: bool = False,
) -> Path:
    """A ``save_pretrained`` folder of a tiny ``architecture`` causal LM (``AutoModelForCausalLM``) and
    its tokenizer; ``chat_template``: the tokenizer's (a name of ``CHAT_TEMPLATES``, or the Jinja itself);
    ``trained``: fitted to ``SENTENCES``."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer_of(architecture)
    if tokenizer.pad_token is None and TOKENIZER_KINDS[architecture] == SENTENCEPIECE:
        tokenizer.pad_token = tokenizer.unk_token  # as many Llama folders: padding is <unk>
    if chat_template is not None:
        tokenizer.chat_template = CHAT_TEMPLATES.get(chat_template, chat_template)
    config = model_config(architecture, tokenizer, hidden, layers, heads, kv_heads)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    if trained:
        _train(model, tokenizer, seed)
    generation = model.generation_config
    generation.bos_token_id = config.bos_token_id
    generation.eos_token_id = config.eos_token_id
    if architecture.startswith("qwen"):  # a turn's end, then the text's: as Qwen's instruct folders
        generation.eos_token_id = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
    generation.pad_token_id = getattr(config, "pad_token_id", None)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def causal_model_folder(
    models: Path,
    name: str,
    architecture: str = "llama",
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    chat_template: str | None = None,
    trained: bool = False,
    extra: str = "",
    files: dict[str, dict] | None = None,
) -> Path:
    """``models/<name>/`` with its model.toml (family text_generation; ``extra``: more TOML) and the
    Hugging Face folder ``hf/`` of a tiny ``architecture`` model inside (``hf_causal_folder``);
    ``files``: keys set in the folder's JSON files afterwards (``generation_config.json``'s defaults)."""
    model = models / name
    hf_causal_folder(
        model / "hf",
        architecture,
        seed=seed,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        chat_template=chat_template,
        trained=trained,
    )
    update_json_files(model / "hf", files)
    write_model_toml(model, FAMILY, extra=extra)
    return model
