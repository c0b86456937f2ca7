"""The text families' model.toml: two lines, the rest read from a Hugging Face folder.

```toml
family = "text_classification"   # a family that reads a folder (clients.families)
[export]
transformers = "hf"              # a save_pretrained folder inside models/<name>/, or a hub id
```

From the folder (JSON files only: this module is framework-free, the router and model preparation
both read it): the labels and ``problem_type`` (``config.json``), the sequence length (the
tokenizer's ``model_max_length``, sentence-transformers' ``max_seq_length``, bounded by the position
embeddings), the pooling and normalisation of a sentence-transformers folder (``modules.json``,
``1_Pooling/config.json``, a ``Normalize`` module) and its prompts
(``config_sentence_transformers.json``), and the inputs (``token_type_ids`` only where the model
has more than one token type). ``max_batch_size``, ``[batching]``, ``[[inputs]]``, ``[[outputs]]``
and ``[preprocess] sequence_length`` in model.toml override what is derived.

What a family reads besides (labels, sentence-transformers' modules), its own checks and its tensors
are the family's (``resolve``'s arguments, given by its module in ``clients/``).

A hub id is fetched by model preparation into ``<model>/hub/``; the router reads that folder.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE_KEY = "transformers"  # [export] transformers = "<folder or hub id>"
HUB_FOLDER = "hub"  # where model preparation saves a hub id's files, inside the model's folder
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_QUEUE_DELAY_US = 2000
# A tokenizer that knows no limit says so with a huge model_max_length (int(1e30)).
NO_LIMIT = 1_000_000
# Models whose positions start after the padding index (RoBERTa's create_position_ids_from_input_ids):
# pad_token_id + 1 of their position embeddings are never a text's position.
OFFSET_POSITIONS = frozenset(
    {"roberta", "xlm-roberta", "camembert", "mpnet", "data2vec-text", "xlm-roberta-xl", "xmod"}
)
# sentence-transformers' pooling modes, as its Pooling module names them, and the legacy flags naming them.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
ST_TRANSFORMER, ST_POOLING, ST_NORMALIZE = "Transformer", "Pooling", "Normalize"
# What the router reads from the folder; model preparation copies these into a repository (never the weights).
ROUTER_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "generation_config.json",
    "chat_template.jinja",  # a tokenizer's chat template, as transformers 5 saves it
    "chat_template.json",  # a processor's, as older folders keep it
    "preprocessor_config.json",  # an image processor's settings (mask_generation: SamProcessor)
    "processor_config.json",  # ... as transformers 5 saves a processor's
)
# The prompt names every SentenceTransformer has, empty unless its folder names a text for them.
ST_DEFAULT_PROMPTS = ("query", "document")


class TextSpecError(ValueError):
    """A text model's folder or settings that cannot be used (app.core.spec turns it into a SpecError)."""


@dataclass(frozen=True)
class TextModel:
    """What a text family reads from its Hugging Face folder, resolved once."""

    folder: Path  # holds config.json and tokenizer.json
    family: str
    source: str  # model.toml's [export] transformers
    model_type: str
    labels: tuple[str, ...]  # config.json id2label, by index (classification heads)
    problem_type: str  # "" when config.json names none
    sequence_length: int  # tokens, special ones included
    token_type_ids: bool  # the graph takes token_type_ids
    pooling: str  # sentence_embedding: sentence-transformers' pooling mode ("" for the others)
    normalize: bool  # sentence_embedding: the folder's pipeline ends with a Normalize module
    dimension: int  # sentence_embedding: the embedding's size; else the hidden size
    modules: tuple[str, ...] = ()  # sentence-transformers' module paths besides the Transformer (copied along)
    prompts: tuple[tuple[str, str], ...] = ()  # sentence_embedding: (name, text) as SentenceTransformer.prompts
    default_prompt_name: str | None = None  # sentence_embedding: the prompt encode() applies unless told


def is_text_spec(raw: Mapping[str, Any]) -> bool:
    return SOURCE_KEY in raw.get("export", {})


def text_folder(model_folder: Path, source: str) -> Path:
    """The folder a model.toml's ``[export] transformers`` names: a folder of the model's, else (a hub
    id) the copy model preparation saved in ``<model>/hub/``."""
    local = model_folder / source
    return local if source and local.is_dir() else model_folder / HUB_FOLDER


def is_local(model_folder: Path, source: str) -> bool:
    return bool(source) and (model_folder / source).is_dir()


def unfetched_hub_id(model_folder: Path, spec_file: str = "model.toml") -> str | None:
    """The hub id a model's ``[export] transformers`` names where its files are not there yet (no
    folder of that name, no ``hub/`` fetched into the model's folder); None otherwise, and where the
    file cannot be read (reading the spec says what is wrong with it)."""
    try:
        raw = tomllib.loads((model_folder / spec_file).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    export = raw.get("export", {})
    source = export.get(SOURCE_KEY) if isinstance(export, dict) else None
    if not isinstance(source, str) or is_local(model_folder, source) or (model_folder / HUB_FOLDER).is_dir():
        return None
    return source


def model_folder(raw: Mapping[str, Any], folder: Path, where: str) -> Path:
    """The Hugging Face folder that model.toml's ``[export] transformers`` names, which holds a
    config.json (the families read from a ``save_pretrained`` folder of a model and its processor)."""
    source = raw["export"][SOURCE_KEY]
    if not isinstance(source, str) or not source.strip():
        raise TextSpecError(f"{where}: [export] {SOURCE_KEY} must name a folder of the model's, or a hub id")
    hf = text_folder(folder, source)
    if not (hf / "config.json").is_file():
        if is_local(folder, source) or hf.is_dir():
            raise TextSpecError(f"{hf}: no config.json (a folder written by save_pretrained() has one)")
        raise TextSpecError(
            f"{where}: [export] {SOURCE_KEY} = {source!r} is not a folder in {folder}; as a hub id it is "
            f"fetched by python -m scripts.model_prep --models {folder.name} (into {HUB_FOLDER}/)"
        )
    return hf


def _read_json(path: Path, required: bool = True) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if required:
            raise TextSpecError(f"{path}: no such file") from None
        return {}
    except (ValueError, UnicodeDecodeError) as error:
        raise TextSpecError(f"{path}: not valid JSON: {error}") from None
    if not isinstance(value, (dict, list)):
        raise TextSpecError(f"{path}: expected a JSON object")
    return value


def _labels(config: Mapping[str, Any], where: Path) -> tuple[str, ...]:
    id2label = config.get("id2label") or {}
    try:
        by_index = {int(index): str(label) for index, label in id2label.items()}
    except (AttributeError, ValueError):
        raise TextSpecError(f"{where}: id2label must map label indices to names") from None
    count = int(config.get("num_labels", len(by_index)) or len(by_index))
    if sorted(by_index) != list(range(len(by_index))) or (by_index and len(by_index) != count):
        raise TextSpecError(f"{where}: id2label must name labels 0 to {count - 1}")
    return tuple(by_index[i] for i in range(len(by_index))) or tuple(f"LABEL_{i}" for i in range(count))


def position_limit(config: Mapping[str, Any]) -> int | None:
    """The longest sequence the position embeddings take (None: the model has no such limit)."""
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int):
        return None
    if config.get("model_type") in OFFSET_POSITIONS:
        positions -= int(config.get("pad_token_id") or 0) + 1
    return positions


def _pooling(folder: Path) -> tuple[str, bool, int | None, tuple[str, ...]]:
    """sentence-transformers' (pooling mode, normalize, dimension, module paths); a plain Hugging Face
    folder pools by mean without normalising, as ``SentenceTransformer(folder)`` does."""
    modules = _read_json(folder / "modules.json", required=False)
    if not modules:
        return "mean", False, None, ()
    kinds = [(str(m.get("type", "")).rsplit(".", 1)[-1], str(m.get("path", ""))) for m in modules]
    known = {ST_TRANSFORMER, ST_POOLING, ST_NORMALIZE}
    unknown = [kind for kind, _ in kinds if kind not in known]
    if unknown or not kinds or kinds[0][0] != ST_TRANSFORMER or ST_POOLING not in [k for k, _ in kinds]:
        raise TextSpecError(
            f"{folder / 'modules.json'}: served are Transformer, Pooling and optionally Normalize modules, "
            f"in that order; this folder has {', '.join(k for k, _ in kinds) or 'none'}"
        )
    pooling_path = next(path for kind, path in kinds if kind == ST_POOLING)
    settings = _read_json(folder / pooling_path / "config.json")
    mode = settings.get("pooling_mode")
    if mode is None:
        mode = [name for flag, name in LEGACY_POOLING_FLAGS.items() if settings.get(flag)]
    modes = [mode] if isinstance(mode, str) else list(mode)
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise TextSpecError(
            f"{folder / pooling_path / 'config.json'}: one pooling mode of {', '.join(POOLING_MODES)} is served, "
            f"this folder has {modes or 'none'}"
        )
    if settings.get("include_prompt") is False:
        raise TextSpecError(f"{folder / pooling_path / 'config.json'}: include_prompt = false is not served")
    dimension = settings.get("embedding_dimension", settings.get("word_embedding_dimension"))
    paths = tuple(path for kind, path in kinds[1:] if path)
    return modes[0], any(kind == ST_NORMALIZE for kind, _ in kinds), dimension, paths


def _prompts(folder: Path) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """sentence-transformers' prompts and default prompt name (``config_sentence_transformers.json``), as
    ``SentenceTransformer(folder)`` reads them: "query" and "document" always, empty unless the folder
    gives them a text, then the folder's own."""
    path = folder / "config_sentence_transformers.json"
    settings = _read_json(path, required=False)
    if not isinstance(settings, dict):
        raise TextSpecError(f"{path}: expected a JSON object")
    given = settings.get("prompts") or {}
    if not isinstance(given, dict) or not all(
        isinstance(name, str) and (text is None or isinstance(text, str)) for name, text in given.items()
    ):
        raise TextSpecError(f"{path}: prompts must be an object of prompt names and their texts")
    prompts = {name: "" for name in ST_DEFAULT_PROMPTS}
    prompts.update({name: text or "" for name, text in given.items()})
    default = settings.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise TextSpecError(f"{path}: default_prompt_name {default!r} is not one of the prompts {list(prompts)}")
    return tuple(prompts.items()), default


def whole(value: Any, where: str, minimum: int, maximum: int | None, bound: str) -> int:
    """A model.toml setting that must be a whole number from ``minimum`` up to ``maximum`` (None: no
    upper bound; ``bound`` names it, with ``{}`` for the number)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TextSpecError(f"{where} must be a whole number of at least {minimum}")
    if maximum is not None and value > maximum:
        raise TextSpecError(f"{where} {value} is more than {bound.format(maximum)}")
    return value


def _sequence_length(
    config: Mapping[str, Any], folder: Path, sentence_transformers: bool, preprocess: Mapping[str, Any], where: str
) -> int:
    limit = position_limit(config)
    given = preprocess.get("sequence_length")
    if given is not None:
        return whole(given, f"{where}: [preprocess] sequence_length", 2, limit, "the model's {} positions")
    candidates = [limit] if limit is not None else []
    tokenizer_limit = _read_json(folder / "tokenizer_config.json", required=False).get("model_max_length")
    if isinstance(tokenizer_limit, (int, float)) and 0 < tokenizer_limit < NO_LIMIT:
        candidates.append(int(tokenizer_limit))
    if sentence_transformers:
        st_limit = _read_json(folder / "sentence_bert_config.json", required=False).get("max_seq_length")
        if isinstance(st_limit, int) and st_limit > 0:
            candidates = [st_limit] + ([limit] if limit is not None else [])
    if not candidates:
        raise TextSpecError(
            f"{where}: no sequence length in {folder} (config.json max_position_embeddings, tokenizer_config.json "
            "model_max_length): set [preprocess] sequence_length"
        )
    return min(candidates)


# A family's tensors from what was read: (the text model, config.json, model.toml as given, where) -> tensors
Tensors = Callable[["TextModel", Mapping[str, Any], Mapping[str, Any], str], list[dict[str, Any]]]


def resolve(
    raw: Mapping[str, Any],
    model_folder: Path,
    where: str,
    *,
    outputs: Tensors,
    inputs: Tensors | None = None,
    labels: bool = False,
    sentence_transformers: bool = False,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    check: Callable[[Mapping[str, Any], Path], None] | None = None,
) -> tuple[dict[str, Any], TextModel]:
    """The model.toml of a text model completed from its folder: ``raw`` with ``max_batch_size``,
    ``inputs`` and ``outputs`` filled in where it gives none, and what the family reads. The family
    says what it reads besides (``labels``: config.json's id2label; ``sentence_transformers``: the
    pooling, normalisation, prompts and sequence limit of a sentence-transformers folder), refuses
    what it cannot serve (``check(config, folder)``) and gives its tensors (``inputs``: the
    tokenizer's unless given)."""
    family = str(raw.get("family", ""))
    source = raw["export"][SOURCE_KEY]
    if not isinstance(source, str) or not source.strip():
        raise TextSpecError(f"{where}: [export] {SOURCE_KEY} must name a folder of the model's, or a hub id")
    folder = text_folder(model_folder, source)
    if model_folder.resolve() not in folder.resolve().parents:
        raise TextSpecError(f"{where}: [export] {SOURCE_KEY} = {source!r} must be a folder inside {model_folder}")
    if not (folder / "config.json").is_file():
        if is_local(model_folder, source) or folder.is_dir():
            raise TextSpecError(f"{folder}: no config.json (a folder written by save_pretrained() has one)")
        raise TextSpecError(
            f"{where}: [export] {SOURCE_KEY} = {source!r} is not a folder in {model_folder}; as a hub id it is "
            f"fetched by python -m scripts.model_prep --models {model_folder.name} (into {HUB_FOLDER}/)"
        )
    if not (folder / "tokenizer.json").is_file():
        raise TextSpecError(
            f"{folder}: no tokenizer.json (a fast tokenizer's file: AutoTokenizer.from_pretrained(...)"
            ".save_pretrained(folder) writes it)"
        )
    config = _read_json(folder / "config.json")
    if check is not None:
        check(config, folder)
    preprocess = raw.get("preprocess", {})
    pooling, normalize, dimension, modules = ("", False, None, ())
    prompts, default_prompt_name = (), None
    if sentence_transformers:
        pooling, normalize, dimension, modules = _pooling(folder)
        prompts, default_prompt_name = _prompts(folder)
    hidden = int(config.get("hidden_size") or config.get("d_model") or config.get("dim") or 0)
    text = TextModel(
        folder=folder,
        family=family,
        source=source,
        model_type=str(config.get("model_type", "")),
        labels=_labels(config, folder / "config.json") if labels else (),
        problem_type=str(config.get("problem_type") or ""),
        sequence_length=_sequence_length(config, folder, sentence_transformers, preprocess, where),
        token_type_ids=int(config.get("type_vocab_size") or 0) >= 2,
        pooling=pooling,
        normalize=normalize,
        dimension=int(dimension or hidden),
        modules=modules,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
    )
    completed = dict(raw)
    completed.setdefault("max_batch_size", max_batch_size)
    completed.setdefault("batching", {"max_queue_delay_microseconds": DEFAULT_QUEUE_DELAY_US})
    completed.setdefault("inputs", (inputs or tokenizer_inputs)(text, config, raw, where))
    completed.setdefault("outputs", outputs(text, config, raw, where))
    return completed, text


def tokenizer_inputs(text: TextModel, *_: Any) -> list[dict[str, Any]]:
    """The encoder's inputs: the tokenizer's ids and mask, and its token types where the model has two."""
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if text.token_type_ids else [])
    return [{"name": name, "dtype": "INT64", "dims": [-1]} for name in names]
