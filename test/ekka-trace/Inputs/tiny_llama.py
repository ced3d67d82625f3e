"""A tiny HuggingFace Llama with seeded random weights: runs one forward and
saves the logits it computed itself, for comparison with the trace. With
`direct`, the forward is called as SGLang's model runner calls it,
`model.forward(ids)`, bypassing the module hooks of the root. With `bf16`,
the model's weights and activations are bfloat16."""
import sys

import torch
import transformers
from safetensors.torch import save_file

torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = transformers.LlamaForCausalLM(config).eval()
if "bf16" in sys.argv[2:]:
    model = model.to(torch.bfloat16)
ids = torch.arange(1, 9).unsqueeze(0)
with torch.no_grad():
    run = model.forward if "direct" in sys.argv[2:] else model
    logits = run(ids).logits
save_file({"logits": logits.contiguous()}, sys.argv[1])
print("logits", tuple(logits.shape))
