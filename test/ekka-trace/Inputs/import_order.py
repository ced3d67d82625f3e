"""A HuggingFace script that imports transformers before torch: transformers
asks whether torch is there (importlib.util.find_spec) before importing it,
and so does this script. The shim still installs its hooks when torch is
imported. Run under ekka-trace."""
import importlib.util

print("torch there:", importlib.util.find_spec("torch") is not None)

import transformers  # noqa: E402
import torch  # noqa: E402

torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
model = transformers.LlamaForCausalLM(config).eval()
with torch.no_grad():
    model(torch.arange(1, 5).unsqueeze(0))
print("ran")
