"""The zoo's cases (../shared/ZOO.md): each a reference model built from a
tiny config with seeded random weights, a prompt, the bug switched on in the
engine (none for clean pairs), and the ground truth, which only the runner
reads: Ekka sees three traces and the code index, as a user's run would."""
import torch
import transformers

SEED = 0


def llama_config():
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def qwen3_config(**extra):
    return transformers.Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=256, **extra)


def qwen3_score_config():
    return qwen3_config(num_labels=3)


def llama_tied_config():
    """A Llama whose head is tied to its embedding, with layers for two
    pipeline stages."""
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True)


def llama4_config():
    """A Llama of four layers, its head untied (a middle layer to break)."""
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def gemma3_config():
    return transformers.Gemma3TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
        query_pre_attn_scalar=16, max_position_embeddings=256,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"])


SOFTCAP = 10.0


def gemma3_softcap_config():
    """Gemma-3 with a final logit soft cap (Gemma-2's 30, here 10: logits of
    a few units, with the embedding the head is tied to scaled up, bend)."""
    c = gemma3_config()
    c.final_logit_softcapping = SOFTCAP
    return c


def qwen2_moe_config():
    return transformers.Qwen2MoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=256)


def qwen2_moe_l1_config():
    """Qwen2-MoE whose first layer is dense, its second sparse."""
    c = qwen2_moe_config()
    c.mlp_only_layers = [0]
    return c


def qwen3_moe_config():
    return transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True, max_position_embeddings=256)


def llama_theta_config():
    """A Llama with Llama-3's rope base."""
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_theta=500000.0)


def llama_v250_config():
    """A Llama whose vocabulary is not a multiple of 64 (vLLM pads it, per
    rank, for its vocab-parallel embedding)."""
    return transformers.LlamaConfig(
        vocab_size=250, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def ernie45_moe_config():
    return transformers.Ernie4_5_MoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        moe_num_experts=8, moe_k=2, moe_num_shared_experts=0, moe_layer_start_index=1,
        moe_layer_end_index=2, moe_layer_interval=1, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=False)


# A prompt of 34 tokens: past the sliding window (8), not a multiple of the
# KV cache's page size (4).
PROMPT = [2] + [(7 * i + 3) % 250 + 3 for i in range(33)]
# A prompt of 38 tokens whose ids reach both halves of a 250-token
# vocabulary.
PROMPT_V250 = [2] + [(7 * i + 3) % 240 + 3 for i in range(37)]
# Embedding cases embed a batch of prompts of one length (the reference runs
# them as a batch, the engine as one flattened sequence of tokens): many
# short prompts, as an embedding server batches queries.
PROMPTS = [[2] + [(7 * i + 13 * j + 3) % 250 + 3 for i in range(11)] for j in range(32)]
# Two requests of one length, prefilled together (no padding on either side).
TWO_PROMPTS = [[2] + [(11 * i + 29 * j + 5) % 250 + 3 for i in range(15)] for j in range(2)]
# Two requests of different lengths: the reference runs them as a batch
# padded on the right with an attention mask, the engine packs their tokens.
UNEVEN_PROMPTS = [[2] + [(13 * i + 31 * j + 7) % 250 + 3 for i in range(n - 1)]
                  for j, n in enumerate((16, 11))]


class MeanPooler(torch.nn.Module):
    """The reference embedding model's pooling: the mean over the tokens,
    in float32."""

    def forward(self, hidden_states):
        return hidden_states.float().mean(dim=1)


class MeanPoolingEmbedder(torch.nn.Module):
    """The reference embedding model: a HF decoder (LlamaModel) and mean
    pooling in float32, as sentence-embedding models built on decoders do."""

    def __init__(self, config):
        super().__init__()
        self.model = transformers.LlamaModel(config)
        self.pooler = MeanPooler()
        self.config = config

    def forward(self, input_ids):
        return self.pooler(self.model(input_ids).last_hidden_state)


class Case:
    """`quant`: the engine's decoder linears quantized ("fp8", "fp4"); the
    checkpoint's weights of those layers are then on the format's grid (per
    row, power-of-two scales), so that a correct quantized engine computes
    what the reference does up to rounding. `scale_weights`: checkpoint
    weights multiplied by a factor (large activations where a case needs
    them). `tp`: the engine runs as that many tensor-parallel ranks (gloo),
    its trace one directory per rank. `options`: the engine's own switches
    (zoo_engine.model.Arch), as a server's flags. `random_norms`: the
    checkpoint's norm weights moved off their initial ones (all equal), so
    that a norm applied with another norm's weight shows."""

    def __init__(self, id, source, model, config, bugs, accepted, kernel=None,
                 prompt=PROMPT, decode=4, symptom="", task="generate", quant=None,
                 scale_weights=None, tp=1, pp=1, options=None, random_norms=False):
        self.id, self.source, self.model, self.config = id, source, model, config
        self.bugs, self.accepted, self.kernel = tuple(bugs), tuple(accepted), kernel
        self.prompt, self.decode, self.symptom = prompt, decode, symptom
        self.task, self.quant = task, quant
        self.scale_weights = dict(scale_weights or {})
        self.tp = tp  # the engine's tensor-parallel ranks (processes)
        self.pp = pp  # or its pipeline stages (one of the two)
        self.options = dict(options or {})
        self.random_norms = random_norms

    @property
    def clean(self):
        return not self.bugs

    def hf_model_class(self):
        if self.model == "MeanPoolingEmbedder":
            return MeanPoolingEmbedder
        return getattr(transformers, self.model)


CASES = [
    Case("clean-llama", "clean pair", "LlamaForCausalLM", llama_config, [], []),
    Case("clean-gemma3", "clean pair", "Gemma3ForCausalLM", gemma3_config, [], []),
    Case("swa-all-layers", "vLLM-17689", "Gemma3ForCausalLM", gemma3_config,
         ["swa-all-layers"], ["model.layers.1.self_attn", "model.layers.1.self_attn.attn"],
         symptom="every layer attends through the sliding window: long-range context lost"),
    Case("swa-size-unset", "SGLang-4807", "Gemma3ForCausalLM", gemma3_config,
         ["swa-size-unset"], ["model.layers.0.self_attn", "model.layers.0.self_attn.attn"],
         symptom="sliding layers attend to the whole prompt"),
    Case("output-not-written", "vLLM-26812", "LlamaForCausalLM", llama_config,
         ["output-not-written"], ["model.layers.0.mlp"],
         symptom="the MLP's prefill result is dropped"),
    Case("lm-head-overwritten", "SGLang-17887", "LlamaForCausalLM", llama_config,
         ["lm-head-overwritten"], ["lm_head"],
         symptom="untied lm_head replaced by the embedding matrix"),
    Case("clean-qwen2-moe", "clean pair", "Qwen2MoeForCausalLM", qwen2_moe_config, [], []),
    Case("clean-qwen3-moe", "clean pair", "Qwen3MoeForCausalLM", qwen3_moe_config, [], []),
    Case("moe-intermediate", "SGLang-10138", "Qwen3MoeForCausalLM", qwen3_moe_config,
         ["moe-intermediate"], ["model.layers.0.mlp.experts"], kernel="zoo::fused_moe",
         symptom="the experts' stacked gate/up weights split at the wrong size"),
    Case("moe-inplace-shared", "SGLang-10344", "Qwen2MoeForCausalLM", qwen2_moe_config,
         ["moe-inplace-shared"], ["model.layers.0.mlp.experts", "model.layers.0.mlp.shared_expert"],
         symptom="routed experts overwrite the hidden states the shared expert then reads"),
    Case("clean-ernie45-moe", "clean pair", "Ernie4_5_MoeForCausalLM", ernie45_moe_config, [], []),
    Case("router-dtype", "vLLM-25833", "Ernie4_5_MoeForCausalLM", ernie45_moe_config,
         ["router-dtype"], ["model.layers.1.mlp.gate"],
         symptom="router and its correction bias in bf16: near-ties flip the chosen experts"),
    Case("clean-embedding", "clean pair", "MeanPoolingEmbedder", llama_config, [], [],
         prompt=PROMPTS, task="embed"),
    Case("pool-cumsum-bf16", "vLLM-15393", "MeanPoolingEmbedder", llama_config,
         ["pool-cumsum-bf16"], ["pooler"], prompt=PROMPTS, task="embed",
         symptom="mean pooling from a bf16 cumulative sum: embeddings drift"),
    Case("paged-attn-last-page", "SGLang-13044, SGLang-7936", "LlamaForCausalLM", llama_config,
         ["paged-attn-last-page"], ["model.layers.0.self_attn", "model.layers.0.self_attn.attn"],
         kernel="zoo::paged_attention",
         symptom="attention reads the unfilled tail of the last KV page"),
    Case("clean-llama-batch", "clean pair", "LlamaForCausalLM", llama_config, [], [],
         prompt=TWO_PROMPTS, task="batch"),
    Case("clean-llama-padded", "clean pair", "LlamaForCausalLM", llama_config, [], [],
         prompt=UNEVEN_PROMPTS, task="batch"),
    Case("causal-mask-stale", "SGLang-18358", "LlamaForCausalLM", llama_config,
         ["causal-mask-stale"], ["model.layers.0.self_attn", "model.layers.0.self_attn.attn"],
         prompt=UNEVEN_PROMPTS, task="batch",
         symptom="a batch of two prompts: the second attends through the first's mask"),
    Case("clean-llama-fp8", "clean pair", "LlamaForCausalLM", llama_config, [], [],
         quant="fp8"),
    Case("fp8-weights-zero", "SGLang-4434", "LlamaForCausalLM", llama_config,
         ["fp8-weights-zero"], ["model.layers.0.self_attn.qkv_proj"], quant="fp8",
         symptom="FP8 linears loaded from a 16-bit checkpoint without online quantization: "
                 "their weights stay zero"),
    Case("clean-llama-fp4", "clean pair", "LlamaForCausalLM", llama_config, [], [],
         quant="fp4"),
    Case("fp4-gemm-overflow", "vLLM-33560", "LlamaForCausalLM", llama_config,
         ["fp4-gemm-overflow"], ["model.layers.0.mlp.gate_up_proj"], kernel="zoo::quant_gemm",
         quant="fp4", scale_weights={"model.layers.0.post_attention_layernorm.weight": 3000.0},
         symptom="the FP4 GEMM rounds its fp32 accumulator to fp16 before the scale: "
                 "large activations overflow"),
    Case("clean-llama-tp2", "clean pair", "LlamaForCausalLM", llama_config, [], [], tp=2),
    Case("clean-qwen3-tp2", "clean pair", "Qwen3ForCausalLM", qwen3_config, [], [], tp=2),
    Case("qk-norm-tp", "vLLM-16296", "Qwen3ForCausalLM", qwen3_config, ["qk-norm-tp"],
         ["model.layers.0.self_attn.q_norm", "model.layers.0.self_attn.k_norm"], tp=2,
         symptom="under tensor parallel 2 the per-head q/k norms run over the rank's heads "
                 "flattened together"),
    Case("clean-qwen3-score-tp2", "clean pair", "Qwen3ForSequenceClassification",
         qwen3_score_config, [], [], tp=2, task="classify"),
    Case("score-head-tp", "vLLM-23804", "Qwen3ForSequenceClassification", qwen3_score_config,
         ["score-head-tp"], ["score"], tp=2, task="classify",
         symptom="under tensor parallel 2 the score head applies one rank's shard of its "
                 "weight to the full hidden state: classification scores drift"),
    Case("clean-llama-pp2", "clean pair", "LlamaForCausalLM", llama_tied_config, [], [], pp=2),
    Case("pp-lm-head-unloaded", "SGLang-21093", "LlamaForCausalLM", llama_tied_config,
         ["pp-lm-head-unloaded"], ["lm_head"], pp=2,
         symptom="under pipeline parallel 2 the last stage never copies the tied embedding "
                 "into lm_head"),
    Case("tp-mlp-reduce", "SGLang-21039", "LlamaForCausalLM", llama_config,
         ["tp-mlp-reduce"], ["model.layers.0.mlp.down_proj", "model.layers.0.mlp"], tp=2,
         symptom="under tensor parallel 2 the MLP's down projection skips its all-reduce"),
]

# Beyond ZOO.md, and outside the benchmark's totals: mechanisms no case of
# the paper exercises, kept as regression cases of Ekka's own mechanisms.
EXTRA_CASES = [
    Case("kv-cache-write-slot", "extra: KV-cache write", "LlamaForCausalLM", llama_config,
         ["kv-cache-write-slot"], ["model.layers.0.self_attn", "model.layers.0.self_attn.attn"],
         kernel="zoo::reshape_and_cache",
         symptom="the KV-cache write stores each write's last token one slot past its own, "
                 "so attention reads a key and value that are not there; named by un-paging "
                 "the cache it wrote with its own slot mapping"),
    # From the held-out evaluation of session 27 (docs/Zoo.md): mechanisms
    # written by reviewers who had not seen the diagnosis' code, their
    # accepted root causes set down before Ekka was run.
    Case("rope-theta-default", "extra: held-out, s27", "LlamaForCausalLM",
         llama_theta_config, ["rope-theta-default"],
         ["model.layers.0.self_attn.rotary_emb", "model.layers.0.self_attn"],
         symptom="the rope base is read from a config key that no longer exists: 10000 "
                 "where the config says 500000"),
    Case("norm-residual-stale", "extra: held-out, s27", "LlamaForCausalLM",
         llama_config, ["norm-residual-stale"],
         ["model.layers.0.post_attention_layernorm"], kernel="zoo::fused_add_rms_norm",
         symptom="the fused add + RMSNorm kernel normalizes the sum but never stores it "
                 "in the residual"),
    Case("final-norm-skipped", "extra: held-out, s27", "LlamaForCausalLM",
         llama_config, ["final-norm-skipped"], ["model.norm", "model"],
         symptom="the final RMSNorm is skipped: the head reads the unnormalized sum"),
    Case("kv-slot-decode", "extra: held-out, s27", "LlamaForCausalLM", llama_config,
         ["kv-slot-decode"], ["model.layers.0.self_attn.attn", "model.layers.0.self_attn"],
         decode=5,
         symptom="decode steps write their key and value one slot early; the prefill is "
                 "right"),
    # From the held-out evaluation's second round (docs/Zoo.md).
    Case("clean-qwen3-fused", "extra: clean pair", "Qwen3ForCausalLM", qwen3_config, [], [],
         options={"fused_qk_norm_rope": True}, random_norms=True),
    Case("fused-qknorm-kweight", "extra: held-out, s27", "Qwen3ForCausalLM", qwen3_config,
         ["fused-qknorm-kweight"], ["model.layers.0.self_attn"],
         kernel="zoo::fused_qk_norm_rope", options={"fused_qk_norm_rope": True},
         random_norms=True,
         symptom="the fused q/k-norm + rope op, called by the attention itself, normalizes "
                 "the key heads with q_norm's weight"),
    Case("clean-llama-tp2-vocab", "extra: clean pair", "LlamaForCausalLM", llama_v250_config,
         [], [], tp=2, prompt=PROMPT_V250, options={"vocab_parallel": True}),
    Case("vocab-shard-offset", "extra: held-out, s27", "LlamaForCausalLM", llama_v250_config,
         ["vocab-shard-offset"], ["model.embed_tokens"], tp=2, prompt=PROMPT_V250,
         options={"vocab_parallel": True},
         symptom="under tensor parallel 2 the vocab-parallel embedding's second rank takes "
                 "its rows from the unpadded vocabulary's half (125), not the padded one's "
                 "(128): ids from 128 on are embedded as the id three before"),
    Case("residual-alias-inplace", "extra: held-out, s27", "LlamaForCausalLM", llama_config,
         ["residual-alias-inplace"], ["model.layers.0.input_layernorm", "model.layers.0"],
         random_norms=True,
         symptom="the first layer's input_layernorm runs in place over the embedding, which "
                 "the residual still aliases: the residual holds the normed values"),
    Case("moe-shared-gate-softmax", "extra: held-out, s27", "Qwen2MoeForCausalLM",
         qwen2_moe_l1_config, ["shared-gate-softmax"], ["model.layers.1.mlp"],
         random_norms=True,
         symptom="the sparse block gates its shared expert with a softmax over the gate's "
                 "single logit (always 1), not a sigmoid: an op of the block itself, not of "
                 "its children"),
    Case("kv-cache-shared", "extra: held-out, s27", "LlamaForCausalLM", llama4_config,
         ["kv-cache-shared"], ["model.layers.1.self_attn.attn", "model.layers.1.self_attn"],
         decode=5,
         symptom="layer 2 is given layer 1's KV cache: the prefill is right, layer 1's decode "
                 "steps read layer 2's keys and values"),
    Case("mask-seq2-leak", "extra: held-out, s27", "LlamaForCausalLM", llama_config,
         ["mask-seq2-leak"], ["model.layers.0.self_attn.attn", "model.layers.0.self_attn"],
         prompt=UNEVEN_PROMPTS, task="batch",
         symptom="a padded batch of two: the second request's causal mask lets each token "
                 "see the next one; the first request is right"),
    Case("softcap-skipped", "extra: held-out, s27", "Gemma3ForCausalLM",
         gemma3_softcap_config, ["softcap-key-wrong"], ["logits_processor"],
         scale_weights={"model.embed_tokens.weight": SOFTCAP},
         symptom="the final logit soft cap is read from a config key the config does not "
                 "have: never applied"),
    Case("rope-style-ernie", "extra: held-out, s27", "Ernie4_5_MoeForCausalLM",
         ernie45_moe_config, ["rope-style-neox"],
         ["model.layers.0.self_attn.rotary_emb", "model.layers.0.self_attn"],
         symptom="neox-style rotary (halves) where Ernie-4.5 rotates interleaved pairs"),
    Case("embed-scale-missing", "extra: held-out, s27", "Gemma3ForCausalLM", gemma3_config,
         ["embed-scale-missing"], ["model.embed_tokens"],
         symptom="Gemma's sqrt(hidden) embedding normalizer is not applied"),
    # No module computes it: the sampler, after the logits, which the
    # diagnosis names when told the engine decodes greedily (--greedy).
    Case("sample-index", "extra: held-out, s28", "LlamaForCausalLM", llama_config,
         ["sample-index"], ["(sampler)"],
         symptom="the first token after the prefill is the argmax of the logits one position "
                 "early"),
]

BY_ID = {c.id: c for c in CASES + EXTRA_CASES}
