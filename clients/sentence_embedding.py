"""Sentence embedding family: a sentence-transformers folder (or any Hugging Face encoder, pooled by
mean), answered as ``SentenceTransformer(folder).encode`` answers.

Payload: ``{"text": str | [str], "normalize": bool, "truncation": bool, "prompt_name": str}``; one
text answers its vector (a list of floats), a list a list of them. Pooling (``mean``, ``cls``,
``max``, ``lasttoken``, ... as sentence-transformers names them) runs inside the network's graph:
Triton returns the pooled ``[batch, dim]``. ``normalize`` L2-normalises it here, as the folder's
``Normalize`` module and ``encode(normalize_embeddings=True)`` do; its default is whether the folder
ends with ``Normalize``, and ``"normalize": false`` answers the pooled vector of such a folder, as
``SentenceTransformer(modules=[transformer, pooling]).encode`` does (and text-embeddings-inference's
``normalize``): an option a caller sends is never ignored.
``sentence-transformers`` cuts every text to its ``max_seq_length``: send ``"truncation": true``
for the same answers on long texts; without it a text past the limit is refused.
``prompt_name`` is ``encode(prompt_name=...)``: the text of that prompt of the folder
(``config_sentence_transformers.json``: "query: ", "passage: " for E5-style retrieval models) is put
before each text; its default is the folder's ``default_prompt_name``, else none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from app.core.family import Family
from app.core.text_spec import TextModel, resolve
from clients.options import Option
from clients.text import TRUNCATION, TextClient

EPSILON = 1e-12  # torch.nn.functional.normalize's floor on the norm


class SentenceEmbeddingClient(TextClient[None]):
    family = "sentence_embedding"
    RESULT_SCHEMA: ClassVar[Mapping[str, Any]] = {
        "type": "array",
        "description": "sentence_embedding, for one text: its vector (SentenceTransformer.encode).",
        "items": {"type": "number"},
    }
    OPTIONS = (Option("normalize", bool, default=False), TRUNCATION, Option("prompt_name", str))

    def configure(self) -> None:
        super().configure()
        self.embeddings_name = self.spec.outputs[0].name
        self.prompts = dict(self.text.prompts)

    def option_defaults(self) -> Mapping[str, Any]:
        return {"normalize": self.text.normalize, "prompt_name": self.text.default_prompt_name}

    def option_choices(self) -> Mapping[str, tuple[str, ...]]:
        return {"prompt_name": tuple(self.prompts)}

    def token_count(self, text: str) -> int:
        """The tokens the model reads for ``text`` with the default options: its default prompt before
        it, special tokens included, cut to the sequence length (OpenAI's ``usage.prompt_tokens``)."""
        prompt = self.prompts.get(self.text.default_prompt_name) or ""
        return len(self.encode(prompt + text, None, "input", True))

    def preprocess(self, item: Any, where: str, options: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], None]:
        text = self.check_text(item, where)
        prompt = self.prompts.get(options["prompt_name"])  # None: no name given; "": a name with no text
        if prompt:  # encode() puts the prompt before the text, then tokenizes and truncates them together
            text = prompt + text
        return self.arrays([self.encode(text, None, where, options["truncation"])]), None

    def postprocess(self, outputs: Mapping[str, np.ndarray], context: None, options: Mapping[str, Any]) -> list:
        vector = outputs[self.embeddings_name][0].astype(np.float32, copy=False)
        if options["normalize"]:
            vector = vector / max(float(np.linalg.norm(vector)), EPSILON)
        return vector.tolist()


def complete(raw: Mapping[str, Any], folder: Path, where: str) -> tuple[dict[str, Any], TextModel]:
    """An embedder's model.toml from its folder: sentence-transformers' modules (pooling, Normalize,
    prompts, max_seq_length) and the pooled vector, ``embeddings [batch, dim]``."""
    return resolve(
        raw,
        folder,
        where,
        sentence_transformers=True,
        outputs=lambda text, *_: [{"name": "embeddings", "dtype": "FP32", "dims": [text.dimension]}],
    )


FAMILY = Family(
    name=SentenceEmbeddingClient.family,
    client=SentenceEmbeddingClient,
    complete=complete,
    export="scripts.model_prep.transformers_export:POOLED",
    small="scripts.model_prep.small_models.encoders:sentence_embedding_folder",
)
