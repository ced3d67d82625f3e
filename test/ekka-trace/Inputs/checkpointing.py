"""A tiny Llama trained with HF gradient checkpointing, which checkpoints
each layer's `forward` (not its call) and only while its class's `forward`
is its own wrapper: every iteration must still checkpoint both layers, as
untraced, and the backward pass's recomputes must start no step."""
import sys

import torch
import transformers as T

torch.manual_seed(0)
config = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = T.LlamaForCausalLM(config).train()
model.gradient_checkpointing_enable(
    gradient_checkpointing_kwargs={"use_reentrant": sys.argv[1] == "reentrant"})
layer = type(model.model.layers[0])
forward = layer.forward
checkpointed = 0
for each in model.model.layers:
    def counted(*args, _checkpoint=each._gradient_checkpointing_func, **kwargs):
        global checkpointed
        checkpointed += 1
        return _checkpoint(*args, **kwargs)
    each._gradient_checkpointing_func = counted
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
ids = torch.randint(0, 128, (2, 12))
for iteration in range(3):
    checkpointed = 0
    loss = model(ids, labels=ids).loss
    assert checkpointed == 2 and layer.forward is forward, (iteration, checkpointed)
    if sys.argv[2:] == ["backward-thread"]:
        # As on a GPU, where autograd runs the backward pass (the
        # recomputes) on a thread of its own.
        import threading
        thread = threading.Thread(target=loss.backward)
        thread.start()
        thread.join()
    else:
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("checkpointing ok")
