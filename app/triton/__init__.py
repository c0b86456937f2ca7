"""Code that runs inside Triton's python backend: model preparation (``python -m scripts.model_prep``)
copies these files into the model repository as ``<model>/1/model.py``, where Triton loads them.

- ``onnx_model.py``: a network served by ONNX Runtime in the python backend (the python target).
- ``text2text_model.py``: a text2text model, Hugging Face's ``generate`` over its three ONNX graphs
  (``onnx_generate.py``), batched across callers.
- ``causal_lm_model.py``: a text_generation model, a decoupled model whose step scheduler runs the
  requests' generations as one batch over ``decoder.onnx`` and streams each token as it is made.
- ``sam_model.py``: a mask_generation model (SAM, SAM-HQ): the image pre-processed, its two ONNX graphs run,
  the image encoder once for every prompt of a request.
- ``zsd_model.py``: a zero_shot_object_detection model (OWLv2, OWL-ViT): the image pre-processed as
  its processor does it, the detector's graph run over the request's labels.
- ``grounded_model.py``: a grounded_segmentation chain: the image decoded once, a zero-shot detector's
  graph, then SAM's two graphs over its boxes (the image encoder once).
- ``image_steps.py``: the pre- and post-processing steps of an image model's Triton pipeline
  (``app.core.pipeline``), running the router's own family clients.
"""

from pathlib import Path

ONNX_MODEL = Path(__file__).with_name("onnx_model.py")
IMAGE_STEPS = Path(__file__).with_name("image_steps.py")
TEXT2TEXT_MODEL = Path(__file__).with_name("text2text_model.py")
CAUSAL_LM_MODEL = Path(__file__).with_name("causal_lm_model.py")
SAM_MODEL = Path(__file__).with_name("sam_model.py")
ZSD_MODEL = Path(__file__).with_name("zsd_model.py")
GROUNDED_MODEL = Path(__file__).with_name("grounded_model.py")
