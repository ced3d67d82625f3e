"""The workload of utils/bench/trace_overhead.py: a HuggingFace Llama (random
weights, float32, CPU or --device cuda), timed over repeated forwards after a
warm-up.
Prints one line: `ms_per_forward=<float>`."""
import argparse
import time

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--profiler", action="store_true",
                    help="run under torch.profiler with record_shapes=True")
parser.add_argument("--iters", type=int, default=10)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
config = transformers.LlamaConfig(
    vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
model = transformers.LlamaForCausalLM(config).eval().to(args.device)
ids = torch.randint(0, 4096, (1, 256)).to(args.device)


def run():
    with torch.no_grad():
        model(ids)
    if args.device != "cpu":
        torch.cuda.synchronize()


run()  # warm-up
if args.profiler:
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device != "cpu" else [])
    with profile(activities=activities, record_shapes=True):
        start = time.perf_counter()
        for _ in range(args.iters):
            run()
        elapsed = time.perf_counter() - start
else:
    start = time.perf_counter()
    for _ in range(args.iters):
        run()
    elapsed = time.perf_counter() - start
print(f"ms_per_forward={1000 * elapsed / args.iters:.3f}")
