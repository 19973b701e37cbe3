"""Every amp-rewrite subcommand, with its default options, over a corpus of real exporters' ONNX models:
finds the internal errors (tracebacks, exit codes other than 0/1/2) and timeouts that hand-made
models miss. Two steps, because the exporters are no dependency of amp-rewrite and clash with
each other:

    # the corpus (random weights, small configs; nothing is downloaded), each family with its own Python:
    E=EXPORT-VENV/bin/python   # pip install torch==2.14.1 torchvision==0.29.1 onnx onnxscript
                                           #   onnxruntime timm transformers scikit-learn skl2onnx ultralytics onnxslim
    $E benchmarks/sweep.py export --out MODELS                  # torchvision timm hf torch dynamo ultralytics
                                                                 # sklearn onnx-light, then awkward (from those)
    python -m models MODELS/bundled                              # with amp-rewrite's Python, from the repository root
    TF-VENV/bin/python benchmarks/sweep.py export --out MODELS --only keras     # tensorflow-cpu tf2onnx
    PADDLE-VENV/bin/python benchmarks/sweep.py export --out MODELS --only paddle    # paddlepaddle paddle2onnx
                                                                                            # packaging
    # the sweep, with amp-rewrite's Python (onnx and onnxruntime; amp_rewrite itself is not imported):
    python benchmarks/sweep.py --models MODELS --amp .venv/bin/amp-rewrite --out RESULTS.json [--timeout 180]
        [--only convert,check,...] [--jobs 2]

Each model lies in MODELS/EXPORTER/NAME.onnx, beside NAME.sample.npz: the inputs it was exported
with, keyed by input name (models without one get generated inputs). Per model, the sweep runs
(SUBCOMMANDS) convert, inspect, check --random 2 and check --localize --random 2 of the converted
model, convert --validate on the sample, bench, grad --loss (a scalar output, else the first
output: then a user error is the expected answer), train on the sample with the float32 model's
own outputs as labels, and train-graph; it classifies each run as a result (exit 0, or 1 for a
check or validation that fails), a user error (exit 2, one message, no traceback), an internal
error (a traceback, 'internal error', or another exit code; rerun with AMP_REWRITE_DEBUG=1 for
its traceback) or a timeout.

Whether train fine-tunes each model, in float32 and in float16 (amp-rewrite's Python as above):

    python benchmarks/sweep.py finetune --models MODELS --amp .venv/bin/amp-rewrite --out RESULTS.json
        [--only FAMILY,...] [--match NAME,...] [--jobs 2] [--timeout 600] [--epochs 4] [--lr RATE]

Per model, data it can learn (``_ft_data``): its sample repeated to 32 samples (float inputs
perturbed, integer ones such as token ids as they are), labels = the float32 model's first float
output on them + a fixed random offset per output element (0.5 x its std, at least 0.01, x noise),
then per precision ``train --loss mse --output OUTPUT`` (train's default learning rate unless --lr;
4 epochs, batch 8, or the sample's batch for a model with a fixed one; --batch-axis for an output
whose batch axis is not 0) and ONNX Runtime's mse of the original and of the trained model against
the labels. Classes: trained (exit 0, the trained model's mse lower), not improved (exit 0, not
lower), refused (exit 2, one message), crashed (a traceback, another exit code, a timeout, or a
trained model ONNX Runtime cannot run), skipped (no per-sample float output to build labels from, or
ONNX Runtime cannot run the original).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

SUBCOMMANDS = ("convert", "inspect", "check", "check-localize", "validate", "bench", "grad", "train", "train-graph")
NEEDS_CONVERTED = ("check", "check-localize")
EXIT_ONE_IS_RESULT = ("check", "check-localize", "validate")
FAMILIES = ("torchvision", "timm", "hf", "torch", "dynamo", "ultralytics", "sklearn", "onnx-light", "awkward",
            "keras", "paddle")
"""Export families in the order ``export`` runs them; keras and paddle need their own Pythons, so the
default (every family) leaves them out, and awkward edits models of torchvision and hf."""


# ---------------------------------------------------------------------------------------------- export
# Runs with an exporter's Python; imports neither amp_rewrite nor anything the other families need.

def _save_sample(path: Path, sample: dict) -> None:
    """The inputs a model was exported with, keyed by its input names, beside it."""
    np.savez(path.with_suffix(".sample.npz"), **{k: np.asarray(v) for k, v in sample.items()})


def _torch_export(out: Path, name: str, model, inputs: dict, outputs: list[str], dynamic: dict | None = None,
                  dynamo: bool = False, opset: int | None = None) -> None:
    """``model`` at ``inputs`` through TorchScript (opset 17) or dynamo (opset 18); ``dynamic`` maps
    input and output names to their named axes ({name: {axis: label}})."""
    import torch

    path = out / f"{name}.onnx"
    model.eval()
    torch.backends.mha.set_fastpath_enabled(False)  # nn.MultiheadAttention's fused kernel has no ONNX export
    with torch.no_grad():
        if dynamo:  # its dynamic_axes conversion fails on a forward(*args); dynamic_shapes say the same
            shapes = tuple({ax: torch.export.Dim.DYNAMIC for ax in (dynamic or {}).get(n, {})} for n in inputs)
            if any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(model.forward).parameters.values()):
                shapes = (shapes,)  # forward(*args): one argument, the tuple
            torch.onnx.export(model, tuple(inputs.values()), str(path), input_names=list(inputs),
                              output_names=outputs, dynamic_shapes=shapes, opset_version=opset or 18, dynamo=True,
                              external_data=False)
        else:
            torch.onnx.export(model, tuple(inputs.values()), str(path), input_names=list(inputs),
                              output_names=outputs, dynamic_axes=dynamic, opset_version=opset or 17, dynamo=False)
    _save_sample(path, {k: v.numpy() for k, v in inputs.items()})


def _batch(names, seq: bool = False) -> dict:
    """Dynamic batch (and sequence) axes for ``names``."""
    return {n: ({0: "batch", 1: "sequence"} if seq else {0: "batch"}) for n in names}


def export_torchvision(out: Path) -> Iterator:
    """Classifiers, segmentation, detection and video models of torchvision, random weights."""
    import torch
    import torchvision.models as tvm
    from torchvision.models import detection, segmentation, video

    x = torch.randn(2, 3, 96, 96)
    dyn = _batch(["x", "logits"])
    for name, build in [("resnet18", tvm.resnet18), ("mobilenet_v3_small", tvm.mobilenet_v3_small),
                        ("efficientnet_b0", tvm.efficientnet_b0), ("squeezenet1_1", tvm.squeezenet1_1),
                        ("shufflenet_v2_x0_5", tvm.shufflenet_v2_x0_5), ("regnet_y_400mf", tvm.regnet_y_400mf),
                        ("convnext_tiny", tvm.convnext_tiny), ("densenet121", tvm.densenet121),
                        ("mnasnet0_5", tvm.mnasnet0_5)]:
        yield name, lambda b=build, n=name: _torch_export(out, n, b(), {"x": x}, ["logits"], dyn)
    yield "googlenet", lambda: _torch_export(out, "googlenet", tvm.googlenet(aux_logits=False, init_weights=True),
                                             {"x": x}, ["logits"], dyn)
    yield "swin_t", lambda: _torch_export(out, "swin_t", tvm.swin_t(), {"x": torch.randn(1, 3, 224, 224)},
                                          ["logits"], dyn)
    yield "vit_small_custom", lambda: _torch_export(
        out, "vit_small_custom", tvm.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4,
                                                       hidden_dim=64, mlp_dim=128, num_classes=10),
        {"x": torch.randn(2, 3, 64, 64)}, ["logits"], dyn)
    seg_dyn = {"x": {0: "batch", 2: "height", 3: "width"}, "out": {0: "batch", 2: "height", 3: "width"}}
    for name, build in [("deeplabv3_mobilenet_v3_large", segmentation.deeplabv3_mobilenet_v3_large),
                        ("lraspp_mobilenet_v3_large", segmentation.lraspp_mobilenet_v3_large)]:
        class Seg(torch.nn.Module):
            def __init__(self, b=build):
                super().__init__()
                self.m = b(weights=None, weights_backbone=None, num_classes=5)

            def forward(self, x):
                return self.m(x)["out"]
        yield name, lambda n=name, s=Seg: _torch_export(out, n, s(), {"x": x}, ["out"], seg_dyn)
    img = [torch.rand(3, 160, 160)]
    det_dyn = {"images": {1: "height", 2: "width"}}
    for name, build, kw in [("ssdlite320_mobilenet_v3_large", detection.ssdlite320_mobilenet_v3_large, {}),
                            ("fasterrcnn_mobilenet_v3_large_320_fpn", detection.fasterrcnn_mobilenet_v3_large_320_fpn,
                             {}),
                            ("retinanet_resnet50_fpn", detection.retinanet_resnet50_fpn,
                             {"min_size": 160, "max_size": 160})]:
        def det(n=name, b=build, k=kw):
            m = b(weights=None, weights_backbone=None, num_classes=5, **k).eval()
            path = out / f"{n}.onnx"
            with torch.no_grad():
                torch.onnx.export(m, (img,), str(path), input_names=["images"],
                                  output_names=["boxes", "scores", "labels"], dynamic_axes=det_dyn, opset_version=17,
                                  dynamo=False)
            _save_sample(path, {"images": img[0].numpy()})
        yield name, det
    clip = {"clip": torch.randn(1, 3, 4, 32, 32)}
    yield "r3d_18", lambda: _torch_export(out, "r3d_18", video.r3d_18(num_classes=5), clip, ["logits"],
                                          _batch(["clip", "logits"]))


def export_timm(out: Path) -> Iterator:
    """timm models through TorchScript, random weights, at their default image sizes where fixed."""
    import timm
    import torch

    for name, size in [("vit_tiny_patch16_224", 224), ("deit_tiny_distilled_patch16_224", 224),
                       ("convnext_atto", 96), ("mobilevitv2_050", 128), ("levit_128s", 224), ("poolformer_s12", 96),
                       ("regnetx_002", 96), ("edgenext_xx_small", 128), ("fastvit_t8", 128),
                       ("tiny_vit_5m_224", 224), ("efficientformerv2_s0", 224), ("hrnet_w18_small", 96),
                       ("mixer_s16_224", 224), ("lcnet_050", 96)]:
        def one(n=name, s=size):
            m = timm.create_model(n, pretrained=False, num_classes=10)
            _torch_export(out, n, m, {"x": torch.randn(2, 3, s, s)}, ["logits"], _batch(["x", "logits"]))
        yield name, one


class _HFWrap:
    """A Hugging Face model as a module of positional tensors returning the named outputs (a tuple)."""

    @staticmethod
    def make(model, names, keys):
        import torch

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *args):
                kw = dict(zip(names, args))
                res = self.m(**kw, return_dict=True, **({"use_cache": False} if "use_cache" in
                                                        self.m.forward.__code__.co_varnames else {}))
                return tuple(res[k] for k in keys)
        return Wrap()


def export_hf(out: Path, dynamo: bool = False, only: tuple = ()) -> None:
    """Hugging Face encoders, decoders, seq2seq, speech and vision models from tiny configs, random weights."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    b, s, v = 2, 16, 128
    ids = torch.randint(0, v, (b, s))
    mask = torch.ones(b, s, dtype=torch.int64)
    types = torch.zeros(b, s, dtype=torch.int64)
    dec = torch.randint(0, v, (b, 8))
    small = {"vocab_size": v, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "max_position_embeddings": 64}
    decoder = {"vocab_size": v, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64}
    pix = torch.randn(b, 3, 32, 32)
    vis = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
           "image_size": 32, "patch_size": 8, "num_labels": 10}
    cases = [
        ("bert_seqcls", lambda: tf.BertForSequenceClassification(tf.BertConfig(**small, num_labels=3)),
         {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}, ["logits"]),
        ("roberta_mlm", lambda: tf.RobertaForMaskedLM(tf.RobertaConfig(**{**small, "max_position_embeddings": 80})),
         {"input_ids": ids + 2, "attention_mask": mask}, ["logits"]),
        ("distilbert", lambda: tf.DistilBertModel(tf.DistilBertConfig(vocab_size=v, dim=64, n_layers=2, n_heads=4,
                                                                       hidden_dim=128)),
         {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state"]),
        ("albert", lambda: tf.AlbertModel(tf.AlbertConfig(**small, embedding_size=32)),
         {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state", "pooler_output"]),
        ("electra_tokcls", lambda: tf.ElectraForTokenClassification(tf.ElectraConfig(**small, embedding_size=32,
                                                                                     num_labels=5)),
         {"input_ids": ids, "attention_mask": mask}, ["logits"]),
        ("deberta_v2", lambda: tf.DebertaV2Model(tf.DebertaV2Config(**small)),
         {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state"]),
        ("gpt2_lm", lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=v, n_embd=64, n_layer=2, n_head=4,
                                                             n_positions=64)),
         {"input_ids": ids, "attention_mask": mask}, ["logits"]),
        ("llama_lm", lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**decoder)),
         {"input_ids": ids, "attention_mask": mask}, ["logits"]),
        ("qwen2_lm", lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**decoder)),
         {"input_ids": ids, "attention_mask": mask}, ["logits"]),
        ("t5_encoder", lambda: tf.T5EncoderModel(tf.T5Config(vocab_size=v, d_model=64, d_kv=16, d_ff=128,
                                                             num_layers=2, num_heads=4)),
         {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state"]),
        ("t5_seq2seq", lambda: tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=v, d_model=64, d_kv=16, d_ff=128,
                                                                         num_layers=2, num_heads=4)),
         {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}, ["logits"]),
        ("bart_seq2seq", lambda: tf.BartForConditionalGeneration(tf.BartConfig(
            vocab_size=v, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64)),
         {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}, ["logits"]),
        ("wav2vec2_ctc", lambda: tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(
            vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4)),
         {"input_values": torch.randn(b, 4000)}, ["logits"]),
        ("whisper_seq2seq", lambda: tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            vocab_size=v, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
            max_source_positions=50, max_target_positions=32, pad_token_id=0, decoder_start_token_id=1)),
         {"input_features": torch.randn(b, 16, 100), "decoder_input_ids": dec}, ["logits"]),
        ("vit_imgcls", lambda: tf.ViTForImageClassification(tf.ViTConfig(**vis)), {"pixel_values": pix}, ["logits"]),
        ("swin_imgcls", lambda: tf.SwinForImageClassification(tf.SwinConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
            num_labels=10)), {"pixel_values": pix}, ["logits"]),
        ("segformer_seg", lambda: tf.SegformerForSemanticSegmentation(tf.SegformerConfig(
            hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], decoder_hidden_size=64, num_labels=5)),
         {"pixel_values": torch.randn(b, 3, 64, 64)}, ["logits"]),
        ("clip", lambda: tf.CLIPModel(tf.CLIPConfig(
            text_config={"vocab_size": v, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "max_position_embeddings": 32},
            vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "image_size": 32, "patch_size": 8}, projection_dim=32)),
         {"input_ids": ids, "pixel_values": pix, "attention_mask": mask}, ["logits_per_image", "logits_per_text"]),
    ]
    dyn_batch = {"pixel_values", "input_values", "input_features"}
    for name, build, inputs, keys in cases:
        if only and name not in only:
            continue

        def one(n=name, bld=build, inp=inputs, ks=keys):
            model = bld().eval()
            if hasattr(model.config, "_attn_implementation") and not dynamo:
                model.config._attn_implementation = "eager"
            dyn = {k: {0: "batch"} if k in dyn_batch else
                   {0: "batch", 1: "decoder_sequence" if k.startswith("decoder") else "sequence"} for k in inp}
            dyn.update({k: {0: "batch"} for k in ks})
            _torch_export(out, n + ("_dynamo" if dynamo else ""), _HFWrap.make(model, list(inp), ks), inp, ks, dyn,
                          dynamo=dynamo)
        yield name + ("_dynamo" if dynamo else ""), one


def export_torch(out: Path, dynamo: bool = False) -> Iterator:
    """Hand-written PyTorch models of common shapes: recurrent, convolutional, encoder-decoder, and one
    that returns its own scalar loss (the input grad and train --loss NAME are for)."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)

    class LSTMClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.rnn = nn.Embedding(100, 32), nn.LSTM(32, 48, 2, batch_first=True)
            self.head = nn.Linear(48, 4)

        def forward(self, tokens):
            return self.head(self.rnn(self.emb(tokens))[0][:, -1])

    class BiGRUTagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.GRU(20, 32, batch_first=True, bidirectional=True), nn.Linear(64, 7)

        def forward(self, feats):
            return self.head(self.rnn(feats)[0]).log_softmax(-1)

    class CRNN(nn.Module):
        """CNN over a text line, then a bidirectional LSTM, CTC log-probabilities per column."""

        def __init__(self):
            super().__init__()
            self.cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d((4, 1)))
            self.rnn, self.head = nn.LSTM(32 * 4, 32, bidirectional=True), nn.Linear(64, 20)

        def forward(self, image):
            f = self.cnn(image)
            f = f.flatten(1, 2).permute(2, 0, 1)
            return self.head(self.rnn(f)[0]).log_softmax(-1)

    class TCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(*[m for d in (1, 2, 4) for m in (nn.Conv1d(8, 8, 3, padding=d, dilation=d),
                                                                       nn.GELU())], nn.Conv1d(8, 2, 1))

        def forward(self, signal):
            return self.net(signal)

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.d1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU())
            self.d2 = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1), nn.GroupNorm(4, 32), nn.SiLU())
            self.up = nn.ConvTranspose2d(32, 16, 2, 2)
            self.out = nn.Conv2d(32, 1, 1)

        def forward(self, image):
            a = self.d1(image)
            return torch.sigmoid(self.out(torch.cat([a, self.up(self.d2(a))], 1)))

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.src, self.tgt = nn.Embedding(50, 32), nn.Embedding(50, 32)
            self.tr = nn.Transformer(32, 4, 2, 2, 64, dropout=0.0, batch_first=True)
            self.head = nn.Linear(32, 50)

        def forward(self, src, tgt):
            causal = torch.triu(torch.full((tgt.shape[1], tgt.shape[1]), float("-inf")), 1)
            return self.head(self.tr(self.src(src), self.tgt(tgt), tgt_mask=causal))

    class WithLoss(nn.Module):
        """An MLP that returns its logits and its scalar cross-entropy loss."""

        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 5))

        def forward(self, x, target):
            logits = self.net(x)
            return logits, nn.functional.cross_entropy(logits, target)

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.ConvTranspose2d(16, 32, 4, 1, 0), nn.BatchNorm2d(32), nn.ReLU(),
                                     nn.ConvTranspose2d(32, 3, 4, 2, 1), nn.Tanh())

        def forward(self, z):
            return self.net(z)

    sfx = "_dynamo" if dynamo else ""
    cases = [
        ("lstm_classifier", LSTMClassifier, {"tokens": torch.randint(0, 100, (2, 12))}, ["logits"], True),
        ("bigru_tagger", BiGRUTagger, {"feats": torch.randn(2, 12, 20)}, ["logprobs"], True),
        ("crnn_ctc", CRNN, {"image": torch.randn(2, 1, 32, 64)}, ["logprobs"],
         {"image": {0: "batch", 3: "width"}, "logprobs": {0: "columns", 1: "batch"}}),
        ("tcn", TCN, {"signal": torch.randn(2, 8, 50)}, ["out"],
         {"signal": {0: "batch", 2: "time"}, "out": {0: "batch", 2: "time"}}),
        ("unet_small", UNet, {"image": torch.randn(2, 3, 32, 32)}, ["mask"],
         {"image": {0: "batch", 2: "h", 3: "w"}, "mask": {0: "batch", 2: "h", 3: "w"}}),
        ("transformer_seq2seq", Seq2Seq, {"src": torch.randint(0, 50, (2, 10)), "tgt": torch.randint(0, 50, (2, 7))},
         ["logits"], {"src": {0: "batch", 1: "src_len"}, "tgt": {0: "batch", 1: "tgt_len"},
                      "logits": {0: "batch", 1: "tgt_len"}}),
        ("mlp_with_loss", WithLoss, {"x": torch.randn(4, 16), "target": torch.randint(0, 5, (4,))},
         ["logits", "loss"], {"x": {0: "batch"}, "target": {0: "batch"}, "logits": {0: "batch"}}),
        ("dcgan_generator", Generator, {"z": torch.randn(2, 16, 1, 1)}, ["image"], False),
    ]
    for name, build, inputs, outs, dyn in cases:
        if dyn is True:
            dyn = _batch([*inputs, *outs], seq=True)
        elif dyn is False:
            dyn = _batch([*inputs, *outs])
        yield name + sfx, lambda n=name, bld=build, i=inputs, o=outs, d=dyn: _torch_export(
            out, n + sfx, bld(), i, o, d, dynamo=dynamo)


def export_dynamo(out: Path) -> Iterator:
    """A few of the above through the dynamo exporter (opset 18)."""
    import torch
    import torchvision.models as tvm

    yield "resnet18_dynamo", lambda: _torch_export(out, "resnet18_dynamo", tvm.resnet18(),
                                                   {"x": torch.randn(2, 3, 64, 64)}, ["logits"],
                                                   _batch(["x", "logits"]), dynamo=True)
    yield "vit_small_custom_dynamo", lambda: _torch_export(
        out, "vit_small_custom_dynamo",
        tvm.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                              num_classes=10), {"x": torch.randn(2, 3, 64, 64)}, ["logits"], _batch(["x", "logits"]),
        dynamo=True)
    yield from export_hf(out, dynamo=True, only=("bert_seqcls", "gpt2_lm", "llama_lm", "whisper_seq2seq"))
    for name, fn in export_torch(out, dynamo=True):
        if name.startswith(("lstm_classifier", "mlp_with_loss", "unet_small")):
            yield name, fn


def export_ultralytics(out: Path) -> Iterator:
    """YOLO detection, segmentation, pose and classification models from their yaml (random weights),
    through Ultralytics' own ONNX export with dynamic axes."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO

    for cfg, size in [("yolov8n.yaml", 160), ("yolo11n.yaml", 160), ("yolo11n-seg.yaml", 160),
                      ("yolo11n-pose.yaml", 160), ("yolo11n-cls.yaml", 96), ("yolov8n-obb.yaml", 160)]:
        def one(c=cfg, s=size):
            with tempfile.TemporaryDirectory() as tmp:
                cwd = os.getcwd()
                os.chdir(tmp)
                try:
                    model = YOLO(c)
                    path = Path(model.export(format="onnx", dynamic=True, imgsz=s, simplify=True))
                    name = c.removesuffix(".yaml").replace("-", "_")
                    shutil.copy(path, out / f"{name}.onnx")
                finally:
                    os.chdir(cwd)
            import onnx
            m = onnx.load(out / f"{name}.onnx")
            _save_sample(out / f"{name}.onnx",
                         {m.graph.input[0].name: np.random.default_rng(0).random((2, 3, s, s), dtype=np.float32)})
        yield cfg, one


def export_sklearn(out: Path) -> Iterator:
    """scikit-learn pipelines through skl2onnx: linear, trees, neural, kernel, clustering, and a
    ColumnTransformer with a string column."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import DoubleTensorType, FloatTensorType, StringTensorType
    from sklearn import cluster, decomposition, ensemble, linear_model, neighbors, neural_network, svm
    from sklearn.compose import ColumnTransformer
    from sklearn.datasets import load_digits, make_regression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    X, y = load_digits(return_X_y=True)
    X = X.astype(np.float32)
    Xr, yr = make_regression(200, 10, random_state=0)
    Xr = Xr.astype(np.float32)
    f = [("X", FloatTensorType([None, X.shape[1]]))]
    fr = [("X", FloatTensorType([None, Xr.shape[1]]))]
    nz = {"zipmap": False}
    cases = [
        ("logreg_zipmap", make_pipeline(StandardScaler(), linear_model.LogisticRegression(max_iter=200)), X, y, f,
         None),
        ("logreg", make_pipeline(StandardScaler(), linear_model.LogisticRegression(max_iter=200)), X, y, f, nz),
        ("random_forest", ensemble.RandomForestClassifier(20, max_depth=6, random_state=0), X, y, f, nz),
        ("gbr", ensemble.GradientBoostingRegressor(n_estimators=20), Xr, yr, fr, None),
        ("mlp_classifier", make_pipeline(StandardScaler(), neural_network.MLPClassifier((32,), max_iter=50)), X, y,
         f, nz),
        ("pca_ridge", make_pipeline(decomposition.PCA(8), linear_model.Ridge()), Xr, yr, fr, None),
        ("svc_rbf", svm.SVC(probability=True), X[:300], y[:300], f, nz),
        ("kmeans", cluster.KMeans(8, n_init=2, random_state=0), X, None, f, None),
        ("knn", neighbors.KNeighborsClassifier(3), X[:300], y[:300], f, nz),
        ("linreg_double", linear_model.LinearRegression(), Xr.astype(np.float64), yr, [
            ("X", DoubleTensorType([None, Xr.shape[1]]))], None),
    ]
    for name, est, xs, ys, types, opts in cases:
        def one(n=name, e=est, xx=xs, yy=ys, t=types, o=opts):
            e.fit(xx, yy) if yy is not None else e.fit(xx)
            onx = to_onnx(e, initial_types=t, options={id(e): o} if o else None, target_opset=17)
            (out / f"{n}.onnx").write_bytes(onx.SerializeToString())
            _save_sample(out / f"{n}.onnx", {"X": xx[:4]})
        yield name, one

    def mixed_columns():
        rng = np.random.default_rng(0)
        num = rng.normal(size=(100, 3)).astype(np.float32)
        cat = rng.choice(["red", "green", "blue"], size=(100, 1))
        import pandas as pd
        frame = pd.DataFrame({"a": num[:, 0], "b": num[:, 1], "c": num[:, 2], "color": cat[:, 0]})
        pipe = make_pipeline(ColumnTransformer([("num", StandardScaler(), ["a", "b", "c"]),
                                                ("cat", OneHotEncoder(), ["color"])]),
                             linear_model.LogisticRegression())
        pipe.fit(frame, rng.integers(0, 2, 100))
        types = [(c, FloatTensorType([None, 1])) for c in "abc"] + [("color", StringTensorType([None, 1]))]
        onx = to_onnx(pipe, initial_types=types, options={id(pipe.steps[-1][1]): nz}, target_opset=17)
        (out / "column_transformer.onnx").write_bytes(onx.SerializeToString())
        _save_sample(out / "column_transformer.onnx",
                     {**{c: num[:4, i:i + 1] for i, c in enumerate("abc")}, "color": cat[:4]})
    yield "column_transformer", mixed_columns


def export_light(out: Path) -> Iterator:
    """onnx's own light model test directories (their weights are ConstantOfShape nodes, not initializers)."""
    import onnx

    base = Path(onnx.__file__).parent / "backend/test/data"
    for path in sorted((base / "light").glob("*.onnx")):
        yield path.stem, lambda p=path: shutil.copy(p, out / p.name)
    print(f"onnx {onnx.__version__}: real/ holds only download pointers: "
          f"{sorted(p.name for p in (base / 'real').iterdir())}")


def export_awkward(out: Path) -> Iterator:
    """Realistic oddities made from the other families' models: zero extents where exporters mean
    'dynamic', declared output shapes or ranks that differ from what runs, onnx's default IR version,
    an already-float16 model, a QDQ-quantized model, ORT's fused transformer ops, tf-style input names,
    encoder and decoder lengths declared under one name (the data has two)."""
    import onnx
    from onnx import TensorProto, helper

    root = out.parent

    def edit(src: str, name: str, change) -> None:
        m = onnx.load(root / src)
        change(m)
        onnx.save(m, out / f"{name}.onnx")
        sample = (root / src).with_suffix(".sample.npz")
        if sample.exists():
            data = dict(np.load(sample))
            renames = {i.name: i.name for i in m.graph.input}
            if name == "tf_style_names":
                renames = {k: f"serving_default_{k}:0" for k in data}
            _save_sample(out / f"{name}.onnx", {renames.get(k, k): v for k, v in data.items()})

    def zero_inputs(m):
        for i in m.graph.input:
            for d in i.type.tensor_type.shape.dim:
                d.Clear()
                d.dim_value = 0

    def zero_all(m):
        zero_inputs(m)
        for o in m.graph.output:
            for d in o.type.tensor_type.shape.dim:
                d.Clear()
                d.dim_value = 0

    def wrong_rank(m):
        o = m.graph.output[0]
        o.type.tensor_type.shape.dim.add().dim_value = 1

    def wrong_extent(m):
        o = m.graph.output[0]
        o.type.tensor_type.shape.dim[1].Clear()
        o.type.tensor_type.shape.dim[1].dim_value = 7

    def wrong_value_info(m):
        inferred = onnx.shape_inference.infer_shapes(m)
        vi = [v for v in inferred.graph.value_info if v.type.tensor_type.elem_type == TensorProto.FLOAT
              and len(v.type.tensor_type.shape.dim) >= 3]
        for v in vi[len(vi) // 3: len(vi) // 3 + 3]:
            bad = m.graph.value_info.add()
            bad.CopyFrom(v)
            del bad.type.tensor_type.shape.dim[-1]

    def tf_names(m):
        names = {i.name: f"serving_default_{i.name}:0" for i in m.graph.input}
        for i in m.graph.input:
            i.name = names[i.name]
        for node in m.graph.node:
            node.input[:] = [names.get(n, n) for n in node.input]

    yield "zero_dims_bert", lambda: edit("hf/bert_seqcls.onnx", "zero_dims_bert", zero_inputs)
    yield "zero_dims_resnet_io", lambda: edit("torchvision/resnet18.onnx", "zero_dims_resnet_io", zero_all)
    yield "wrong_rank_output_resnet", lambda: edit("torchvision/resnet18.onnx", "wrong_rank_output_resnet",
                                                   wrong_rank)
    yield "wrong_rank_output_gpt2", lambda: edit("hf/gpt2_lm.onnx", "wrong_rank_output_gpt2", wrong_rank)
    yield "wrong_extent_output_mobilenet", lambda: edit("torchvision/mobilenet_v3_small.onnx",
                                                        "wrong_extent_output_mobilenet", wrong_extent)
    yield "wrong_rank_value_info_bert", lambda: edit("hf/bert_seqcls.onnx", "wrong_rank_value_info_bert",
                                                     wrong_value_info)
    yield "tf_style_names", lambda: edit("torchvision/resnet18.onnx", "tf_style_names", tf_names)

    def shared_seq(m):  # encoder and decoder lengths under one name, as a hand-written dynamic_axes often has
        for i in m.graph.input:
            for d in i.type.tensor_type.shape.dim:
                if d.dim_param in ("decoder_sequence", "src_len", "tgt_len"):
                    d.dim_param = "sequence"
    for src in ("hf/t5_seq2seq", "hf/bart_seq2seq", "torch/transformer_seq2seq"):
        name = "shared_seq_name_" + src.split("/")[1].split("_")[0]
        yield name, lambda s=src, n=name: edit(f"{s}.onnx", n, shared_seq)

    def default_ir():
        rng = np.random.default_rng(0)
        w1, w2 = (helper.make_tensor(n, TensorProto.FLOAT, s, rng.normal(size=s).astype(np.float32).ravel())
                  for n, s in (("w1", [8, 16]), ("w2", [16, 3])))
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["z"]), helper.make_node("Softmax", ["z"], ["y"])],
            "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w1, w2])
        m = helper.make_model(graph)
        onnx.save(m, out / "default_ir_version.onnx")
        _save_sample(out / "default_ir_version.onnx", {"x": rng.normal(size=(2, 8)).astype(np.float32)})
        print(f"default_ir_version: IR {m.ir_version}, opset {m.opset_import[0].version}")
    yield "default_ir_version", default_ir

    def already_fp16():
        import torch
        import torchvision.models as tvm
        x = torch.randn(2, 3, 64, 64).half()
        m = tvm.resnet18().eval().half()
        with torch.no_grad():
            torch.onnx.export(m, (x,), str(out / "already_fp16_resnet18.onnx"), input_names=["x"],
                              output_names=["logits"], dynamic_axes=_batch(["x", "logits"]), opset_version=17,
                              dynamo=False)
        _save_sample(out / "already_fp16_resnet18.onnx", {"x": x.numpy()})
    yield "already_fp16_resnet18", already_fp16

    def qdq():
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.data = iter([{"x": np.random.default_rng(i).normal(size=(2, 3, 96, 96)).astype(np.float32)}
                                  for i in range(4)])

            def get_next(self):
                return next(self.data, None)
        quantize_static(str(root / "torchvision/resnet18.onnx"), str(out / "qdq_resnet18.onnx"), Reader(),
                        quant_format=QuantFormat.QDQ)
        shutil.copy((root / "torchvision/resnet18.onnx").with_suffix(".sample.npz"),
                    out / "qdq_resnet18.sample.npz")
    yield "qdq_resnet18", qdq

    def ort_fused():
        from onnxruntime.transformers.optimizer import optimize_model
        opt = optimize_model(str(root / "hf/bert_seqcls.onnx"), model_type="bert", num_heads=4, hidden_size=64)
        opt.save_model_to_file(str(out / "ort_fused_bert.onnx"))
        shutil.copy((root / "hf/bert_seqcls.onnx").with_suffix(".sample.npz"), out / "ort_fused_bert.sample.npz")
        print("ort_fused_bert ops:", sorted({n.op_type for n in opt.model.graph.node if n.domain}))
    yield "ort_fused_bert", ort_fused


def export_keras(out: Path) -> Iterator:
    """Keras 3 applications (weights=None) and small functional models through tf2onnx (TensorFlow's Python)."""
    import tensorflow as tf
    import tf2onnx

    keras = tf.keras
    rng = np.random.default_rng(0)

    def conv(name, model, shapes):
        spec = tuple(tf.TensorSpec((None, *s), tf.float32, name=f"in{i}") for i, s in enumerate(shapes))
        path = out / f"{name}.onnx"
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=str(path))
        names = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
        _save_sample(path, {n: rng.normal(size=(2, *s)).astype(np.float32) for n, s in zip(names, shapes)})

    yield "mobilenet_v2", lambda: conv("mobilenet_v2", keras.applications.MobileNetV2(
        weights=None, input_shape=(96, 96, 3), alpha=0.35, classes=10), [(96, 96, 3)])
    yield "efficientnet_b0", lambda: conv("efficientnet_b0", keras.applications.EfficientNetB0(
        weights=None, input_shape=(64, 64, 3), classes=10), [(64, 64, 3)])
    yield "resnet50", lambda: conv("resnet50", keras.applications.ResNet50(
        weights=None, input_shape=(64, 64, 3), classes=10), [(64, 64, 3)])

    def lstm():
        inp = keras.Input((20, 8))
        x = keras.layers.LSTM(32, return_sequences=True)(inp)
        x = keras.layers.GRU(16)(x)
        return keras.Model(inp, keras.layers.Dense(3, activation="softmax")(x))
    yield "lstm_gru", lambda: conv("lstm_gru", lstm(), [(20, 8)])

    def two_inputs():
        a, b = keras.Input((16,)), keras.Input((10, 4))
        x = keras.layers.Concatenate()([keras.layers.Dense(8, activation="relu")(a),
                                        keras.layers.Flatten()(keras.layers.Conv1D(4, 3, padding="same")(b))])
        x = keras.layers.BatchNormalization()(x)
        return keras.Model([a, b], keras.layers.Dense(1)(x))
    yield "two_inputs", lambda: conv("two_inputs", two_inputs(), [(16,), (10, 4)])

    def attention():
        inp = keras.Input((12, 32))
        x = keras.layers.MultiHeadAttention(4, 8)(inp, inp)
        x = keras.layers.LayerNormalization()(x + inp)
        return keras.Model(inp, keras.layers.GlobalAveragePooling1D()(x))
    yield "mha_encoder", lambda: conv("mha_encoder", attention(), [(12, 32)])


def export_paddle(out: Path) -> Iterator:
    """paddle.vision models through paddle2onnx (PaddlePaddle's Python)."""
    import paddle

    models = paddle.vision.models
    for name, build in [("resnet18", models.resnet18), ("mobilenet_v2", models.mobilenet_v2)]:
        def one(n=name, b=build):
            m = b(num_classes=10)
            m.eval()
            with tempfile.TemporaryDirectory() as tmp:
                paddle.onnx.export(m, f"{tmp}/{n}", input_spec=[paddle.static.InputSpec([None, 3, 64, 64], "float32",
                                                                                        "x")], opset_version=17)
                shutil.copy(f"{tmp}/{n}.onnx", out / f"{n}.onnx")
            _save_sample(out / f"{n}.onnx", {"x": np.random.default_rng(0).normal(size=(2, 3, 64, 64))
                                             .astype(np.float32)})
        yield name, one


def export(argv: list[str]) -> None:
    """``export``: write the families' models under OUT/FAMILY; one failure is reported and skipped."""
    p = argparse.ArgumentParser(prog="sweep.py export")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default=",".join(f for f in FAMILIES if f not in ("keras", "paddle")))
    p.add_argument("--match", default="", help="only models whose name contains this")
    a = p.parse_args(argv)
    makers = {"torchvision": export_torchvision, "timm": export_timm, "hf": export_hf, "torch": export_torch,
              "dynamo": export_dynamo, "ultralytics": export_ultralytics, "sklearn": export_sklearn,
              "onnx-light": export_light, "awkward": export_awkward, "keras": export_keras, "paddle": export_paddle}
    failed = []
    for family in a.only.split(","):
        out = a.out / family
        out.mkdir(parents=True, exist_ok=True)
        try:
            jobs = list(makers[family](out))
        except Exception as exc:  # an exporter that does not import: the whole family is skipped
            failed.append(f"{family}: {type(exc).__name__}: {exc}")
            print(f"FAILED {family}: {exc}", flush=True)
            continue
        for name, job in jobs:
            if a.match and a.match not in name:
                continue
            start = time.perf_counter()
            try:
                job()
                print(f"ok {family}/{name} ({time.perf_counter() - start:.1f} s)", flush=True)
            except Exception as exc:
                failed.append(f"{family}/{name}: {type(exc).__name__}: {str(exc)[:300]}")
                print(f"FAILED {family}/{name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                traceback.print_exc(limit=-3)
    print(f"{len(failed)} failed:" if failed else "all exported", *failed, sep="\n  ")


# ---------------------------------------------------------------------------------------------- sweep
# Runs with amp-rewrite's Python (onnx, onnxruntime); amp-rewrite itself runs in subprocesses.

_ELEM = {1: np.float32, 10: np.float16, 11: np.float64, 6: np.int32, 7: np.int64, 9: np.bool_, 2: np.uint8,
         3: np.int8, 8: np.str_}


def _sample(m, model: Path) -> dict[str, np.ndarray]:
    """The exported sample beside ``model`` (its ModelProto ``m``), or generated inputs: fixed extents as
    declared, a free or zero one 2 on the first axis and 8 elsewhere."""
    side = model.with_suffix(".sample.npz")
    if side.exists():
        return dict(np.load(side))
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(0)
    sample = {}
    for i in (i for i in m.graph.input if i.name not in inits):
        t = i.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else (2 if k == 0 else 8) for k, d in enumerate(t.shape.dim)]
        dtype = _ELEM.get(t.elem_type, np.float32)
        sample[i.name] = (rng.normal(size=shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                          else np.ones(shape, dtype) if dtype == np.bool_ else np.zeros(shape, dtype))
    return sample


def _float_outputs(m) -> list[str]:
    return [o.name for o in m.graph.output if o.type.tensor_type.elem_type in (1, 10, 11, 16)]


def prepare(model: Path, work: Path) -> None:
    """``prepare MODEL WORK`` (a child: ONNX Runtime may crash): WORK/sample.npz (the exported sample, or
    generated inputs), WORK/train.npz (the sample and a ``labels`` array, the first float output of the
    float32 model on it) and WORK/meta.json (which output grad and train use; whether ONNX Runtime ran it)."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(model), load_external_data=False)
    sample = _sample(m, model)
    np.savez(work / "sample.npz", **sample)
    floats = _float_outputs(m)
    meta = {"float_output": floats[0] if floats else m.graph.output[0].name, "ran": False,
            "scalar_output": next((o.name for o in m.graph.output if o.type.HasField("tensor_type")
                                   and o.type.tensor_type.HasField("shape")
                                   and not o.type.tensor_type.shape.dim and o.name in floats), None)}
    labels = None
    try:
        sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        outs = sess.run(None, sample)
        meta["ran"] = True
        named = {o.name: v for o, v in zip(sess.get_outputs(), outs)}
        if meta["scalar_output"] is None:
            meta["scalar_output"] = next((n for n in floats if np.ndim(named.get(n)) == 0), None)
        if floats:
            labels = np.asarray(named[meta["float_output"]])
            labels = labels + np.float32(0.1) * np.random.default_rng(1).normal(size=labels.shape).astype(labels.dtype)
    except Exception as exc:
        meta["ort_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if labels is None:  # declared shape, free extents 2
        o = next((o for o in m.graph.output if o.name == meta["float_output"]), m.graph.output[0])
        labels = np.zeros([d.dim_value or 2 for d in o.type.tensor_type.shape.dim], np.float32)
    np.savez(work / "train.npz", **sample, labels=labels)
    (work / "meta.json").write_text(json.dumps(meta))


def commands(amp: str, model: Path, work: Path, meta: dict) -> dict[str, list[str]]:
    """The command line of each subcommand on ``model``, its outputs in ``work``."""
    conv, sample, train = str(work / "conv.onnx"), str(work / "sample.npz"), str(work / "train.npz")
    m, out = str(model), meta["float_output"]
    return {
        "convert": [amp, "convert", m, "-o", conv],
        "inspect": [amp, "inspect", m],
        "check": [amp, "check", m, conv, "--random", "2"],
        "check-localize": [amp, "check", m, conv, "--localize", "--random", "2"],
        "validate": [amp, "convert", m, "-o", str(work / "validated.onnx"), "--validate", sample],
        "bench": [amp, "bench", m, "--runs", "5", "--warmup", "1", "--profile-runs", "0"],
        "grad": [amp, "grad", m, "--loss", meta["scalar_output"] or out, "-o", str(work / "grad.onnx")],
        "train": [amp, "train", m, "--data", train, "--loss", "mse", "--output", out, "--labels", "labels",
                  "--epochs", "1", "-o", str(work / "trained.onnx")],
        "train-graph": [amp, "train-graph", m, "--loss", "mse", "--output", out, "--labels", "labels", "-o",
                        str(work / "step.onnx")],
    }


def classify(sub: str, code: int | None, text: str) -> str:
    """result, user error, internal or timeout, by the exit code and what was printed."""
    if code is None:
        return "timeout"
    if "Traceback" in text or "internal error" in text or code not in (0, 1, 2):
        return "internal"
    if code == 1 and sub not in EXIT_ONE_IS_RESULT:
        return "internal"
    return "user error" if code == 2 else "result"


def run_one(cmd: list[str], timeout: float, debug: bool = False) -> tuple[int | None, str, str, float]:
    """Exit code (None on timeout), stdout, stderr and seconds of one command; its process group is
    killed on timeout (amp-rewrite's range check runs in a child)."""
    env = {**os.environ, **({"AMP_REWRITE_DEBUG": "1"} if debug else {})}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        code = None
    return code, out, err, time.perf_counter() - start


def sweep_model(model: Path, root: Path, amp: str, only: list[str], timeout: float) -> list[dict]:
    """Every subcommand on one model, in a scratch directory removed afterwards."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
        work = Path(tmp)
        prep = [sys.executable, __file__, "prepare", str(model), str(work)]
        code, _, err, _ = run_one(prep, timeout)
        if code != 0:
            print(f"prepare failed for {model}: {err.strip().splitlines()[-1:] if err.strip() else code}", flush=True)
            (work / "meta.json").write_text(json.dumps({"float_output": "output", "scalar_output": None,
                                                        "ran": False, "ort_error": f"prepare: {code}"}))
            for name in ("sample.npz", "train.npz"):
                (work / name).touch()
        meta = json.loads((work / "meta.json").read_text())
        cmds = commands(amp, model, work, meta)
        for sub in SUBCOMMANDS:
            if sub not in only:
                continue
            row = {"model": str(model.relative_to(root)), "exporter": model.relative_to(root).parts[0],
                   "subcommand": sub, "cmd": shlex.join(cmds[sub]).replace(str(work), "$WORK"),
                   "ort_ran_original": meta["ran"], "ort_error": meta.get("ort_error")}
            if sub in NEEDS_CONVERTED and not (work / "conv.onnx").exists():
                if "convert" not in only:  # --only check: convert first, quietly
                    run_one(cmds["convert"], timeout)
                if not (work / "conv.onnx").exists():
                    rows.append({**row, "class": "skipped", "exit": None, "stderr": ["convert wrote nothing"],
                                 "seconds": 0.0})
                    continue
            code, out, err, secs = run_one(cmds[sub], timeout)
            cls = classify(sub, code, out + err)
            lines = [ln for ln in err.strip().splitlines() if ln.strip()] or out.strip().splitlines()[-3:]
            row.update({"class": cls, "exit": code, "stderr": lines[-3:], "seconds": round(secs, 2)})
            if cls == "internal" and "Traceback" not in err:  # its traceback, for the report
                _, _, derr, _ = run_one(cmds[sub], timeout, debug=True)
                row["traceback"] = derr.strip().splitlines()[-15:]
            elif cls == "internal":
                row["traceback"] = err.strip().splitlines()[-15:]
            if sub == "convert":
                row["convert_summary"] = [ln for ln in (out + err).splitlines()
                                          if "range check" in ln or "NOT RUN" in ln or "warning" in ln.lower()][:4]
            rows.append(row)
            print(f"{row['class']:10} {secs:6.1f}s {row['model']} {sub}"
                  + (f": {lines[-1][:150]}" if cls != "result" and lines else ""), flush=True)
    return rows


def summarize(rows: list[dict]) -> None:
    """The table per subcommand, then every internal error and timeout with its message."""
    classes = ("result", "user error", "internal", "timeout", "skipped")
    print(f"\n{'subcommand':16}" + "".join(f"{c:>12}" for c in classes))
    for sub in SUBCOMMANDS:
        sel = [r for r in rows if r["subcommand"] == sub]
        if sel:
            print(f"{sub:16}" + "".join(f"{sum(r['class'] == c for r in sel):>12}" for c in classes))
    bad = [r for r in rows if r["class"] in ("internal", "timeout")]
    print(f"\n{len(bad)} internal errors and timeouts:")
    for r in bad:
        msg = (r.get("traceback") or r["stderr"] or ["(nothing printed)"])[-1]
        print(f"  [{r['class']}] {r['model']} {r['subcommand']} (exit {r['exit']}, {r['seconds']} s): {msg[:300]}")


def _corpus(root: Path, keep) -> list[Path]:
    """The models under ``root`` whose relative path ``keep`` keeps, round robin over the exporters: a
    partial sweep covers them all."""
    models = [m for m in sorted(root.rglob("*.onnx")) if keep(m.relative_to(root))]
    seen: dict[Path, int] = {}
    order = {m: (seen.setdefault(m.parent, 0), seen.update({m.parent: seen[m.parent] + 1}))[0] for m in models}
    return sorted(models, key=lambda m: (order[m], str(m)))


def sweep(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=Path, required=True)
    p.add_argument("--amp", default=shutil.which("amp-rewrite") or "amp-rewrite")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--only", default=",".join(SUBCOMMANDS))
    p.add_argument("--jobs", type=int, default=2, help="models swept at once")
    p.add_argument("--match", default="", help="only models whose path contains one of these (comma-separated)")
    a = p.parse_args(argv)
    only = a.only.split(",")
    unknown = set(only) - set(SUBCOMMANDS)
    if unknown:
        p.error(f"unknown subcommands {sorted(unknown)}; known: {', '.join(SUBCOMMANDS)}")
    root = a.models.resolve()
    models = _corpus(root, lambda rel: any(s in str(rel) for s in a.match.split(",")))
    print(f"{len(models)} models, {len(only)} subcommands, {a.jobs} at once", flush=True)
    _over_corpus(a, root, models, lambda model: sweep_model(model, root, a.amp, only, a.timeout), summarize)


def _over_corpus(a, root: Path, models: list[Path], work, summary) -> None:
    """``work`` on each model (``a.jobs`` at once), its rows appended to OUT.partial.jsonl as they come,
    then all of them written to ``a.out`` and summarized."""
    partial = a.out.with_suffix(".partial.jsonl")
    partial.write_text("")

    def one(model: Path) -> list[dict]:
        rows = work(model)
        with partial.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        return rows
    start = time.perf_counter()
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = [r for rs in pool.map(one, models) for r in rs]
    a.out.write_text(json.dumps({"amp": a.amp, "models": str(root), "seconds": round(time.perf_counter() - start),
                                 "runs": rows}, indent=1))
    summary(rows)
    print(f"\n{len(rows)} runs in {time.perf_counter() - start:.0f} s; wrote {a.out}")


# ---------------------------------------------------------------------------------------------- finetune
# Whether `train` fine-tunes each model on data it can learn; amp-rewrite's Python, amp-rewrite in subprocesses.

FT_PRECISIONS = ("float32", "float16")
FT_SAMPLES = 32
FT_MIN_STD = 0.01
"""The labels' offset is 0.5 x the output's std x noise, the std at least this: a random-weight model
whose output is constant (features that vanish, a uniform softmax) gets an offset it can learn, not one of 1e-10."""
UNTRAINED_STATISTICS = "running statistics were never measured on data"
"""What train's warning on never-calibrated BatchNormalization statistics says."""
FT_CLASSES = ("trained", "not improved", "refused", "crashed", "skipped")


def _ft_run(model: Path, data: dict, meta: dict) -> np.ndarray:
    """``meta['output']`` of ``model`` on ``data``, one sample-sized chunk at a time (a fixed batch runs
    too), joined on the output's batch axis."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    k = meta["chunk"]
    feeds = [{i.name: data[i.name] if np.ndim(data[i.name]) == 0 else data[i.name][s:s + k]
              for i in sess.get_inputs()} for s in range(0, meta["samples"], k)]
    return np.concatenate([sess.run([meta["output"]], f)[0] for f in feeds], axis=meta["axis"])


def _mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))


def ft_data(model: Path, work: Path) -> None:
    """``ft-data MODEL WORK`` (a child): WORK/data.npz and WORK/ft.json (see ``_ft_data``)."""
    (work / "ft.json").write_text(json.dumps(_ft_data(model, work)))


def _ft_data(model: Path, work: Path) -> dict:
    """WORK/data.npz: the sample repeated to FT_SAMPLES samples (float inputs perturbed after the first
    copy, integer ones as they are) with ``labels`` = the float32 model's first float output + a fixed
    offset per output element (0.5 std x noise, the same for every sample: learnable; FT_MIN_STD). Returns that
    output, its batch axis (the one that grows with a doubled batch), the batch size (8, or the sample's
    where a doubled one does not run) and the original model's mse; or why there is no data ({"skip": ...})."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(model), load_external_data=False)
    sample, floats = _sample(m, model), _float_outputs(m)
    batched = [v for v in sample.values() if np.ndim(v)]
    if not floats or not batched:
        return {"skip": "no float output" if not floats else "no input with a batch axis"}
    out, chunk = floats[0], len(batched[0])
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    one = sess.run([out], sample)[0]
    try:
        two = sess.run([out], {k: np.concatenate([v, v]) if np.ndim(v) else v for k, v in sample.items()})[0]
        doubled = [a for a in range(one.ndim) if two.shape[a] == 2 * one.shape[a]]
    except Exception:  # a fixed batch
        doubled = []
    if len(doubled) > 1:  # CLIP's logits_per_image [batch, batch]: no labels per sample
        return {"skip": f"output {out}: axes {doubled} grow with the batch"}
    copies, rng = -(-FT_SAMPLES // chunk), np.random.default_rng(0)

    def copy(v: np.ndarray) -> np.ndarray:
        if not np.issubdtype(v.dtype, np.floating):
            return v
        return (v + 0.1 * (np.std(v, dtype=np.float64) or 1) * rng.normal(size=v.shape)).astype(v.dtype)
    data = {k: np.concatenate([v] + [copy(v) for _ in range(copies - 1)]) if np.ndim(v) else v
            for k, v in sample.items()}
    meta = {"output": out, "axis": doubled[0] if doubled else 0, "batch": 8 if doubled else chunk, "chunk": chunk,
            "samples": chunk * copies}
    try:
        outs = _ft_run(model, data, meta)
    except ValueError as exc:  # concatenate: the chunks' outputs differ in shape
        return {"skip": f"outputs of different shapes: {str(exc)[:200]}"}
    if outs.shape[meta["axis"]] != meta["samples"]:
        return {"skip": f"output {out} {list(outs.shape)} has no batch axis (its sample has {chunk})"}
    if not np.isfinite(outs).all():
        return {"skip": f"output {out} not finite"}
    shape = [1 if a == meta["axis"] else n for a, n in enumerate(outs.shape)]
    std = max(float(np.std(outs, dtype=np.float64)), FT_MIN_STD)
    labels = (outs + 0.5 * std * np.random.default_rng(1).normal(size=shape)).astype(outs.dtype)
    np.savez(work / "data.npz", **data, labels=labels)
    return {**meta, "std": std, "mse_original": _mse(outs, labels)}


def ft_mse(work: Path, model: Path) -> None:
    """``ft-mse WORK MODEL`` (a child): prints the mse of MODEL's output against WORK's labels."""
    data = dict(np.load(work / "data.npz"))
    print(json.dumps(_mse(_ft_run(model, data, json.loads((work / "ft.json").read_text())), data["labels"])))


def finetune_model(model: Path, root: Path, amp: str, timeout: float, epochs: int, flags: list[str],
                   calibrate: bool = False) -> list[dict]:
    """Data for one model, then train in each precision and the trained model's mse, in a scratch directory.
    ``calibrate``: where train warned that the model's BatchNormalization statistics were never calibrated (a
    random-weight export), calibrate them first (``train --lr 0``, ``FT_CALIBRATION_STEPS``) and fine-tune that
    model instead, as one
    fine-tunes a pretrained model; the rows keep the uncalibrated run's class."""
    rel = str(model.relative_to(root))
    base = {"model": rel, "exporter": rel.split("/")[0]}
    with tempfile.TemporaryDirectory(prefix="finetune-") as tmp:
        work = Path(tmp)
        meta = _ft_meta(model, work, timeout)
        if "skip" in meta:
            print(f"{'skipped':12} {rel}: {meta['skip']}", flush=True)
            return [{**base, "precision": p, "class": "skipped", "message": meta["skip"]} for p in FT_PRECISIONS]
        rows = _ft_runs(model, work, meta, base, amp, timeout, epochs, flags)
        if not calibrate or not any(r.get("untrained_statistics") for r in rows):
            return rows
        calibrated = work / "calibrated.onnx"
        sample = model.with_suffix(".sample.npz")  # the calibrated model's data: the same inputs
        if sample.exists():
            shutil.copyfile(sample, calibrated.with_suffix(".sample.npz"))
        code, _, err, secs = run_one(_ft_train_cmd(amp, model, work, meta, "float32", _calibration_epochs(meta),
                                                   ["--lr", "0"], calibrated), timeout)
        meta = _ft_meta(calibrated, work, timeout) if code == 0 else {"skip": f"calibration (exit {code})"}
        if "skip" in meta:
            print(f"{'':12} {rel}: not calibrated: {meta['skip']}", flush=True)
            return rows
        print(f"{'calibrated':12} {secs:6.1f}s {rel}", flush=True)
        return [{**row, "calibrated": True, "uncalibrated_class": before["class"]} for row, before in
                zip(_ft_runs(calibrated, work, meta, base, amp, timeout, epochs, flags), rows)]


FT_CALIBRATION_STEPS = 40
"""Steps of ``train --lr 0`` that calibrate never-calibrated BatchNormalization statistics: the weights stay,
the running statistics move to the data's (40 steps leave 0.9^40, under 2%, of the initial values at PyTorch's
momentum)."""


def _calibration_epochs(meta: dict) -> int:
    """Epochs of ``FT_CALIBRATION_STEPS`` steps at least, in batches of the model's batch."""
    return -(-FT_CALIBRATION_STEPS * meta["batch"] // meta["samples"])


def _ft_meta(model: Path, work: Path, timeout: float) -> dict:
    """``_ft_data`` of ``model`` into ``work`` (in a child), or why there is no data ({"skip": ...})."""
    code, _, err, _ = run_one([sys.executable, __file__, "ft-data", str(model), str(work)], timeout)
    said = err.strip().splitlines() or [""]
    return json.loads((work / "ft.json").read_text()) if code == 0 else {
        "skip": f"data (exit {code}): " + next((ln for ln in reversed(said) if "Error" in ln), said[-1])[:200]}


def _ft_train_cmd(amp: str, model: Path, work: Path, meta: dict, precision: str, epochs: int, flags: list[str],
                  trained: Path) -> list[str]:
    cmd = [amp, "train", str(model), "--data", str(work / "data.npz"), "--loss", "mse", "--output",
           meta["output"], "--labels", "labels", "--epochs", str(epochs), "--batch-size", str(meta["batch"]),
           *flags, "--precision", precision, "--report", str(work / f"report-{precision}.json"), "-o", str(trained),
           "--quiet"]
    return cmd + (["--batch-axis", f"labels:{meta['axis']}"] if meta["axis"] else [])


def _ft_runs(model: Path, work: Path, meta: dict, base: dict, amp: str, timeout: float, epochs: int,
             flags: list[str]) -> list[dict]:
    """Fine-tune ``model`` on ``work``'s data in each precision: a row per precision."""
    rows, tmp = [], str(work)
    for p in FT_PRECISIONS:
        trained = work / f"trained-{p}.onnx"
        cmd = _ft_train_cmd(amp, model, work, meta, p, epochs, flags, trained)
        code, out, err, secs = run_one(cmd, timeout)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()] or out.strip().splitlines()[-3:]
        row = {**base, "precision": p, "cmd": shlex.join(cmd).replace(tmp, "$WORK"), "exit": code,
               "seconds": round(secs, 2), "batch": meta["batch"], "std": meta["std"],
               "mse_original": meta["mse_original"]}
        if code == 0 and "Traceback" not in err:
            row["untrained_statistics"] = UNTRAINED_STATISTICS in err
            rep = json.loads((work / f"report-{p}.json").read_text())
            row.update(first_loss=rep["epochs"][0]["loss"], last_loss=rep["epochs"][-1]["loss"],
                       steps=rep["steps"], skipped_steps=len(rep["skipped_steps"]))
            c2, o2, e2, _ = run_one([sys.executable, __file__, "ft-mse", tmp, str(trained)], timeout)
            if c2 == 0:
                row["mse_trained"] = json.loads(o2.strip().splitlines()[-1])
                row["class"] = "trained" if row["mse_trained"] < meta["mse_original"] else "not improved"
            else:
                row.update({"class": "crashed", "stderr": ["evaluating the trained model:",
                                                           *e2.strip().splitlines()[-5:]]})
        elif code == 2 and "Traceback" not in err:
            row.update({"class": "refused", "message": lines[-1] if lines else ""})
        else:
            row.update({"class": "crashed", "stderr": [f"timeout after {timeout:.0f} s"] if code is None
                        else lines[-8:]})
            if code is not None and "Traceback" not in err:  # its traceback, for the report
                row["traceback"] = run_one(cmd, timeout, debug=True)[2].strip().splitlines()[-15:]
        rows.append(row)
        extra = (f"mse {meta['mse_original']:.4g} -> {row['mse_trained']:.4g}" if "mse_trained" in row
                 else (row.get("message") or row.get("stderr", [""])[-1])[:150])
        print(f"{row['class']:12} {secs:6.1f}s {base['model']} {p}: {extra}", flush=True)
    return rows


def ft_summarize(rows: list[dict]) -> None:
    """The table per precision, refusals grouped by message, every crash, float16 against float32."""
    print(f"\n{'precision':10}" + "".join(f"{c:>14}" for c in FT_CLASSES))
    for p in FT_PRECISIONS:
        print(f"{p:10}" + "".join(f"{sum(r['class'] == c and r['precision'] == p for r in rows):>14}"
                                  for c in FT_CLASSES))
    for cls, key in (("refused", "message"), ("skipped", "message")):
        groups: dict[str, list[str]] = {}
        for r in rows:
            if r["class"] == cls:
                groups.setdefault(r[key].removeprefix("amp-rewrite: error: ")[:80], []).append(
                    f"{r['model']} {r['precision']}")
        print(f"\n{cls}, by message:")
        for msg, who in sorted(groups.items(), key=lambda g: -len(g[1])):
            print(f"  {len(who):3}  {msg}\n        {', '.join(who)}")
    for p in FT_PRECISIONS:
        gains = sorted(r["mse_trained"] / r["mse_original"] for r in rows if r["class"] == "trained"
                       and r["precision"] == p)
        if gains:
            print(f"\n{p} trained: mse trained/original median {gains[len(gains) // 2]:.3g}, "
                  f"marginal (above 0.99): {sum(g > 0.99 for g in gains)}")
    worse = [r for r in rows if r["class"] == "not improved"]
    print(f"\nnot improved: {len(worse)}, of which the epoch loss fell (first epoch > last): "
          f"{sum(r['first_loss'] > r['last_loss'] for r in worse)}; the first epoch's loss >1% above the original "
          f"mse (overshoot): {sum(r['first_loss'] > 1.01 * r['mse_original'] for r in worse)}; train warned that "
          f"the BatchNormalization statistics were never calibrated: "
          f"{sum(r.get('untrained_statistics', False) for r in worse)}")
    for r in worse:
        print(f"  {r['model']} {r['precision']}: mse {r['mse_original']:.4g} -> {r['mse_trained']:.4g}, "
              f"epoch loss {r['first_loss']:.4g} -> {r['last_loss']:.4g}, skipped steps {r['skipped_steps']}"
              + (", BatchNormalization statistics never calibrated" if r.get("untrained_statistics") else ""))
    calibrated = [r for r in rows if r.get("calibrated")]
    print(f"\ncalibrated first (BatchNormalization statistics never calibrated): {len(calibrated)} runs; classes "
          f"before: {dict(Counter(r['uncalibrated_class'] for r in calibrated))}, after: "
          f"{dict(Counter(r['class'] for r in calibrated))}")
    crashes = [r for r in rows if r["class"] == "crashed"]
    print(f"\n{len(crashes)} crashes:")
    for r in crashes:
        print(f"  {r['model']} {r['precision']} (exit {r['exit']}, {r['seconds']} s)\n    {r['cmd']}",
              *(f"    | {ln}" for ln in (r.get("traceback") or r["stderr"])[-6:]), sep="\n")
    by = {(r["model"], r["precision"]): r for r in rows}
    pairs = [(m, by[m, "float32"], by[m, "float16"]) for m, p in by if p == "float32" and (m, "float16") in by
             and by[m, "float32"]["class"] == by[m, "float16"]["class"] == "trained"]
    ratios = [(m, b["mse_trained"] / a["mse_trained"]) for m, a, b in pairs if a["mse_trained"] > 0]
    print(f"\nfloat16 vs float32, both trained: {len(pairs)} models; final own-mse ratio float16/float32 "
          f"within 10%: {sum(abs(x - 1) <= 0.1 for _, x in ratios)}, float16 worse by >10%: "
          f"{sum(x > 1.1 for _, x in ratios)}, better by >10%: {sum(x < 0.9 for _, x in ratios)}")
    for m, x in sorted(ratios, key=lambda t: -abs(t[1] - 1)):
        if abs(x - 1) > 0.1:
            print(f"  {x:8.3f}  {m}")


def finetune(argv: list[str]) -> None:
    """``finetune``: whether train fine-tunes each model, in float32 and in float16 (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="sweep.py finetune", description=finetune.__doc__)
    p.add_argument("--models", type=Path, required=True)
    p.add_argument("--amp", default=shutil.which("amp-rewrite") or "amp-rewrite")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default="", help="only these exporter families (comma-separated)")
    p.add_argument("--match", default="", help="only models whose path contains one of these (comma-separated)")
    p.add_argument("--jobs", type=int, default=2, help="models at once")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds per train (a 224x224 network with a fixed batch of 1 takes 128 steps on 2 cores)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", help="train's --lr (default: train's own default)")
    p.add_argument("--batchnorm", choices=("auto", "train", "freeze"),
                   help="train's --batchnorm (default: train's own)")
    p.add_argument("--calibrate", action="store_true",
                   help="calibrate never-calibrated BatchNormalization statistics first (see finetune_model)")
    a = p.parse_args(argv)
    flags = [*(["--lr", a.lr] if a.lr else []), *(["--batchnorm", a.batchnorm] if a.batchnorm else [])]
    root = a.models.resolve()
    models = _corpus(root, lambda rel: (not a.only or rel.parts[0] in a.only.split(","))
                     and any(s in str(rel) for s in a.match.split(",")))
    print(f"{len(models)} models, {a.jobs} at once", flush=True)
    _over_corpus(a, root, models,
                 lambda model: finetune_model(model, root, a.amp, a.timeout, a.epochs, flags, a.calibrate),
                 ft_summarize)


if __name__ == "__main__":
    if sys.argv[1:2] == ["export"]:
        export(sys.argv[2:])
    elif sys.argv[1:2] == ["prepare"]:
        prepare(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:2] == ["finetune"]:
        finetune(sys.argv[2:])
    elif sys.argv[1:2] == ["ft-data"]:
        ft_data(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:2] == ["ft-mse"]:
        ft_mse(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sweep(sys.argv[1:])
