"""YOLOv5s v7.0 (ultralytics/yolov5 ``models/yolov5s.yaml``), written out without its package.

The official ``yolov5`` package pulls in training, logging and hub dependencies that a model
export does not need. Module classes, attribute names and layer indices follow the official
``models/common.py`` and ``models/yolo.py`` so that an official state_dict loads unchanged
(``model.0.conv.weight`` ... ``model.24.anchors``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

NUM_CLASSES = 80
ANCHORS = ((10, 13, 16, 30, 33, 23), (30, 61, 62, 45, 59, 119), (116, 90, 156, 198, 373, 326))
STRIDES = (8.0, 16.0, 32.0)
DEPTH_MULTIPLE = 0.33
WIDTH_MULTIPLE = 0.50


def autopad(k: int, p: int | None = None) -> int:
    return k // 2 if p is None else p


class Conv(nn.Module):
    """Conv2d -> BatchNorm2d -> SiLU."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP bottleneck with three convolutions."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained max-pools."""

    def __init__(self, c1: int, c2: int, k: int = 5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Concat(nn.Module):
    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(x, self.d)


class Detect(nn.Module):
    """The three detection heads; inference output [B, sum(na*ny*nx), 5 + nc] in input pixels."""

    def __init__(self, nc: int, anchors: tuple[tuple[int, ...], ...], ch: tuple[int, ...], strides: tuple[float, ...]):
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        stride = torch.tensor(strides)
        self.stride = stride
        # As in the official model: anchors are kept in units of each level's stride.
        self.register_buffer("anchors", torch.tensor(anchors).float().view(self.nl, -1, 2) / stride.view(-1, 1, 1))
        self.m = nn.ModuleList(nn.Conv2d(x, self.no * self.na, 1) for x in ch)

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        z = []
        for i in range(self.nl):
            p = self.m[i](x[i])
            bs, _, ny, nx = p.shape
            p = p.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            grid, anchor_grid = self._make_grid(nx, ny, i)
            xy, wh, conf = p.sigmoid().split((2, 2, self.nc + 1), 4)
            xy = (xy * 2 + grid) * self.stride[i]
            wh = (wh * 2) ** 2 * anchor_grid
            z.append(torch.cat((xy, wh, conf), 4).view(bs, self.na * nx * ny, self.no))
        return torch.cat(z, 1)

    def _make_grid(self, nx: int, ny: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        d, t = self.anchors[i].device, self.anchors[i].dtype
        shape = 1, self.na, ny, nx, 2
        yv, xv = torch.meshgrid(torch.arange(ny, device=d, dtype=t), torch.arange(nx, device=d, dtype=t), indexing="ij")
        grid = torch.stack((xv, yv), 2).expand(shape) - 0.5
        anchor_grid = (self.anchors[i] * self.stride[i]).view((1, self.na, 1, 1, 2)).expand(shape)
        return grid, anchor_grid

    def initialize_biases(self) -> None:
        """The official prior: objectness ~ 8 objects per 640 image, classes ~ 0.6 / nc."""
        for mi, s in zip(self.m, self.stride):
            b = mi.bias.view(self.na, -1)
            b.data[:, 4] += math.log(8 / (640 / s) ** 2)
            b.data[:, 5 : 5 + self.nc] += math.log(0.6 / (self.nc - 0.99999))
            mi.bias = nn.Parameter(b.view(-1), requires_grad=True)


def _depth(n: int, multiple: float = DEPTH_MULTIPLE) -> int:
    return max(round(n * multiple), 1) if n > 1 else n


def _width(c: int, multiple: float = WIDTH_MULTIPLE) -> int:
    return int(math.ceil(c * multiple / 8) * 8)


# yolov5s.yaml v7.0: (from, repeats, module, args before width/depth scaling).
_BACKBONE = (
    (-1, 1, Conv, (64, 6, 2, 2)),
    (-1, 1, Conv, (128, 3, 2)),
    (-1, 3, C3, (128,)),
    (-1, 1, Conv, (256, 3, 2)),
    (-1, 6, C3, (256,)),
    (-1, 1, Conv, (512, 3, 2)),
    (-1, 9, C3, (512,)),
    (-1, 1, Conv, (1024, 3, 2)),
    (-1, 3, C3, (1024,)),
    (-1, 1, SPPF, (1024, 5)),
)
_HEAD = (
    (-1, 1, Conv, (512, 1, 1)),
    (-1, 1, nn.Upsample, (None, 2, "nearest")),
    ((-1, 6), 1, Concat, (1,)),
    (-1, 3, C3, (512, False)),
    (-1, 1, Conv, (256, 1, 1)),
    (-1, 1, nn.Upsample, (None, 2, "nearest")),
    ((-1, 4), 1, Concat, (1,)),
    (-1, 3, C3, (256, False)),
    (-1, 1, Conv, (256, 3, 2)),
    ((-1, 14), 1, Concat, (1,)),
    (-1, 3, C3, (512, False)),
    (-1, 1, Conv, (512, 3, 2)),
    ((-1, 10), 1, Concat, (1,)),
    (-1, 3, C3, (1024, False)),
    ((17, 20, 23), 1, Detect, ()),
)


def _make_layer(
    f, n: int, module: type, args: tuple, ch: list[int], width: float = WIDTH_MULTIPLE, depth: float = DEPTH_MULTIPLE
) -> tuple[nn.Module, int]:
    """One layer from its yaml row; ``ch``: output channels of the layers so far (``f`` indexes it)."""
    if module in (Conv, C3, SPPF):
        c1, c2 = ch[f], _width(args[0], width)
        extra = args[1:]
        if module is C3:
            return module(c1, c2, _depth(n, depth), *extra), c2
        return module(c1, c2, *extra), c2
    if module is Concat:
        return module(*args), sum(ch[x] for x in f)
    if module is Detect:
        return module(NUM_CLASSES, ANCHORS, tuple(ch[x] for x in f), STRIDES), 0
    return module(*args), ch[f]


class DetectionModel(nn.Module):
    """YOLOv5s v7.0 with the official layer indices (``self.model[24]`` is Detect). Other width and
    depth multiples give the family's other sizes (YOLOv5n: 0.25 and 0.33), the same inputs and outputs."""

    def __init__(self, in_channels: int = 3, width: float = WIDTH_MULTIPLE, depth: float = DEPTH_MULTIPLE):
        super().__init__()
        layers, ch, save = [], [], []
        for i, (f, n, module, args) in enumerate(_BACKBONE + _HEAD):
            layer, c2 = _make_layer(f, n, module, args, ch or [in_channels], width, depth)
            layer.i, layer.f = i, f
            save.extend(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)
            layers.append(layer)
            ch.append(c2)
        self.model = nn.Sequential(*layers)
        self.save = sorted(set(save))
        self._initialize()

    def _initialize(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps, m.momentum = 1e-3, 0.03
        self.model[-1].initialize_biases()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: list[torch.Tensor | None] = []
        for m in self.model:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in self.save else None)
        return x
