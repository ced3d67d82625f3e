"""A tiny BART's generate(), which runs the encoder alone first, then the
whole model at each step."""
import torch
import transformers as T

torch.manual_seed(0)
config = T.BartConfig(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                      decoder_ffn_dim=128, max_position_embeddings=64)
model = T.BartForConditionalGeneration(config).eval()
with torch.no_grad():
    for _ in range(2):  # the second's encoder is a step of its own too
        out = model.generate(torch.arange(3, 13).unsqueeze(0), min_new_tokens=3,
                             max_new_tokens=3, do_sample=False)
print("generated", out.shape[1])
