#!/usr/bin/env python3
"""Exports torchvision's SSDlite 320 (MobileNetV3-Large backbone) with seeded
random weights (no download), with torch.onnx's TorchScript exporter
(dynamo=False). torch's default, the dynamo exporter, does not export the
full detector (torch 2.15: torch.export stops in torchvision's batched_nms,
GuardOnDataDependentSymNode on the per-class box counts); the TorchScript
exporter writes it with its If and its wide Concats:

  ssdlite_heads  the network and the box decoding, which every SSDlite
                 deployment runs: images [N,3,320,320] in [0,1] ->
                   bbox_regression [N,A,4], cls_logits [N,A,91] (the heads),
                   boxes [N,A,4] (anchors decoded by the model's box coder,
                   clipped to the image), scores [N,A,91] (softmax)
                 with A = 3234 anchors, N a named dim.

The model is torchvision's ssdlite320_mobilenet_v3_large builder with the
backbone at width_mult 0.25 (torchvision's builder passes no width to the
backbone, so it is assembled here from the same parts: reduced tail, the
builder's BatchNorm, its normal init, its extractor, anchors and head), 91
classes, so the file stays small (about 5.5 MB).

  ssdlite_full   the whole detector (--full), postprocessing included:
                 images [1,3,320,320] -> boxes [D,4], scores [D], labels [D],
                 D the detections kept (about 5.9 MB).

The full model's postprocessing (score threshold, per-class top-k, batched
NMS) is exported as NonZero, GatherND, TopK and an If on the number of boxes
left, with a Concat of 90 per-class results: shapes that depend on the
scores, which no plan per input shape holds; kiln runs it node by node
(models/valrun.h).

The files are kept in tests/data/detection/ so that the tests need no torch;
run this again (pip install torch torchvision) to remake them.

Usage: make_detection_models.py [--out tests/data/detection] [--full]
"""
import argparse
import os
from functools import partial

import torch
from torch import nn
from torchvision.models import mobilenet_v3_large
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection import ssdlite
from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.ssd import SSD
from torchvision.ops import boxes as box_ops

SIZE = (320, 320)


def build_ssdlite(width_mult=0.25, num_classes=91):
    """ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    with the backbone's width_mult exposed."""
    norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.03)
    backbone = mobilenet_v3_large(weights=None, norm_layer=norm, reduced_tail=True, width_mult=width_mult)
    ssdlite._normal_init(backbone)
    backbone = ssdlite._mobilenet_extractor(backbone, 6, norm)
    anchors = DefaultBoxGenerator([[2, 3] for _ in range(6)], min_ratio=0.2, max_ratio=0.95)
    out_channels = det_utils.retrieve_out_channels(backbone, SIZE)
    head = ssdlite.SSDLiteHead(out_channels, anchors.num_anchors_per_location(), num_classes, norm)
    return SSD(backbone, anchors, SIZE, num_classes, head=head, score_thresh=0.001, nms_thresh=0.55,
               detections_per_img=300, topk_candidates=300, image_mean=[0.5] * 3, image_std=[0.5] * 3)


class Heads(nn.Module):
    """SSD.forward up to postprocess_detections, on a batch already 320x320:
    normalization, backbone, heads, and the decoding of every anchor."""

    def __init__(self, ssd):
        super().__init__()
        self.ssd = ssd
        mean = torch.tensor(ssd.transform.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(ssd.transform.image_std).view(1, 3, 1, 1)
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        with torch.no_grad():
            x = torch.zeros(1, 3, *SIZE)
            feats = list(ssd.backbone(x).values())
            a = ssd.anchor_generator(ImageList(x, [SIZE]), feats)[0]
        self.register_buffer("anchors", a)

    def forward(self, images):
        x = (images - self.mean) / self.std
        feats = list(self.ssd.backbone(x).values())
        h = self.ssd.head(feats)
        reg, logits = h["bbox_regression"], h["cls_logits"]
        n = reg.shape[0]
        anchors = self.anchors.unsqueeze(0).expand(n, -1, -1).reshape(-1, 4)
        boxes = self.ssd.box_coder.decode_single(reg.reshape(-1, 4), anchors).reshape(n, -1, 4)
        boxes = box_ops.clip_boxes_to_image(boxes, SIZE)
        return reg, logits, boxes, torch.softmax(logits, -1)


def calibrate(heads, batches=4):
    """Gives every BatchNorm running statistics from random images, as
    training would: with the initial ones (mean 0, variance 1) the random
    network's activations shrink layer by layer to about 1e-17 and the heads
    would compare nothing."""
    bns = [m for m in heads.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
    heads.train()
    with torch.no_grad():
        for _ in range(batches):
            heads(torch.rand(8, 3, *SIZE))
    heads.eval()


class Full(nn.Module):
    def __init__(self, ssd):
        super().__init__()
        self.ssd = ssd

    def forward(self, images):
        o = self.ssd(list(images))[0]
        return o["boxes"], o["scores"], o["labels"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "detection"))
    ap.add_argument("--full", action="store_true", help="also write ssdlite_full.onnx (postprocessing included)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    ssd = build_ssdlite().eval()
    heads = Heads(ssd)
    calibrate(heads)
    x = torch.rand(2, 3, *SIZE)
    outs = ["bbox_regression", "cls_logits", "boxes", "scores"]
    torch.onnx.export(heads, (x,), os.path.join(a.out, "ssdlite_heads.onnx"), input_names=["images"],
                      output_names=outs, dynamic_axes={n: {0: "N"} for n in ["images"] + outs}, opset_version=17,
                      dynamo=False)
    if a.full:
        torch.onnx.export(Full(ssd).eval(), (x[:1],), os.path.join(a.out, "ssdlite_full.onnx"), input_names=["images"],
                          output_names=["boxes", "scores", "labels"], opset_version=17, dynamo=False)


if __name__ == "__main__":
    main()
