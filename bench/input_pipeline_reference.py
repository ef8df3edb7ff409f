#!/usr/bin/python3
"""The reference input pipeline for bench/input_pipeline.sh: torchvision's ImageFolder + DataLoader
with the reference ImageNet training transforms (RandomResizedCrop, RandomHorizontalFlip, ToTensor,
Normalize), `--workers` worker processes, shuffled batches. Prints one line:
  reference workers W batch B images N seconds S images/s X
over the batches after --warmup (worker start-up excluded)."""
import argparse
import time

import torch
from torchvision import datasets, transforms as T


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    tf = T.Compose([T.RandomResizedCrop(a.image_size), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = datasets.ImageFolder(a.data_dir + "/train", tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, drop_last=True,
                                     num_workers=a.workers, persistent_workers=True)
    done, images, t0 = 0, 0, time.perf_counter()
    while done < a.warmup + a.batches:
        for x, _ in dl:
            if done == a.warmup:
                images, t0 = 0, time.perf_counter()
            images += x.shape[0]
            done += 1
            if done == a.warmup + a.batches:
                break
    s = time.perf_counter() - t0
    print(f"reference workers {a.workers} batch {a.batch_size} images {images} seconds {s:.3f} "
          f"images/s {images / s:.1f}")


if __name__ == "__main__":
    main()
