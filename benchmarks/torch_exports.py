"""Real exporters' output as an external suite: small BERT, GPT-2, Llama, ConvNeXt, T5, ViT,
MobileNetV3, diffusion UNet, LSTM, detection-head and cached GPT decoder models written in PyTorch,
exported by its TorchScript exporter (opsets 14 and 17, and 17 with every module a local function)
and by its dynamo exporter (opset 18), then converted and checked. Two steps, because PyTorch is
not a dependency:

    python benchmarks/torch_exports.py export --out DIR   # with a Python that has torch (2.13 CPU here)
    python benchmarks/torch_exports.py check --models DIR # with amp-rewrite's

``check`` converts each model with its defaults (generated inputs), and once with fixed inputs
(token ids below the vocabulary, masks of ones, diffusion timesteps in 0-999) as the range check's
data, and reports: the range check's line, whether ONNX Runtime loads the converted model at its
default optimizations (in a child process: its CPU provider crashes on some float16 graphs), and
the relative L2 error of the worst output with float16 storage emulated, against float32. Random
weights (seed 0). ``cases`` writes the same conversions (and the ORT float16 script's) as cases
for ``benchmarks/gpu_fuzz.py run``, which runs them on a GPU's float16 kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB, WIDTH, HEADS, LAYERS = 100, 64, 4, 2
SIZES = {"tiny": (VOCAB, WIDTH, HEADS, LAYERS, 64),
         "base": (32000, 768, 12, 12, 512)}
"""Vocabulary, width, heads, layers and positions of the text models by ``export --size``:
tiny for the suite, base (BERT-base's shape, a Llama vocabulary) for timing on a GPU."""
BATCH_ONLY = ("x", "t")
HF_BATCH_ONLY = ("pixel_values", "input_features")
"""Hugging Face inputs whose only dynamic dimension is the batch."""
"""Inputs whose only dynamic dimension is the batch (images, timesteps); the others have a sequence too."""


def export(out: Path, only: list[str], size: str = "tiny") -> None:
    """The models written here; at ``size`` base, through the TorchScript exporter at opset 17 only."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.export import Dim

    torch.manual_seed(0)
    V, D, H, L, P = SIZES[size]

    class Bert(nn.Module):
        """nn.TransformerEncoder (post-norm, GELU) after token and position embeddings."""

        def __init__(self):
            super().__init__()
            self.tok, self.pos, self.ln = nn.Embedding(V, D), nn.Embedding(P, D), nn.LayerNorm(D)
            layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.0, activation="gelu", batch_first=True)
            self.enc = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
            self.head = nn.Linear(D, 2)

        def forward(self, ids, mask):
            x = self.ln(self.tok(ids) + self.pos(torch.arange(ids.shape[1]).unsqueeze(0)))
            return self.head(self.enc(x, src_key_padding_mask=mask == 0)[:, 0])

    class ManualNorm(nn.Module):
        """LayerNorm written out, as older GPT-2 and ConvNeXt code does, over ``dim``."""

        def __init__(self, d, dim=-1, eps=1e-5):
            super().__init__()
            self.g, self.b, self.dim, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), dim, eps

        def forward(self, x):
            u = x.mean(self.dim, keepdim=True)
            s = (x - u).pow(2).mean(self.dim, keepdim=True)
            shape = [-1] + [1] * (-self.dim - 1) if self.dim < 0 else [-1] + [1] * (x.dim() - self.dim - 1)
            return self.g.view(shape) * ((x - u) / torch.sqrt(s + self.eps)) + self.b.view(shape)

    def block(**layers):
        return nn.ModuleDict(layers)

    class GPT(nn.Module):
        """GPT-2: written-out LayerNorms, causal attention by masked_fill, tanh GELU with Pow 3."""

        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(P, D)
            self.blocks = nn.ModuleList([block(ln1=ManualNorm(D), qkv=nn.Linear(D, 3 * D), proj=nn.Linear(D, D),
                                               ln2=ManualNorm(D), fc=nn.Linear(D, 4 * D), out=nn.Linear(4 * D, D))
                                         for _ in range(L)])
            self.lnf, self.head = ManualNorm(D), nn.Linear(D, V, bias=False)

        def forward(self, ids):
            b, t = ids.shape
            x = self.tok(ids) + self.pos(torch.arange(t).unsqueeze(0))
            causal = torch.tril(torch.ones(t, t)).view(1, 1, t, t)
            for blk in self.blocks:
                q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in blk["qkv"](blk["ln1"](x)).split(D, dim=2))
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
                att = att.masked_fill(causal == 0, float("-inf")).softmax(-1)
                x = x + blk["proj"]((att @ v).transpose(1, 2).contiguous().view(b, t, D))
                h = blk["fc"](blk["ln2"](x))
                h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
                x = x + blk["out"](h)
            return self.head(self.lnf(x))

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.w, self.eps = nn.Parameter(torch.ones(d)), eps

        def forward(self, x):
            return self.w * (x * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + self.eps))

    class Llama(nn.Module):
        """Llama: RMSNorm, scaled_dot_product_attention (causal), SwiGLU."""

        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(V, D)
            self.layers = nn.ModuleList([block(n1=RMSNorm(D), qkv=nn.Linear(D, 3 * D, bias=False),
                                               o=nn.Linear(D, D, bias=False), n2=RMSNorm(D),
                                               gate=nn.Linear(D, 2 * D, bias=False), up=nn.Linear(D, 2 * D, bias=False),
                                               down=nn.Linear(2 * D, D, bias=False)) for _ in range(L)])
            self.norm, self.head = RMSNorm(D), nn.Linear(D, V, bias=False)

        def forward(self, ids):
            b, t = ids.shape
            x = self.tok(ids)
            for layer in self.layers:
                qkv = layer["qkv"](layer["n1"](x)).split(D, dim=2)
                q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in qkv)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + layer["o"](a.transpose(1, 2).reshape(b, t, D))
                h = layer["n2"](x)
                x = x + layer["down"](F.silu(layer["gate"](h)) * layer["up"](h))
            return self.head(self.norm(x))

    class ConvNeXt(nn.Module):
        """A ConvNeXt stage: a channels-first written-out LayerNorm after the stem, a depthwise 7x7,
        LayerNorm, an inverted MLP with GELU, layer scale of 1e-6."""

        def __init__(self):
            super().__init__()
            self.stem, self.ln0 = nn.Conv2d(3, 32, 4, 4), ManualNorm(32, dim=1, eps=1e-6)
            self.dw, self.ln = nn.Conv2d(32, 32, 7, padding=3, groups=32), nn.LayerNorm(32)
            self.pw1, self.pw2 = nn.Linear(32, 128), nn.Linear(128, 32)
            self.gamma = nn.Parameter(1e-6 * torch.ones(32))
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            x = self.ln0(self.stem(x))
            y = self.pw2(F.gelu(self.pw1(self.ln(self.dw(x).permute(0, 2, 3, 1)))))
            x = x + (self.gamma * y).permute(0, 3, 1, 2)
            return self.head(x.mean([-2, -1]))

    class T5(nn.Module):
        """A T5 encoder: relative position buckets (Log of distances truncated to integers), RMSNorm,
        and Hugging Face's additive mask ``(1 - mask) * finfo(float32).min``."""

        def __init__(self, buckets=32, distance=128):
            super().__init__()
            self.tok, self.bias = nn.Embedding(V, D), nn.Embedding(buckets, H)
            self.buckets, self.distance = buckets, distance
            self.layers = nn.ModuleList([block(n1=RMSNorm(D), qkv=nn.Linear(D, 3 * D, bias=False),
                                               o=nn.Linear(D, D, bias=False), n2=RMSNorm(D),
                                               wi=nn.Linear(D, 4 * D, bias=False), wo=nn.Linear(4 * D, D, bias=False))
                                         for _ in range(L)])
            self.norm = RMSNorm(D)

        def bucket(self, rel):
            n = self.buckets // 2
            exact = n // 2
            ret = (rel > 0).long() * n
            rel = rel.abs()
            large = exact + (torch.log(rel.float() / exact) / math.log(self.distance / exact) * (n - exact)).long()
            large = torch.min(large, torch.full_like(large, n - 1))
            return ret + torch.where(rel < exact, rel, large)

        def forward(self, ids, mask):
            b, t = ids.shape
            pos = torch.arange(t)
            bias = self.bias(self.bucket(pos[None, :] - pos[:, None])).permute(2, 0, 1).unsqueeze(0)
            bias = bias + (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
            x = self.tok(ids)
            for layer in self.layers:
                qkv = layer["qkv"](layer["n1"](x)).split(D, dim=2)
                q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in qkv)
                att = (q @ k.transpose(-2, -1) + bias).softmax(-1)
                x = x + layer["o"]((att @ v).transpose(1, 2).reshape(b, t, D))
                x = x + layer["wo"](F.relu(layer["wi"](layer["n2"](x))))
            return self.norm(x)

    class ViT(nn.Module):
        """A ViT: patch convolution, a class token concatenated in front, learned positions, pre-norm
        nn.TransformerEncoder, the class token's head."""

        def __init__(self):
            super().__init__()
            self.patch, self.cls = nn.Conv2d(3, D, 8, 8), nn.Parameter(torch.zeros(1, 1, D))
            self.pos = nn.Parameter(0.02 * torch.randn(1, 65, D))
            layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.0, activation="gelu", batch_first=True,
                                               norm_first=True)
            self.enc = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
            self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, 10)

        def forward(self, x):
            p = self.patch(x).flatten(2).transpose(1, 2)
            p = torch.cat([self.cls.expand(p.shape[0], -1, -1), p], 1) + self.pos
            return self.head(self.ln(self.enc(p))[:, 0])

    class MobileNet(nn.Module):
        """MobileNetV3 blocks: BatchNorm, Hardswish, depthwise convolutions, squeeze-and-excitation
        with Hardsigmoid."""

        def __init__(self):
            super().__init__()
            def cbn(i, o, k, s=1, g=1):
                conv = nn.Conv2d(i, o, k, s, k // 2, groups=g, bias=False)
                return nn.Sequential(conv, nn.BatchNorm2d(o), nn.Hardswish())
            self.stem, self.expand, self.dw = cbn(3, 16, 3, 2), cbn(16, 64, 1), cbn(64, 64, 3, 2, 64)
            self.se1, self.se2, self.project = nn.Conv2d(64, 16, 1), nn.Conv2d(16, 64, 1), nn.Conv2d(64, 24, 1)
            self.head = nn.Linear(24, 10)

        def forward(self, x):
            y = self.dw(self.expand(self.stem(x)))
            y = y * F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
            return self.head(self.project(y).mean([-2, -1]))

    class UNet(nn.Module):
        """A diffusion UNet level: sinusoidal timestep embedding (timesteps up to 1000), GroupNorm,
        SiLU, a strided convolution down, nearest upsampling and a skip concatenation."""

        def __init__(self, c=32):
            super().__init__()
            self.c, self.inp = c, nn.Conv2d(4, c, 3, padding=1)
            self.temb = nn.Sequential(nn.Linear(c, 4 * c), nn.SiLU(), nn.Linear(4 * c, c))
            self.n1, self.down, self.n2 = nn.GroupNorm(8, c), nn.Conv2d(c, c, 3, 2, 1), nn.GroupNorm(8, c)
            self.up, self.out = nn.Conv2d(2 * c, c, 3, padding=1), nn.Conv2d(c, 4, 3, padding=1)

        def forward(self, x, t):
            half = self.c // 2
            freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
            angles = t[:, None] * freqs[None]
            emb = self.temb(torch.cat([torch.sin(angles), torch.cos(angles)], -1))
            h = self.inp(x) + emb[:, :, None, None]
            d = self.down(F.silu(self.n1(h)))
            u = F.interpolate(F.silu(self.n2(d)), scale_factor=2.0, mode="nearest")
            return self.out(F.silu(self.up(torch.cat([u, h], 1))))

    class Recurrent(nn.Module):
        """A two-layer LSTM tagger: embedding, nn.LSTM, a linear head."""

        def __init__(self):
            super().__init__()
            self.tok, self.lstm, self.head = nn.Embedding(V, D), nn.LSTM(D, D, 2, batch_first=True), nn.Linear(D, 5)

        def forward(self, ids):
            return self.head(self.lstm(self.tok(ids))[0])

    class Detector(nn.Module):
        """A detection head: anchor box decoding with Exp clamped at log(1000/16), sigmoid scores, TopK
        and a Gather of the chosen boxes."""

        def __init__(self):
            super().__init__()
            self.body, self.box, self.cls = nn.Conv2d(3, 32, 4, 4), nn.Conv2d(32, 4, 1), nn.Conv2d(32, 1, 1)
            self.anchors = nn.Parameter(16.0 * torch.rand(256, 4) * 64.0, requires_grad=False)

        def forward(self, x):
            f = F.relu(self.body(x))
            d = self.box(f).flatten(2).transpose(1, 2)
            s = self.cls(f).flatten(1).sigmoid()
            a = self.anchors[: d.shape[1]]
            wh = a[:, 2:] * torch.exp(d[..., 2:].clamp(max=math.log(1000.0 / 16)))
            xy = a[:, :2] + d[..., :2] * a[:, 2:]
            boxes = torch.cat([xy - wh / 2, xy + wh / 2], -1)
            top, idx = s.topk(10, dim=1)
            return top, torch.gather(boxes, 1, idx[..., None].expand(-1, -1, 4))

    class CachedGPT(nn.Module):
        """A GPT decoder step with a key/value cache, as Hugging Face Optimum exports one: past keys
        and values per layer ([batch, heads, past, head size]), a mask over past and new tokens,
        positions from past to past + new, masked_fill with finfo(float32).min; returns the logits
        and the present keys and values."""

        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(128, D)
            self.blocks = nn.ModuleList([block(ln1=nn.LayerNorm(D), qkv=nn.Linear(D, 3 * D), proj=nn.Linear(D, D),
                                               ln2=nn.LayerNorm(D), fc=nn.Linear(D, 4 * D), out=nn.Linear(4 * D, D))
                                         for _ in range(L)])
            self.lnf, self.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

        def forward(self, ids, attention_mask, past_k0, past_v0, past_k1, past_v1):
            b, t = ids.shape
            p = past_k0.shape[2]
            x = self.tok(ids) + self.pos(torch.arange(p, p + t).unsqueeze(0))
            keep = torch.ones(t, p + t, dtype=torch.bool).tril(p)[None, None] & attention_mask[:, None, None, :].bool()
            presents = []
            for blk, past_k, past_v in zip(self.blocks, (past_k0, past_k1), (past_v0, past_v1)):
                qkv = blk["qkv"](blk["ln1"](x)).split(D, dim=2)
                q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in qkv)
                k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
                presents += [k, v]
                att = ((q @ k.transpose(-2, -1)) / math.sqrt(D // H)).masked_fill(~keep, torch.finfo(torch.float32).min)
                x = x + blk["proj"]((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, D))
                x = x + blk["out"](F.gelu(blk["fc"](blk["ln2"](x))))
            return (self.head(self.lnf(x)), *presents)

    example = (2, 16) if size == "tiny" else (32, 128)  # nn.TransformerEncoder's export keeps the example's batch
    ids = (torch.randint(0, V, example),)
    ones = torch.ones(*example, dtype=torch.long)
    cache = tuple(torch.randn(2, H, 5, D // H) for _ in range(2 * L))
    models = {"bert": (Bert(), (ids[0], ones), ["ids", "mask"]),
              "gpt": (GPT(), ids, ["ids"]), "llama": (Llama(), ids, ["ids"]),
              "convnext": (ConvNeXt(), (torch.randn(2, 3, 64, 64),), ["x"]),
              "t5": (T5(), (ids[0], ones), ["ids", "mask"]), "vit": (ViT(), (torch.randn(2, 3, 64, 64),), ["x"]),
              "mobilenet": (MobileNet(), (torch.randn(2, 3, 64, 64),), ["x"]),
              "unet": (UNet(), (torch.randn(2, 4, 32, 32), torch.tensor([10.0, 900.0])), ["x", "t"]),
              "lstm": (Recurrent(), ids, ["ids"]), "detector": (Detector(), (torch.randn(2, 3, 64, 64),), ["x"]),
              "gptkv": (CachedGPT(), (ids[0][:, :3], torch.ones(2, 8, dtype=torch.long), *cache),
                        ["ids", "attention_mask", "past_k0", "past_v0", "past_k1", "past_v1"])}
    out.mkdir(parents=True, exist_ok=True)
    for name, (model, args, names) in models.items():
        if only and name not in only:
            continue
        model.eval()
        batch, seq, past = Dim("batch", min=1, max=64), Dim("seq", min=2, max=64), Dim("past", min=1, max=64)
        axes = {n: _axes(n, "batch", "seq", "past", "past + seq") for n in names}
        shapes = {n: _axes(n, batch, seq, past, Dim.AUTO) for n in names}  # past + seq: export works it out
        ways = {f"op{opset}": dict(dynamic_axes=axes, opset_version=opset, dynamo=False) for opset in (14, 17)}
        ways["op17functions"] = dict(ways["op17"], export_modules_as_functions=True)  # each module a local function
        ways["dynamo18"] = dict(dynamic_shapes=shapes, opset_version=18, dynamo=True, external_data=False)
        ways = ways if size == "tiny" else {"op17": ways["op17"]}
        _export(torch, model, args, names, out, name,
                {way: dict(kwargs, output_names=["out"]) for way, kwargs in ways.items()})
        print("exported", name, flush=True)


def export_hf(out: Path, only: list[str], full_size: bool = False) -> None:
    """Hugging Face transformers' own architectures, tiny (2 layers, width 64, vocabulary 100,
    random weights), each through the TorchScript exporter at opset 17 and the dynamo exporter
    at opset 18, as ``hf-<name>_<way>.onnx``: what its users export themselves. ``full_size``:
    BERT-base and GPT-2 small with their default configurations instead (TorchScript only)."""
    import torch
    import transformers as tf
    import transformers.masking_utils as masks
    from torch.export import Dim

    @contextlib.contextmanager
    def vmap_free_masks():
        """Masks built without vmap, which the TorchScript exporter cannot trace (as with torch < 2.6;
        the dynamo exporter traces vmap, and failed on Whisper with the old masks)."""
        table = masks.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
        kept = masks.sdpa_mask, table["sdpa"]
        masks.sdpa_mask = table["sdpa"] = masks.sdpa_mask_older_torch
        try:
            yield
        finally:
            masks.sdpa_mask, table["sdpa"] = kept

    _ByName = _by_name(torch.nn)
    torch.manual_seed(0)
    small = dict(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                 intermediate_size=2 * WIDTH, max_position_embeddings=128, use_cache=False)
    decoder = dict(small, num_key_value_heads=2, pad_token_id=0, attn_implementation="eager")
    seq2seq = dict(vocab_size=VOCAB, d_model=WIDTH, encoder_layers=LAYERS, decoder_layers=LAYERS,
                   encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=2 * WIDTH,
                   decoder_ffn_dim=2 * WIDTH, max_position_embeddings=128, use_cache=False,
                   pad_token_id=0, decoder_start_token_id=0)
    vision = dict(hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=2 * WIDTH,
                  image_size=32, patch_size=8, num_channels=3)
    text, image = ["input_ids", "attention_mask"], ["pixel_values"]
    ids = torch.randint(1, VOCAB, (2, 16))
    pair = (ids, torch.ones(2, 16, dtype=torch.long))
    pixels = (torch.randn(2, 3, 32, 32),)
    full = {"bert-base": lambda: (tf.BertModel(tf.BertConfig()), pair, text),
            "gpt2-small": lambda: (tf.GPT2LMHeadModel(tf.GPT2Config(use_cache=False)), pair, text)}
    builds = full if full_size else {
        "bert": lambda: (tf.BertModel(tf.BertConfig(**small)), pair, text),
        "roberta": lambda: (tf.RobertaModel(tf.RobertaConfig(**dict(small, pad_token_id=1))), pair, text),
        "distilbert": lambda: (tf.DistilBertModel(tf.DistilBertConfig(
            vocab_size=VOCAB, dim=WIDTH, n_layers=LAYERS, n_heads=HEADS, hidden_dim=2 * WIDTH)),
            pair, text),
        "albert": lambda: (tf.AlbertModel(tf.AlbertConfig(**dict(small, embedding_size=32))), pair, text),
        "deberta": lambda: (tf.DebertaV2Model(tf.DebertaV2Config(**dict(small, relative_attention=True,
                                                                       position_buckets=32))), pair, text),
        "gpt2": lambda: (tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS,
                                                          n_head=HEADS, n_positions=128,
                                                          use_cache=False)), pair, text),
        "llama": lambda: (tf.LlamaForCausalLM(tf.LlamaConfig(**decoder)), pair, text),
        "mistral": lambda: (tf.MistralForCausalLM(tf.MistralConfig(**dict(decoder, sliding_window=8))), pair, text),
        "qwen2": lambda: (tf.Qwen2ForCausalLM(tf.Qwen2Config(**decoder)), pair, text),
        "gemma": lambda: (tf.GemmaForCausalLM(tf.GemmaConfig(**dict(decoder, head_dim=16))), pair, text),
        "phi": lambda: (tf.PhiForCausalLM(tf.PhiConfig(**decoder)), pair, text),
        "gptneox": lambda: (tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**small)), pair, text),
        "falcon": lambda: (tf.FalconForCausalLM(tf.FalconConfig(**dict(small, num_kv_heads=HEADS))), pair, text),
        "bloom": lambda: (tf.BloomForCausalLM(tf.BloomConfig(vocab_size=VOCAB, hidden_size=WIDTH, n_layer=LAYERS,
                                                             n_head=HEADS, use_cache=False)),
                          pair, text),
        "t5": lambda: (tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=VOCAB, d_model=WIDTH, d_kv=16, d_ff=2 * WIDTH, num_layers=LAYERS, num_heads=HEADS,
            use_cache=False, decoder_start_token_id=0)),
            (*pair, ids[:, :8]), [*text, "decoder_input_ids"]),
        "bart": lambda: (tf.BartForConditionalGeneration(tf.BartConfig(**seq2seq)), (*pair, ids[:, :8]),
                         [*text, "decoder_input_ids"]),
        "whisper": lambda: (tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            **dict(seq2seq, num_mel_bins=16, max_source_positions=32, max_target_positions=64))),
            (torch.randn(2, 16, 64), ids[:, :8]), ["input_features", "decoder_input_ids"]),
        "vit": lambda: (tf.ViTModel(tf.ViTConfig(**vision)), pixels, image),
        "clip": lambda: (tf.CLIPVisionModel(tf.CLIPVisionConfig(**vision)), pixels, image),
        "swin": lambda: (tf.SwinModel(tf.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2],
                                                    num_heads=[2, 4], window_size=4)),
                         pixels, image),
        "convnext": lambda: (tf.ConvNextModel(tf.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1])),
                             pixels, image),
        "resnet": lambda: (tf.ResNetModel(tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])),
                           pixels, image),
        "segformer": lambda: (tf.SegformerForSemanticSegmentation(tf.SegformerConfig(
            hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, sr_ratios=[2, 1], num_attention_heads=[1, 2],
            decoder_hidden_size=32, num_labels=3)), pixels, image),
        "wav2vec2": lambda: (tf.Wav2Vec2Model(tf.Wav2Vec2Config(
            hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=2 * WIDTH,
            conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4)), (torch.randn(2, 1600),), ["input_values"]),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, build in builds.items():
        if only and name not in only:
            continue
        try:
            model, args, names = build()
        except Exception as exc:  # a configuration this transformers version does not take
            print(f"not built: {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
            continue
        model = _ByName(model, names).eval()  # the wrapper too: dynamo exports train-mode Dropout otherwise
        batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=2, max=64)
        axes = {n: {0: "batch"} if n in HF_BATCH_ONLY else {0: "batch", 1: "seq"} for n in names}
        shapes = (tuple({0: batch} if n in HF_BATCH_ONLY else {0: batch, 1: seq if n in text else Dim.AUTO}
                        for n in names),)  # the one argument of forward(*args)
        with vmap_free_masks():
            _export(torch, model, args, names, out, f"hf-{name}", {"op17": dict(dynamic_axes=axes, opset_version=17,
                                                                                   dynamo=False)})
        if not full_size:
            _export(torch, model, args, names, out, f"hf-{name}",
                    {"dynamo18": dict(dynamic_shapes=shapes, opset_version=18, dynamo=True, external_data=False)})
        print("exported", f"hf-{name}", flush=True)


def _by_name(nn):
    class ByName(nn.Module):
        """A model called with its inputs by name, in the order given (forward's own order puts
        other arguments between them: GPT-2's second is past_key_values)."""

        def __init__(self, model, names: list[str]):
            super().__init__()
            self.model, self.names = model, names

        def forward(self, *args):
            out = self.model(**dict(zip(self.names, args)))
            return out.to_tuple() if hasattr(out, "to_tuple") else out
    return ByName


def _export(torch, model, args, names: list[str], out: Path, stem: str, ways: dict[str, dict]) -> None:
    """``model`` exported each way as ``<stem>_<way>.onnx``; an exporter's failure is said and passed."""
    for way, kwargs in ways.items():
        try:
            torch.onnx.export(model, args, out / f"{stem}_{way}.onnx", input_names=names, **kwargs)
        except Exception as exc:  # an exporter's limit, not amp-rewrite's: say so and go on
            print(f"not exported: {stem}_{way}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)


def _axes(name: str, batch, seq, past, total) -> dict:
    """The dynamic axes of an input, by its name: names or ``torch.export.Dim`` objects."""
    if name in BATCH_ONLY:
        return {0: batch}
    if name.startswith("past_"):  # a layer's cached keys or values: [batch, heads, past, head size]
        return {0: batch, 2: past}
    return {0: batch, 1: total if name == "attention_mask" else seq}


def _realistic(feeds: dict) -> dict:
    """Token ids below the vocabulary, masks of ones, diffusion timesteps in 0-999."""
    import numpy as np

    feeds, rng = dict(feeds), np.random.default_rng(0)
    if "ids" in feeds:
        feeds["ids"] = rng.integers(0, VOCAB, feeds["ids"].shape).astype(np.int64)
    for mask in ("mask", "attention_mask"):
        if mask in feeds:
            feeds[mask] = np.ones_like(feeds[mask])
    if "t" in feeds:
        feeds["t"] = rng.integers(0, 1000, feeds["t"].shape).astype(np.float32)
    return feeds


def _sample(model) -> tuple[dict, list]:
    """The first generated inputs float32 runs on, made realistic, and float32's outputs on them."""
    from amp_rewrite.inputs import samples
    from amp_rewrite.runtime import instrument

    reference = instrument.session(model)
    _, (feeds, wants) = samples.first_that_runs(
        ((text, [_realistic(data[0])]) for text, data in samples.attempts(model)),
        lambda data: (data[0], reference.run(None, data[0])))
    return feeds, wants


def _peer(path: str):
    """ONNX Runtime's float16 script's output of the model at ``path``, or why it failed (a line)."""
    import onnx

    with tempfile.TemporaryDirectory() as folder:
        target = str(Path(folder) / "peer.onnx")
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_convert.py"), "ort", path, target],
                              capture_output=True, text=True)
        if done.returncode:
            return f"fails: {(done.stderr.strip().splitlines() or ['?'])[-1][:80]}"
        return onnx.load(target)


def _selected(models: Path, only: list[str]) -> list[str]:
    return [path for path in sorted(glob.glob(str(models / "*.onnx")))
            if not only or Path(path).stem.rsplit("_", 1)[0] in only]


def check(models: Path, only: list[str], peers: bool) -> None:
    import numpy as np
    import onnx

    from amp_rewrite import convert
    from amp_rewrite.runtime import instrument
    from amp_rewrite.runtime.emulate import emulated
    from models.fuzz import load_failure

    def loads(model) -> str:
        return load_failure(model) or "loads"

    def worst_error(converted, feeds: dict, wants: list) -> float:
        gots = instrument.session(emulated(converted)).run(None, feeds)
        return max(float(np.linalg.norm(got.astype(np.float32) - want) / max(float(np.linalg.norm(want)), 1e-30))
                   for got, want in zip(gots, wants))

    def peer(path: str, feeds: dict, wants: list) -> str:
        """ONNX Runtime's float16 script's output: whether it loads, and its error."""
        converted = _peer(path)
        if isinstance(converted, str):
            return f"{converted} |"
        try:
            error = f"{worst_error(converted, feeds, wants):.1e}"
        except Exception as exc:  # its output does not run
            error = f"does not run: {str(exc).splitlines()[0][:80]}"
        return f"{loads(converted)} | {error} |"

    print("| model | range check, generated inputs | low nodes | casts | loads at default optimizations "
          "| rel L2, emulated float16 (worst output) |" + (" ORT float16 script: loads | rel L2 |" if peers else ""))
    print("|---|---|---:|---:|---|---:|" + ("---|---:|" if peers else ""))
    for path in _selected(models, only):
        model = onnx.load(path)
        _, report = convert(model)
        feeds, wants = _sample(model)
        converted, fixed = convert(model, inputs=[feeds])
        print(f"| {Path(path).stem} | {report.range_check} | {fixed.low_nodes}/{fixed.nodes} | {fixed.casts_inserted} "
              f"| {loads(converted)} (float32: {loads(model)}) | {worst_error(converted, feeds, wants):.1e} |"
              + (f" {peer(path, feeds, wants)}" if peers else ""), flush=True)


def cases(models: Path, only: list[str], out: Path) -> None:
    """Each model as a case of ``benchmarks/gpu_fuzz.py run`` (one .npz): float32, amp-rewrite's
    output converted with the case's inputs as the range check's data, the ORT float16 script's
    output where it converts, and the inputs; to run the exports on a GPU's float16 kernels."""
    import numpy as np
    import onnx

    from amp_rewrite import convert

    out.mkdir(parents=True, exist_ok=True)
    for path in _selected(models, only):
        model = onnx.load(path)
        feeds, _ = _sample(model)
        converted, _ = convert(model, inputs=[feeds])
        peer = _peer(path)
        kinds = {"fp32": model, "mixed": converted, **({} if isinstance(peer, str) else {"peer": peer})}
        np.savez_compressed(out / f"case_{Path(path).stem}.npz",
                            **{kind: np.frombuffer(m.SerializeToString(), np.uint8) for kind, m in kinds.items()},
                            **{f"feed_{name}": array for name, array in feeds.items()})
        print(f"{Path(path).stem}: {', '.join(kinds)}" + (f" ({peer})" if isinstance(peer, str) else ""), flush=True)


def time_tools(models: Path, only: list[str]) -> None:
    """Each converter of ``make bench`` on each model, as ``make bench`` times it (one run; peak
    PSS from a run of its own): for exports at their real size (BERT-base, GPT-2 small)."""
    from benchmarks.run import TOOLS, measure

    print("| model | MiB | tool | seconds | peak RSS MiB | peak PSS MiB | note |")
    print("|---|---:|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as folder:
        for path in _selected(models, only):
            for tool, command in TOOLS.items():
                output = str(Path(folder) / "out.onnx")
                run = measure([*command, path, *(["-o", output] if tool.startswith("amp") else [output])], 900)
                print(f"| {Path(path).stem} | {Path(path).stat().st_size / 2**20:.0f} | {tool} | {run.seconds:.2f} | "
                      f"{run.peak_bytes / 2**20:.0f} | {run.pss_bytes / 2**20:.0f} | {run.error} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    for step in ("export", "check", "time", "cases"):
        sub = steps.add_parser(step)
        sub.add_argument("--out" if step == "export" else "--models", type=Path,
                         default=ROOT / "benchmarks" / "work" / "torch_exports")
        sub.add_argument("--only", nargs="+", default=[], metavar="NAME",
                         help="these models alone (bert, t5, unet, ...; check: file stems' prefixes)")
        if step == "check":
            sub.add_argument("--peers", action="store_true",
                             help="also convert each with ONNX Runtime's float16 script (keep_io_types) and check it")
        if step == "cases":
            sub.add_argument("--cases", type=Path, default=ROOT / "benchmarks" / "work" / "gpu_exports",
                             help="folder for the cases (gpu_fuzz.py run --cases)")
        if step == "export":
            sub.add_argument("--hf", action="store_true",
                             help="Hugging Face transformers' architectures instead (transformers installed)")
            sub.add_argument("--size", choices=sorted(SIZES), default="tiny",
                             help="the models written here: tiny (the suite) or base (BERT-base's shape, opset 17)")
            sub.add_argument("--full-size", action="store_true",
                             help="with --hf: BERT-base and GPT-2 small at their real sizes, for `time`")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.step == "check":
        check(args.models, args.only, args.peers)
    elif args.step == "cases":
        cases(args.models, args.only, args.cases)
    elif args.step == "time":
        time_tools(args.models, args.only)
    elif args.hf:
        export_hf(args.out, args.only, args.full_size)
    else:
        export(args.out, args.only, args.size)

if __name__ == "__main__":
    main()
