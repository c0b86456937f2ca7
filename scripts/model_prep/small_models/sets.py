"""The named sets of small models the tests serve, built once into one folder keyed by content.

A set is a folder of model sources (each ``<name>/model.toml`` and its Hugging Face folder ``hf/``)
and, unless it is only read as folders, the repository ``python -m scripts.model_prep`` prepares from
it (python target). Every set is built into ``<root>/<key>/<set>/{models,repository}``, their ONNX
exports cached in ``<root>/<key>/cache``. The key is a digest of what the build reads: the sources of
model preparation (these builders and the sets below among them), of ``app/core`` and ``app/triton``
(specs, and the ``model.py`` files copied into the repositories) and the versions of the libraries
that train and export. A folder whose key is there and complete is read as it is; one that is missing
is built under a file lock, so that processes asking at once (pytest-xdist's workers) build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from app.core.settings import PROJECT_ROOT
from scripts.model_prep.small_models.causal import FAMILY as TEXT_GENERATION
from scripts.model_prep.small_models.causal import TEMPLATES as CAUSAL_TEMPLATES
from scripts.model_prep.small_models.encoders import KINDS, NER_LABELS, update_json_files
from scripts.model_prep.small_models.owl import FAMILY as ZERO_SHOT_DETECTION
from scripts.model_prep.small_models.sam import FAMILY as MASK_GENERATION
from scripts.model_prep.small_models.seq2seq import FAMILY as TEXT2TEXT
from scripts.model_prep.small_models.zsd import GROUNDING_DINO_KIND

ROOT_VARIABLE = "TEST_SMALL_MODELS"  # where the built sets are (make test sets it)
DEFAULT_ROOT = PROJECT_ROOT / "build" / "small-models"
# What a build reads: model preparation, the shared layer, the Triton models copied into the repositories
# and the families (clients/: each completes its model.toml from a folder and names its export).
KEY_SOURCES = ("scripts/model_prep", "app/core", "app/triton", "clients")
KEY_PACKAGES = ("torch", "transformers", "tokenizers", "onnx", "onnxruntime", "openvino", "openvino-genai")
COMPLETE = "BUILT.json"  # written last: a folder without it is a build that did not finish
BUILD_JOBS = min(2, os.cpu_count() or 1)  # processes building the sets' groups at once
STALE_S = 24 * 3600  # another key's build unused this long is removed after a build


@dataclass(frozen=True)
class ModelSet:
    about: str
    models: dict[str, tuple[str, dict]]  # name: (family, the builder's options)
    prepared: bool = True  # also prepared into the set's repository (python target)
    seconds: float = 1.0  # about how long its build takes on one core: the longest groups start first


E5_PROMPTS = {"query": "query: ", "passage": "passage: "}  # the prompts of E5-style retrieval models
# A generation_config.json's own defaults: generate() and the family's client start from them
GENERATION_DEFAULTS = {"num_beams": 3, "max_length": 12, "no_repeat_ngram_size": 2}
# Sampling by default, as Qwen3's generation_config.json: a request that says nothing samples
SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}


# text_generation's other engine, said in model.toml's [export] table; the architectures it serves here
OPENVINO_ENGINE = 'engine = "openvino"\n'
OPENVINO_ARCHITECTURES = {"gpt2": None, "llama": "llama2", "qwen2": "chatml", "qwen3": "chatml", "phi3": None}


def _clean_up(flag: bool) -> dict:
    return {"tokenizer_config.json": {"clean_up_tokenization_spaces": flag}}


SETS = {
    "text": ModelSet(
        "each tokenizer kind, a pair-taking classifier with token_type_ids (BERT), a reranker (one label), "
        "a multi-label classifier and each pooling mode",
        {
            "sentiment_bert": ("text_classification", {"kind": "bert"}),
            "topic_roberta": ("text_classification", {"kind": "roberta", "labels": ("WORLD", "SPORTS", "BUSINESS")}),
            "reranker_xlmr": ("text_classification", {"kind": "xlm-roberta", "labels": ("LABEL_0",)}),
            "tags_bert": (
                "text_classification",
                {"kind": "bert", "labels": ("A", "B", "C"), "problem_type": "multi_label_classification"},
            ),
            "ner_bert": ("token_classification", {"kind": "bert", "labels": NER_LABELS}),
            "ner_roberta": ("token_classification", {"kind": "roberta", "labels": NER_LABELS}),
            "ner_xlmr": ("token_classification", {"kind": "xlm-roberta", "labels": NER_LABELS}),
            "embed_bert_mean": ("sentence_embedding", {"kind": "bert", "pooling": "mean"}),
            "embed_roberta_cls": ("sentence_embedding", {"kind": "roberta", "pooling": "cls", "normalize": False}),
            "embed_xlmr_max": (  # with E5's prompts, the query's by default
                "sentence_embedding",
                {"kind": "xlm-roberta", "pooling": "max", "prompts": E5_PROMPTS, "default_prompt_name": "query"},
            ),
            "embed_bert_last": ("sentence_embedding", {"kind": "bert", "pooling": "lasttoken", "normalize": False}),
            "fill_roberta": ("fill_mask", {"kind": "roberta"}),
        },
        seconds=11,
    ),
    "fill_mask": ModelSet(
        "a masked LM of each tokenizer kind, each cleaning up spaces its own way (tokenizer_config.json's "
        "clean_up_tokenization_spaces: the default, ignored by a BPE tokenizer, applied)",
        {
            "fill_bert": ("fill_mask", {"kind": "bert", "files": _clean_up(False)}),
            "fill_roberta": ("fill_mask", {"kind": "roberta", "files": _clean_up(True)}),
            "fill_xlmr": ("fill_mask", {"kind": "xlm-roberta", "files": _clean_up(True)}),
        },
        seconds=1.5,
    ),
    "entities": ModelSet(
        "a token classifier of each tokenizer kind (other weights than the text set's), read as folders",
        {f"ner_{kind}": ("token_classification", {"kind": kind, "labels": NER_LABELS, "seed": 3}) for kind in KINDS},
        prepared=False,
        seconds=0.5,
    ),
    "text2text": ModelSet(
        "T5 and BART, random and trained; the trained BART's generation_config.json sets its defaults",
        {
            "t5_random": (TEXT2TEXT, {"kind": "t5"}),
            "t5_trained": (TEXT2TEXT, {"kind": "t5", "trained": True}),
            "bart_random": (TEXT2TEXT, {"kind": "bart"}),
            "bart_trained": (
                TEXT2TEXT,
                {"kind": "bart", "trained": True, "files": {"generation_config.json": GENERATION_DEFAULTS}},
            ),
        },
        seconds=31,
    ),
    "text2text_stack": ModelSet(
        "the trained T5 and BART as the whole stack serves them",
        {
            "t5_gen": (TEXT2TEXT, {"kind": "t5", "trained": True}),
            "bart_gen": (TEXT2TEXT, {"kind": "bart", "trained": True}),
        },
        seconds=6,
    ),
    "sam": ModelSet(
        "a tiny SAM (SamModel + SamProcessor, 256-pixel inputs, seeded random weights), one of another "
        "seed, so that two models answer differently, and a tiny SAM-HQ (SamHQModel + SamHQProcessor)",
        {
            "sam_tiny": (MASK_GENERATION, {}),
            "sam_other": (MASK_GENERATION, {"seed": 1}),
            "samhq_tiny": (MASK_GENERATION, {"kind": "sam_hq", "seed": 2}),
        },
        seconds=8,
    ),
    "zsd": ModelSet(
        "a tiny OWLv2 and a tiny OWL-ViT (64-pixel inputs, 64 boxes, 16-token labels, a tiny CLIP BPE) and a "
        "tiny Grounding DINO (Swin and BERT, 200-pixel short side, BERT's special ids, 256-token prompts), seeded "
        "random weights: the three kinds of the zero_shot_object_detection family",
        {
            "owlv2_tiny": (ZERO_SHOT_DETECTION, {"kind": "owlv2"}),
            "owlvit_tiny": (ZERO_SHOT_DETECTION, {"kind": "owlvit", "seed": 1}),
            "gdino_tiny": (ZERO_SHOT_DETECTION, {"kind": GROUNDING_DINO_KIND}),
        },
        seconds=11,
    ),
    "causal": ModelSet(
        "a tiny decoder-only model of each architecture text_generation serves (chat templates: ChatML on "
        "Qwen3, Qwen's with tools on Qwen2, Llama 2's on Llama, none on GPT-2; qwen3's generation_config.json samples by default) and "
        "the same six trained on the sentences of causal.SENTENCES (wider: 64)",
        {
            "gpt2_random": (TEXT_GENERATION, {"architecture": "gpt2"}),
            "llama_random": (TEXT_GENERATION, {"architecture": "llama", "chat_template": "llama2"}),
            "qwen2_random": (TEXT_GENERATION, {"architecture": "qwen2", "chat_template": "qwen_tools"}),
            "qwen3_random": (
                TEXT_GENERATION,
                {
                    "architecture": "qwen3",
                    "chat_template": "chatml",
                    "files": {"generation_config.json": SAMPLING_DEFAULTS},
                },
            ),
            "mistral_random": (TEXT_GENERATION, {"architecture": "mistral"}),
            "phi3_random": (TEXT_GENERATION, {"architecture": "phi3"}),
            **{
                f"{architecture}_trained": (
                    TEXT_GENERATION,
                    {"architecture": architecture, "trained": True, "hidden": 64, "chat_template": template},
                )
                for architecture, template in CAUSAL_TEMPLATES.items()
            },
        },
        seconds=21,
    ),
    "causal_openvino": ModelSet(
        'the tiny decoder-only models of the causal set on OpenVINO GenAI ([export] engine = "openvino"): '
        "each architecture whose attention spans the whole context (the causal set's Mistral has a sliding "
        "window of 8, which the engine refuses), and the trained Llama with int8 weights, with int4 weights, "
        "and in bf16 arithmetic",
        {
            **{
                f"{architecture}_openvino": (
                    TEXT_GENERATION,
                    {"architecture": architecture, "chat_template": template, "extra": OPENVINO_ENGINE},
                )
                for architecture, template in OPENVINO_ARCHITECTURES.items()
            },
            **{
                f"llama_{lowered}": (
                    TEXT_GENERATION,
                    {
                        "architecture": "llama",
                        "trained": True,
                        "hidden": 64,
                        "chat_template": "llama2",
                        "extra": OPENVINO_ENGINE + line,
                    },
                )
                for lowered, line in (
                    ("int8", 'weights = "int8"\n'),
                    ("int4", 'weights = "int4"\n'),
                    ("bf16", 'precision = "bf16"\n'),
                )
            },
        },
        seconds=20,
    ),
}


@dataclass(frozen=True)
class Built:
    """The folder of one key: each set's model sources and prepared repository."""

    path: Path
    key: str = field(default="")

    def models(self, name: str) -> Path:
        return self.path / name / "models"

    def repository(self, name: str) -> Path:
        if not SETS[name].prepared:
            raise ValueError(f"the small-model set {name!r} is not prepared: read its models()")
        return self.path / name / "repository"

    @property
    def cache(self) -> Path:
        """The sets' ONNX exports (model preparation's --cache-dir)."""
        return self.path / "cache"

    @property
    def complete(self) -> bool:
        return (self.path / COMPLETE).is_file()


def content_key() -> str:
    """The digest of what a build reads (KEY_SOURCES' Python files, KEY_PACKAGES' versions)."""
    digest = hashlib.sha256()
    for folder in KEY_SOURCES:
        for path in sorted((PROJECT_ROOT / folder).rglob("*.py")):
            digest.update(path.relative_to(PROJECT_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for package in KEY_PACKAGES:
        digest.update(f"{package}=={metadata.version(package)}\n".encode())
    return digest.hexdigest()[:16]


def default_root() -> Path:
    return Path(os.environ.get(ROOT_VARIABLE) or DEFAULT_ROOT)


def _build_model(models: Path, name: str, family: str, options: dict) -> Path:
    """One small model, by its family's builder (``Family.small``)."""
    from clients.families import FAMILIES

    return FAMILIES[family].small_builder()(models, name, **options)


def _settings(options: dict) -> dict:
    """A model's options for its builder: all but the data files written over its folder."""
    return {key: value for key, value in options.items() if key != "files"}


def _same(family: str, options: dict) -> str:
    """What makes two models of the sets one build: their family and settings."""
    return json.dumps([family, _settings(options)], sort_keys=True, default=list)


def groups() -> list[list[str]]:
    """The sets in groups that share no build, each group's sets in ``SETS``' order: two sets with a
    model of the same family and options are in one group, which builds it once and copies it."""
    order = list(SETS)
    found: list[tuple[set[str], list[str]]] = []  # (the group's builds, its sets)
    for set_name, model_set in SETS.items():
        builds = {_same(family, options) for family, options in model_set.models.values()}
        joined = [group for group in found if group[0] & builds]
        names = sorted([set_name, *(name for _, its in joined for name in its)], key=order.index)
        found = [group for group in found if group not in joined] + [(builds.union(*(b for b, _ in joined)), names)]
    return sorted((names for _, names in found), key=lambda names: order.index(names[0]))


def _build_group(target: Path, set_names: list[str], number: int, log: Callable[[str], None] = print) -> None:
    """One group's sets into ``target``: each folder built once, each prepared set's repository by
    ``scripts.model_prep`` (the ONNX exports cached in the key's cache, shared by the groups)."""
    from scripts.model_prep import cli

    made: dict[str, Path] = {}
    folders = target / f"folders-{number}"  # one build of each family and options, copied into the sets
    for set_name in set_names:
        model_set = SETS[set_name]
        for name, (family, options) in model_set.models.items():
            same, settings = _same(family, options), _settings(options)
            if same not in made:
                log(f"[small-models] {set_name}/{name}: building {family} {settings} ...")
                made[same] = _build_model(folders, str(len(made)), family, settings)
            shutil.copytree(made[same], target / set_name / "models" / name)
            update_json_files(target / set_name / "models" / name / "hf", options.get("files"))
        if model_set.prepared:
            log(f"[small-models] {set_name}: python -m scripts.model_prep ...")
            argv = [
                "--source",
                str(target / set_name / "models"),
                "--repository",
                str(target / set_name / "repository"),
            ]
            if cli.main([*argv, "--cache-dir", str(Built(target).cache)]) != 0:
                raise RuntimeError(f"model preparation of the small-model set {set_name!r} failed (its output above)")
    shutil.rmtree(folders, ignore_errors=True)


def _one_thread() -> None:
    """A building process's torch on one thread: the processes side by side would otherwise each
    start a thread a core, which wait on each other (42.6 s instead of 59.2 s for the sets here)."""
    import torch

    torch.set_num_threads(1)


def print_now(line: str) -> None:
    """A build's log line, out at once (between the other building process's lines; the CLI's log)."""
    print(line, flush=True)


def build(target: Path, log: Callable[[str], None] = print, jobs: int = BUILD_JOBS) -> None:
    """Every set into ``target`` (emptied first), the groups (``groups``) in ``jobs`` processes at once,
    the longest first: a set's build is mostly one core's work (torch on one thread, ONNX exports and
    their checks). The processes print their lines as they go (each names its set and model)."""
    shutil.rmtree(target, ignore_errors=True)
    started = time.perf_counter()
    ordered = sorted(groups(), key=lambda names: -sum(SETS[name].seconds for name in names))
    if jobs <= 1 or len(ordered) == 1:
        for number, names in enumerate(ordered):
            _build_group(target, names, number, log)
    else:
        spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch threads forked
        with ProcessPoolExecutor(jobs, mp_context=spawn, initializer=_one_thread) as pool:
            running = [
                pool.submit(_build_group, target, names, number, print_now) for number, names in enumerate(ordered)
            ]
            try:
                for done in running:
                    done.result()  # a failed group's error, here
            except BaseException:
                pool.shutdown(cancel_futures=True)  # the groups not started yet are not
                raise
    seconds = round(time.perf_counter() - started, 1)
    (target / COMPLETE).write_text(json.dumps({"sets": sorted(SETS), "seconds": seconds}, indent=2))
    log(f"[small-models] built {len(SETS)} sets into {target} in {seconds} s")


def ensure(root: Path | None = None, rebuild: bool = False, log: Callable[[str], None] = print) -> Built:
    """The built sets of this content's key under ``root`` (default: $TEST_SMALL_MODELS, else
    build/small-models), built first where they are missing (or with ``rebuild``). A file lock makes
    processes asking at once wait for one build; other keys' folders unused for a day are removed after a build."""
    root = (root or default_root()).resolve()
    key = content_key()
    built = Built(root / key, key)
    if built.complete and not rebuild:
        (root / f"{key}.lock").touch()  # asked for now: not stale
        return built
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if rebuild or not built.complete:
            build(built.path, log)
            _remove_stale(root, key)
    return built


def _remove_stale(root: Path, key: str) -> None:
    """Other keys' folders not asked for in a day (``STALE_S``): checkouts of other revisions that share
    this root (a second worktree, a branch under test) keep theirs while they use them."""
    for stale in root.iterdir():
        if not stale.is_dir() or stale.name == key:
            continue
        lock = root / f"{stale.name}.lock"
        if time.time() - (lock if lock.exists() else stale).stat().st_mtime > STALE_S:
            shutil.rmtree(stale, ignore_errors=True)
            lock.unlink(missing_ok=True)
