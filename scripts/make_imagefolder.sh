#!/usr/bin/env bash
# Builds a small ImageNet-shaped folder of JPEGs from the Fashion-MNIST files already on the machine
# (Debian package dataset-fashion-mnist; nothing is downloaded), for `edl train --data imagefolder`,
# its tests and bench/input_pipeline.sh:
#   OUT/train/<class>/*.JPEG   OUT/val/<class>/*.JPEG   OUT/manifest.txt
# Each 28x28 image is upscaled, colourised (two random tints and mild noise) and written as JPEG.
# With --broken (the default), train/ also gets the awkward files real datasets hold: grayscale,
# CMYK and progressive JPEGs, a PNG named .JPEG, a 1x1 image, a truncated JPEG (all decodable), and
# an empty file, random bytes and a text file named .JPEG (undecodable). manifest.txt lists every
# file as "<path relative to OUT> <kind>", kinds: jpeg gray cmyk progressive png tiny truncated
# empty garbage text. Takes ~1 s per 200 images. Rerunning with the same flags rewrites the same set.
#
#   scripts/make_imagefolder.sh OUT [--classes 10] [--train_per_class 20] [--val_per_class 5]
#       [--size varied|WxH] [--quality varied|Q] [--broken yes|no] [--seed 1]
# FASHION_DIR overrides /usr/share/datasets/fashion-mnist; PYTHON overrides /usr/bin/python3 (Debian's,
# which has numpy and PIL: python3-numpy, python3-pil).
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1; shift
CLASSES=10 TRAIN=20 VAL=5 SIZE=varied QUALITY=varied BROKEN=yes SEED=1
while [ $# -gt 0 ]; do
  case "$1" in
    --classes) CLASSES=$2 ;;
    --train_per_class) TRAIN=$2 ;;
    --val_per_class) VAL=$2 ;;
    --size) SIZE=$2 ;;
    --quality) QUALITY=$2 ;;
    --broken) BROKEN=$2 ;;
    --seed) SEED=$2 ;;
    *) usage ;;
  esac
  shift 2 || usage
done
FASHION_DIR=${FASHION_DIR:-/usr/share/datasets/fashion-mnist}
[ -f "$FASHION_DIR/train-images-idx3-ubyte.gz" ] ||
  { echo "make_imagefolder: no $FASHION_DIR/train-images-idx3-ubyte.gz; install dataset-fashion-mnist" >&2; exit 1; }
mkdir -p "$OUT"

exec "${PYTHON:-/usr/bin/python3}" - "$OUT" "$CLASSES" "$TRAIN" "$VAL" "$SIZE" "$QUALITY" "$BROKEN" "$SEED" "$FASHION_DIR" <<'PY'
import gzip, io, os, shutil, sys
import numpy as np
from PIL import Image

out, classes, ntrain, nval, size, quality, broken, seed, fdir = sys.argv[1:]
classes, ntrain, nval, seed = int(classes), int(ntrain), int(nval), int(seed)
if not 1 <= classes <= 10:
    sys.exit("make_imagefolder: --classes must be 1..10 (Fashion-MNIST has 10)")
names = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
         "ankle-boot"]

def idx(path, header):
    with gzip.open(path, "rb") as f:
        data = f.read()
    return np.frombuffer(data, dtype=np.uint8, offset=header)

images = idx(os.path.join(fdir, "train-images-idx3-ubyte.gz"), 16).reshape(-1, 28, 28)
labels = idx(os.path.join(fdir, "train-labels-idx1-ubyte.gz"), 8)
rng = np.random.RandomState(seed)
manifest = []

def pick_size():
    if size != "varied":
        w, h = size.lower().split("x")
        return int(w), int(h)
    w = int(rng.randint(64, 641))
    h = int(np.clip(w / np.exp(rng.uniform(np.log(0.5), np.log(2.0))), 48, 800))
    return w, h

def pick_quality():
    return int(rng.randint(60, 99)) if quality == "varied" else int(quality)

def render(i):
    """Fashion-MNIST image i, upscaled and colourised, as an RGB PIL image."""
    w, h = pick_size()
    g = Image.fromarray(images[i]).resize((w, h), Image.BICUBIC)
    a = np.asarray(g, dtype=np.float32)[..., None] / 255.0
    fg, bg = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    rgb = a * fg + (1 - a) * bg + rng.normal(0, 6, (h, w, 3))
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")

def save(img, rel, kind, **kw):
    path = os.path.join(out, rel)
    img.save(path, "JPEG", quality=pick_quality(), **kw)
    manifest.append((rel, kind))

for split in ("train", "val"):
    shutil.rmtree(os.path.join(out, split), ignore_errors=True)
    per = ntrain if split == "train" else nval
    for c in range(classes):
        os.makedirs(os.path.join(out, split, names[c]))
        # Disjoint samples for train and val: train from the front of each class, val from the back.
        pool = np.flatnonzero(labels == c)
        pool = pool[:per] if split == "train" else pool[::-1][:per]
        for k, i in enumerate(pool):
            save(render(i), f"{split}/{names[c]}/{split}_{c}_{k:05d}.JPEG", "jpeg")

if broken == "yes":
    d = os.path.join("train", names[0])
    src = images[np.flatnonzero(labels == 0)[-1]]
    save(render(0).convert("L"), f"{d}/odd_gray.JPEG", "gray")
    save(render(1).convert("CMYK"), f"{d}/odd_cmyk.JPEG", "cmyk")
    save(render(2), f"{d}/odd_progressive.JPEG", "progressive", progressive=True)
    render(3).save(os.path.join(out, d, "odd_png.JPEG"), "PNG")
    manifest.append((f"{d}/odd_png.JPEG", "png"))
    save(Image.new("RGB", (1, 1), (200, 30, 90)), f"{d}/odd_tiny.JPEG", "tiny")
    buf = io.BytesIO()
    render(4).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    with open(os.path.join(out, d, "odd_truncated.JPEG"), "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    manifest.append((f"{d}/odd_truncated.JPEG", "truncated"))
    open(os.path.join(out, d, "odd_empty.JPEG"), "wb").close()
    manifest.append((f"{d}/odd_empty.JPEG", "empty"))
    with open(os.path.join(out, d, "odd_garbage.JPEG"), "wb") as f:
        f.write(rng.bytes(5000))
    manifest.append((f"{d}/odd_garbage.JPEG", "garbage"))
    with open(os.path.join(out, d, "odd_text.JPEG"), "w") as f:
        f.write("this is not an image\n")
    manifest.append((f"{d}/odd_text.JPEG", "text"))

with open(os.path.join(out, "manifest.txt"), "w") as f:
    for rel, kind in manifest:
        f.write(f"{rel} {kind}\n")
print(f"make_imagefolder: {len(manifest)} files in {out} ({classes} classes)")
PY
