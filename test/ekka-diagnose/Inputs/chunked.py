"""A tiny HuggingFace Llama served greedily after a chunked prefill whose
last chunk is one token (a 12-token prompt in chunks of 11: 11 tokens, then
1), each decode step fed the argmax of the logits before (`serve`, which
writes the tokens it consumed to TOKENS); or one forward over those tokens
(`oneshot`, as a reference runs)."""
import argparse
import json

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["oneshot", "serve"])
parser.add_argument("tokens")
parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
args = parser.parse_args()

torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = transformers.LlamaForCausalLM(config).eval().to(getattr(torch, args.dtype))
# Its last token is the argmax of the first chunk's row 7 (of 11), not of its last.
prompt = [1, 17, 42, 9, 33, 5, 77, 21, 64, 3, 11, 22]
with torch.no_grad():
    if args.mode == "oneshot":
        with open(args.tokens) as f:
            model(torch.tensor([json.load(f)]))
    else:
        consumed = list(prompt)
        out = model(torch.tensor([prompt[:11]]), use_cache=True)
        out = model(torch.tensor([prompt[11:]]), past_key_values=out.past_key_values,
                    use_cache=True)
        for _ in range(3):
            token = int(out.logits[0, -1].argmax())
            consumed.append(token)
            out = model(torch.tensor([[token]]), past_key_values=out.past_key_values,
                        use_cache=True)
        with open(args.tokens, "w") as f:
            json.dump(consumed, f)
print(args.mode, "done")
