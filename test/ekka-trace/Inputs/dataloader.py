"""A DataLoader whose workers run a module (a dataset's transform, as
torchvision's are) before the program's model gets its first batch."""
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Transformed(Dataset):
    def __init__(self):
        self.transform = torch.nn.Linear(4, 4)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        with torch.no_grad():
            return self.transform(torch.full((4,), float(i)))


if __name__ == "__main__":
    model = torch.nn.Linear(4, 2)
    batches = DataLoader(Transformed(), batch_size=2, num_workers=2,
                         multiprocessing_context=sys.argv[1])
    with torch.no_grad():
        for batch in batches:
            if sys.argv[2:] != ["workers-only"]:
                model(batch)
    print("loaded")
