"""The Hugging Face references of the prompted image families, run as a caller runs them, one image a
call (batch 1): the processor, the model, the processor's post-processing. The benchmark times them;
the fidelity tests (``tests/sam_reference.py``, ``tests/zsd_reference.py``) compare answers with them.

``threads``: PyTorch's intra-op threads, set when given (the tests run at 1; the benchmark leaves
PyTorch's own, every CPU, as a caller would).
"""

from __future__ import annotations

from pathlib import Path


def _set_threads(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


class SamReference:
    """``SamModel`` + ``SamProcessor`` (``SamHQModel`` + ``SamHQProcessor`` for a SAM-HQ folder: the
    Auto classes pick): ``prompt`` runs one prompt (a box, or points) and keeps the masks as logits;
    ``boxes`` runs every box of an image in one call, as a caller with several boxes does, binarised
    by ``post_process_masks``."""

    def __init__(self, folder: Path, threads: int | None = 1) -> None:
        from transformers import AutoModel, AutoProcessor

        _set_threads(threads)
        self.model = AutoModel.from_pretrained(str(folder)).eval()
        self.processor = AutoProcessor.from_pretrained(str(folder))

    def run(self, image, multimask: bool = False, binarize: bool = True, **prompts):
        """``processor(images=image, **prompts)`` -> the model -> ``post_process_masks``: the image's
        masks ``[prompts, masks, H, W]`` and the model's outputs."""
        import torch

        inputs = self.processor(images=image, return_tensors="pt", **prompts)
        with torch.no_grad():
            out = self.model(**inputs, multimask_output=multimask)
        masks = self.processor.post_process_masks(
            out.pred_masks, inputs["original_sizes"], inputs["reshaped_input_sizes"], binarize=binarize
        )[0]
        return masks, out

    def boxes(self, image, boxes) -> list:
        """Every box's mask and predicted IoU, one call for the image."""
        masks, out = self.run(image, input_boxes=[[list(box) for box in boxes]])
        return [(mask[0], float(score)) for mask, score in zip(masks, out.iou_scores[0, :, 0])]


class ZsdReference:
    """``AutoModelForZeroShotObjectDetection`` + ``AutoProcessor``: ``detect`` answers one image."""

    def __init__(self, folder: Path, threads: int | None = 1) -> None:
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        _set_threads(threads)
        self.model = AutoModelForZeroShotObjectDetection.from_pretrained(str(folder)).eval()
        self.processor = AutoProcessor.from_pretrained(str(folder))

    @property
    def grounding(self) -> bool:
        return self.model.config.model_type == "grounding-dino"

    def detect(self, image, labels, threshold: float | None = None, text_threshold: float = 0.25) -> list[dict]:
        """The answer a caller gets from transformers, best first. ``labels``: a list of labels, or
        (Grounding DINO) a prompt; ``threshold``: the processor's default unless given."""
        import numpy as np
        import torch

        text = labels if isinstance(labels, str) else [list(labels)]
        inputs = self.processor(images=image, text=text, return_tensors="pt")
        with torch.no_grad():
            outputs = self.model(**inputs)
        size = [(image.height, image.width)]
        if self.grounding:
            found = self.processor.post_process_grounded_object_detection(
                outputs,
                threshold=0.25 if threshold is None else threshold,
                text_threshold=text_threshold,
                target_sizes=size,
            )[0]
        else:
            found = self.processor.post_process_grounded_object_detection(
                outputs, threshold=0.1 if threshold is None else threshold, target_sizes=size, text_labels=text
            )[0]
        scores = found["scores"].numpy()
        order = np.argsort(-scores, kind="stable")
        return [
            {"label": found["text_labels"][i], "score": float(scores[i]), "box": found["boxes"][i].tolist()}
            for i in order
        ]
