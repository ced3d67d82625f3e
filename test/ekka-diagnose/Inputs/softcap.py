"""A tiny HuggingFace Gemma-2 (final logit soft-cap 1.0) run two ways over
one sequence: `hf`, the model itself, whose ForCausalLM soft-caps the head's
logits in its own forward; or `engine`, as a serving engine lays it out, the
same weights with the soft-cap in a `logits_processor` module after the head
(vLLM's LogitsProcessor). --bug leaves the soft-cap out; --wrap runs `hf`
inside a program's own root module that returns the logits' softmax."""
import argparse

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["hf", "engine"])
parser.add_argument("--bug", action="store_true")
parser.add_argument("--wrap", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
config = transformers.Gemma2Config(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
    final_logit_softcapping=1.0, attn_implementation="eager")
hf = transformers.Gemma2ForCausalLM(config).eval()


class LogitsProcessor(torch.nn.Module):
    def __init__(self, cap):
        super().__init__()
        self.cap = cap

    def forward(self, logits):
        if args.bug:
            return logits
        return torch.tanh(logits / self.cap) * self.cap


class Engine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = hf.model
        self.lm_head = hf.lm_head
        self.logits_processor = LogitsProcessor(config.final_logit_softcapping)

    def forward(self, ids):
        hidden = self.model(input_ids=ids).last_hidden_state
        return self.logits_processor(self.lm_head(hidden))


class Wrap(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = hf.model
        self.lm_head = hf.lm_head

    def forward(self, ids):
        return self.lm_head(self.model(input_ids=ids).last_hidden_state).softmax(-1)


ids = torch.tensor([[2, 17, 42, 9, 33, 5, 77, 21, 64, 3, 11, 8]])
with torch.no_grad():
    if args.wrap:
        out = Wrap()(ids)
    else:
        out = hf(ids).logits if args.mode == "hf" else Engine()(ids)
print(args.mode, tuple(out.shape))
