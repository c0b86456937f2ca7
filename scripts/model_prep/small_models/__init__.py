"""Small Hugging Face models of the text families, built offline in seconds: what the tests serve, the
benchmarks' smoke runs and the documentation's worked examples.

- ``encoders``: text and token classifiers, sentence-transformers encoders and masked LMs of each
  tokenizer kind (WordPiece, byte-level BPE, SentencePiece/Unigram), seeded random weights;
- ``text2text``: T5 and BART folders, seeded random or trained in seconds on a toy task;
- ``causal``: decoder-only folders (GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3), seeded random, and a
  Llama trained in seconds on a few sentences;
- ``sets``: the named sets of them the tests serve, built once into a folder named by the content of
  what builds them (builders, settings, model preparation, library versions) and prepared by
  ``python -m scripts.model_prep``; ``python -m scripts.model_prep.small_models`` (``cli``) builds it,
  as ``make test-models`` does.
"""
