"""The torch modules a ``mask_generation`` model's two ONNX graphs are exported from
(``scripts.model_prep.sam_export``), by model type (``KINDS``: SAM, SAM-HQ), as SAM's own
``export_onnx_model.py`` and optimum's ``SamOnnxConfig`` split the model:

- ``Encoder``: ``pixel_values [batch, 3, S, S]`` -> ``image_embeddings [batch, C, h, w]``, and for SAM-HQ
  also ``intermediate_embeddings [batch, h, w, vit_dim]`` (its ViT's first global-attention layer's
  output, the one ``SamHQMaskDecoder`` reads);
- ``Decoder``: the encoder's outputs, ``input_points [1, prompts, points, 2]``, ``input_labels [1,
  prompts, points]`` -> ``iou_scores [1, prompts, 4]``, ``pred_masks [1, prompts, 4, 4h, 4w]``: the
  prompt encoder (a box is its two corners labelled 2 and 3, as SAM's export takes it; the image-wide
  positional embedding, which depends on the weights only, is a constant of the graph) and the mask
  decoder of all four mask tokens (Hugging Face computes the four and slices); ``HQDecoder``: SAM-HQ's
  (``SamHQMaskDecoder.forward`` with ``hq_token_only`` false): the HQ features of the two embeddings,
  the HQ token beside the four, each token's mask plus the HQ token's, tokens 1 to 3 sorted by their
  scores as ``multimask_output`` sorts them. As transformers' ``SamHQMaskDecoder`` does it, the masks
  are made from the image the two-way transformer was given (the embedding plus the dense prompt, its
  ``transpose(2, 3).reshape`` swapping h and w), not from the image it gives back as SAM's are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from app.core import mask_contract as contract


class Encoder(nn.Module):
    """The vision encoder; its outputs ``contract.ENCODER_OUTPUTS``, in their order."""

    def __init__(self, model: nn.Module, intermediate: bool = False) -> None:
        super().__init__()
        self.vision_encoder = model.vision_encoder
        self.intermediate = intermediate

    def forward(self, pixel_values):
        found = self.vision_encoder(pixel_values)
        if self.intermediate:
            return found.last_hidden_state, found.intermediate_embeddings[0]
        return found.last_hidden_state


class Decoder(nn.Module):
    """SAM's prompt encoder (points and labels; no mask input) and mask decoder, all four tokens out:
    ``SamMaskDecoder.forward``'s operations, in its order, without its last slice."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.image_size = float(model.prompt_encoder.input_image_size)
        with torch.no_grad():
            self.register_buffer("image_pe", model.get_image_wide_positional_embeddings().clone())

    def embed_points(self, points, labels):
        encoder = self.model.prompt_encoder
        embedded = encoder.shared_embedding((points + 0.5) / self.image_size)
        label = labels.unsqueeze(-1)
        embedded = torch.where(label == contract.NOT_A_POINT, encoder.not_a_point_embed.weight, embedded)
        for index in range(len(encoder.point_embed)):  # background, foreground, a box's two corners
            embedded = embedded + encoder.point_embed[index].weight * (label == index).to(embedded.dtype)
        return embedded

    def attend(self, image_embeddings, input_points, input_labels, output_tokens: list):
        """The two-way transformer over the output tokens and the prompts' (``output_tokens``: the
        decoder's token weights, in its order): the tokens out, the image it was given (the embedding
        plus the dense prompt, once a prompt) and the image it gives back."""
        sparse = self.embed_points(input_points, input_labels)
        decoder, encoder = self.model.mask_decoder, self.model.prompt_encoder
        batch, _, height, width = image_embeddings.shape
        dense = encoder.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(batch, -1, height, width)
        prompts = sparse.shape[1]
        tokens = torch.cat(output_tokens, dim=0).repeat(batch, prompts, 1, 1)
        tokens = torch.cat((tokens, sparse), dim=2)
        image = (image_embeddings + dense).repeat_interleave(prompts, 0)
        positions = self.image_pe.repeat_interleave(prompts, 0)
        point_embedding, attended = decoder.transformer(
            point_embeddings=tokens,
            image_embeddings=image,
            image_positional_embeddings=positions,
            attention_similarity=None,
            target_embedding=None,
        )
        return point_embedding, image, attended

    def upscale(self, image, shape):
        """``image`` as ``[batch * prompts, C, h, w]`` (``shape``: the embedding's, ``[batch, C, h, w]``;
        the decoder's ``transpose(2, 3).reshape``), upscaled by its two transposed convolutions."""
        decoder = self.model.mask_decoder
        _, channels, height, width = shape
        image = image.transpose(2, 3).reshape(-1, channels, height, width)
        upscaled = decoder.activation(decoder.upscale_layer_norm(decoder.upscale_conv1(image)))
        return decoder.activation(decoder.upscale_conv2(upscaled))

    @staticmethod
    def project(hyper, upscaled, batch: int, prompts: int):
        """The hypernetworks' outputs ``[batch, prompts, tokens, c]`` against the upscaled image: the masks."""
        _, up_channels, up_height, up_width = upscaled.shape
        upscaled = upscaled.reshape(batch, prompts, up_channels, up_height * up_width)
        return (hyper @ upscaled).reshape(batch, prompts, -1, up_height, up_width)

    def forward(self, image_embeddings, input_points, input_labels):
        decoder = self.model.mask_decoder
        weights = [decoder.iou_token.weight, decoder.mask_tokens.weight]
        point_embedding, _, attended = self.attend(image_embeddings, input_points, input_labels, weights)
        upscaled = self.upscale(attended, image_embeddings.shape)
        batch, prompts = point_embedding.shape[:2]
        hyper = torch.stack(
            [
                decoder.output_hypernetworks_mlps[i](point_embedding[:, :, 1 + i, :])
                for i in range(decoder.num_mask_tokens)
            ],
            dim=2,
        )
        return decoder.iou_prediction_head(point_embedding[:, :, 0, :]), self.project(hyper, upscaled, batch, prompts)


class HQDecoder(Decoder):
    """SAM-HQ's prompt encoder and mask decoder: ``SamHQMaskDecoder.forward``'s operations in its order,
    for all four tokens at once: token 0 (``multimask_output=False``) and tokens 1 to 3 sorted by
    score (``multimask_output=True``), each plus the HQ token's mask."""

    def forward(self, image_embeddings, intermediate_embeddings, input_points, input_labels):
        decoder = self.model.mask_decoder
        activation = decoder.activation
        hq_features = decoder.encoder_conv2(activation(decoder.encoder_norm(decoder.encoder_conv1(image_embeddings))))
        vit_features = intermediate_embeddings.permute(0, 3, 1, 2)
        compressed = activation(decoder.compress_vit_norm(decoder.compress_vit_conv1(vit_features)))
        hq_features = hq_features + decoder.compress_vit_conv2(compressed)
        weights = [decoder.iou_token.weight, decoder.mask_tokens.weight, decoder.hq_token.weight]
        point_embedding, image, _ = self.attend(image_embeddings, input_points, input_labels, weights)
        upscaled = self.upscale(image, image_embeddings.shape)  # as SamHQMaskDecoder: not the transformer's image
        batch, prompts = point_embedding.shape[:2]
        upscaled_hq = decoder.mask_conv2(activation(decoder.mask_norm(decoder.mask_conv1(upscaled))))
        upscaled_hq = upscaled_hq + hq_features.repeat(batch * prompts, 1, 1, 1)
        mlps = [*decoder.output_hypernetworks_mlps, decoder.hq_mask_mlp]  # the HQ token last
        hyper = torch.stack([mlp(point_embedding[:, :, 1 + i, :]) for i, mlp in enumerate(mlps)], dim=2)
        masks = self.project(hyper[:, :, :-1], upscaled, batch, prompts)
        masks_hq = self.project(hyper[:, :, -1:], upscaled_hq, batch, prompts)
        iou = decoder.iou_prediction_head(point_embedding[:, :, 0, :])
        best, order = torch.sort(iou[:, :, 1:], dim=2, descending=True)
        size = masks.shape[-2:]
        sorted_masks = torch.gather(masks[:, :, 1:], 2, order[..., None, None].expand(-1, -1, -1, *size))
        return torch.cat([iou[:, :, :1], best], dim=2), torch.cat([masks[:, :, :1], sorted_masks], dim=2) + masks_hq


@dataclass(frozen=True)
class Kind:
    """A model type's classes: transformers' model and processor (by name), the graphs' modules."""

    model_type: str
    model: str
    processor: str
    decoder: type

    @property
    def intermediate(self) -> bool:
        """Whether the encoder gives the intermediate embeddings too (the contract's encoder outputs)."""
        return contract.INTERMEDIATE_EMBEDDINGS in contract.ENCODER_OUTPUTS[self.model_type]

    def modules(self, model: nn.Module) -> tuple[nn.Module, nn.Module]:
        return Encoder(model, self.intermediate), self.decoder(model)

    def classes(self) -> tuple[type, type]:
        """transformers' model and processor classes (transformers imported here, when needed)."""
        import transformers

        return getattr(transformers, self.model), getattr(transformers, self.processor)


KINDS = {
    kind.model_type: kind
    for kind in (
        Kind(contract.SAM, "SamModel", "SamProcessor", Decoder),
        Kind(contract.SAM_HQ, "SamHQModel", "SamHQProcessor", HQDecoder),
    )
}


def image_embeddings(model: nn.Module, pixel_values) -> tuple:
    """``model.get_image_embeddings`` as the encoder graph's outputs: SAM's embedding, or SAM-HQ's
    ``(embedding, intermediate embeddings)`` with the first of them (the one its decoder reads)."""
    found = model.get_image_embeddings(pixel_values)
    return (found[0], found[1][0]) if isinstance(found, tuple) else (found,)
