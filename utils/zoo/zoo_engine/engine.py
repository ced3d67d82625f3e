"""Serving: the weight loader, the paged KV cache and the prefill/decode loop."""
import os
import types

import torch

from .model import Arch, ForCausalLM, ForEmbedding, ForSequenceClassification, Linear

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# (target parameter, HF checkpoint name, shard): vLLM's stacked_params_mapping.
STACKED = [
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]


def load_kernels(path=None):
    """Loads the engine's C++ kernels (the `zoo::` custom ops)."""
    if hasattr(torch.ops, "zoo") and hasattr(torch.ops.zoo, "paged_attention"):
        return
    path = path or os.environ.get("EKKA_ZOO_KERNELS") or os.path.join(
        os.environ.get("EKKA_BUILD_DIR", os.path.join(ROOT, "build")), "lib",
        "libekka_zoo_kernels.so")
    if not os.path.exists(path):
        raise SystemExit(f"zoo: the engine's kernels are not built ({path}); run utils/build")
    torch.ops.load_library(path)


class Engine:
    """One sequence at a time: prefill the prompt, then decode greedily. On
    the CPU, or on a GPU (`device="cuda"`) with the kernels' CUDA versions.
    `options`: the engine's own switches, as a server's flags (Arch)."""

    def __init__(self, hf_config, checkpoint, dtype=torch.bfloat16, bugs=(), block_size=4,
                 num_blocks=256, task="generate", device="cpu", quant=None, tp_rank=0,
                 tp_size=1, pp_rank=0, pp_size=1, options=None):
        load_kernels()
        self.bugs = frozenset(bugs)
        torch.ops.zoo.set_bugs(",".join(sorted(self.bugs)))
        self.arch = Arch(hf_config, quant, tp_rank, tp_size, pp_rank, pp_size, options)
        self.dtype = dtype
        self.device = torch.device(device)
        with torch.device("meta"):
            model = {"embed": ForEmbedding, "classify": ForSequenceClassification}.get(
                task, ForCausalLM)(self.arch, self.bugs)
        self.model = model.to_empty(device=self.device).to(dtype).eval()
        for module in self.model.modules():
            if getattr(module, "keep_fp32", False):
                module.float()  # as HF keeps the router in float32
            if isinstance(module, Linear) and module.quant:
                module.allocate_quantized()
        self.load_weights(checkpoint)
        self.process_weights_after_loading()
        a = self.arch
        self.block_size = block_size
        shape = (num_blocks, block_size, a.num_kv_heads, a.head_dim)
        for i in self.arch.stage_layers:
            self.model.model.layers[i].self_attn.attn.kv_cache = (torch.zeros(shape, dtype=dtype, device=self.device),
                                             torch.zeros(shape, dtype=dtype, device=self.device))
            if "kv-cache-shared" in self.bugs and i == 2:
                # The planted bug: the KV-sharing map (for models whose
                # layers reuse an earlier layer's cache) puts layer 2 on
                # layer 1's cache, which layer 2's writes then overwrite.
                self.model.model.layers[i].self_attn.attn.kv_cache = \
                    self.model.model.layers[1].self_attn.attn.kv_cache
        # Pages are handed out from the end of the pool, so that a sequence's
        # pages are not the first ones (paging is visible in the cache).
        self.free_blocks = list(range(num_blocks))

    def shard(self, name, weight):
        """This rank's share of a checkpoint tensor under tensor parallelism:
        the rows of a column-parallel layer (Q, K, V, gate, up: its heads or
        columns), the input columns of a row-parallel one (o_proj,
        down_proj); the rest is replicated."""
        a = self.arch
        if a.tp_size == 1:
            return weight
        if name == "score.weight" and "score-head-tp" in self.bugs:
            # The planted bug: the (replicated) score head is loaded as if it
            # were row-parallel, one rank's share of the hidden features,
            # and applied to the full hidden state without a reduction.
            size = weight.shape[1] // a.tp_size
            own = torch.zeros_like(weight)
            own[:, a.tp_rank * size:(a.tp_rank + 1) * size] = \
                weight[:, a.tp_rank * size:(a.tp_rank + 1) * size]
            return own
        if name == "model.embed_tokens.weight" and a.vocab_parallel:
            # This rank's rows of the vocabulary padded to a multiple of 64
            # (the padding rows zero).
            rows = a.vocab_shard
            start = a.tp_rank * rows
            if "vocab-shard-offset" in self.bugs:
                # The planted bug: the shard's first row is taken from the
                # unpadded vocabulary's share, not the padded one's: a rank
                # after the first embeds each of its ids with the row of an
                # id a few before it.
                start = a.tp_rank * (weight.shape[0] // a.tp_size)
            own = torch.zeros(rows, weight.shape[1], dtype=weight.dtype)
            part = weight[start:start + rows]
            own[:part.shape[0]] = part
            return own
        column = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")
        if any(p in name for p in column):
            dim = 0
        elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
            dim = 1
        else:
            return weight
        size = weight.shape[dim] // a.tp_size
        return weight.narrow(dim, a.tp_rank * size, size)

    def load_weights(self, checkpoint):
        """Maps HF checkpoint names onto the engine's (fused) parameters."""
        checkpoint = {name: self.shard(name, w) for name, w in checkpoint.items()}
        params = dict(self.model.named_parameters())
        a = self.arch
        q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        offsets = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}
        loaded = set()
        with torch.no_grad():
            for name, weight in checkpoint.items():
                for fused, part, shard in STACKED:
                    if f".{part}." in name:
                        target = name.replace(f".{part}.", f".{fused}.")
                        if target not in params:
                            break  # another pipeline stage's layer
                        if shard in offsets:
                            start, size = offsets[shard]
                        else:  # gate, up: the halves of this projection
                            size = params[target].shape[0] // 2
                            start = shard * size
                        params[target][start:start + size].copy_(weight)
                        loaded.add(target)
                        break
                else:
                    # HF's stacked experts are vLLM's w13 / w2.
                    name = name.replace("mlp.experts.gate_up_proj", "mlp.experts.w13_weight")
                    name = name.replace("mlp.experts.down_proj", "mlp.experts.w2_weight")
                    if name in params:
                        params[name].copy_(weight)
                        loaded.add(name)
            if "lm_head.weight" not in params:
                pass  # an embedding model has no head
            elif "lm_head.weight" not in checkpoint or a.tie_word_embeddings \
                    or "lm-head-overwritten" in self.bugs:
                # Tied embeddings: the head is the embedding matrix. (The
                # planted bug copies it whether or not they are tied.) The
                # last pipeline stage has no embedding of its own: it takes
                # the checkpoint's.
                if "pp-lm-head-unloaded" in self.bugs and not a.first_stage:
                    # The planted bug: the last stage assumes the tied copy
                    # happened with the embedding, on the first stage.
                    params["lm_head.weight"].zero_()
                else:
                    params["lm_head.weight"].copy_(
                        params["model.embed_tokens.weight"] if a.first_stage
                        else checkpoint["model.embed_tokens.weight"])
                loaded.add("lm_head.weight")
        missing = sorted(set(params) - loaded)
        if missing:
            raise SystemExit(f"zoo: weights missing from the checkpoint: {missing[:4]}")

    def process_weights_after_loading(self):
        """Quantizes the loaded weights of quantized layers (vLLM's online
        quantization of a 16-bit checkpoint)."""
        if "fp8-weights-zero" in self.bugs:
            return  # the planted bug: never quantized, the kernel reads zeros
        for module in self.model.modules():
            if isinstance(module, Linear) and module.quant:
                module.quantize()

    def _forward(self, ids, positions, meta):
        """One forward; under pipeline parallelism, this stage's part: it
        receives the previous stage's (hidden states, residual), sends its
        own on, and only the last stage returns logits."""
        a = self.arch
        if a.pp_size == 1:
            return self.model(ids, positions, meta=meta)
        intermediate = None
        if not a.first_stage:
            buffers = [torch.empty(len(positions), a.hidden_size) for _ in range(2)]
            for b in buffers:
                torch.distributed.recv(b, src=a.pp_rank - 1)
            intermediate = tuple(b.to(self.dtype) for b in buffers)
        out = self.model(ids, positions, meta=meta, intermediate=intermediate)
        if a.last_stage:
            return out
        for t in out:  # sent as float32: exact for bf16, and any backend takes it
            torch.distributed.send(t.float().contiguous(), dst=a.pp_rank + 1)
        return None

    def _sampled(self, token):
        """The next token: under tensor parallelism rank 0's choice, under
        pipeline parallelism the last stage's, broadcast to every rank (as
        vLLM's driver worker samples for all)."""
        a = self.arch
        if a.tp_size > 1 or a.pp_size > 1:
            src = 0 if a.tp_size > 1 else a.pp_size - 1
            token = (token.reshape(1).clone() if token is not None
                     else torch.zeros(1, dtype=torch.long))
            torch.distributed.broadcast(token, src=src)
        return int(token)

    def _slots(self, table, positions):
        bs = self.block_size
        while len(table) * bs < int(positions[-1]) + 1:
            if not self.free_blocks:
                raise SystemExit("zoo: the KV cache is out of pages")
            table.append(self.free_blocks.pop())
        return torch.tensor([table[p // bs] * bs + p % bs for p in positions.tolist()])

    def embed(self, prompts):
        with torch.device(self.device):
            return self._embed(prompts)

    def batch(self, prompts):
        """One prefill over a batch of prompts (flattened, each with its own
        pages), attended through the torch-native backend: a boolean mask
        per request over the batch's tokens. Returns the logits."""
        with torch.device(self.device), torch.no_grad():
            ids, positions, slots, tables, seq_ids, masks = [], [], [], [], [], []
            total = sum(len(p) for p in prompts)
            start = 0
            for i, prompt in enumerate(prompts):
                table, n = [], len(prompt)
                pos = torch.arange(n)
                slots.append(self._slots(table, pos))
                tables.append(table)
                ids += prompt
                positions.append(pos)
                seq_ids += [i] * n
                if "causal-mask-stale" in self.bugs and masks:
                    # The planted bug: the mask built for the first request
                    # is reused for the next, cut to its rows (it points at
                    # the first request's tokens).
                    masks.append((start, start + n, masks[0][2][:n]))
                else:
                    mask = torch.zeros(n, total, dtype=torch.bool)
                    # The planted bug `mask-seq2-leak`: every request after
                    # the first gets its causal mask one diagonal too high,
                    # each token also seeing the next one.
                    diagonal = 1 if "mask-seq2-leak" in self.bugs and i > 0 else 0
                    mask[:, start:start + n] = torch.ones(n, n, dtype=torch.bool).tril(diagonal)
                    masks.append((start, start + n, mask))
                start += n
            width = max(len(t) for t in tables)
            meta = types.SimpleNamespace(
                slot_mapping=torch.cat(slots), positions=torch.cat(positions),
                block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
                seq_ids=torch.tensor(seq_ids), attn_masks=masks)
            return self.model(torch.tensor(ids), meta.positions, meta=meta)

    def classify(self, prompt):
        """One forward over the prompt; the last token's scores."""
        with torch.device(self.device), torch.no_grad():
            positions = torch.arange(len(prompt))
            table = []
            meta = types.SimpleNamespace(slot_mapping=self._slots(table, positions),
                                         block_tables=torch.tensor([table]),
                                         seq_ids=torch.zeros_like(positions), positions=positions)
            return self.model(torch.tensor(prompt), positions, meta=meta)[-1]

    def generate(self, prompt, max_new_tokens):
        with torch.device(self.device):
            return self._generate(prompt, max_new_tokens)

    def _embed(self, prompts):
        """One forward over the prompts as a flattened batch (vLLM's layout:
        their tokens one after the other, each sequence with its own pages);
        returns the pooled embeddings, one per prompt."""
        ids, positions, slots, tables, seq_ids = [], [], [], [], []
        for i, prompt in enumerate(prompts):
            table = []
            pos = torch.arange(len(prompt))
            slots.append(self._slots(table, pos))
            tables.append(table)
            ids += prompt
            positions.append(pos)
            seq_ids += [i] * len(prompt)
        width = max(len(t) for t in tables)
        meta = types.SimpleNamespace(
            slot_mapping=torch.cat(slots), positions=torch.cat(positions),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
            seq_ids=torch.tensor(seq_ids))
        with torch.no_grad():
            return self.model(torch.tensor(ids), meta.positions,
                              torch.tensor([len(p) for p in prompts]), meta=meta)

    def _generate(self, prompt, max_new_tokens):
        """Greedy decoding. Returns the tokens the model consumed (the prompt,
        then each decode step's input) and the tokens it generated."""
        table = []
        consumed, generated = list(prompt), []
        ids = torch.tensor(prompt)
        positions = torch.arange(len(prompt))
        with torch.no_grad():
            for step in range(max_new_tokens):
                slots = self._slots(table, positions)
                if "kv-slot-decode" in self.bugs and step >= 1:
                    # The planted bug: each decode step writes its key and
                    # value one slot early (over the previous token's) and
                    # reads its own slot, never written; the prefill is right.
                    slots = slots - 1
                meta = types.SimpleNamespace(slot_mapping=slots,
                                             block_tables=torch.tensor([table]),
                                             seq_ids=torch.zeros_like(positions),
                                             positions=positions)
                logits = self._forward(ids, positions, meta)
                # The planted bug sample-index: the first token after the
                # prefill is taken from the logits of the prompt's last
                # position but one.
                row = -2 if "sample-index" in self.bugs and step == 0 else -1
                token = self._sampled(logits[row].argmax() if logits is not None else None)
                generated.append(token)
                if step + 1 < max_new_tokens:
                    consumed.append(token)
                positions = torch.tensor([int(positions[-1]) + 1])
                ids = torch.tensor([token])
        return consumed, generated
